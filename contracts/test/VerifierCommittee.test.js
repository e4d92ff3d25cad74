const { expect } = require("chai");
const { ethers } = require("hardhat");
const { loadFixture, time, setBalance } = require("@nomicfoundation/hardhat-network-helpers");
const {
  P, MODEL, PRICE, REPORT_TYPES, CHALLENGE_TYPES, domainOf, sortByAddress, deployQuarry, activate, createTask,
  buildResult, signVotes, signReport, signChallengeSet, gasCost,
} = require("./helpers");

const coder = ethers.AbiCoder.defaultAbiCoder();
const ETH = (x) => ethers.parseEther(String(x));
const MAX_U64 = 2n ** 64n - 1n;
const STAKE = P.minVerifierStake;
const BURN = "0x000000000000000000000000000000000000dEaD"; // Arbitration.BURN: absences are burned
const BUDGET4 = 4n * 100n * PRICE; // default task: shard 0 has 4 requests x 100 tokens
const COLL4 = (BUDGET4 * BigInt(P.collateralBps)) / 10000n;
const TOKENS4 = 40n; // 4 receipts x 10 tokens (buildResult's default)
const D = { None: 0n, Open: 1n, MinerAtFault: 2n, MinerNotAtFault: 3n, Expired: 4n };
/** A seat ending at epoch `at` stays bonded until every dispute it could judge has expired
 * (epochStart(at) + Arbitration.disputeTimeout()), plus unbondingPeriod. */
const unbondsAt = async (committee, at) => (await committee.epochStart(at)) + P.disputeTimeout + P.verifierUnbonding;
const BALLOT = { None: 0n, Fault: 1n, NoFault: 2n, Absent: 3n };

/** Fixture: the four 1-ETH verifiers of deployQuarry plus four honest members that bonded 5 ETH each. */
async function richCommittee() {
  const q = await deployQuarry();
  const rich = q.signers.slice(10, 14);
  for (const r of rich) await q.committee.connect(r).register({ value: ETH(5) });
  await activate(q.committee);
  return { ...q, rich };
}

describe("VerifierCommittee", function () {
  /** Moves to the start of the next epoch so a test has a whole epoch of blocks to work in. */
  async function toEpochStart(committee) {
    const cur = await committee.currentEpoch();
    await time.increaseTo(await committee.epochStart(cur + 1n));
    return cur + 1n;
  }
  /** Moves to the start of epoch `e` (no-op when already there or later); returns `e`. */
  async function toEpoch(committee, e) {
    const start = await committee.epochStart(e);
    if (BigInt(await time.latest()) < start) await time.increaseTo(start);
    return e;
  }
  function report(epoch, miners, scores, tag = "evidence") {
    return { epoch, miners, scoresBps: scores, evidenceRoot: ethers.id(tag) };
  }
  const submitReport = (committee, r, sigs) =>
    committee.submitReputation(r.epoch, r.miners, r.scoresBps, r.evidenceRoot, sigs);
  /** `n` fresh externally owned accounts holding `value` wei each. */
  async function wallets(n, value = ETH(10)) {
    const out = [];
    for (let i = 0; i < n; i++) {
      const w = ethers.Wallet.createRandom().connect(ethers.provider);
      await setBalance(w.address, value);
      out.push(w);
    }
    return out;
  }
  /** Registers `ws` with `value` each, `churnLimit` per epoch, and moves to the epoch where the
   * last of them is active; returns that epoch. */
  async function registerOverEpochs(committee, ws, value = STAKE) {
    const limit = Number(await committee.churnLimit());
    let e = await toEpochStart(committee);
    for (let i = 0; i < ws.length; i += limit) {
      for (const w of ws.slice(i, i + limit)) {
        await expect(committee.connect(w).register({ value }))
          .to.emit(committee, "VerifierRegistered").withArgs(w.address, value, e + 1n);
      }
      e = await toEpoch(committee, e + 1n);
    }
    return e;
  }
  const addrs = (xs) => xs.map((x) => x.address);
  const sortedAddrs = (xs) => addrs(sortByAddress(xs));
  function leaderFor(members, last, epoch) {
    const idx = BigInt(ethers.keccak256(coder.encode(["bytes32", "uint256"], [last, epoch]))) % BigInt(members.length);
    return members[Number(idx)];
  }
  /** A task of the client whose shard 0 (4 requests, 10 tokens each) q.miner claimed and submitted. */
  async function submitted(q, over = {}) {
    const { taskId } = await createTask(q.task, q.client, over);
    await q.task.connect(q.miner).claimShard(taskId, 0);
    const res = await buildResult(q.task, taskId, 0, 0, 4, q.miner);
    await q.task.connect(q.miner).submitResult(taskId, 0, res.root, "store://out", res.total);
    return { taskId, res };
  }
  /** The client disputes receipt `k` of shard 0 with the minimum bond; returns the dispute id. */
  async function openDispute(q, taskId, res, k = 1) {
    await q.arb.connect(q.client).openDispute(
      taskId, 0, res.receipts[k], res.proofOf(k), "store://evidence", { value: P.minBond });
    return q.arb.disputeCount();
  }

  describe("params and wiring", function () {
    it("exposes constructor params and defaults; owner setters validate and emit", async function () {
      const { committee, owner, outsider, verifiers, arb } = await loadFixture(deployQuarry);
      expect(await committee.minVerifierStake()).to.equal(P.minVerifierStake);
      expect(await committee.unbondingPeriod()).to.equal(P.verifierUnbonding);
      expect(await committee.epochDuration()).to.equal(P.epochDuration);
      expect(await committee.maxMembers()).to.equal(64);
      expect(await committee.MAX_MEMBERS_CAP()).to.equal(64);
      expect(await committee.MAX_SEATS()).to.equal(128);
      expect(await committee.MAX_REPORT_MINERS()).to.equal(256);
      expect(await committee.activationDelay()).to.equal(1);
      expect(await committee.churnLimit()).to.equal(4);
      expect(await committee.idleStrikesAllowed()).to.equal(0);
      expect(await committee.idleSlashBps()).to.equal(1000);
      expect(await committee.arbitration()).to.equal(await arb.getAddress());
      expect(await committee.treasury()).to.equal(ethers.ZeroAddress);
      expect(await committee.nextReportEpoch()).to.equal(0);
      // the challenge answer window: half an epoch by default, positive and below an epoch
      expect(await committee.challengeAnswerWindow()).to.equal(P.epochDuration / 2n);
      await expect(committee.setChallengeAnswerWindow(P.epochDuration))
        .to.be.revertedWithCustomError(committee, "InvalidAnswerWindow").withArgs(P.epochDuration, P.epochDuration);
      await expect(committee.setChallengeAnswerWindow(0))
        .to.be.revertedWithCustomError(committee, "InvalidAnswerWindow").withArgs(0, P.epochDuration);
      await expect(committee.connect(outsider).setChallengeAnswerWindow(5))
        .to.be.revertedWithCustomError(committee, "OwnableUnauthorizedAccount");
      await expect(committee.setChallengeAnswerWindow(P.epochDuration - 1n))
        .to.emit(committee, "ChallengeAnswerWindowSet").withArgs(P.epochDuration - 1n);
      await expect(committee.setTreasury(outsider)).to.emit(committee, "TreasurySet").withArgs(outsider.address);
      await expect(committee.setTreasury(ethers.ZeroAddress)).to.be.revertedWithCustomError(committee, "ZeroAddress");
      await expect(committee.setMinVerifierStake(3)).to.emit(committee, "MinVerifierStakeSet").withArgs(3);
      await expect(committee.setUnbondingPeriod(3)).to.emit(committee, "UnbondingPeriodSet").withArgs(3);
      await expect(committee.setMaxMembers(0)).to.be.revertedWithCustomError(committee, "InvalidMaxMembers").withArgs(0);
      await expect(committee.setMaxMembers(65)).to.be.revertedWithCustomError(committee, "InvalidMaxMembers").withArgs(65);
      // below the member count is allowed: it removes no one (see "top-N by stake")
      await expect(committee.setMaxMembers(1)).to.emit(committee, "MaxMembersSet").withArgs(1);
      expect(await committee.members()).to.have.length(4);
      await expect(committee.setMembershipParams(0, 4))
        .to.be.revertedWithCustomError(committee, "InvalidMembershipParams").withArgs(0, 4);
      await expect(committee.setMembershipParams(1, 0))
        .to.be.revertedWithCustomError(committee, "InvalidMembershipParams").withArgs(1, 0);
      await expect(committee.setMembershipParams(2, 7)).to.emit(committee, "MembershipParamsSet").withArgs(2, 7);
      expect(await committee.activationDelay()).to.equal(2);
      expect(await committee.churnLimit()).to.equal(7);
      await expect(committee.setIdlePenalty(2, 10001)).to.be.revertedWithCustomError(committee, "InvalidBps").withArgs(10001);
      await expect(committee.setIdlePenalty(2, 10000)).to.emit(committee, "IdlePenaltySet").withArgs(2, 10000);
      expect(await committee.idleStrikesAllowed()).to.equal(2);
      expect(await committee.idleSlashBps()).to.equal(10000);
      for (const [f, args] of [
        ["setMaxMembers", [10]], ["setMembershipParams", [1, 1]], ["setIdlePenalty", [0, 0]], ["setTreasury", [outsider.address]],
        ["setMinVerifierStake", [1]], ["setUnbondingPeriod", [1]],
      ]) {
        await expect(committee.connect(outsider)[f](...args))
          .to.be.revertedWithCustomError(committee, "OwnableUnauthorizedAccount").withArgs(outsider.address);
      }
      for (const f of ["setGPURegistry", "setEscrow", "setArbitration"]) {
        await expect(committee[f](owner)).to.be.revertedWithCustomError(committee, "AlreadySet");
      }
      // only Arbitration penalizes absences
      await expect(committee.connect(owner).penalizeAbsence(verifiers[0], owner))
        .to.be.revertedWithCustomError(committee, "Unauthorized").withArgs(owner.address);
      const F = await ethers.getContractFactory("VerifierCommittee");
      await expect(F.deploy(1, 1, 0, 0)).to.be.revertedWithCustomError(committee, "ZeroEpochDuration");
      const fresh = await F.deploy(1, 1, 10, 5);
      expect(await fresh.genesisTime()).to.equal(5);
      const future = await F.deploy(1, 1, 10, 2n ** 63n);
      const rc = await future.deploymentTransaction().wait();
      expect(await future.genesisTime()).to.equal((await ethers.provider.getBlock(rc.blockNumber)).timestamp);
      for (const f of ["setGPURegistry", "setEscrow", "setArbitration"]) {
        await expect(fresh[f](ethers.ZeroAddress)).to.be.revertedWithCustomError(fresh, "ZeroAddress");
      }
      await expect(fresh.penalizeAbsence(verifiers[0], owner))
        .to.be.revertedWithCustomError(fresh, "Unauthorized").withArgs(owner.address);
      await expect(fresh.submitReputation(0, [], [], ethers.ZeroHash, [])).to.be.revertedWithCustomError(fresh, "NotWired");
      const r = report(0, [], []);
      await expect(fresh.proveEquivocation(verifiers[0], r, "0x", r, "0x")).to.be.revertedWithCustomError(fresh, "NotWired");
    });
  });

  describe("membership timing", function () {
    it("register takes effect at currentEpoch() + activationDelay, not before", async function () {
      const { committee, verifiers, outsider, signers } = await loadFixture(deployQuarry);
      const c = await toEpochStart(committee);
      await expect(committee.connect(outsider).register({ value: ETH(2) }))
        .to.emit(committee, "VerifierRegistered").withArgs(outsider.address, ETH(2), c + 1n);
      const info = await committee.verifierInfo(outsider);
      expect(info.stake).to.equal(ETH(2));
      expect(info.weight).to.equal(ETH(2));
      expect(info.activeFrom).to.equal(c + 1n);
      expect(info.activeUntil).to.equal(MAX_U64);
      expect(info.withdrawableAt).to.equal(0);
      expect(await committee.activations(c + 1n)).to.equal(1);
      expect(await committee.seats()).to.deep.equal([...addrs(verifiers), outsider.address]);
      // not a member (no weight, not listed) in the current epoch
      expect(await committee.isMember(outsider)).to.equal(false);
      expect(await committee.weightAt(outsider, c)).to.equal(0);
      expect(await committee.members()).to.deep.equal(sortedAddrs(verifiers));
      expect(await committee.membersAt(c + 1n)).to.deep.equal(sortedAddrs([...verifiers, outsider]));
      expect(await committee.weightAt(outsider, c + 1n)).to.equal(ETH(2));
      expect(await committee.totalWeightAt(c)).to.equal(4n * STAKE);
      expect(await committee.totalWeightAt(c + 1n)).to.equal(4n * STAKE + ETH(2));
      // one second before the boundary it still is not; at the boundary it is
      await time.increaseTo((await committee.epochStart(c + 1n)) - 1n);
      expect(await committee.isMember(outsider)).to.equal(false);
      expect(await activate(committee)).to.equal(c + 1n);
      expect(await committee.currentEpoch()).to.equal(c + 1n);
      expect(await committee.isMember(outsider)).to.equal(true);
      expect(await committee.members()).to.deep.equal(sortedAddrs([...verifiers, outsider]));
      // a longer delay schedules further out
      await committee.setMembershipParams(3, 4);
      const late = signers[10];
      await expect(committee.connect(late).register({ value: STAKE }))
        .to.emit(committee, "VerifierRegistered").withArgs(late.address, STAKE, c + 4n);
      await toEpoch(committee, c + 3n);
      expect(await committee.isMember(late)).to.equal(false);
      await toEpoch(committee, c + 4n);
      expect(await committee.isMember(late)).to.equal(true);
    });

    it("requestExit keeps the seat until the boundary; withdrawStake after unbonding, to the wei; re-registration", async function () {
      const { committee, verifiers, outsider } = await loadFixture(deployQuarry);
      const v = verifiers[1];
      await expect(committee.connect(v).withdrawStake()).to.be.revertedWithCustomError(committee, "NotExiting").withArgs(v.address);
      const c = await toEpochStart(committee);
      const wAt = await unbondsAt(committee, c + 1n);
      expect(wAt).to.equal((await committee.epochStart(c + 1n)) + 600n + 100n);
      await expect(committee.connect(v).requestExit())
        .to.emit(committee, "VerifierExitRequested").withArgs(v.address, c + 1n, wAt);
      const info = await committee.verifierInfo(v);
      expect(info.activeUntil).to.equal(c + 1n);
      expect(info.withdrawableAt).to.equal(wAt);
      expect(info.stake).to.equal(STAKE);
      // still a member for the rest of the epoch
      expect(await committee.isMember(v)).to.equal(true);
      expect(await committee.members()).to.deep.equal(sortedAddrs(verifiers));
      expect(await committee.memberCountAt(c)).to.equal(4);
      expect(await committee.memberCountAt(c + 1n)).to.equal(3);
      expect(await committee.membersAt(c + 1n)).to.deep.equal(sortedAddrs(verifiers.filter((x) => x !== v)));
      await expect(committee.connect(v).requestExit()).to.be.revertedWithCustomError(committee, "NotMember").withArgs(v.address);
      await expect(committee.connect(outsider).requestExit())
        .to.be.revertedWithCustomError(committee, "NotMember").withArgs(outsider.address);
      await expect(committee.connect(v).register({ value: STAKE }))
        .to.be.revertedWithCustomError(committee, "AlreadyRegistered").withArgs(v.address);
      await expect(committee.connect(v).withdrawStake())
        .to.be.revertedWithCustomError(committee, "UnbondingNotOver").withArgs(wAt);
      // out from the boundary on
      await toEpoch(committee, c + 1n);
      expect(await committee.isMember(v)).to.equal(false);
      expect(await committee.members()).to.deep.equal(sortedAddrs(verifiers.filter((x) => x !== v)));
      await expect(committee.connect(v).register({ value: STAKE }))
        .to.be.revertedWithCustomError(committee, "AlreadyRegistered").withArgs(v.address);
      await time.setNextBlockTimestamp(wAt - 1n);
      await expect(committee.connect(v).withdrawStake())
        .to.be.revertedWithCustomError(committee, "UnbondingNotOver").withArgs(wAt);
      await time.setNextBlockTimestamp(wAt);
      const before = await ethers.provider.getBalance(v);
      const tx = await committee.connect(v).withdrawStake();
      await expect(tx).to.emit(committee, "VerifierStakeWithdrawn").withArgs(v.address, STAKE);
      expect((await ethers.provider.getBalance(v)) - before + (await gasCost(tx))).to.equal(STAKE);
      const cleared = await committee.verifierInfo(v);
      expect([cleared.stake, cleared.weight, cleared.activeFrom, cleared.activeUntil, cleared.withdrawableAt])
        .to.deep.equal([0n, 0n, 0n, 0n, 0n]);
      await expect(committee.connect(v).withdrawStake()).to.be.revertedWithCustomError(committee, "NotExiting").withArgs(v.address);
      // registers again, with the usual delay
      const cur = await committee.currentEpoch();
      await expect(committee.connect(v).register({ value: ETH(3) }))
        .to.emit(committee, "VerifierRegistered").withArgs(v.address, ETH(3), cur + 1n);
      expect(await committee.seats()).to.have.length(4); // its old seat was pruned
      await activate(committee);
      expect(await committee.isMember(v)).to.equal(true);
      expect(await committee.weightAt(v, cur + 1n)).to.equal(ETH(3));
    });

    it("refuses low stakes and a second registration while pending, seated or unbonding", async function () {
      const { committee, verifiers, outsider, signers } = await loadFixture(deployQuarry);
      await expect(committee.connect(outsider).register())
        .to.be.revertedWithCustomError(committee, "InsufficientStake").withArgs(STAKE, 0);
      await expect(committee.connect(outsider).register({ value: STAKE - 1n }))
        .to.be.revertedWithCustomError(committee, "InsufficientStake").withArgs(STAKE, STAKE - 1n);
      await expect(committee.connect(verifiers[0]).register({ value: ETH(5) }))
        .to.be.revertedWithCustomError(committee, "AlreadyRegistered").withArgs(verifiers[0].address);
      await committee.connect(outsider).register({ value: STAKE });
      await expect(committee.connect(outsider).register({ value: STAKE }))
        .to.be.revertedWithCustomError(committee, "AlreadyRegistered").withArgs(outsider.address);
      // a zero minimum still needs some stake
      await committee.setMinVerifierStake(0);
      await expect(committee.connect(signers[10]).register({ value: 0 }))
        .to.be.revertedWithCustomError(committee, "InsufficientStake").withArgs(0, 0);
      await expect(committee.connect(signers[10]).register({ value: 1 }))
        .to.emit(committee, "VerifierRegistered");
    });

    it("contract accounts are refused, from a call and from a constructor", async function () {
      const { committee, gpu, owner } = await loadFixture(deployQuarry);
      const proxy = await (await ethers.getContractFactory("RegisterProxy")).deploy();
      const proxyAddr = await proxy.getAddress();
      await expect(proxy.joinCommittee(committee, { value: STAKE }))
        .to.be.revertedWithCustomError(committee, "ContractAccount").withArgs(proxyAddr);
      // the proxy is shared with the GPURegistry test: it is refused there too
      await expect(proxy.joinMiners(gpu, MODEL, { value: P.minStake }))
        .to.be.revertedWithCustomError(gpu, "ContractAccount").withArgs(proxyAddr);
      // from its constructor a contract has no code yet; it is refused all the same
      const F = await ethers.getContractFactory("RegisterInConstructor");
      const next = () => owner.getNonce().then((nonce) => ethers.getCreateAddress({ from: owner.address, nonce }));
      let predicted = await next();
      await expect(F.deploy(committee, ethers.ZeroAddress, ethers.ZeroHash, { value: STAKE }))
        .to.be.revertedWithCustomError(committee, "ContractAccount").withArgs(predicted);
      predicted = await next();
      await expect(F.deploy(ethers.ZeroAddress, gpu, MODEL, { value: P.minStake }))
        .to.be.revertedWithCustomError(gpu, "ContractAccount").withArgs(predicted);
      expect(await committee.seats()).to.have.length(4);
      expect((await committee.verifierInfo(proxyAddr)).activeFrom).to.equal(0);
    });
  });

  describe("churn limit and activation delay", function () {
    it("activates at most churnLimit verifiers per epoch; the next epoch accepts more", async function () {
      const { committee } = await loadFixture(deployQuarry);
      const ws = await wallets(6);
      const c = await toEpochStart(committee);
      for (const w of ws.slice(0, 4)) {
        await expect(committee.connect(w).register({ value: STAKE }))
          .to.emit(committee, "VerifierRegistered").withArgs(w.address, STAKE, c + 1n);
      }
      expect(await committee.activations(c + 1n)).to.equal(4);
      // no more stake than the smallest pending join: refused (more would displace it, "gap 4" below)
      await expect(committee.connect(ws[4]).register({ value: STAKE }))
        .to.be.revertedWithCustomError(committee, "ChurnLimitReached").withArgs(c + 1n, 4);
      await toEpoch(committee, c + 1n);
      await expect(committee.connect(ws[4]).register({ value: ETH(9) }))
        .to.emit(committee, "VerifierRegistered").withArgs(ws[4].address, ETH(9), c + 2n);
      expect(await committee.activations(c + 2n)).to.equal(1);
      // a higher limit set by the owner applies to the boundary being filled
      await committee.setMembershipParams(1, 1);
      await expect(committee.connect(ws[5]).register({ value: STAKE }))
        .to.be.revertedWithCustomError(committee, "ChurnLimitReached").withArgs(c + 2n, 1);
      await committee.setMembershipParams(1, 2);
      await committee.connect(ws[5]).register({ value: STAKE });
      expect(await committee.memberCountAt(c)).to.equal(4);
      expect(await committee.memberCountAt(c + 1n)).to.equal(8);
      expect(await committee.memberCountAt(c + 2n)).to.equal(10);
      // exits are not rate-limited
      const c2 = await toEpoch(committee, c + 2n);
      for (const w of ws) await committee.connect(w).requestExit();
      expect(await committee.memberCountAt(c2 + 1n)).to.equal(4);
    });

    it("a lower activation delay never schedules a change before one already scheduled", async function () {
      const { committee, verifiers, signers } = await loadFixture(deployQuarry);
      const [a, b, x, y] = signers.slice(10, 14);
      await expect(committee.setMembershipParams(3, 2)).to.emit(committee, "MembershipParamsSet").withArgs(3, 2);
      const c = await toEpochStart(committee);
      await expect(committee.connect(a).register({ value: STAKE }))
        .to.emit(committee, "VerifierRegistered").withArgs(a.address, STAKE, c + 3n);
      await committee.connect(b).register({ value: STAKE });
      await expect(committee.connect(x).register({ value: STAKE }))
        .to.be.revertedWithCustomError(committee, "ChurnLimitReached").withArgs(c + 3n, 2);
      await committee.setMembershipParams(1, 4);
      // currentEpoch() + 1 would be c + 1, but c + 3 is already scheduled
      await expect(committee.connect(x).register({ value: ETH(2) }))
        .to.emit(committee, "VerifierRegistered").withArgs(x.address, ETH(2), c + 3n);
      const wAt = await unbondsAt(committee, c + 3n);
      await expect(committee.connect(verifiers[0]).requestExit())
        .to.emit(committee, "VerifierExitRequested").withArgs(verifiers[0].address, c + 3n, wAt);
      expect(await committee.activations(c + 3n)).to.equal(3);
      for (const e of [c, c + 1n, c + 2n]) {
        expect(await committee.totalWeightAt(e)).to.equal(4n * STAKE);
        expect(await committee.membersAt(e)).to.deep.equal(sortedAddrs(verifiers));
      }
      expect(await committee.totalWeightAt(c + 3n)).to.equal(3n * STAKE + 2n * STAKE + ETH(2));
      await toEpoch(committee, c + 2n);
      expect(await committee.isMember(a)).to.equal(false);
      expect(await committee.isMember(verifiers[0])).to.equal(true);
      // still in epoch c + 2: the next change can only go to c + 3 as well
      await expect(committee.connect(y).register({ value: STAKE }))
        .to.emit(committee, "VerifierRegistered").withArgs(y.address, STAKE, c + 3n);
      await toEpoch(committee, c + 3n);
      expect(await committee.members()).to.deep.equal(sortedAddrs([...verifiers.slice(1), a, b, x, y]));
      // with the schedule caught up, the delay of 1 applies again
      await committee.connect(verifiers[1]).requestExit();
      expect((await committee.verifierInfo(verifiers[1])).activeUntil).to.equal(c + 4n);
    });

    it("a join cancelled before it takes effect gives slot and seat back at once, but its stake unbonds", async function () {
      // The attack of the first round: accounts register and at once request exit, to hold the
      // boundary's activation slots (or the seat list) without joining. Slots and seats come
      // back at once; the stake stays bonded for unbondingPeriod, so squatting is never free.
      const { committee, verifiers, signers } = await loadFixture(deployQuarry);
      const honest = signers.slice(10, 14);
      const att = await wallets(4);
      const c = await toEpochStart(committee);
      const unbonding = await committee.unbondingPeriod();
      for (const w of att) {
        await committee.connect(w).register({ value: STAKE });
        expect(await committee.activations(c + 1n)).to.equal(1);
        expect(await committee.seats()).to.have.length(verifiers.length + 1);
        const before = await ethers.provider.getBalance(w);
        const ts = BigInt(await time.latest()) + 1n;
        await time.setNextBlockTimestamp(ts);
        const tx = await committee.connect(w).requestExit();
        await expect(tx).to.emit(committee, "VerifierExitRequested").withArgs(w.address, c + 1n, ts + unbonding);
        expect(before - (await ethers.provider.getBalance(w))).to.equal(await gasCost(tx)); // nothing back yet
        expect(await committee.activations(c + 1n)).to.equal(0);
        expect(await committee.seats()).to.have.length(verifiers.length);
        const info = await committee.verifierInfo(w);
        expect([info.stake, info.activeFrom, info.activeUntil, info.withdrawableAt])
          .to.deep.equal([STAKE, c + 1n, c + 1n, ts + unbonding]);
        await expect(committee.connect(w).withdrawStake())
          .to.be.revertedWithCustomError(committee, "UnbondingNotOver").withArgs(ts + unbonding);
        await expect(committee.connect(w).register({ value: STAKE }))
          .to.be.revertedWithCustomError(committee, "AlreadyRegistered");
        await expect(committee.connect(w).requestExit()).to.be.revertedWithCustomError(committee, "NotMember");
      }
      expect(await committee.memberCountAt(c + 1n)).to.equal(4);
      expect(await committee.totalWeightAt(c + 1n)).to.equal(4n * STAKE);
      expect(await ethers.provider.getBalance(committee)).to.equal(8n * STAKE);
      // the boundary's four slots are all free for honest verifiers; the limit holds after them
      for (const h of honest) {
        await expect(committee.connect(h).register({ value: ETH(50) }))
          .to.emit(committee, "VerifierRegistered").withArgs(h.address, ETH(50), c + 1n);
      }
      expect(await committee.activations(c + 1n)).to.equal(4);
      const [late] = await wallets(1);
      await expect(committee.connect(late).register({ value: ETH(50) }))
        .to.be.revertedWithCustomError(committee, "ChurnLimitReached").withArgs(c + 1n, 4);
      await toEpoch(committee, c + 1n);
      expect(await committee.members()).to.deep.equal(sortedAddrs([...verifiers, ...honest]));
      expect(await committee.totalWeightAt(c + 1n)).to.equal(4n * STAKE + 4n * ETH(50));
      // a cancelled join judged nothing: the dispute bound does not apply, only unbondingPeriod
      const w0 = (await committee.verifierInfo(att[0])).withdrawableAt;
      await time.increaseTo(w0);
      const before = await ethers.provider.getBalance(att[0]);
      const tx = await committee.connect(att[0]).withdrawStake();
      await expect(tx).to.emit(committee, "VerifierStakeWithdrawn").withArgs(att[0].address, STAKE);
      expect((await ethers.provider.getBalance(att[0])) - before + (await gasCost(tx))).to.equal(STAKE);
      // and may then register again, like any newcomer
      const e = await committee.currentEpoch();
      await committee.connect(att[0]).register({ value: STAKE });
      expect((await committee.verifierInfo(att[0])).activeFrom).to.equal(e + 1n);
    });

    it("issue 29 gap 4: four 0.1 ETH squatters no longer keep out a 50 ETH join; the displaced squatter gets its stake back at once", async function () {
      // The attack: four minimum joins fill the next boundary's activation slots, so an honest
      // verifier with 50 ETH was refused ChurnLimitReached; the squatters cancelled before the
      // boundary and rotated. Slots now go by stake: the honest join displaces the smallest.
      const { committee, verifiers, signers } = await loadFixture(deployQuarry);
      const MIN = ETH(1) / 10n;
      await committee.setMinVerifierStake(MIN);
      const honest = signers[10];
      const sq = await wallets(4);
      const c = await toEpochStart(committee);
      const committeeBal = await ethers.provider.getBalance(committee);
      for (const w of sq) await committee.connect(w).register({ value: MIN });
      expect(await committee.activations(c + 1n)).to.equal(4);
      // the pending join displaced is the smallest; among equals, the highest address
      const victim = sortByAddress(sq)[3];
      const tx = committee.connect(honest).register({ value: ETH(50) });
      await expect(tx).to.emit(committee, "VerifierDisplaced").withArgs(victim.address, honest.address, c + 1n)
        .and.to.emit(committee, "VerifierRegistered").withArgs(honest.address, ETH(50), c + 1n);
      expect(await committee.activations(c + 1n)).to.equal(4);
      expect(await committee.seats()).to.have.length(verifiers.length + 4);
      expect(await committee.memberCountAt(c + 1n)).to.equal(8);
      expect(await committee.totalWeightAt(c + 1n)).to.equal(4n * STAKE + 3n * MIN + ETH(50));
      // the displaced join took no effect and did nothing wrong: its stake is free at once
      const ts = BigInt(await time.latest());
      const info = await committee.verifierInfo(victim);
      expect([info.activeFrom, info.activeUntil, info.withdrawableAt]).to.deep.equal([c + 1n, c + 1n, ts]);
      const before = await ethers.provider.getBalance(victim);
      const wtx = await committee.connect(victim).withdrawStake();
      await expect(wtx).to.emit(committee, "VerifierStakeWithdrawn").withArgs(victim.address, MIN);
      expect((await ethers.provider.getBalance(victim)) - before + (await gasCost(wtx))).to.equal(MIN);
      // squatting again with the same stake is refused; one wei more only displaces a squatter
      const [again, richer] = await wallets(2);
      await expect(committee.connect(again).register({ value: MIN }))
        .to.be.revertedWithCustomError(committee, "ChurnLimitReached").withArgs(c + 1n, 4);
      const left = sortByAddress(sq.filter((w) => w !== victim));
      await expect(committee.connect(richer).register({ value: MIN + 1n }))
        .to.emit(committee, "VerifierDisplaced").withArgs(left[2].address, richer.address, c + 1n);
      await expect(committee.connect(left[2]).withdrawStake()).to.emit(committee, "VerifierStakeWithdrawn").withArgs(left[2].address, MIN);
      // the rotation: the remaining squatters cancel, and their stake stays bonded
      const unbonding = await committee.unbondingPeriod();
      for (const w of [left[0], left[1], richer]) {
        const t = BigInt(await time.latest()) + 1n;
        await time.setNextBlockTimestamp(t);
        await expect(committee.connect(w).requestExit())
          .to.emit(committee, "VerifierExitRequested").withArgs(w.address, c + 1n, t + unbonding);
      }
      // the honest verifier sits from the boundary, to the wei of the snapshot
      await toEpoch(committee, c + 1n);
      expect(await committee.members()).to.deep.equal(sortedAddrs([...verifiers, honest]));
      expect(await committee.totalWeightAt(c + 1n)).to.equal(4n * STAKE + ETH(50));
      // held: the honest 50 ETH and the three cancelled squatters' stakes, unbonding
      expect(await ethers.provider.getBalance(committee)).to.equal(committeeBal + ETH(50) + 2n * MIN + MIN + 1n);
    });

    it("issue 29 gap 4: keeping a 50 ETH join out takes churnLimit bonds above 50 ETH each, seated or locked for the unbonding period", async function () {
      const { committee, verifiers, signers } = await loadFixture(deployQuarry);
      const honest = signers[10];
      const att = await wallets(4, ETH(60));
      const c = await toEpochStart(committee);
      const committeeBal = await ethers.provider.getBalance(committee);
      for (const w of att) await committee.connect(w).register({ value: ETH(50) + 1n });
      await expect(committee.connect(honest).register({ value: ETH(50) }))
        .to.be.revertedWithCustomError(committee, "ChurnLimitReached").withArgs(c + 1n, 4);
      expect(await ethers.provider.getBalance(committee)).to.equal(committeeBal + 4n * (ETH(50) + 1n));
      // cancelling before the boundary frees the slots but locks every attacker's 50 ETH + 1 wei
      const unbonding = await committee.unbondingPeriod();
      for (const w of att) {
        const t = BigInt(await time.latest()) + 1n;
        await time.setNextBlockTimestamp(t);
        await committee.connect(w).requestExit();
        expect((await committee.verifierInfo(w)).withdrawableAt).to.equal(t + unbonding);
        await expect(committee.connect(w).withdrawStake()).to.be.revertedWithCustomError(committee, "UnbondingNotOver");
      }
      await expect(committee.connect(honest).register({ value: ETH(50) }))
        .to.emit(committee, "VerifierRegistered").withArgs(honest.address, ETH(50), c + 1n);
      await toEpoch(committee, c + 1n);
      expect(await committee.members()).to.deep.equal(sortedAddrs([...verifiers, honest]));
    });

    it("register-then-exit cannot fill the seat list: 124 cancelled joins within one epoch leave it as it was", async function () {
      // Before cancelled joins left the seat list, 124 minimum stakes filled all MAX_SEATS (128)
      // entries within one epoch and register() reverted CommitteeFull(maxMembers, 0) until the
      // boundary. Now each cancelled join leaves no seat behind, and its stake stays bonded.
      this.timeout(300000);
      const { committee, verifiers, signers } = await loadFixture(deployQuarry);
      const honest = signers[10];
      const maxSeats = Number(await committee.MAX_SEATS());
      const att = await wallets(maxSeats - verifiers.length);
      const c = await toEpochStart(committee);
      // one epoch is 60 blocks at automine: send the attack in a few blocks instead
      await ethers.provider.send("evm_setAutomine", [false]);
      try {
        for (let i = 0; i < att.length; i += 16) {
          for (const w of att.slice(i, i + 16)) {
            await committee.connect(w).register({ value: STAKE, gasLimit: 1_000_000 });
            await committee.connect(w).requestExit({ gasLimit: 300_000 });
          }
          await ethers.provider.send("evm_mine", []);
        }
      } finally {
        await ethers.provider.send("evm_setAutomine", [true]);
      }
      expect(await committee.currentEpoch()).to.equal(c);
      expect(await committee.seats()).to.have.length(verifiers.length);
      expect(await committee.activations(c + 1n)).to.equal(0);
      expect(await committee.memberCountAt(c + 1n)).to.equal(4);
      // every attacker's stake is still held
      expect(await ethers.provider.getBalance(committee)).to.equal(BigInt(4 + att.length) * STAKE);
      for (const w of att) expect((await committee.verifierInfo(w)).activeUntil).to.equal(c + 1n);
      // an honest verifier registers in the same epoch
      await expect(committee.connect(honest).register({ value: ETH(50) }))
        .to.emit(committee, "VerifierRegistered").withArgs(honest.address, ETH(50), c + 1n);
      expect(await committee.seats()).to.have.length(5);
    });
  });

  describe("top-N by stake", function () {
    it("with every seat taken, a newcomer with more stake displaces the least staked member at the boundary", async function () {
      const { committee, verifiers, signers } = await loadFixture(deployQuarry);
      const [a, b, d, e] = signers.slice(10, 14);
      // the fixture's four verifiers hold 1 ETH each and were activated together: ties go to
      // the highest address
      const [s0, s1, s2, s3] = sortByAddress(verifiers);
      await committee.setMaxMembers(4);
      const c = await toEpochStart(committee);
      await expect(committee.connect(a).register({ value: STAKE }))
        .to.be.revertedWithCustomError(committee, "CommitteeFull").withArgs(4, STAKE);
      const w3 = await unbondsAt(committee, c + 1n);
      await expect(committee.connect(a).register({ value: ETH(2) }))
        .to.emit(committee, "VerifierDisplaced").withArgs(s3.address, a.address, c + 1n)
        .and.to.emit(committee, "VerifierRegistered").withArgs(a.address, ETH(2), c + 1n);
      let info = await committee.verifierInfo(s3);
      expect([info.activeUntil, info.withdrawableAt, info.stake]).to.deep.equal([c + 1n, w3, STAKE]);
      await expect(committee.connect(b).register({ value: STAKE }))
        .to.be.revertedWithCustomError(committee, "CommitteeFull").withArgs(4, STAKE);
      await expect(committee.connect(b).register({ value: STAKE + 1n }))
        .to.emit(committee, "VerifierDisplaced").withArgs(s2.address, b.address, c + 1n);
      expect(await committee.memberCountAt(c + 1n)).to.equal(4);
      expect(await committee.totalWeightAt(c + 1n)).to.equal(2n * STAKE + ETH(2) + STAKE + 1n);
      expect(await committee.membersAt(c)).to.deep.equal(sortedAddrs(verifiers));
      expect(await committee.membersAt(c + 1n)).to.deep.equal(sortedAddrs([s0, s1, a, b]));
      // the displaced stay members until the boundary, then are out and unbond
      expect(await committee.isMember(s3)).to.equal(true);
      await expect(committee.connect(s3).requestExit()).to.be.revertedWithCustomError(committee, "NotMember").withArgs(s3.address);
      await expect(committee.connect(s3).register({ value: ETH(9) }))
        .to.be.revertedWithCustomError(committee, "AlreadyRegistered").withArgs(s3.address);
      await toEpoch(committee, c + 1n);
      expect(await committee.members()).to.deep.equal(sortedAddrs([s0, s1, a, b]));
      expect(await committee.isMember(s3)).to.equal(false);
      await expect(committee.connect(s3).withdrawStake()).to.be.revertedWithCustomError(committee, "UnbondingNotOver").withArgs(w3);
      // a leaving member is never the one displaced: s1 (the tie's higher address) leaves, so
      // s0 (1 ETH) is displaced
      await committee.connect(s1).requestExit();
      await expect(committee.connect(d).register({ value: STAKE + 2n })).to.not.emit(committee, "VerifierDisplaced");
      // that registration pruned the seats that ended at this boundary
      expect([...(await committee.seats())]).to.have.members(addrs([s0, s1, a, b, d]));
      await expect(committee.connect(e).register({ value: STAKE + 1n }))
        .to.emit(committee, "VerifierDisplaced").withArgs(s0.address, e.address, c + 2n);
      expect(await committee.membersAt(c + 2n)).to.deep.equal(sortedAddrs([a, b, d, e]));
      await time.setNextBlockTimestamp(w3);
      const before = await ethers.provider.getBalance(s3);
      const tx = await committee.connect(s3).withdrawStake();
      await expect(tx).to.emit(committee, "VerifierStakeWithdrawn").withArgs(s3.address, STAKE);
      expect((await ethers.provider.getBalance(s3)) - before + (await gasCost(tx))).to.equal(STAKE);
    });

    it("ties: among equal stakes the member activated last is displaced first, then the highest address, whatever the seats' order", async function () {
      const { committee, verifiers, signers } = await loadFixture(deployQuarry);
      const [v0, v1, v2, v3] = verifiers; // seats in this order, all 1 ETH from epoch 1
      // the newcomer with the lowest address among ten candidates: below the fixture's highest
      const n1 = sortByAddress(signers.slice(10, 20))[0];
      expect(BigInt(n1.address)).to.be.lessThan(BigInt(sortByAddress(verifiers)[3].address));
      const [n2, n3, n4] = await wallets(3);
      const c = await toEpochStart(committee);
      await committee.connect(v0).requestExit();
      await committee.connect(n1).register({ value: STAKE }); // 1 ETH from c + 1
      await toEpoch(committee, c + 1n);
      await committee.setMaxMembers(4);
      // the next registration prunes v0's seat: n1 moves into it and is no longer the last seat
      await expect(committee.connect(n2).register({ value: ETH(2) }))
        .to.emit(committee, "VerifierDisplaced").withArgs(n1.address, n2.address, c + 2n);
      expect(await committee.seats()).to.deep.equal(addrs([n1, v1, v2, v3, n2]));
      // then, among v1, v2, v3 (all from epoch 1), the highest address, then the next
      const [, mid, high] = sortByAddress([v1, v2, v3]);
      await expect(committee.connect(n3).register({ value: ETH(2) }))
        .to.emit(committee, "VerifierDisplaced").withArgs(high.address, n3.address, c + 2n);
      await expect(committee.connect(n4).register({ value: ETH(2) }))
        .to.emit(committee, "VerifierDisplaced").withArgs(mid.address, n4.address, c + 2n);
      const low = sortByAddress([v1, v2, v3])[0];
      expect(await committee.membersAt(c + 2n)).to.deep.equal(sortedAddrs([low, n2, n3, n4]));
    });

    it("displacing a member then cancelling the join evicts it only at the price of a bonded stake", async function () {
      // helper round 9: displace-then-cancel used to refund the newcomer at once, so evicting
      // the least staked member cost gas only. The stake now unbonds like any other exit.
      const { committee, verifiers, signers } = await loadFixture(deployQuarry);
      const a = signers[10];
      const [s0, s1, s2, s3] = sortByAddress(verifiers);
      await committee.setMaxMembers(4);
      const c = await toEpochStart(committee);
      await expect(committee.connect(a).register({ value: ETH(2) }))
        .to.emit(committee, "VerifierDisplaced").withArgs(s3.address, a.address, c + 1n);
      const ts = BigInt(await time.latest()) + 1n;
      await time.setNextBlockTimestamp(ts);
      const unbonding = await committee.unbondingPeriod();
      const tx = await committee.connect(a).requestExit();
      await expect(tx).to.emit(committee, "VerifierExitRequested").withArgs(a.address, c + 1n, ts + unbonding);
      expect(await ethers.provider.getBalance(committee)).to.equal(4n * STAKE + ETH(2));
      expect(await committee.membersAt(c + 1n)).to.deep.equal(sortedAddrs([s0, s1, s2]));
      expect(await committee.totalWeightAt(c + 1n)).to.equal(3n * STAKE);
      // the freed seat is open to anyone at the minimum stake again
      await expect(committee.connect(signers[11]).register({ value: STAKE }))
        .to.emit(committee, "VerifierRegistered").withArgs(signers[11].address, STAKE, c + 1n);
      await expect(committee.connect(a).withdrawStake())
        .to.be.revertedWithCustomError(committee, "UnbondingNotOver").withArgs(ts + unbonding);
      await time.increaseTo(ts + unbonding);
      await expect(committee.connect(a).withdrawStake()).to.emit(committee, "VerifierStakeWithdrawn").withArgs(a.address, ETH(2));
    });

    it("lowering maxMembers removes no one; newcomers then displace one for one", async function () {
      const { committee, verifiers, signers } = await loadFixture(deployQuarry);
      await committee.setMaxMembers(2);
      const c = await toEpochStart(committee);
      expect(await committee.memberCountAt(c + 5n)).to.equal(4);
      await expect(committee.connect(signers[10]).register({ value: ETH(2) }))
        .to.emit(committee, "VerifierDisplaced").withArgs(verifiers[3].address, signers[10].address, c + 1n);
      expect(await committee.memberCountAt(c + 1n)).to.equal(4);
    });

    it("gap 4b: sixty minimum stakes fill all 64 seats, yet an honest verifier with more stake gets a seat", async function () {
      this.timeout(120000);
      const { committee, verifiers, signers } = await loadFixture(deployQuarry);
      const honest = signers[10];
      const sybils = await wallets(60, STAKE + ETH("0.1"));
      // at four activations per epoch the attack takes 15 epochs
      const start = await committee.currentEpoch();
      const e = await registerOverEpochs(committee, sybils);
      expect(e - start).to.equal(16n);
      expect(await committee.memberCountAt(e)).to.equal(64);
      expect(await committee.members()).to.deep.equal(sortedAddrs([...verifiers, ...sybils]));
      const extra = (await wallets(1))[0];
      await expect(committee.connect(extra).register({ value: STAKE }))
        .to.be.revertedWithCustomError(committee, "CommitteeFull").withArgs(64, STAKE);
      // the honest verifier bonds a little more and takes a seat of the last four sybils (all
      // 1 ETH, activated last): the one with the highest address
      const lastBatch = sortByAddress(sybils.slice(56));
      const last = lastBatch[3];
      for (const s of sybils.slice(56)) expect((await committee.verifierInfo(s)).activeFrom).to.equal(e);
      await expect(committee.connect(honest).register({ value: STAKE + 1n }))
        .to.emit(committee, "VerifierDisplaced").withArgs(last.address, honest.address, e + 1n)
        .and.to.emit(committee, "VerifierRegistered").withArgs(honest.address, STAKE + 1n, e + 1n);
      expect(await committee.memberCountAt(e + 1n)).to.equal(64);
      await toEpoch(committee, e + 1n);
      expect(await committee.isMember(honest)).to.equal(true);
      expect(await committee.isMember(last)).to.equal(false);
      expect(await committee.members())
        .to.deep.equal(sortedAddrs([...verifiers, ...sybils.filter((s) => s !== last), honest]));
      // the honest verifier is no longer the cheapest seat: an equal newcomer cannot take it
      await expect(committee.connect(extra).register({ value: STAKE }))
        .to.be.revertedWithCustomError(committee, "CommitteeFull").withArgs(64, STAKE);
      // the next newcomer with more stake takes the next of the last batch, by address
      await expect(committee.connect(extra).register({ value: STAKE + 1n }))
        .to.emit(committee, "VerifierDisplaced").withArgs(lastBatch[2].address, extra.address, e + 2n);
    });
  });

  describe("stake-weighted quorum", function () {
    it("weightAt, totalWeightAt, memberCountAt and quorumWeight per epoch across joins and exits", async function () {
      const { committee, verifiers, signers } = await loadFixture(deployQuarry);
      const a = signers[10];
      const [v0, v1] = verifiers;
      const c = await toEpochStart(committee);
      await committee.connect(a).register({ value: ETH(3) });
      await committee.connect(v0).requestExit();
      expect(await committee.totalWeightAt(c)).to.equal(ETH(4));
      expect(await committee.memberCountAt(c)).to.equal(4);
      expect(await committee.quorumWeight(c)).to.equal((ETH(4) * 2n) / 3n + 1n);
      expect(await committee.totalWeightAt(c + 1n)).to.equal(ETH(6));
      expect(await committee.memberCountAt(c + 1n)).to.equal(4);
      expect(await committee.quorumWeight(c + 1n)).to.equal(ETH(4) + 1n);
      expect(await committee.weightAt(a, c)).to.equal(0);
      expect(await committee.weightAt(a, c + 1n)).to.equal(ETH(3));
      expect(await committee.weightAt(a, c + 100n)).to.equal(ETH(3));
      expect(await committee.weightAt(v0, c)).to.equal(STAKE);
      expect(await committee.weightAt(v0, c + 1n)).to.equal(0);
      expect(await committee.totalWeightAt(c + 100n)).to.equal(ETH(6));
      // before the fixture's verifiers joined there was no committee
      expect(await committee.totalWeightAt(0)).to.equal(0);
      expect(await committee.memberCountAt(0)).to.equal(0);
      expect(await committee.quorumWeight(0)).to.equal(1);
      expect(await committee.weightAt(v1, 0)).to.equal(0);
      expect(await committee.totalWeightAt(1)).to.equal(ETH(4));
      await toEpoch(committee, c + 1n);
      await committee.connect(v1).requestExit();
      expect(await committee.totalWeightAt(c + 2n)).to.equal(ETH(5));
      expect(await committee.memberCountAt(c + 2n)).to.equal(3);
      expect(await committee.quorumWeight(c + 2n)).to.equal((ETH(5) * 2n) / 3n + 1n);
      // earlier epochs are fixed
      expect(await committee.totalWeightAt(c)).to.equal(ETH(4));
      expect(await committee.totalWeightAt(c + 1n)).to.equal(ETH(6));
      expect(await committee.weightAt(v1, c + 1n)).to.equal(STAKE);
      expect(await committee.weightAt(v1, c + 2n)).to.equal(0);
    });

    it("commitChallengeSet and submitReputation need more than two thirds of the weight, not of the heads", async function () {
      const { committee, verifiers, signers, miner } = await loadFixture(deployQuarry);
      const big = signers[10];
      await committee.connect(big).register({ value: ETH(3) });
      const c = await activate(committee);
      await toEpochStart(committee);
      const cur = c + 1n;
      const required = (ETH(7) * 2n) / 3n + 1n;
      expect(await committee.quorumWeight(cur)).to.equal(required);
      const h = ethers.id("cs");
      // four of five members (80% of heads) hold 4 of 7 ETH
      const small = sortByAddress(verifiers);
      await expect(committee.commitChallengeSet(cur + 1n, h, await signChallengeSet(committee, small, { epoch: cur + 1n, challengeSetHash: h })))
        .to.be.revertedWithCustomError(committee, "QuorumNotReached").withArgs(required, ETH(4));
      const r = report(cur, [miner.address], [7000]);
      await expect(submitReport(committee, r, await signReport(committee, small, r)))
        .to.be.revertedWithCustomError(committee, "QuorumNotReached").withArgs(required, ETH(4));
      // 3 + 1 = 4 of 7 ETH is not enough either; three of five heads holding 3 + 1 + 1 = 5 of 7 ETH is
      const heavy = sortByAddress([big, verifiers[0], verifiers[1]]);
      await expect(committee.commitChallengeSet(cur + 1n, h, await signChallengeSet(committee, [big, verifiers[0]], { epoch: cur + 1n, challengeSetHash: h })))
        .to.be.revertedWithCustomError(committee, "QuorumNotReached").withArgs(required, ETH(4));
      await expect(committee.commitChallengeSet(cur + 1n, h, await signChallengeSet(committee, heavy, { epoch: cur + 1n, challengeSetHash: h })))
        .to.emit(committee, "ChallengeSetCommitted");
      await expect(submitReport(committee, r, await signReport(committee, heavy, r)))
        .to.emit(committee, "ReputationSubmitted").withArgs(cur, r.evidenceRoot, 1, addrs(heavy));
    });

    it("issue 29 gap 5: stake bonded one second before a boundary decides a dispute opened one second after it; bonded at the boundary it does not", async function () {
      // The true bound (activationDelay 1): stake bonded at any time in epoch e sits from the
      // start of e + 1, so it judges every dispute opened from then on, as little as one second
      // after it was bonded. Not "bonded at least one epoch before the dispute".
      const q = await loadFixture(deployQuarry);
      const { committee, arb, escrow, task, client, miner, signers } = q;
      const [attacker, late] = signers.slice(10, 12);
      const { taskId, res } = await submitted(q);
      const { taskId: taskId2, res: res2 } = await submitted(q);
      const e = await committee.currentEpoch();
      const boundary = await committee.epochStart(e + 1n);
      const H = ETH(4); // the four honest members
      await time.setNextBlockTimestamp(boundary - 1n);
      await expect(committee.connect(attacker).register({ value: 2n * H + 1n }))
        .to.emit(committee, "VerifierRegistered").withArgs(attacker.address, 2n * H + 1n, e + 1n);
      // one second too late for the same boundary: it sits from e + 2
      await time.setNextBlockTimestamp(boundary);
      await expect(committee.connect(late).register({ value: 2n * H + 1n }))
        .to.emit(committee, "VerifierRegistered").withArgs(late.address, 2n * H + 1n, e + 2n);
      // the dispute opens one second after the boundary, two after the bond: epoch e + 1
      await time.setNextBlockTimestamp(boundary + 1n);
      const id = await openDispute(q, taskId, res);
      const d = await arb.getDispute(id);
      expect(d.epoch).to.equal(e + 1n);
      expect(d.totalWeight).to.equal(H + 2n * H + 1n);
      // the latecomer is not in this dispute's committee
      await expect(arb.castVotes(id, true, await signVotes(arb, [late], id, true)))
        .to.be.revertedWithCustomError(arb, "NotCommitteeMember").withArgs(late.address);
      // the attacker alone holds more than two thirds: it rules an honest receipt a fault
      const tx = arb.castVotes(id, true, await signVotes(arb, [attacker], id, true));
      await expect(tx).to.emit(arb, "DisputeResolved").withArgs(id, true, [attacker.address], COLL4);
      const reward = (COLL4 * BigInt(P.verifierRewardBps)) / 10000n;
      expect(await escrow.withdrawable(attacker)).to.equal(reward);
      expect(await escrow.withdrawable(client)).to.equal(BUDGET4 + COLL4 - reward + P.minBond);
      expect((await q.gpu.minerInfo(miner)).stake).to.equal(P.minStake - COLL4);
      // a dispute opened in epoch e + 2 has the latecomer in its committee too
      await time.increaseTo(await committee.epochStart(e + 2n));
      const id2 = await openDispute(q, taskId2, res2);
      expect(await arb.castVotes.staticCall(id2, true, await signVotes(arb, sortByAddress([attacker, late]), id2, true))).to.equal(true);
      expect((await task.getShard(taskId, 0)).state).to.equal(5n); // Refunded
    });

    it("gap 3: nine minimum stakes registered after a dispute opened are not in its snapshot", async function () {
      const q = await loadFixture(deployQuarry);
      const { committee, arb, escrow, gpu, task, miner, client, verifiers } = q;
      const { taskId, res } = await submitted(q);
      const id = await openDispute(q, taskId, res);
      const opened = await committee.currentEpoch();
      let d = await arb.getDispute(id);
      expect(d.epoch).to.equal(opened);
      expect(d.totalWeight).to.equal(ETH(4));
      // the client (the attacker) bonds nine minimum stakes; they activate within the dispute's timeout
      const sybils = await wallets(9);
      const e = await registerOverEpochs(committee, sybils);
      expect(e).to.equal(opened + 4n);
      expect(BigInt(await time.latest())).to.be.lessThan(d.deadline);
      for (const s of sybils) {
        expect(await committee.isMember(s)).to.equal(true);
        expect(await committee.weightAt(s, d.epoch)).to.equal(0);
      }
      // 9 of 13 ETH now: a quorum of the current committee, but not of the dispute's
      expect(await committee.quorumWeight(e)).to.equal((ETH(13) * 2n) / 3n + 1n);
      const sorted = sortByAddress(sybils);
      await expect(arb.castVotes(id, true, await signVotes(arb, sybils, id, true)))
        .to.be.revertedWithCustomError(arb, "NotCommitteeMember").withArgs(sorted[0].address);
      // the dispute's committee resolves it: no fault
      const honest = sortByAddress(verifiers.slice(0, 3));
      const tx = arb.castVotes(id, false, await signVotes(arb, honest, id, false));
      await expect(tx).to.emit(arb, "DisputeResolved").withArgs(id, false, addrs(honest), 0);
      d = await arb.getDispute(id);
      expect(d.status).to.equal(D.MinerNotAtFault);
      expect(d.faultWeight).to.equal(0);
      expect(d.noFaultWeight).to.equal(ETH(3));
      const each = (P.minBond - (P.minBond * BigInt(P.minerBondShareBps)) / 10000n) / 3n;
      for (const h of honest) expect(await escrow.withdrawable(h)).to.equal(each);
      expect(await escrow.withdrawable(miner)).to.equal(P.minBond - each * 3n);
      expect(await escrow.withdrawable(client)).to.equal(0);
      for (const s of sybils) expect(await escrow.withdrawable(s)).to.equal(0);
      const m = await gpu.minerInfo(miner);
      expect([m.stake, m.locked]).to.deep.equal([P.minStake, COLL4]);
      // the shard's window closed at the verdict: the miner is paid in full at once
      await task.finalizeShard(taskId, 0);
      expect(await escrow.withdrawable(miner)).to.equal(P.minBond - each * 3n + TOKENS4 * PRICE);
      expect(await escrow.withdrawable(client)).to.equal(BUDGET4 - TOKENS4 * PRICE);
      expect((await gpu.minerInfo(miner)).locked).to.equal(0);
    });

    it("gap 3: nine minimum stakes bonded before the dispute cannot outweigh honest members that bonded more", async function () {
      const q = await loadFixture(richCommittee);
      const { committee, arb, escrow, gpu, task, miner, client, verifiers, rich } = q;
      const sybils = await wallets(9);
      const e = await registerOverEpochs(committee, sybils);
      expect(await committee.memberCountAt(e)).to.equal(17);
      expect(await committee.totalWeightAt(e)).to.equal(ETH(33));
      const { taskId, res } = await submitted(q);
      const id = await openDispute(q, taskId, res);
      let d = await arb.getDispute(id);
      expect(d.epoch).to.equal(e);
      expect(d.totalWeight).to.equal(ETH(33));
      // nine of seventeen members vote "fault" on a correct receipt: recorded, but 9 of 33 ETH
      const sorted = sortByAddress(sybils);
      const sybilSigs = await signVotes(arb, sybils, id, true);
      expect(await arb.castVotes.staticCall(id, true, sybilSigs)).to.equal(false);
      const tx = await arb.castVotes(id, true, sybilSigs);
      for (const s of sorted) await expect(tx).to.emit(arb, "VoteCast").withArgs(id, s.address, true, STAKE);
      await expect(tx).to.not.emit(arb, "DisputeResolved");
      d = await arb.getDispute(id);
      expect(d.status).to.equal(D.Open);
      expect(d.faultWeight).to.equal(ETH(9));
      expect(await arb.ballotOf(id, sorted[0])).to.equal(BALLOT.Fault);
      expect(await arb.votersOf(id, true)).to.deep.equal(addrs(sorted));
      await expect(arb.castVotes(id, true, sybilSigs)).to.be.revertedWithCustomError(arb, "NoNewVotes").withArgs(id);
      // the honest side: 4 x 5 ETH = 20 of 33 is not yet more than two thirds (22)
      const richSorted = sortByAddress(rich);
      const richSigs = await signVotes(arb, rich, id, false);
      expect(await arb.castVotes.staticCall(id, false, richSigs)).to.equal(false);
      const rtx = await arb.castVotes(id, false, richSigs);
      for (const r of richSorted) await expect(rtx).to.emit(arb, "VoteCast").withArgs(id, r.address, false, ETH(5));
      // + 3 x 1 ETH = 23 > 22: resolved, no fault
      const small = sortByAddress(verifiers.slice(0, 3));
      const smallSigs = await signVotes(arb, small, id, false);
      expect(await arb.castVotes.staticCall(id, false, smallSigs)).to.equal(true);
      const voters = [...addrs(richSorted), ...addrs(small)];
      await expect(arb.castVotes(id, false, smallSigs)).to.emit(arb, "DisputeResolved").withArgs(id, false, voters, 0);
      d = await arb.getDispute(id);
      expect([d.status, d.faultWeight, d.noFaultWeight]).to.deep.equal([D.MinerNotAtFault, ETH(9), ETH(23)]);
      // the bond: half to the miner, the rest split among the 7 no-fault voters by recorded
      // weight (5 ETH each for the rich, 1 ETH each for the small; 23 ETH in all), dust to the miner
      const pool = P.minBond - (P.minBond * BigInt(P.minerBondShareBps)) / 10000n;
      const toRich = (pool * ETH(5)) / ETH(23);
      const toSmall = (pool * ETH(1)) / ETH(23);
      expect([toRich, toSmall]).to.deep.equal([10869565217391304n, 2173913043478260n]);
      for (const r of richSorted) expect(await escrow.withdrawable(r)).to.equal(toRich);
      for (const v of small) expect(await escrow.withdrawable(v)).to.equal(toSmall);
      const toMiner = P.minBond - 4n * toRich - 3n * toSmall;
      expect(toMiner).to.equal(P.minBond / 2n + 4n);
      expect(await escrow.withdrawable(miner)).to.equal(toMiner);
      for (const s of sybils) expect(await escrow.withdrawable(s)).to.equal(0);
      expect(await escrow.withdrawable(client)).to.equal(0);
      expect(await escrow.withdrawable(verifiers[3])).to.equal(0);
      const m = await gpu.minerInfo(miner);
      expect([m.stake, m.locked]).to.deep.equal([P.minStake, COLL4]);
      await task.finalizeShard(taskId, 0);
      expect(await escrow.withdrawable(miner)).to.equal(toMiner + TOKENS4 * PRICE);
    });
    it("limit of a 2/3 stake quorum: more than twice the honest stake, bonded a boundary ahead of the dispute, buys the verdict and nothing slashes it", async function () {
      // The client picks when its dispute opens, so the activation delay does not stop it from
      // bonding first; only the stake ratio does (README: a verdict needs more than two thirds
      // of the snapshot's stake). Against the fixture's 4 x 1 ETH committee nine minimum stakes
      // (9 of 13 ETH) resolve a correct shard as fault, and nothing is slashed from them for
      // voting against the receipt. The reward goes by weight: 1/9 each.
      const q = await loadFixture(deployQuarry);
      const { committee, arb, escrow, gpu, miner, client } = q;
      const sybils = await wallets(9);
      await registerOverEpochs(committee, sybils);
      const { taskId, res } = await submitted(q);
      const id = await openDispute(q, taskId, res);
      expect((await arb.getDispute(id)).totalWeight).to.equal(ETH(13));
      const sorted = sortByAddress(sybils);
      await expect(arb.castVotes(id, true, await signVotes(arb, sybils, id, true)))
        .to.emit(arb, "DisputeResolved").withArgs(id, true, addrs(sorted), COLL4);
      const each = (COLL4 * BigInt(P.verifierRewardBps)) / 10000n / 9n;
      for (const s of sybils) {
        expect(await escrow.withdrawable(s)).to.equal(each);
        expect((await committee.verifierInfo(s)).stake).to.equal(STAKE);
      }
      expect(await escrow.withdrawable(client)).to.equal(P.minBond + BUDGET4 + COLL4 - each * 9n);
      expect((await gpu.minerInfo(miner)).stake).to.equal(P.minStake - COLL4);
    });
  });

  describe("blocking and absence", function () {
    it("gap 4a: idle verifiers a disputed cheater registers after the dispute opened cannot block it", async function () {
      const q = await loadFixture(deployQuarry);
      const { committee, arb, escrow, gpu, task, miner, client, verifiers } = q;
      const { taskId, res } = await submitted(q);
      const id = await openDispute(q, taskId, res);
      const d0 = await arb.getDispute(id);
      const idle = await wallets(2);
      const e = await registerOverEpochs(committee, idle);
      // for a dispute opened now, the four honest members (4 of 6 ETH) would be no quorum
      expect(await committee.quorumWeight(e)).to.equal(ETH(4) + 1n);
      for (const w of idle) expect(await committee.weightAt(w, d0.epoch)).to.equal(0);
      const honest = sortByAddress(verifiers.slice(1));
      const tx = arb.castVotes(id, true, await signVotes(arb, honest, id, true));
      await expect(tx).to.emit(arb, "DisputeResolved").withArgs(id, true, addrs(honest), COLL4);
      await expect(tx).to.emit(task, "ShardRefunded").withArgs(taskId, 0, BUDGET4);
      expect((await arb.getDispute(id)).status).to.equal(D.MinerAtFault);
      const slash = (COLL4 * BigInt(P.faultSlashBps)) / 10000n;
      const each = (slash * BigInt(P.verifierRewardBps)) / 10000n / 3n;
      for (const h of honest) expect(await escrow.withdrawable(h)).to.equal(each);
      expect(await escrow.withdrawable(client)).to.equal(P.minBond + BUDGET4 + slash - each * 3n);
      expect(await escrow.withdrawable(miner)).to.equal(0);
      for (const w of idle) expect(await escrow.withdrawable(w)).to.equal(0);
      const m = await gpu.minerInfo(miner);
      expect([m.stake, m.locked]).to.deep.equal([P.minStake - slash, 0n]);
    });

    it("members of the snapshot who let a dispute expire lose their seat and 10% of their stake to nothing to the opener (burned)", async function () {
      const q = await loadFixture(deployQuarry);
      const { committee, arb, escrow, task, client, outsider, verifiers } = q;
      const [v0, v1, v2, v3] = verifiers;
      const { taskId, res } = await submitted(q);
      const id = await openDispute(q, taskId, res);
      const d = await arb.getDispute(id);
      const other = await submitted(q);
      const id2 = await openDispute(q, other.taskId, other.res);
      // one vote only: 1 of 4 ETH
      expect(await arb.castVotes.staticCall(id, false, await signVotes(arb, [v0], id, false))).to.equal(false);
      await arb.castVotes(id, false, await signVotes(arb, [v0], id, false));
      await expect(arb.reportAbsence(id, [v1]))
        .to.be.revertedWithCustomError(arb, "DisputeNotExpiredStatus").withArgs(D.Open);
      await time.increaseTo(d.deadline);
      await expect(arb.castVotes(id, false, await signVotes(arb, [v1], id, false)))
        .to.be.revertedWithCustomError(arb, "DisputeDeadlinePassed").withArgs(d.deadline);
      await expect(arb.expireDispute(id)).to.emit(arb, "DisputeExpired").withArgs(id);
      expect(await escrow.withdrawable(client)).to.equal(P.minBond);
      await time.increaseTo((await arb.getDispute(id2)).deadline);
      await arb.expireDispute(id2);
      expect(await escrow.withdrawable(client)).to.equal(2n * P.minBond);
      await expect(arb.reportAbsence(id, [v0])).to.be.revertedWithCustomError(arb, "NotAbsent").withArgs(v0.address);
      await expect(arb.reportAbsence(id, [outsider]))
        .to.be.revertedWithCustomError(arb, "NotCommitteeMember").withArgs(outsider.address);
      const c = await toEpochStart(committee);
      const escrowBal = await ethers.provider.getBalance(escrow);
      const cut = (STAKE * 1000n) / 10000n;
      const tx = arb.connect(outsider).reportAbsence(id, [v1, v2]);
      await expect(tx).to.emit(committee, "AbsencePenalized").withArgs(v1.address, 1, cut, BURN)
        .and.to.emit(committee, "AbsencePenalized").withArgs(v2.address, 1, cut, BURN)
        .and.to.emit(arb, "AbsenceReported").withArgs(id, v1.address, cut)
        .and.to.emit(arb, "AbsenceReported").withArgs(id, v2.address, cut);
      expect(await escrow.withdrawable(client)).to.equal(2n * P.minBond);
      expect(await escrow.withdrawable(BURN)).to.equal(2n * cut);
      expect(await ethers.provider.getBalance(escrow)).to.equal(escrowBal + 2n * cut);
      expect(await escrow.withdrawable(outsider)).to.equal(0);
      const wAt = await unbondsAt(committee, c + 1n);
      for (const v of [v1, v2]) {
        const info = await committee.verifierInfo(v);
        expect([info.stake, info.weight, info.activeUntil, info.withdrawableAt]).to.deep.equal([STAKE - cut, STAKE, c + 1n, wAt]);
        expect(await committee.strikesOf(v)).to.equal(1);
        expect(await arb.ballotOf(id, v)).to.equal(BALLOT.Absent);
        expect(await committee.isMember(v)).to.equal(true); // until the boundary
      }
      await expect(arb.reportAbsence(id, [v1])).to.be.revertedWithCustomError(arb, "NotAbsent").withArgs(v1.address);
      // a second expired dispute: another strike and 10% of what is left; the exit stays as it was
      const cut2 = ((STAKE - cut) * 1000n) / 10000n;
      await expect(arb.reportAbsence(id2, [v1]))
        .to.emit(committee, "AbsencePenalized").withArgs(v1.address, 2, cut2, BURN);
      expect(await committee.strikesOf(v1)).to.equal(2);
      const info1 = await committee.verifierInfo(v1);
      expect([info1.stake, info1.activeUntil, info1.withdrawableAt]).to.deep.equal([STAKE - cut - cut2, c + 1n, wAt]);
      expect(await escrow.withdrawable(client)).to.equal(2n * P.minBond);
      expect(await escrow.withdrawable(BURN)).to.equal(2n * cut + cut2);
      expect(await committee.strikesOf(v3)).to.equal(0);
      expect(await committee.membersAt(c + 1n)).to.deep.equal(sortedAddrs([v0, v3]));
      expect(await committee.totalWeightAt(c + 1n)).to.equal(ETH(2));
      await toEpoch(committee, c + 1n);
      expect(await committee.isMember(v1)).to.equal(false);
      await time.setNextBlockTimestamp(wAt);
      const before = await ethers.provider.getBalance(v1);
      const wtx = await committee.connect(v1).withdrawStake();
      await expect(wtx).to.emit(committee, "VerifierStakeWithdrawn").withArgs(v1.address, STAKE - cut - cut2);
      expect((await ethers.provider.getBalance(v1)) - before + (await gasCost(wtx))).to.equal(STAKE - cut - cut2);
      // the expired disputes left the shards to be finalized as no fault
      await task.finalizeShard(taskId, 0);
      await task.finalizeShard(other.taskId, 0);
    });

    it("setIdlePenalty(1, 1000): the first absence costs the seat only, the second the stake; strikes survive re-registration", async function () {
      const q = await loadFixture(deployQuarry);
      const { committee, arb, escrow, client, verifiers } = q;
      const v = verifiers[1];
      await expect(committee.setIdlePenalty(1, 1000)).to.emit(committee, "IdlePenaltySet").withArgs(1, 1000);
      const first = await submitted(q);
      const id1 = await openDispute(q, first.taskId, first.res);
      await time.increaseTo((await arb.getDispute(id1)).deadline);
      await arb.expireDispute(id1);
      const c = await toEpochStart(committee);
      await expect(arb.reportAbsence(id1, [v]))
        .to.emit(committee, "AbsencePenalized").withArgs(v.address, 1, 0, BURN)
        .and.to.emit(arb, "AbsenceReported").withArgs(id1, v.address, 0);
      expect(await escrow.withdrawable(client)).to.equal(P.minBond);
      const info = await committee.verifierInfo(v);
      expect([info.stake, info.activeUntil]).to.deep.equal([STAKE, c + 1n]);
      // leaves at the boundary, withdraws its whole stake, registers again with 2 ETH
      const wAt = await unbondsAt(committee, c + 1n);
      await time.setNextBlockTimestamp(wAt);
      const before = await ethers.provider.getBalance(v);
      const wtx = await committee.connect(v).withdrawStake();
      expect((await ethers.provider.getBalance(v)) - before + (await gasCost(wtx))).to.equal(STAKE);
      expect(await committee.strikesOf(v)).to.equal(1);
      await committee.connect(v).register({ value: ETH(2) });
      await activate(committee);
      expect(await committee.isMember(v)).to.equal(true);
      const second = await submitted(q);
      const id2 = await openDispute(q, second.taskId, second.res);
      expect((await arb.getDispute(id2)).totalWeight).to.equal(ETH(5));
      await time.increaseTo((await arb.getDispute(id2)).deadline);
      await arb.expireDispute(id2);
      const cut = (ETH(2) * 1000n) / 10000n;
      await expect(arb.reportAbsence(id2, [v]))
        .to.emit(committee, "AbsencePenalized").withArgs(v.address, 2, cut, BURN);
      expect(await committee.strikesOf(v)).to.equal(2);
      expect((await committee.verifierInfo(v)).stake).to.equal(ETH(2) - cut);
      expect(await escrow.withdrawable(client)).to.equal(2n * P.minBond);
      expect(await escrow.withdrawable(BURN)).to.equal(cut);
    });

    it("an absent member that asked to leave cannot withdraw before the dispute expires, even one opened in the last second of its seat", async function () {
      // The escape of the first round: with unbondingPeriod (100 s) below the dispute timeout
      // (600 s), a member that requested exit withdrew before the dispute expired and could not
      // be reported. Its stake now stays bonded until epochStart(activeUntil) + disputeTimeout +
      // unbondingPeriod: the whole unbonding period is left to report it, however late the
      // dispute opened.
      const q = await loadFixture(deployQuarry);
      const { committee, arb, escrow, client, verifiers } = q;
      const v = verifiers[3];
      const c = await toEpochStart(committee);
      const { taskId, res } = await submitted(q);
      await committee.connect(v).requestExit(); // its seat ends at c + 1
      const end = await committee.epochStart(c + 1n);
      const wAt = await unbondsAt(committee, c + 1n);
      expect((await committee.verifierInfo(v)).withdrawableAt).to.equal(wAt);
      // the client opens its dispute in the last second of epoch c
      await time.setNextBlockTimestamp(end - 1n);
      const id = await openDispute(q, taskId, res);
      const d = await arb.getDispute(id);
      expect([d.epoch, d.deadline]).to.deep.equal([c, end - 1n + P.disputeTimeout]);
      expect(await committee.weightAt(v, d.epoch)).to.equal(STAKE);
      expect(wAt).to.equal(d.deadline + 1n + P.verifierUnbonding);
      // the escape: where the old rule released the stake, and at the deadline, still bonded
      await time.setNextBlockTimestamp(end + P.verifierUnbonding);
      await expect(committee.connect(v).withdrawStake())
        .to.be.revertedWithCustomError(committee, "UnbondingNotOver").withArgs(wAt);
      await time.setNextBlockTimestamp(d.deadline);
      await expect(committee.connect(v).withdrawStake())
        .to.be.revertedWithCustomError(committee, "UnbondingNotOver").withArgs(wAt);
      await arb.expireDispute(id);
      // reported in the last second before wAt: a strike and 10% burned
      await time.setNextBlockTimestamp(wAt - 1n);
      await expect(arb.reportAbsence(id, [v]))
        .to.emit(committee, "AbsencePenalized").withArgs(v.address, 1, STAKE / 10n, BURN)
        .and.to.emit(arb, "AbsenceReported").withArgs(id, v.address, STAKE / 10n);
      expect(await committee.strikesOf(v)).to.equal(1);
      const info = await committee.verifierInfo(v);
      expect([info.stake, info.activeUntil, info.withdrawableAt]).to.deep.equal([STAKE - STAKE / 10n, c + 1n, wAt]);
      expect(await escrow.withdrawable(client)).to.equal(P.minBond);
      expect(await escrow.withdrawable(BURN)).to.equal(STAKE / 10n);
      // then it gets back what is left, to the wei
      await time.setNextBlockTimestamp(wAt);
      const before = await ethers.provider.getBalance(v);
      const wtx = await committee.connect(v).withdrawStake();
      await expect(wtx).to.emit(committee, "VerifierStakeWithdrawn").withArgs(v.address, STAKE - STAKE / 10n);
      expect((await ethers.provider.getBalance(v)) - before + (await gasCost(wtx))).to.equal(STAKE - STAKE / 10n);
    });

    it("a dispute timeout raised after the exit request still binds the stake: the absent member cannot withdraw first", async function () {
      // withdrawableAt was read once at the exit request; withdrawStake now recomputes the bound
      // with the current timeout and applies the later of the two.
      const q = await loadFixture(deployQuarry);
      const { committee, arb, escrow, client, verifiers } = q;
      const v = verifiers[3];
      const c = await toEpochStart(committee);
      const { taskId, res } = await submitted(q);
      await committee.connect(v).requestExit();
      const wAt = await unbondsAt(committee, c + 1n);
      expect((await committee.verifierInfo(v)).withdrawableAt).to.equal(wAt);
      await arb.setParams(P.minBond, 3600, P.faultSlashBps, P.verifierRewardBps, P.minerBondShareBps);
      const id = await openDispute(q, taskId, res);
      const d = await arb.getDispute(id);
      expect(d.epoch).to.equal(c);
      expect(await committee.weightAt(v, d.epoch)).to.equal(STAKE);
      expect(d.deadline).to.be.greaterThan(wAt);
      const bound = (await committee.epochStart(c + 1n)) + 3600n + P.verifierUnbonding; // raised timeout
      expect(bound).to.equal(wAt + 3600n - P.disputeTimeout);
      await time.setNextBlockTimestamp(wAt);
      await expect(committee.connect(v).withdrawStake())
        .to.be.revertedWithCustomError(committee, "UnbondingNotOver").withArgs(bound);
      await time.increaseTo(d.deadline);
      await arb.expireDispute(id);
      await expect(arb.reportAbsence(id, [v]))
        .to.emit(committee, "AbsencePenalized").withArgs(v.address, 1, STAKE / 10n, BURN);
      expect(await committee.strikesOf(v)).to.equal(1);
      expect(await escrow.withdrawable(client)).to.equal(P.minBond);
      expect(await escrow.withdrawable(BURN)).to.equal(STAKE / 10n);
      await time.setNextBlockTimestamp(bound);
      const before = await ethers.provider.getBalance(v);
      const wtx = await committee.connect(v).withdrawStake();
      expect((await ethers.provider.getBalance(v)) - before + (await gasCost(wtx))).to.equal(STAKE - STAKE / 10n);
    });

    it("limit of a 2/3 stake quorum: more than a third of the snapshot's weight voting the other way blocks a verdict; expiry then pays the miner, and voters are never absent", async function () {
      // The cheating miner bonds three minimum stakes before it cheats: 3 of 7 ETH. They vote
      // "no fault" on a faulty shard; the four honest members (4 of 7 ETH) cannot reach two
      // thirds (README: more than a third of the stake can always block), the dispute expires
      // as no fault, and voters cannot be reported absent.
      const q = await loadFixture(deployQuarry);
      const { committee, arb, escrow, gpu, task, miner, client, verifiers } = q;
      const guards = await wallets(3);
      await registerOverEpochs(committee, guards);
      const { taskId, res } = await submitted(q);
      const id = await openDispute(q, taskId, res);
      const d = await arb.getDispute(id);
      expect(d.totalWeight).to.equal(ETH(7));
      expect(await arb.castVotes.staticCall(id, true, await signVotes(arb, verifiers, id, true))).to.equal(false);
      await arb.castVotes(id, true, await signVotes(arb, verifiers, id, true));
      await arb.castVotes(id, false, await signVotes(arb, guards, id, false));
      const after = await arb.getDispute(id);
      expect([after.status, after.faultWeight, after.noFaultWeight]).to.deep.equal([D.Open, ETH(4), ETH(3)]);
      await time.increaseTo(d.deadline);
      await arb.expireDispute(id);
      await expect(arb.reportAbsence(id, [sortByAddress(guards)[0]]))
        .to.be.revertedWithCustomError(arb, "NotAbsent").withArgs(sortByAddress(guards)[0].address);
      for (const g of guards) expect((await committee.verifierInfo(g)).stake).to.equal(STAKE);
      await task.finalizeShard(taskId, 0);
      expect(await escrow.withdrawable(miner)).to.equal(TOKENS4 * PRICE);
      expect(await escrow.withdrawable(client)).to.equal(P.minBond + BUDGET4 - TOKENS4 * PRICE);
      expect((await gpu.minerInfo(miner)).stake).to.equal(P.minStake);
    });
  });

  describe("reputation reports", function () {
    it("writes quorum-signed scores to GPURegistry and skips unregistered miners", async function () {
      const { committee, gpu, task, client, miner, miner2, outsider, verifiers } = await loadFixture(deployQuarry);
      const cur = await toEpochStart(committee);
      // miners strictly ascending by address
      expect(BigInt(miner2.address) < BigInt(miner.address) && BigInt(miner.address) < BigInt(outsider.address)).to.equal(true);
      const r = report(cur, [miner2.address, miner.address, outsider.address], [9000, 3000, 7000]);
      const signers = sortByAddress(verifiers.slice(1));
      const sigs = await signReport(committee, signers, r);
      const tx = await submitReport(committee, r, sigs);
      await expect(tx).to.emit(committee, "ReputationSubmitted").withArgs(cur, r.evidenceRoot, 3, addrs(signers));
      await expect(tx).to.emit(gpu, "ReputationSet").withArgs(miner.address, 3000);
      await expect(tx).to.emit(gpu, "ReputationSet").withArgs(miner2.address, 9000);
      await expect(tx).to.emit(committee, "ReputationSkipped").withArgs(cur, outsider.address);
      expect((await gpu.minerInfo(miner)).reputationBps).to.equal(3000);
      expect((await gpu.minerInfo(miner2)).reputationBps).to.equal(9000);
      expect(await committee.reported(cur)).to.equal(true);
      expect(await committee.nextReportEpoch()).to.equal(cur + 1n);
      // a miner below the untrusted threshold can no longer claim
      const { taskId } = await createTask(task, client);
      await expect(task.connect(miner).claimShard(taskId, 0)).to.be.revertedWithCustomError(task, "NotEligible").withArgs(miner.address);
      await task.connect(miner2).claimShard(taskId, 0);
      // a repeat, or an unreported older epoch, is out of order now
      await expect(submitReport(committee, r, sigs))
        .to.be.revertedWithCustomError(committee, "ReportOutOfOrder").withArgs(cur, cur + 1n);
      const past = report(cur - 1n, [miner.address], [5000]);
      await expect(submitReport(committee, past, await signReport(committee, signers, past)))
        .to.be.revertedWithCustomError(committee, "ReportOutOfOrder").withArgs(cur - 1n, cur + 1n);
      expect((await gpu.minerInfo(miner)).reputationBps).to.equal(3000);
    });

    it("a MISSED score records unavailability (GPURegistry.recordMissed): reputation kept, no burn", async function () {
      const { committee, gpu, miner, miner2, verifiers } = await loadFixture(deployQuarry);
      const MISSED = await committee.MISSED();
      expect(MISSED).to.equal(65535);
      const cur = await toEpochStart(committee);
      const signers = sortByAddress(verifiers.slice(1));
      // any other score above 10000 is out of range
      await expect(submitReport(committee, report(cur, [miner.address], [MISSED - 1n]), []))
        .to.be.revertedWithCustomError(committee, "ScoreOutOfRange").withArgs(MISSED - 1n);
      const before = await gpu.minerInfo(miner);
      const r = report(cur, [miner2.address, miner.address], [9000, MISSED]);
      const tx = await submitReport(committee, r, await signReport(committee, signers, r));
      await expect(tx).to.emit(gpu, "ReportMissed").withArgs(miner.address, 1, false);
      await expect(tx).to.emit(gpu, "ReputationSet").withArgs(miner2.address, 9000);
      const after = await gpu.minerInfo(miner);
      expect([after.reputationBps, after.stake, after.onProbation]).to.deep.equal(
        [before.reputationBps, before.stake, before.onProbation]);
      expect(await gpu.missedReportsOf(miner)).to.equal(1);
    });

    it("reverts on a future epoch, bad arrays and bad quorums", async function () {
      const { committee, miner, verifiers, outsider } = await loadFixture(deployQuarry);
      const cur = await toEpochStart(committee);
      const sorted = sortByAddress(verifiers);
      const fut = report(cur + 1n, [miner.address], [1]);
      await expect(submitReport(committee, fut, await signReport(committee, sorted, fut)))
        .to.be.revertedWithCustomError(committee, "WrongEpoch").withArgs(cur + 1n, cur);
      await expect(submitReport(committee, report(cur, [miner.address], [1, 2]), []))
        .to.be.revertedWithCustomError(committee, "LengthMismatch").withArgs(1, 2);
      const many = Array.from({ length: 257 }, () => miner.address);
      await expect(submitReport(committee, report(cur, many, many.map(() => 1)), []))
        .to.be.revertedWithCustomError(committee, "TooManyMiners").withArgs(256, 257);
      await expect(submitReport(committee, report(cur, [miner.address], [10001]), []))
        .to.be.revertedWithCustomError(committee, "ScoreOutOfRange").withArgs(10001);
      // epoch 0 had no committee: nothing can reach its quorum
      await expect(submitReport(committee, report(0n, [], []), []))
        .to.be.revertedWithCustomError(committee, "QuorumNotReached").withArgs(1, 0);
      const r = report(cur, [miner.address], [6000]);
      const sigs = await signReport(committee, sorted, r);
      const required = (ETH(4) * 2n) / 3n + 1n;
      await expect(submitReport(committee, r, sigs.slice(1, 3)))
        .to.be.revertedWithCustomError(committee, "QuorumNotReached").withArgs(required, ETH(2));
      await expect(submitReport(committee, r, []))
        .to.be.revertedWithCustomError(committee, "QuorumNotReached").withArgs(required, 0);
      await expect(submitReport(committee, r, [sigs[0], sigs[1], sigs[1]]))
        .to.be.revertedWithCustomError(committee, "DuplicateSigner").withArgs(sorted[1].address);
      await expect(submitReport(committee, r, [sigs[3], sigs[1], sigs[2]])).to.be.revertedWithCustomError(committee, "SignersNotSorted");
      await expect(submitReport(committee, r, await signReport(committee, [outsider], r)))
        .to.be.revertedWithCustomError(committee, "NotCommitteeMember").withArgs(outsider.address);
      const wrongContract = await signReport(committee, [sorted[0]], r, { verifyingContract: await committee.escrow() });
      await expect(submitReport(committee, r, wrongContract)).to.be.revertedWithCustomError(committee, "NotCommitteeMember");
      const tampered = { ...r, scoresBps: [6001] };
      await expect(submitReport(committee, tampered, sigs.slice(0, 1))).to.be.revertedWithCustomError(committee, "NotCommitteeMember");
      await expect(submitReport(committee, r, [...sigs.slice(0, 3), "0x1234"])).to.be.revertedWithCustomError(committee, "InvalidSignature");
      await submitReport(committee, r, sigs);
    });

    it("lists miners strictly ascending by address: a quorum-signed report out of order or with a repeat reverts MinersNotSorted", async function () {
      const { committee, gpu, miner, miner2, outsider, verifiers } = await loadFixture(deployQuarry);
      const cur = await toEpochStart(committee);
      const signers = sortByAddress(verifiers);
      const [a, b, c] = [miner2.address, miner.address, outsider.address]; // ascending
      expect(BigInt(a) < BigInt(b) && BigInt(b) < BigInt(c)).to.equal(true);
      const refused = [
        [[b, a], [7000, 8000]], // descending
        [[a, c, b], [7000, 8000, 9000]], // the last two swapped
        [[a, a], [7000, 7000]], // a repeat
        [[a, b, a], [7000, 8000, 9000]], // a repeat further down
        [[a, b, b, c], [7000, 8000, 8000, 9000]],
        [[ethers.ZeroAddress, a, ethers.ZeroAddress], [0, 7000, 0]],
      ];
      for (const [miners, scores] of refused) {
        const r = report(cur, miners, scores);
        // properly signed by the whole committee, and still refused, before the quorum is checked
        await expect(submitReport(committee, r, await signReport(committee, signers, r)))
          .to.be.revertedWithCustomError(committee, "MinersNotSorted");
        await expect(submitReport(committee, r, [])).to.be.revertedWithCustomError(committee, "MinersNotSorted");
      }
      // the array checks come in order: lengths, count, then per entry its score, then its order
      await expect(submitReport(committee, report(cur, [b, a], [7000]), []))
        .to.be.revertedWithCustomError(committee, "LengthMismatch").withArgs(2, 1);
      await expect(submitReport(committee, report(cur, [b, a, c], [7000, 8000, 10001]), []))
        .to.be.revertedWithCustomError(committee, "MinersNotSorted");
      await expect(submitReport(committee, report(cur, [b, a], [7000, 10001]), []))
        .to.be.revertedWithCustomError(committee, "ScoreOutOfRange").withArgs(10001);
      expect(await committee.nextReportEpoch()).to.equal(0);
      expect(await committee.reported(cur)).to.equal(false);
      expect((await gpu.minerInfo(miner)).reputationBps).to.equal(P.initialRepBps);
      expect((await gpu.minerInfo(miner2)).reputationBps).to.equal(P.initialRepBps);
      // the same scores in ascending order land (the zero address is not registered: skipped)
      const ok = report(cur, [ethers.ZeroAddress, a, b], [0, 8000, 7000]);
      const tx = await submitReport(committee, ok, await signReport(committee, signers, ok));
      await expect(tx).to.emit(committee, "ReputationSubmitted").withArgs(cur, ok.evidenceRoot, 3, addrs(signers));
      await expect(tx).to.emit(committee, "ReputationSkipped").withArgs(cur, ethers.ZeroAddress);
      expect((await gpu.minerInfo(miner2)).reputationBps).to.equal(8000);
      expect((await gpu.minerInfo(miner)).reputationBps).to.equal(7000);
      expect(await committee.nextReportEpoch()).to.equal(cur + 1n);
      // a single miner is trivially sorted
      const one = report(cur + 1n, [c], [6000], "one");
      await toEpoch(committee, cur + 1n);
      await expect(submitReport(committee, one, await signReport(committee, signers, one)))
        .to.emit(committee, "ReputationSkipped").withArgs(cur + 1n, c);
    });

    it("gap 5: a held-back older report cannot roll reputation back", async function () {
      const { committee, gpu, miner, miner2, verifiers } = await loadFixture(deployQuarry);
      const e = await toEpochStart(committee);
      await toEpoch(committee, e + 1n);
      const signers = sortByAddress(verifiers);
      const older = report(e, [miner2.address, miner.address], [9500, 9500], "e");
      const newer = report(e + 1n, [miner2.address, miner.address], [2000, 3000], "e+1");
      const olderSigs = await signReport(committee, signers, older);
      const newerSigs = await signReport(committee, signers, newer);
      expect(await committee.nextReportEpoch()).to.equal(0);
      await expect(submitReport(committee, newer, newerSigs))
        .to.emit(committee, "ReputationSubmitted").withArgs(e + 1n, newer.evidenceRoot, 2, addrs(signers));
      expect(await committee.nextReportEpoch()).to.equal(e + 2n);
      await expect(submitReport(committee, older, olderSigs))
        .to.be.revertedWithCustomError(committee, "ReportOutOfOrder").withArgs(e, e + 2n);
      await expect(submitReport(committee, newer, newerSigs))
        .to.be.revertedWithCustomError(committee, "ReportOutOfOrder").withArgs(e + 1n, e + 2n);
      expect((await gpu.minerInfo(miner)).reputationBps).to.equal(3000);
      expect((await gpu.minerInfo(miner2)).reputationBps).to.equal(2000);
      expect(await committee.reported(e)).to.equal(false);
      expect(await committee.reported(e + 1n)).to.equal(true);
      // much later the older report still cannot land; the next epoch's can
      await toEpoch(committee, e + 5n);
      await expect(submitReport(committee, older, olderSigs))
        .to.be.revertedWithCustomError(committee, "ReportOutOfOrder").withArgs(e, e + 2n);
      const next = report(e + 2n, [miner.address], [4000], "e+2");
      await submitReport(committee, next, await signReport(committee, signers, next));
      expect((await gpu.minerInfo(miner)).reputationBps).to.equal(4000);
      expect((await gpu.minerInfo(miner2)).reputationBps).to.equal(2000);
      expect(await committee.nextReportEpoch()).to.equal(e + 3n);
    });

    it("a report is signed by its epoch's snapshot: later joiners cannot sign it, members who left since can", async function () {
      const { committee, gpu, miner, verifiers, signers } = await loadFixture(deployQuarry);
      const [v0, v1, v2, v3] = verifiers;
      const a = signers[10];
      const c = await toEpochStart(committee);
      await committee.connect(a).register({ value: ETH(2) });
      await committee.connect(v0).requestExit();
      await toEpoch(committee, c + 1n);
      expect(await committee.isMember(a)).to.equal(true);
      expect(await committee.isMember(v0)).to.equal(false);
      const rc = report(c, [miner.address], [7000], "c");
      await expect(submitReport(committee, rc, await signReport(committee, [a, v1, v2, v3], rc)))
        .to.be.revertedWithCustomError(committee, "NotCommitteeMember").withArgs(a.address);
      const oldSigners = sortByAddress([v0, v1, v2]);
      await expect(submitReport(committee, rc, await signReport(committee, oldSigners, rc)))
        .to.emit(committee, "ReputationSubmitted").withArgs(c, rc.evidenceRoot, 1, addrs(oldSigners));
      expect((await gpu.minerInfo(miner)).reputationBps).to.equal(7000);
      // epoch c + 1: v1, v2, v3 and a hold 5 ETH; v0 is out
      const r1 = report(c + 1n, [miner.address], [8000], "c+1");
      await expect(submitReport(committee, r1, await signReport(committee, [v0, v1, v2, v3], r1)))
        .to.be.revertedWithCustomError(committee, "NotCommitteeMember").withArgs(v0.address);
      await expect(submitReport(committee, r1, await signReport(committee, [v1, v2, v3], r1)))
        .to.be.revertedWithCustomError(committee, "QuorumNotReached").withArgs((ETH(5) * 2n) / 3n + 1n, ETH(3));
      await submitReport(committee, r1, await signReport(committee, [a, v1, v2], r1));
      expect((await gpu.minerInfo(miner)).reputationBps).to.equal(8000);
    });
  });

  describe("epochs, leaders and challenge sets", function () {
    it("currentEpoch, epochStart and leaderOf follow the formulas over the sorted snapshot", async function () {
      const { committee, verifiers, signers } = await loadFixture(deployQuarry);
      const g = await committee.genesisTime();
      const e = await toEpochStart(committee);
      expect(await committee.epochStart(e)).to.equal(g + e * P.epochDuration);
      expect(BigInt(await time.latest())).to.equal(g + e * P.epochDuration);
      expect(await committee.currentEpoch()).to.equal(e);
      await time.increase(P.epochDuration - 1n);
      expect(await committee.currentEpoch()).to.equal(e);
      await time.increase(1);
      expect(await committee.currentEpoch()).to.equal(e + 1n);
      const members = await committee.members();
      expect(members).to.deep.equal(sortedAddrs(verifiers));
      const last = await committee.lastCommitHash();
      expect(last).to.equal(ethers.ZeroHash);
      for (const ep of [1n, 7n, 1000n]) {
        expect(await committee.leaderOf(ep)).to.equal(leaderFor(members, last, ep));
      }
      // the leader of an epoch is drawn from that epoch's committee
      const newcomer = signers[10];
      await committee.connect(newcomer).register({ value: STAKE });
      await committee.connect(verifiers[0]).requestExit();
      const next = e + 2n;
      const nextMembers = sortedAddrs([...verifiers.slice(1), newcomer]);
      expect(await committee.membersAt(next)).to.deep.equal(nextMembers);
      expect(await committee.leaderOf(next)).to.equal(leaderFor(nextMembers, last, next));
      expect(await committee.leaderOf(e + 1n)).to.equal(leaderFor(members, last, e + 1n));
      // epoch 0 had no members
      await expect(committee.leaderOf(0)).to.be.revertedWithCustomError(committee, "NoMembers");
      const empty = await (await ethers.getContractFactory("VerifierCommittee")).deploy(1, 1, 10, 0);
      await expect(empty.leaderOf(1)).to.be.revertedWithCustomError(empty, "NoMembers");
      expect(await empty.members()).to.deep.equal([]);
    });

    it("commits the next epoch's set with a weight quorum of the current snapshot and chains lastCommitHash", async function () {
      const { committee, verifiers, signers } = await loadFixture(deployQuarry);
      const cur = await toEpochStart(committee);
      // a pending newcomer is not in the current snapshot; a member leaving at the boundary is
      const newcomer = signers[10];
      await committee.connect(newcomer).register({ value: ETH(5) });
      await committee.connect(verifiers[3]).requestExit();
      const epoch = cur + 1n;
      const h1 = ethers.id("challenge-set-1");
      await expect(committee.commitChallengeSet(epoch, h1,
        await signChallengeSet(committee, [newcomer, ...verifiers.slice(0, 3)], { epoch, challengeSetHash: h1 })))
        .to.be.revertedWithCustomError(committee, "NotCommitteeMember").withArgs(newcomer.address);
      const s1 = sortByAddress(verifiers.slice(1));
      const sigs = await signChallengeSet(committee, s1, { epoch, challengeSetHash: h1 });
      const c1 = ethers.keccak256(coder.encode(["bytes32", "uint256", "bytes32"], [ethers.ZeroHash, epoch, h1]));
      await expect(committee.commitChallengeSet(epoch, h1, sigs))
        .to.emit(committee, "ChallengeSetCommitted").withArgs(epoch, h1, c1, addrs(s1));
      expect(await committee.lastCommitHash()).to.equal(c1);
      expect(await committee.challengeSetOf(epoch)).to.equal(h1);
      const m1 = await committee.membersAt(epoch);
      expect(m1).to.deep.equal(sortedAddrs([...verifiers.slice(0, 3), newcomer]));
      expect(await committee.leaderOf(epoch)).to.equal(leaderFor(m1, c1, epoch));
      await expect(committee.commitChallengeSet(epoch, h1, sigs))
        .to.be.revertedWithCustomError(committee, "AlreadyCommitted").withArgs(epoch);
      // next epoch: the snapshot changed (the newcomer holds 5 of 8 ETH), the chain goes on
      await toEpoch(committee, epoch);
      const e2 = epoch + 1n;
      const h2 = ethers.id("challenge-set-2");
      const required = (ETH(8) * 2n) / 3n + 1n;
      await expect(committee.commitChallengeSet(e2, h2, await signChallengeSet(committee, verifiers.slice(0, 3), { epoch: e2, challengeSetHash: h2 })))
        .to.be.revertedWithCustomError(committee, "QuorumNotReached").withArgs(required, ETH(3));
      await expect(committee.commitChallengeSet(e2, h2, await signChallengeSet(committee, [verifiers[3], newcomer], { epoch: e2, challengeSetHash: h2 })))
        .to.be.revertedWithCustomError(committee, "NotCommitteeMember").withArgs(verifiers[3].address);
      const s2 = sortByAddress([newcomer, verifiers[0]]);
      const c2 = ethers.keccak256(coder.encode(["bytes32", "uint256", "bytes32"], [c1, e2, h2]));
      await expect(committee.commitChallengeSet(e2, h2, await signChallengeSet(committee, s2, { epoch: e2, challengeSetHash: h2 })))
        .to.emit(committee, "ChallengeSetCommitted").withArgs(e2, h2, c2, addrs(s2));
      expect(await committee.lastCommitHash()).to.equal(c2);
      expect(await committee.leaderOf(e2)).to.equal(leaderFor(await committee.membersAt(e2), c2, e2));
    });

    it("reverts on the wrong epoch, a zero hash and bad signatures", async function () {
      const { committee, verifiers, outsider } = await loadFixture(deployQuarry);
      const cur = await toEpochStart(committee);
      const h = ethers.id("cs");
      const sorted = sortByAddress(verifiers);
      const sign = (epoch, who, over) => signChallengeSet(committee, who, { epoch, challengeSetHash: h }, over);
      for (const e of [cur, cur + 2n]) {
        await expect(committee.commitChallengeSet(e, h, await sign(e, sorted)))
          .to.be.revertedWithCustomError(committee, "WrongEpoch").withArgs(e, cur);
      }
      const e = cur + 1n;
      await expect(committee.commitChallengeSet(e, ethers.ZeroHash, [])).to.be.revertedWithCustomError(committee, "ZeroChallengeSet");
      const sigs = await sign(e, sorted);
      await expect(committee.commitChallengeSet(e, h, sigs.slice(0, 2)))
        .to.be.revertedWithCustomError(committee, "QuorumNotReached").withArgs((ETH(4) * 2n) / 3n + 1n, ETH(2));
      await expect(committee.commitChallengeSet(e, h, [sigs[0], sigs[0], sigs[1]]))
        .to.be.revertedWithCustomError(committee, "DuplicateSigner").withArgs(sorted[0].address);
      await expect(committee.commitChallengeSet(e, h, [sigs[2], sigs[1], sigs[0]]))
        .to.be.revertedWithCustomError(committee, "SignersNotSorted");
      await expect(committee.commitChallengeSet(e, h, await sign(e, [outsider])))
        .to.be.revertedWithCustomError(committee, "NotCommitteeMember").withArgs(outsider.address);
      await expect(committee.commitChallengeSet(e, h, await sign(e, [sorted[0]], { chainId: 1n })))
        .to.be.revertedWithCustomError(committee, "NotCommitteeMember");
      await expect(committee.commitChallengeSet(e, h, ["0xdead"])).to.be.revertedWithCustomError(committee, "InvalidSignature");
      await committee.commitChallengeSet(e, h, sigs.slice(0, 3));
    });
  });

  describe("proveEquivocation", function () {
    it("slashes the whole stake, half to the prover and half to the treasury; unseats at the next boundary", async function () {
      const { committee, escrow, owner, verifiers, outsider, miner } = await loadFixture(deployQuarry);
      const v = verifiers[2];
      const c = await toEpochStart(committee);
      const a = report(5n, [miner.address], [6000]);
      const b = report(5n, [miner.address], [2000]);
      const [sa] = await signReport(committee, [v], a);
      const [sb] = await signReport(committee, [v], b);
      const escrowBal = await ethers.provider.getBalance(escrow);
      await expect(committee.connect(outsider).proveEquivocation(v, a, sa, b, sb))
        .to.emit(committee, "Equivocation").withArgs(v.address, 5, outsider.address, STAKE);
      expect(await escrow.withdrawable(outsider)).to.equal(STAKE / 2n);
      expect(await escrow.withdrawable(owner)).to.equal(STAKE - STAKE / 2n);
      expect(await ethers.provider.getBalance(escrow)).to.equal(escrowBal + STAKE);
      const wAt = await unbondsAt(committee, c + 1n);
      const info = await committee.verifierInfo(v);
      expect([info.stake, info.weight, info.activeUntil, info.withdrawableAt]).to.deep.equal([0n, STAKE, c + 1n, wAt]);
      // its seat ends at the boundary, but with no stake left it has no weight (min(weight,
      // stake)) and is listed nowhere from now on; the epoch's fixed totals still count it
      expect(await committee.isMember(v)).to.equal(false);
      expect(await committee.weightAt(v, c)).to.equal(0);
      expect(await committee.members()).to.deep.equal(sortedAddrs(verifiers.filter((x) => x !== v)));
      expect(await committee.memberCountAt(c)).to.equal(4);
      expect(await committee.totalWeightAt(c)).to.equal(ETH(4));
      expect(await committee.memberCountAt(c + 1n)).to.equal(3);
      expect(await committee.totalWeightAt(c + 1n)).to.equal(ETH(3));
      await expect(committee.proveEquivocation(v, a, sa, b, sb))
        .to.be.revertedWithCustomError(committee, "NothingToSlash").withArgs(v.address);
      await toEpoch(committee, c + 1n);
      expect(await committee.isMember(v)).to.equal(false);
      // the emptied record clears after unbonding, then it may register again
      await time.setNextBlockTimestamp(wAt);
      await expect(committee.connect(v).withdrawStake()).to.emit(committee, "VerifierStakeWithdrawn").withArgs(v.address, 0);
      await committee.connect(v).register({ value: STAKE });
      // one that never registered has nothing to slash
      const [oa] = await signReport(committee, [outsider], a);
      const [ob] = await signReport(committee, [outsider], b);
      await expect(committee.proveEquivocation(outsider, a, oa, b, ob))
        .to.be.revertedWithCustomError(committee, "NothingToSlash").withArgs(outsider.address);
    });

    it("a verifier leaving or displaced stays slashable until it withdraws; the treasury gets its half", async function () {
      const { committee, escrow, verifiers, outsider, signers, miner } = await loadFixture(deployQuarry);
      const [v0, , , v3] = verifiers;
      await committee.setTreasury(outsider);
      const c = await toEpochStart(committee);
      await committee.connect(v0).requestExit();
      await committee.setMaxMembers(3);
      await expect(committee.connect(signers[10]).register({ value: ETH(2) }))
        .to.emit(committee, "VerifierDisplaced").withArgs(v3.address, signers[10].address, c + 1n);
      await toEpoch(committee, c + 1n);
      const a = report(1n, [miner.address], [6000], "x");
      const b = report(1n, [miner.address], [6000], "y");
      for (const v of [v0, v3]) {
        const before = await committee.verifierInfo(v);
        const [sa] = await signReport(committee, [v], a);
        const [sb] = await signReport(committee, [v], b);
        await committee.connect(verifiers[1]).proveEquivocation(v, a, sa, b, sb);
        const after = await committee.verifierInfo(v);
        expect([after.stake, after.activeUntil, after.withdrawableAt]).to.deep.equal([0n, before.activeUntil, before.withdrawableAt]);
      }
      expect(await escrow.withdrawable(verifiers[1])).to.equal(STAKE);
      expect(await escrow.withdrawable(outsider)).to.equal(STAKE);
      expect(await committee.memberCountAt(c + 1n)).to.equal(3);
    });

    it("a verifier slashed to zero no longer votes, nor earns voter rewards, in snapshots taken before (NotCommitteeMember)", async function () {
      // The attack of the first round: slashed to zero, v still voted with its full 1 ETH in a
      // dispute opened before and took a third of the reward. weightAt is now min(weight, stake).
      const q = await loadFixture(deployQuarry);
      const { committee, arb, escrow, gpu, owner, miner, client, outsider, verifiers } = q;
      const v = verifiers[2];
      const { taskId, res } = await submitted(q);
      const id = await openDispute(q, taskId, res);
      const a = report(5n, [miner.address], [6000]);
      const b = report(5n, [miner.address], [2000]);
      const [sa] = await signReport(committee, [v], a);
      const [sb] = await signReport(committee, [v], b);
      await committee.connect(outsider).proveEquivocation(v, a, sa, b, sb);
      expect((await committee.verifierInfo(v)).stake).to.equal(0);
      const d = await arb.getDispute(id);
      expect(await committee.weightAt(v, d.epoch)).to.equal(0);
      expect(d.totalWeight).to.equal(ETH(4));
      await expect(arb.castVotes(id, true, await signVotes(arb, verifiers.slice(0, 3), id, true)))
        .to.be.revertedWithCustomError(arb, "NotCommitteeMember").withArgs(v.address);
      // the three others (3 of the snapshot's 4 ETH) decide; v gets nothing
      const voters = sortByAddress([verifiers[0], verifiers[1], verifiers[3]]);
      const tx = arb.castVotes(id, true, await signVotes(arb, voters, id, true));
      await expect(tx).to.emit(arb, "DisputeResolved").withArgs(id, true, addrs(voters), COLL4);
      expect(await arb.ballotOf(id, v)).to.equal(BALLOT.None);
      const each = (COLL4 * BigInt(P.verifierRewardBps)) / 10000n / 3n;
      for (const x of voters) expect(await escrow.withdrawable(x)).to.equal(each);
      expect(await escrow.withdrawable(v)).to.equal(0);
      expect(await escrow.withdrawable(client)).to.equal(P.minBond + BUDGET4 + COLL4 - each * 3n);
      expect(await escrow.withdrawable(outsider)).to.equal(STAKE / 2n);
      expect(await escrow.withdrawable(owner)).to.equal(STAKE - STAKE / 2n);
      expect((await gpu.minerInfo(miner)).stake).to.equal(P.minStake - COLL4);
    });

    it("reverts on different epochs, identical reports, the wrong signer, bad signatures", async function () {
      const { committee, verifiers, miner } = await loadFixture(deployQuarry);
      const [v, w] = verifiers;
      const a = report(3n, [miner.address], [6000]);
      const b = report(3n, [miner.address], [100]);
      const c = report(4n, [miner.address], [100]);
      const [sa] = await signReport(committee, [v], a);
      const [sb] = await signReport(committee, [v], b);
      const [sc] = await signReport(committee, [v], c);
      const [wb] = await signReport(committee, [w], b);
      await expect(committee.proveEquivocation(v, a, sa, c, sc)).to.be.revertedWithCustomError(committee, "EpochMismatch").withArgs(3, 4);
      await expect(committee.proveEquivocation(v, a, sa, a, sa)).to.be.revertedWithCustomError(committee, "SameReport");
      await expect(committee.proveEquivocation(v, a, sa, b, wb))
        .to.be.revertedWithCustomError(committee, "SignerMismatch").withArgs(v.address, w.address);
      await expect(committee.proveEquivocation(w, a, sa, b, wb))
        .to.be.revertedWithCustomError(committee, "SignerMismatch").withArgs(w.address, v.address);
      await expect(committee.proveEquivocation(v, a, "0xdead", b, sb)).to.be.revertedWithCustomError(committee, "InvalidSignature");
      await expect(committee.proveEquivocation(v, a, sa, b, "0x")).to.be.revertedWithCustomError(committee, "InvalidSignature");
      const [wrongChain] = await signReport(committee, [v], b, { chainId: 1n });
      const wrongSigner = ethers.recoverAddress(
        ethers.TypedDataEncoder.hash({ ...(await domainOf(committee)), chainId: 1n }, REPORT_TYPES, b), wrongChain);
      expect(wrongSigner).to.equal(v.address);
      const recovered = ethers.recoverAddress(await committee.hashReport(b), wrongChain);
      await expect(committee.proveEquivocation(v, a, sa, b, wrongChain))
        .to.be.revertedWithCustomError(committee, "SignerMismatch").withArgs(v.address, recovered);
      // nothing was slashed
      expect((await committee.verifierInfo(v)).stake).to.equal(STAKE);
    });
  });

  describe("paid audit rates", function () {
    // The default task: 10 requests x 100 tokens at 1 gwei, all of it open; four members sit.
    const PAYMENT = 10n * 100n * PRICE;
    /** What raiseAuditRate must take: for each member, auditFeeBps of the open budget per
     * unit of rate added above `floor` (written out here, not read from the contract). */
    const feeOf = (open, floor, rate, members = 4n) => (open * (rate - floor) * 2500n) / (10000n * 10000n) * members;

    it("a client buys a higher rate; each member of that epoch pulls its equal share, to the wei", async function () {
      const q = await loadFixture(deployQuarry);
      const { committee, escrow, client, verifiers, outsider } = q;
      const e = await toEpochStart(committee);
      const { taskId } = await createTask(q.task, client);
      expect(await committee.BASE_AUDIT_RATE_BPS()).to.equal(1000);
      expect(await committee.auditFeeBps()).to.equal(2500);
      expect(await committee.auditRateOf(taskId)).to.equal(0);
      const fee1 = feeOf(PAYMENT, 1000n, 5000n);
      expect(fee1).to.equal(ethers.parseUnits("400", "gwei")); // 4 x 0.25 x 0.4 x 1000 gwei
      expect(await committee.auditFee(taskId, 5000)).to.equal(fee1);
      const held0 = await ethers.provider.getBalance(committee);
      const wallet0 = await ethers.provider.getBalance(client);
      const tx = await committee.connect(client).raiseAuditRate(taskId, 5000, { value: fee1 });
      await expect(tx).to.emit(committee, "AuditRateRaised").withArgs(taskId, 5000, e, fee1);
      expect(await ethers.provider.getBalance(client)).to.equal(wallet0 - fee1 - (await gasCost(tx)));
      // Raising again pays only for the rate added above the one already bought.
      const fee2 = feeOf(PAYMENT, 5000n, 8000n);
      await committee.connect(client).raiseAuditRate(taskId, 8000, { value: fee2 });
      expect(await committee.auditRateOf(taskId)).to.equal(8000);
      expect(await ethers.provider.getBalance(committee)).to.equal(held0 + fee1 + fee2);
      const share = (fee1 + fee2) / 4n;
      expect(await committee.auditFeePerMember(e)).to.equal(share);
      await expect(committee.connect(verifiers[0]).claimAuditFees(e))
        .to.be.revertedWithCustomError(committee, "EpochNotOver").withArgs(e);

      await toEpoch(committee, e + 1n);
      for (const v of verifiers) {
        const before = await escrow.withdrawable(v);
        await expect(committee.connect(v).claimAuditFees(e))
          .to.emit(committee, "AuditFeeClaimed").withArgs(e, v.address, share);
        expect(await escrow.withdrawable(v)).to.equal(before + share);
      }
      // Every wei paid left the committee; none twice, none to a non-member.
      expect(await ethers.provider.getBalance(committee)).to.equal(held0);
      await expect(committee.connect(verifiers[0]).claimAuditFees(e))
        .to.be.revertedWithCustomError(committee, "AuditFeeAlreadyClaimed").withArgs(e, verifiers[0].address);
      await expect(committee.connect(outsider).claimAuditFees(e))
        .to.be.revertedWithCustomError(committee, "NotCommitteeMember").withArgs(outsider.address);
      await expect(committee.connect(verifiers[1]).claimAuditFees(e - 1n))
        .to.be.revertedWithCustomError(committee, "NoAuditFees").withArgs(e - 1n);
      const v = verifiers[2];
      const pulled = await escrow.withdrawable(v);
      const w0 = await ethers.provider.getBalance(v);
      const wtx = await escrow.connect(v).withdraw();
      expect(await ethers.provider.getBalance(v)).to.equal(w0 + pulled - (await gasCost(wtx)));
    });

    it("the honest miner of a task with a bought rate is paid exactly as without it", async function () {
      const q = await loadFixture(deployQuarry);
      const { committee, escrow, client, miner, gpu } = q;
      const { taskId } = await createTask(q.task, client);
      await committee.connect(client).raiseAuditRate(taskId, 10000, { value: feeOf(PAYMENT, 1000n, 10000n) });
      const stake0 = (await gpu.minerInfo(miner)).stake;
      await q.task.connect(miner).claimShard(taskId, 0);
      const res = await buildResult(q.task, taskId, 0, 0, 4, miner);
      await q.task.connect(miner).submitResult(taskId, 0, res.root, "store://out", res.total);
      await time.increase(P.challengeWindow);
      const paid0 = await escrow.withdrawable(miner);
      await q.task.finalizeShard(taskId, 0);
      // 40 tokens billed at 1 gwei: the whole pay, the stake whole and unlocked.
      expect(await escrow.withdrawable(miner)).to.equal(paid0 + TOKENS4 * PRICE);
      const info = await gpu.minerInfo(miner);
      expect(info.stake).to.equal(stake0);
      expect(info.locked).to.equal(0);
    });

    it("refuses the wrong payer, rate, fee or moment with named errors", async function () {
      const q = await loadFixture(deployQuarry);
      const { committee, client, outsider, miner } = q;
      const { taskId } = await createTask(q.task, client);
      const fee = feeOf(PAYMENT, 1000n, 3000n);
      await expect(committee.connect(outsider).raiseAuditRate(taskId, 3000, { value: fee }))
        .to.be.revertedWithCustomError(committee, "NotClient").withArgs(outsider.address);
      await expect(committee.connect(client).raiseAuditRate(taskId, 1000))
        .to.be.revertedWithCustomError(committee, "RateNotRaised").withArgs(1000, 1000);
      await expect(committee.connect(client).raiseAuditRate(taskId, 10001))
        .to.be.revertedWithCustomError(committee, "InvalidBps").withArgs(10001);
      await expect(committee.connect(client).raiseAuditRate(taskId, 3000, { value: fee - 1n }))
        .to.be.revertedWithCustomError(committee, "WrongFee").withArgs(fee, fee - 1n);
      await expect(committee.connect(client).raiseAuditRate(taskId, 3000, { value: fee + 1n }))
        .to.be.revertedWithCustomError(committee, "WrongFee").withArgs(fee, fee + 1n);
      await expect(committee.auditFee(99, 3000)).to.be.revertedWithCustomError(q.task, "UnknownTask").withArgs(99);
      // Once a miner has claimed at the old rate, the rate stays.
      await q.task.connect(miner).claimShard(taskId, 0);
      await expect(committee.connect(client).raiseAuditRate(taskId, 3000, { value: fee }))
        .to.be.revertedWithCustomError(committee, "ShardsCommitted").withArgs(taskId);
      // A cancelled task or one past its deadline has nothing left to audit.
      const t2 = (await createTask(q.task, client)).taskId;
      await q.task.connect(client).cancelTask(t2);
      await expect(committee.connect(client).raiseAuditRate(t2, 3000, { value: fee }))
        .to.be.revertedWithCustomError(committee, "TaskClosed").withArgs(t2);
      const t3 = (await createTask(q.task, client)).taskId;
      await time.increase(3600);
      await expect(committee.connect(client).raiseAuditRate(t3, 3000, { value: fee }))
        .to.be.revertedWithCustomError(committee, "TaskClosed").withArgs(t3);
      await expect(committee.connect(outsider).setAuditFee(100))
        .to.be.revertedWithCustomError(committee, "OwnableUnauthorizedAccount").withArgs(outsider.address);
      await expect(committee.setAuditFee(10001)).to.be.revertedWithCustomError(committee, "InvalidBps").withArgs(10001);
      await expect(committee.setAuditFee(100)).to.emit(committee, "AuditFeeSet").withArgs(100);
    });
  });

  describe("views", function () {
    it("type hashes, digests and domain match ethers", async function () {
      const { committee, miner } = await loadFixture(deployQuarry);
      const domain = await domainOf(committee);
      expect(domain.chainId).to.equal(31337n);
      expect(await committee.domainSeparator()).to.equal(ethers.TypedDataEncoder.hashDomain(domain));
      expect(await committee.REPORT_TYPEHASH()).to.equal(
        ethers.id("Report(uint256 epoch,address[] miners,uint16[] scoresBps,bytes32 evidenceRoot)"));
      expect(await committee.CHALLENGE_SET_TYPEHASH()).to.equal(ethers.id("ChallengeSet(uint256 epoch,bytes32 challengeSetHash)"));
      const r = report(9n, [miner.address, ethers.ZeroAddress], [1, 10000]);
      expect(await committee.hashReport(r)).to.equal(ethers.TypedDataEncoder.hash(domain, REPORT_TYPES, r));
      const empty = report(9n, [], []);
      expect(await committee.hashReport(empty)).to.equal(ethers.TypedDataEncoder.hash(domain, REPORT_TYPES, empty));
      const cs = { epoch: 4n, challengeSetHash: ethers.id("c") };
      expect(await committee.hashChallengeSet(cs.epoch, cs.challengeSetHash))
        .to.equal(ethers.TypedDataEncoder.hash(domain, CHALLENGE_TYPES, cs));
    });
  });
});
