const { expect } = require("chai");
const { ethers } = require("hardhat");
const { loadFixture, time } = require("@nomicfoundation/hardhat-network-helpers");
const {
  P, MODEL, REPORT_TYPES, CHALLENGE_TYPES, domainOf, sortByAddress, deployQuarry, createTask,
  signReport, signChallengeSet, gasCost,
} = require("./helpers");

const coder = ethers.AbiCoder.defaultAbiCoder();

describe("VerifierCommittee", function () {
  /** Moves to the start of the next epoch so a test has a whole epoch of blocks to work in. */
  async function toEpochStart(committee) {
    const g = await committee.genesisTime();
    const cur = await committee.currentEpoch();
    await time.increaseTo(g + (cur + 1n) * P.epochDuration);
    return cur + 1n;
  }
  function report(epoch, miners, scores, tag = "evidence") {
    return { epoch, miners, scoresBps: scores, evidenceRoot: ethers.id(tag) };
  }

  describe("params and wiring", function () {
    it("exposes constructor params; owner setters validate", async function () {
      const { committee, owner, outsider, verifiers } = await loadFixture(deployQuarry);
      expect(await committee.minVerifierStake()).to.equal(P.minVerifierStake);
      expect(await committee.unbondingPeriod()).to.equal(P.verifierUnbonding);
      expect(await committee.epochDuration()).to.equal(P.epochDuration);
      expect(await committee.maxMembers()).to.equal(64);
      expect(await committee.treasury()).to.equal(ethers.ZeroAddress);
      await expect(committee.setTreasury(outsider)).to.emit(committee, "TreasurySet").withArgs(outsider.address);
      await expect(committee.setTreasury(ethers.ZeroAddress)).to.be.revertedWithCustomError(committee, "ZeroAddress");
      await expect(committee.setMinVerifierStake(3)).to.emit(committee, "MinVerifierStakeSet").withArgs(3);
      await expect(committee.setUnbondingPeriod(3)).to.emit(committee, "UnbondingPeriodSet").withArgs(3);
      await expect(committee.setMaxMembers(3)).to.be.revertedWithCustomError(committee, "InvalidMaxMembers").withArgs(3);
      await expect(committee.setMaxMembers(65)).to.be.revertedWithCustomError(committee, "InvalidMaxMembers");
      await expect(committee.setMaxMembers(4)).to.emit(committee, "MaxMembersSet").withArgs(4);
      await expect(committee.connect(outsider).setMaxMembers(10)).to.be.revertedWithCustomError(committee, "OwnableUnauthorizedAccount");
      for (const f of ["setGPURegistry", "setEscrow"]) {
        await expect(committee[f](owner)).to.be.revertedWithCustomError(committee, "AlreadySet");
      }
      const F = await ethers.getContractFactory("VerifierCommittee");
      await expect(F.deploy(1, 1, 0, 0)).to.be.revertedWithCustomError(committee, "ZeroEpochDuration");
      const fresh = await F.deploy(1, 1, 10, 5);
      expect(await fresh.genesisTime()).to.equal(5);
      for (const f of ["setGPURegistry", "setEscrow"]) {
        await expect(fresh[f](ethers.ZeroAddress)).to.be.revertedWithCustomError(fresh, "ZeroAddress");
      }
      await expect(fresh.submitReputation(0, [], [], ethers.ZeroHash, [])).to.be.revertedWithCustomError(fresh, "NotWired");
      const r = report(0, [], []);
      await expect(fresh.proveEquivocation(verifiers[0], r, "0x", r, "0x")).to.be.revertedWithCustomError(fresh, "NotWired");
    });
  });

  describe("membership", function () {
    it("register, quorum, members", async function () {
      const { committee, verifiers, outsider } = await loadFixture(deployQuarry);
      expect(await committee.memberCount()).to.equal(4);
      expect(await committee.quorum()).to.equal(3);
      expect(await committee.members()).to.deep.equal(verifiers.map((v) => v.address));
      expect(await committee.isMember(verifiers[0])).to.equal(true);
      expect(await committee.isMember(outsider)).to.equal(false);
      const info = await committee.verifierInfo(verifiers[0]);
      expect(info.stake).to.equal(P.minVerifierStake);
      expect(info.member).to.equal(true);
      await expect(committee.connect(outsider).register({ value: P.minVerifierStake }))
        .to.emit(committee, "VerifierRegistered").withArgs(outsider.address, P.minVerifierStake);
      expect(await committee.quorum()).to.equal(4); // floor(10/3)+1
    });
    it("reverts on zero or low stake and double registration", async function () {
      const { committee, verifiers, outsider } = await loadFixture(deployQuarry);
      await expect(committee.connect(outsider).register())
        .to.be.revertedWithCustomError(committee, "InsufficientStake").withArgs(P.minVerifierStake, 0);
      await expect(committee.connect(outsider).register({ value: P.minVerifierStake - 1n }))
        .to.be.revertedWithCustomError(committee, "InsufficientStake");
      await expect(committee.connect(verifiers[0]).register({ value: P.minVerifierStake }))
        .to.be.revertedWithCustomError(committee, "AlreadyRegistered");
    });
    it("caps the committee at 64 members; quorum is floor(2n/3)+1", async function () {
      const { committee, owner } = await loadFixture(deployQuarry);
      const expectQ = (n) => Math.floor((2 * n) / 3) + 1;
      for (let n = 5; n <= 64; n++) {
        const w = ethers.Wallet.createRandom().connect(ethers.provider);
        await owner.sendTransaction({ to: w.address, value: P.minVerifierStake + ethers.parseEther("0.01") });
        await committee.connect(w).register({ value: P.minVerifierStake });
        if (n % 20 === 0 || n === 64) expect(await committee.quorum()).to.equal(expectQ(n));
      }
      expect(await committee.memberCount()).to.equal(64);
      expect(await committee.quorum()).to.equal(43);
      const w = ethers.Wallet.createRandom().connect(ethers.provider);
      await owner.sendTransaction({ to: w.address, value: ethers.parseEther("2") });
      await expect(committee.connect(w).register({ value: P.minVerifierStake }))
        .to.be.revertedWithCustomError(committee, "CommitteeFull").withArgs(64);
    });
    it("a lower cap set by the owner applies", async function () {
      const { committee, outsider } = await loadFixture(deployQuarry);
      await committee.setMaxMembers(4);
      await expect(committee.connect(outsider).register({ value: P.minVerifierStake }))
        .to.be.revertedWithCustomError(committee, "CommitteeFull").withArgs(4);
    });
    it("requestExit leaves at once; withdrawStake after unbonding, to the wei", async function () {
      const { committee, verifiers, outsider } = await loadFixture(deployQuarry);
      const v = verifiers[1];
      await expect(committee.connect(v).withdrawStake()).to.be.revertedWithCustomError(committee, "NotExiting");
      await expect(committee.connect(v).requestExit()).to.emit(committee, "VerifierExitRequested");
      expect(await committee.isMember(v)).to.equal(false);
      expect(await committee.members()).to.deep.equal([verifiers[0], verifiers[3], verifiers[2]].map((x) => x.address));
      expect(await committee.quorum()).to.equal(3);
      await expect(committee.connect(v).requestExit()).to.be.revertedWithCustomError(committee, "NotMember");
      await expect(committee.connect(outsider).requestExit()).to.be.revertedWithCustomError(committee, "NotMember");
      await expect(committee.connect(v).register({ value: P.minVerifierStake })).to.be.revertedWithCustomError(committee, "AlreadyRegistered");
      await expect(committee.connect(v).withdrawStake()).to.be.revertedWithCustomError(committee, "UnbondingNotOver");
      await time.increase(P.verifierUnbonding);
      const before = await ethers.provider.getBalance(v);
      const tx = await committee.connect(v).withdrawStake();
      await expect(tx).to.emit(committee, "VerifierStakeWithdrawn").withArgs(v.address, P.minVerifierStake);
      expect((await ethers.provider.getBalance(v)) - before + (await gasCost(tx))).to.equal(P.minVerifierStake);
      await committee.connect(v).register({ value: P.minVerifierStake });
      expect(await committee.isMember(v)).to.equal(true);
    });
  });

  describe("epochs and leaders", function () {
    it("currentEpoch and leaderOf follow the formulas", async function () {
      const { committee } = await loadFixture(deployQuarry);
      const e = await toEpochStart(committee);
      expect(await committee.currentEpoch()).to.equal(e);
      await time.increase(P.epochDuration);
      expect(await committee.currentEpoch()).to.equal(e + 1n);
      const members = await committee.members();
      const last = await committee.lastCommitHash();
      for (const ep of [0n, 1n, 7n, 1000n]) {
        const idx = BigInt(ethers.keccak256(coder.encode(["bytes32", "uint256"], [last, ep]))) % BigInt(members.length);
        expect(await committee.leaderOf(ep)).to.equal(members[Number(idx)]);
      }
      const empty = await (await ethers.getContractFactory("VerifierCommittee")).deploy(1, 1, 10, 0);
      await expect(empty.leaderOf(1)).to.be.revertedWithCustomError(empty, "NoMembers");
    });
  });

  describe("commitChallengeSet", function () {
    it("commits next epoch's set with a quorum and chains lastCommitHash", async function () {
      const { committee, verifiers } = await loadFixture(deployQuarry);
      const cur = await toEpochStart(committee);
      const epoch = cur + 1n;
      const h = ethers.id("challenge-set");
      const signers = sortByAddress(verifiers.slice(0, 3));
      const sigs = await signChallengeSet(committee, signers, { epoch, challengeSetHash: h });
      const expected = ethers.keccak256(coder.encode(["bytes32", "uint256", "bytes32"], [ethers.ZeroHash, epoch, h]));
      await expect(committee.commitChallengeSet(epoch, h, sigs))
        .to.emit(committee, "ChallengeSetCommitted").withArgs(epoch, h, expected, signers.map((s) => s.address));
      expect(await committee.lastCommitHash()).to.equal(expected);
      expect(await committee.challengeSetOf(epoch)).to.equal(h);
      const members = await committee.members();
      const idx = BigInt(ethers.keccak256(coder.encode(["bytes32", "uint256"], [expected, epoch]))) % 4n;
      expect(await committee.leaderOf(epoch)).to.equal(members[Number(idx)]);
      await expect(committee.commitChallengeSet(epoch, h, sigs))
        .to.be.revertedWithCustomError(committee, "AlreadyCommitted").withArgs(epoch);
    });
    it("reverts on the wrong epoch, a zero hash and bad quorums", async function () {
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
        .to.be.revertedWithCustomError(committee, "QuorumNotReached").withArgs(3, 2);
      await expect(committee.commitChallengeSet(e, h, [sigs[0], sigs[0], sigs[1]]))
        .to.be.revertedWithCustomError(committee, "DuplicateSigner").withArgs(sorted[0].address);
      await expect(committee.commitChallengeSet(e, h, [sigs[2], sigs[1], sigs[0]]))
        .to.be.revertedWithCustomError(committee, "SignersNotSorted");
      await expect(committee.commitChallengeSet(e, h, await sign(e, [outsider])))
        .to.be.revertedWithCustomError(committee, "NotCommitteeMember").withArgs(outsider.address);
      await expect(committee.commitChallengeSet(e, h, await sign(e, [sorted[0]], { chainId: 1n })))
        .to.be.revertedWithCustomError(committee, "NotCommitteeMember");
      await committee.commitChallengeSet(e, h, sigs);
    });
  });

  describe("submitReputation", function () {
    it("writes quorum-signed scores to GPURegistry and skips unregistered miners", async function () {
      const { committee, gpu, task, client, miner, miner2, outsider, verifiers } = await loadFixture(deployQuarry);
      const cur = await toEpochStart(committee);
      const r = report(cur, [miner.address, miner2.address, outsider.address], [3000, 9000, 7000]);
      const signers = sortByAddress(verifiers.slice(1));
      const sigs = await signReport(committee, signers, r);
      const tx = await committee.submitReputation(r.epoch, r.miners, r.scoresBps, r.evidenceRoot, sigs);
      await expect(tx).to.emit(committee, "ReputationSubmitted").withArgs(cur, r.evidenceRoot, 3, signers.map((s) => s.address));
      await expect(tx).to.emit(gpu, "ReputationSet").withArgs(miner.address, 3000);
      await expect(tx).to.emit(committee, "ReputationSkipped").withArgs(cur, outsider.address);
      expect((await gpu.minerInfo(miner)).reputationBps).to.equal(3000);
      expect((await gpu.minerInfo(miner2)).reputationBps).to.equal(9000);
      expect(await committee.reported(cur)).to.equal(true);
      // a miner below the untrusted threshold can no longer claim
      const { taskId } = await createTask(task, client);
      await expect(task.connect(miner).claimShard(taskId, 0)).to.be.revertedWithCustomError(task, "NotEligible");
      await task.connect(miner2).claimShard(taskId, 0);
      await expect(committee.submitReputation(r.epoch, r.miners, r.scoresBps, r.evidenceRoot, sigs))
        .to.be.revertedWithCustomError(committee, "AlreadyReported").withArgs(cur);
      // a past epoch that was never reported is still accepted
      const past = report(cur - 1n, [miner.address], [5000]);
      await committee.submitReputation(past.epoch, past.miners, past.scoresBps, past.evidenceRoot,
        await signReport(committee, signers, past));
      expect((await gpu.minerInfo(miner)).reputationBps).to.equal(5000);
    });
    it("reverts on a future epoch, bad arrays and bad quorums", async function () {
      const { committee, miner, verifiers, outsider } = await loadFixture(deployQuarry);
      const cur = await toEpochStart(committee);
      const sorted = sortByAddress(verifiers);
      const sub = (r, sigs) => committee.submitReputation(r.epoch, r.miners, r.scoresBps, r.evidenceRoot, sigs);
      const fut = report(cur + 1n, [miner.address], [1]);
      await expect(sub(fut, await signReport(committee, sorted, fut)))
        .to.be.revertedWithCustomError(committee, "WrongEpoch").withArgs(cur + 1n, cur);
      await expect(sub(report(cur, [miner.address], [1, 2]), []))
        .to.be.revertedWithCustomError(committee, "LengthMismatch").withArgs(1, 2);
      const many = Array.from({ length: 257 }, () => miner.address);
      await expect(sub(report(cur, many, many.map(() => 1)), []))
        .to.be.revertedWithCustomError(committee, "TooManyMiners").withArgs(256, 257);
      await expect(sub(report(cur, [miner.address], [10001]), []))
        .to.be.revertedWithCustomError(committee, "ScoreOutOfRange").withArgs(10001);
      const r = report(cur, [miner.address], [6000]);
      const sigs = await signReport(committee, sorted, r);
      await expect(sub(r, sigs.slice(1, 3))).to.be.revertedWithCustomError(committee, "QuorumNotReached").withArgs(3, 2);
      await expect(sub(r, [sigs[0], sigs[1], sigs[1]]))
        .to.be.revertedWithCustomError(committee, "DuplicateSigner").withArgs(sorted[1].address);
      await expect(sub(r, [sigs[3], sigs[1], sigs[2]])).to.be.revertedWithCustomError(committee, "SignersNotSorted");
      await expect(sub(r, await signReport(committee, [outsider], r)))
        .to.be.revertedWithCustomError(committee, "NotCommitteeMember").withArgs(outsider.address);
      const wrongContract = await signReport(committee, [sorted[0]], r, { verifyingContract: await committee.escrow() });
      await expect(sub(r, wrongContract)).to.be.revertedWithCustomError(committee, "NotCommitteeMember");
      const tampered = { ...r, scoresBps: [6001] };
      await expect(sub(tampered, sigs.slice(0, 1))).to.be.revertedWithCustomError(committee, "NotCommitteeMember");
      await sub(r, sigs);
    });
  });

  describe("proveEquivocation", function () {
    it("slashes the whole stake: half to the prover, half to the treasury; removes the member", async function () {
      const { committee, escrow, owner, verifiers, outsider, miner } = await loadFixture(deployQuarry);
      const v = verifiers[2];
      const a = report(5n, [miner.address], [6000]);
      const b = report(5n, [miner.address], [2000]);
      const [sa] = await signReport(committee, [v], a);
      const [sb] = await signReport(committee, [v], b);
      const escrowBal = await ethers.provider.getBalance(escrow);
      await expect(committee.connect(outsider).proveEquivocation(v, a, sa, b, sb))
        .to.emit(committee, "Equivocation").withArgs(v.address, 5, outsider.address, P.minVerifierStake);
      expect(await escrow.withdrawable(outsider)).to.equal(P.minVerifierStake / 2n);
      expect(await escrow.withdrawable(owner)).to.equal(P.minVerifierStake - P.minVerifierStake / 2n);
      expect(await ethers.provider.getBalance(escrow)).to.equal(escrowBal + P.minVerifierStake);
      expect(await committee.isMember(v)).to.equal(false);
      expect(await committee.memberCount()).to.equal(3);
      expect((await committee.verifierInfo(v)).stake).to.equal(0);
      await expect(committee.proveEquivocation(v, a, sa, b, sb))
        .to.be.revertedWithCustomError(committee, "NothingToSlash").withArgs(v.address);
      // the emptied record clears after unbonding, then it may register again
      await time.increase(P.verifierUnbonding);
      await committee.connect(v).withdrawStake();
      await committee.connect(v).register({ value: P.minVerifierStake });
    });
    it("an exiting verifier stays slashable; the treasury gets its half", async function () {
      const { committee, escrow, verifiers, outsider, owner, miner } = await loadFixture(deployQuarry);
      const v = verifiers[0];
      await committee.setTreasury(outsider);
      await committee.connect(v).requestExit();
      const a = report(1n, [miner.address], [6000], "x");
      const b = report(1n, [miner.address], [6000], "y");
      const [sa] = await signReport(committee, [v], a);
      const [sb] = await signReport(committee, [v], b);
      await committee.connect(verifiers[1]).proveEquivocation(v, a, sa, b, sb);
      expect(await escrow.withdrawable(verifiers[1])).to.equal(P.minVerifierStake / 2n);
      expect(await escrow.withdrawable(outsider)).to.equal(P.minVerifierStake / 2n);
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
      const [wrongChain] = await signReport(committee, [v], b, { chainId: 1n });
      await expect(committee.proveEquivocation(v, a, sa, b, wrongChain)).to.be.revertedWithCustomError(committee, "SignerMismatch");
    });
  });

  describe("views", function () {
    it("type hashes, digests and domain match ethers", async function () {
      const { committee, miner } = await loadFixture(deployQuarry);
      const domain = await domainOf(committee);
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
