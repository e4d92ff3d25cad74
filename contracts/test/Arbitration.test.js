const { expect } = require("chai");
const { ethers } = require("hardhat");
const { loadFixture, time } = require("@nomicfoundation/hardhat-network-helpers");
const {
  P, MODEL, OTHER_MODEL, PRICE, RECEIPT_TYPES, VOTE_TYPES, domainOf, sortByAddress, deployQuarry, createTask,
  buildResult, receiptStructHash, signVotes, gasCost,
} = require("./helpers");

const S = { Open: 0n, Claimed: 1n, Submitted: 2n, Disputed: 3n, Finalized: 4n, Refunded: 5n };
const D = { None: 0n, Open: 1n, MinerAtFault: 2n, MinerNotAtFault: 3n, Expired: 4n };
const BUDGET4 = 4n * 100n * PRICE;
const COLL4 = (BUDGET4 * BigInt(P.collateralBps)) / 10000n;
const TOKENS = 40n; // 4 receipts x 10 tokens

describe("Arbitration", function () {
  async function submitted() {
    const q = await deployQuarry();
    const { taskId, value } = await createTask(q.task, q.client, { arbiter: q.arbiter.address });
    await q.task.connect(q.miner).claimShard(taskId, 0);
    const res = await buildResult(q.task, taskId, 0, 0, 4, q.miner);
    await q.task.connect(q.miner).submitResult(taskId, 0, res.root, "store://out", TOKENS);
    return { ...q, taskId, payment: value, res };
  }
  async function disputed() {
    const q = await submitted();
    const k = 2;
    await q.arb.connect(q.client).openDispute(
      q.taskId, 0, q.res.receipts[k], q.res.sigs[k], q.res.proofOf(k), "store://evidence", { value: P.minBond });
    return { ...q, disputeId: 1n };
  }
  const open = (q, k = 1, over = {}) => {
    const r = over.receipt ?? q.res.receipts[k];
    return q.arb.connect(over.from ?? q.client).openDispute(
      over.taskId ?? q.taskId, over.shard ?? 0, r, over.sig ?? q.res.sigs[k], over.proof ?? q.res.proofOf(k),
      "store://evidence", { value: over.value ?? P.minBond });
  };

  describe("params and wiring", function () {
    it("exposes constructor params; owner setters validate", async function () {
      const { arb, outsider, task } = await loadFixture(deployQuarry);
      expect(await arb.minBond()).to.equal(P.minBond);
      expect(await arb.disputeTimeout()).to.equal(P.disputeTimeout);
      expect(await arb.faultSlashBps()).to.equal(P.faultSlashBps);
      expect(await arb.verifierRewardBps()).to.equal(P.verifierRewardBps);
      expect(await arb.minerBondShareBps()).to.equal(P.minerBondShareBps);
      await expect(arb.setParams(1, 2, 3, 4, 5)).to.emit(arb, "ParamsSet").withArgs(1, 2, 3, 4, 5);
      for (const bad of [[1, 2, 10001, 4, 5], [1, 2, 3, 10001, 5], [1, 2, 3, 4, 10001]]) {
        await expect(arb.setParams(...bad)).to.be.revertedWithCustomError(arb, "InvalidBps");
      }
      await expect(arb.connect(outsider).setParams(1, 2, 3, 4, 5)).to.be.revertedWithCustomError(arb, "OwnableUnauthorizedAccount");
      for (const f of ["setTaskRegistry", "setGPURegistry", "setCommittee", "setEscrow"]) {
        await expect(arb[f](task)).to.be.revertedWithCustomError(arb, "AlreadySet");
      }
      const fresh = await (await ethers.getContractFactory("Arbitration")).deploy(1, 1, 1, 1, 1);
      for (const f of ["setTaskRegistry", "setGPURegistry", "setCommittee", "setEscrow"]) {
        await expect(fresh[f](ethers.ZeroAddress)).to.be.revertedWithCustomError(fresh, "ZeroAddress");
      }
      const r = { taskId: 1, shard: 0, index: 0, requestHash: ethers.ZeroHash, outputHash: ethers.ZeroHash, outputTokens: 0, modelId: MODEL };
      await expect(fresh.openDispute(1, 0, r, "0x", [], "e", { value: 1 })).to.be.revertedWithCustomError(fresh, "NotWired");
    });
  });

  describe("openDispute", function () {
    it("checks signature, proof and fields, takes the bond and freezes the shard", async function () {
      const q = await loadFixture(submitted);
      const { arb, task, client, miner, taskId, res } = q;
      const tx = await open(q, 1);
      const now = BigInt(await time.latest());
      await expect(tx).to.emit(arb, "DisputeOpened");
      await expect(tx).to.emit(task, "ShardDisputed").withArgs(taskId, 0);
      const d = await arb.getDispute(1);
      expect(d.taskId).to.equal(taskId);
      expect(d.shard).to.equal(0);
      expect(d.status).to.equal(D.Open);
      expect(d.opener).to.equal(client.address);
      expect(d.miner).to.equal(miner.address);
      expect(d.bond).to.equal(P.minBond);
      expect(d.openedAt).to.equal(now);
      expect(d.deadline).to.equal(now + P.disputeTimeout);
      expect(d.receipt.index).to.equal(1);
      expect(d.receipt.outputHash).to.equal(res.receipts[1].outputHash);
      expect(d.evidenceURI).to.equal("store://evidence");
      expect(await arb.disputeCount()).to.equal(1);
      expect(await ethers.provider.getBalance(arb)).to.equal(P.minBond);
      expect((await task.getShard(taskId, 0)).state).to.equal(S.Disputed);
      await time.increase(P.challengeWindow);
      await expect(task.finalizeShard(taskId, 0)).to.be.revertedWithCustomError(task, "DisputeOpen");
      await expect(open(q, 0)).to.be.revertedWithCustomError(arb, "ShardNotSubmitted").withArgs(S.Disputed);
    });
    it("the named arbiter may dispute for the client; others may not", async function () {
      const q = await loadFixture(submitted);
      await expect(open(q, 0, { from: q.outsider }))
        .to.be.revertedWithCustomError(q.arb, "NotClientOrArbiter").withArgs(q.outsider.address);
      await expect(open(q, 0, { from: q.miner })).to.be.revertedWithCustomError(q.arb, "NotClientOrArbiter");
      await open(q, 0, { from: q.arbiter });
      expect((await q.arb.getDispute(1)).opener).to.equal(q.arbiter.address);
    });
    it("reverts below the minimum bond", async function () {
      const q = await loadFixture(submitted);
      await expect(open(q, 0, { value: P.minBond - 1n }))
        .to.be.revertedWithCustomError(q.arb, "InsufficientBond").withArgs(P.minBond, P.minBond - 1n);
      await expect(open(q, 0, { value: 0n })).to.be.revertedWithCustomError(q.arb, "InsufficientBond");
    });
    it("reverts outside the window and on shards that are not submitted", async function () {
      const q = await loadFixture(submitted);
      await q.task.connect(q.miner2).claimShard(q.taskId, 1);
      await expect(open(q, 0, { shard: 1 })).to.be.revertedWithCustomError(q.arb, "ShardNotSubmitted").withArgs(S.Claimed);
      await expect(open(q, 0, { shard: 2 })).to.be.revertedWithCustomError(q.arb, "ShardNotSubmitted").withArgs(S.Open);
      const s = await q.task.getShard(q.taskId, 0);
      await time.increaseTo(s.windowEnd);
      await expect(open(q, 0)).to.be.revertedWithCustomError(q.arb, "OutsideWindow").withArgs(s.windowEnd);
    });
    it("reverts when the receipt does not match the task and shard", async function () {
      const q = await loadFixture(submitted);
      const base = q.res.receipts[0];
      for (const bad of [{ taskId: q.taskId + 1n }, { shard: 1 }, { modelId: OTHER_MODEL }, { index: 4 }]) {
        await expect(open(q, 0, { receipt: { ...base, ...bad } })).to.be.revertedWithCustomError(q.arb, "ReceiptMismatch");
      }
    });
    it("reverts on a signature from the wrong key, chain or contract", async function () {
      const q = await loadFixture(submitted);
      const r = q.res.receipts[0];
      const domain = await domainOf(q.task);
      const byOther = await q.miner2.signTypedData(domain, RECEIPT_TYPES, r);
      await expect(open(q, 0, { sig: byOther }))
        .to.be.revertedWithCustomError(q.arb, "InvalidMinerSignature").withArgs(q.miner2.address, q.miner.address);
      const wrongChain = await q.miner.signTypedData({ ...domain, chainId: 1n }, RECEIPT_TYPES, r);
      await expect(open(q, 0, { sig: wrongChain })).to.be.revertedWithCustomError(q.arb, "InvalidMinerSignature");
      const wrongContract = await q.miner.signTypedData({ ...domain, verifyingContract: await q.arb.getAddress() }, RECEIPT_TYPES, r);
      await expect(open(q, 0, { sig: wrongContract })).to.be.revertedWithCustomError(q.arb, "InvalidMinerSignature");
      await expect(open(q, 0, { sig: "0x1234" })).to.be.revertedWithCustomError(q.arb, "InvalidSignature");
    });
    it("reverts on a receipt the result root does not commit to", async function () {
      const q = await loadFixture(submitted);
      await expect(open(q, 0, { proof: q.res.proofOf(1) })).to.be.revertedWithCustomError(q.arb, "InvalidProof");
      // signed by the miner but never part of the submitted result
      const r = { ...q.res.receipts[0], outputHash: ethers.id("another output") };
      const sig = await q.miner.signTypedData(await domainOf(q.task), RECEIPT_TYPES, r);
      await expect(open(q, 0, { receipt: r, sig })).to.be.revertedWithCustomError(q.arb, "InvalidProof");
    });
  });

  describe("resolve", function () {
    it("fault: slashes the collateral, refunds the shard, returns the bond, rewards voters, to the wei", async function () {
      const q = await loadFixture(disputed);
      const { arb, task, gpu, escrow, client, miner, verifiers, taskId, payment } = q;
      const voters = sortByAddress(verifiers.slice(0, 3));
      const sigs = await signVotes(arb, voters, 1n, true);
      const stakeBefore = (await gpu.minerInfo(miner)).stake;
      const escrowBal = await ethers.provider.getBalance(escrow);
      const tx = await arb.connect(q.outsider).resolve(1, true, sigs);
      await expect(tx).to.emit(arb, "DisputeResolved").withArgs(1, true, voters.map((v) => v.address), COLL4);
      await expect(tx).to.emit(task, "ShardDisputeResolved").withArgs(taskId, 0, true);
      const reward = (COLL4 * BigInt(P.verifierRewardBps)) / 10000n;
      const each = reward / 3n;
      for (const v of voters) expect(await escrow.withdrawable(v)).to.equal(each);
      expect(await escrow.withdrawable(verifiers[3])).to.equal(0);
      // client: whole shard budget + slashed stake not paid to voters + its bond back
      expect(await escrow.withdrawable(client)).to.equal(BUDGET4 + COLL4 - each * 3n + P.minBond);
      expect(await escrow.withdrawable(miner)).to.equal(0);
      expect(await escrow.escrowed(taskId)).to.equal(payment - BUDGET4);
      const info = await gpu.minerInfo(miner);
      expect(info.stake).to.equal(stakeBefore - COLL4);
      expect(info.locked).to.equal(0);
      expect(await ethers.provider.getBalance(arb)).to.equal(0);
      expect(await ethers.provider.getBalance(escrow)).to.equal(escrowBal + COLL4 + P.minBond);
      expect((await task.getShard(taskId, 0)).state).to.equal(S.Refunded);
      expect((await arb.getDispute(1)).status).to.equal(D.MinerAtFault);
      expect((await task.getTask(taskId)).committed).to.equal(0);
      // the client pulls it all
      const before = await ethers.provider.getBalance(client);
      const wtx = await escrow.connect(client).withdraw();
      expect((await ethers.provider.getBalance(client)) - before + (await gasCost(wtx)))
        .to.equal(BUDGET4 + COLL4 - each * 3n + P.minBond);
      await expect(arb.resolve(1, true, sigs)).to.be.revertedWithCustomError(arb, "DisputeNotOpen").withArgs(D.MinerAtFault);
      const bal = await ethers.provider.getBalance(escrow);
      expect(bal).to.equal((await escrow.totalEscrowed()) + (await escrow.totalWithdrawable()));
    });
    it("fault opened by the arbiter returns the bond to the arbiter", async function () {
      const q = await loadFixture(submitted);
      await open(q, 3, { from: q.arbiter });
      await q.arb.resolve(1, true, await signVotes(q.arb, q.verifiers, 1n, true));
      expect(await q.escrow.withdrawable(q.arbiter)).to.equal(P.minBond);
      const each = (COLL4 * BigInt(P.verifierRewardBps)) / 10000n / 4n;
      expect(await q.escrow.withdrawable(q.client)).to.equal(BUDGET4 + COLL4 - each * 4n);
    });
    it("no fault: bond to miner and voters, shard finalizable at once, to the wei", async function () {
      const q = await loadFixture(disputed);
      const { arb, task, gpu, escrow, client, miner, verifiers, taskId } = q;
      const voters = verifiers.slice(1, 4);
      const tx = await arb.resolve(1, false, await signVotes(arb, voters, 1n, false));
      await expect(tx).to.emit(arb, "DisputeResolved");
      await expect(tx).to.emit(task, "ShardDisputeResolved").withArgs(taskId, 0, false);
      const toMiner = (P.minBond * BigInt(P.minerBondShareBps)) / 10000n;
      const each = (P.minBond - toMiner) / 3n;
      for (const v of voters) expect(await escrow.withdrawable(v)).to.equal(each);
      expect(await escrow.withdrawable(miner)).to.equal(P.minBond - each * 3n);
      expect(await escrow.withdrawable(client)).to.equal(0);
      const s = await task.getShard(taskId, 0);
      expect(s.state).to.equal(S.Submitted);
      expect(s.windowEnd).to.equal(await time.latest());
      expect((await arb.getDispute(1)).status).to.equal(D.MinerNotAtFault);
      expect((await gpu.minerInfo(miner)).locked).to.equal(COLL4);
      // the window is closed now: no second dispute
      await expect(open(q, 0)).to.be.revertedWithCustomError(arb, "OutsideWindow").withArgs(s.windowEnd);
      await task.finalizeShard(taskId, 0);
      expect(await escrow.withdrawable(miner)).to.equal(P.minBond - each * 3n + TOKENS * PRICE);
      expect(await escrow.withdrawable(client)).to.equal(BUDGET4 - TOKENS * PRICE);
      expect((await gpu.minerInfo(miner)).locked).to.equal(0);
      await expect(open(q, 0)).to.be.revertedWithCustomError(arb, "ShardNotSubmitted").withArgs(S.Finalized);
    });
    it("reverts without quorum, on repeated or unsorted signers and on non-members", async function () {
      const q = await loadFixture(disputed);
      const { arb, verifiers, outsider } = q;
      const sorted = sortByAddress(verifiers);
      const sigs = await signVotes(arb, sorted, 1n, true);
      expect(await q.committee.quorum()).to.equal(3);
      await expect(arb.resolve(1, true, sigs.slice(0, 2)))
        .to.be.revertedWithCustomError(arb, "QuorumNotReached").withArgs(3, 2);
      await expect(arb.resolve(1, true, [sigs[0], sigs[1], sigs[1]]))
        .to.be.revertedWithCustomError(arb, "DuplicateSigner").withArgs(sorted[1].address);
      await expect(arb.resolve(1, true, [sigs[1], sigs[0], sigs[2]]))
        .to.be.revertedWithCustomError(arb, "SignersNotSorted");
      const withOutsider = sortByAddress([...sorted.slice(0, 3), outsider]);
      await expect(arb.resolve(1, true, await signVotes(arb, withOutsider, 1n, true)))
        .to.be.revertedWithCustomError(arb, "NotCommitteeMember").withArgs(outsider.address);
      // a member who left the committee no longer counts
      await q.committee.connect(sorted[0]).requestExit();
      await expect(arb.resolve(1, true, sigs.slice(0, 3)))
        .to.be.revertedWithCustomError(arb, "NotCommitteeMember").withArgs(sorted[0].address);
      await expect(arb.resolve(1, true, ["0x00"])).to.be.revertedWithCustomError(arb, "InvalidSignature");
      await expect(arb.resolve(9, true, sigs)).to.be.revertedWithCustomError(arb, "UnknownDispute").withArgs(9);
    });
    it("reverts on votes for the other verdict, dispute, chain or contract", async function () {
      const q = await loadFixture(disputed);
      const { arb, task, verifiers } = q;
      const v = [verifiers[0]];
      const cases = [
        await signVotes(arb, v, 1n, false),
        await signVotes(arb, v, 2n, true),
        await signVotes(arb, v, 1n, true, { chainId: 1n }),
        await signVotes(arb, v, 1n, true, { verifyingContract: await task.getAddress() }),
      ];
      for (const sigs of cases) {
        await expect(arb.resolve(1, true, sigs)).to.be.revertedWithCustomError(arb, "NotCommitteeMember");
      }
    });
    it("reverts after the dispute deadline", async function () {
      const q = await loadFixture(disputed);
      const d = await q.arb.getDispute(1);
      await time.increaseTo(d.deadline);
      await expect(q.arb.resolve(1, true, await signVotes(q.arb, q.verifiers, 1n, true)))
        .to.be.revertedWithCustomError(q.arb, "DisputeDeadlinePassed").withArgs(d.deadline);
    });
  });

  describe("expireDispute", function () {
    it("after the timeout: no fault, bond back to the opener, shard proceeds", async function () {
      const q = await loadFixture(disputed);
      const { arb, task, escrow, client, miner, taskId } = q;
      const d = await arb.getDispute(1);
      await expect(arb.expireDispute(1)).to.be.revertedWithCustomError(arb, "DisputeNotExpired").withArgs(d.deadline);
      await time.increaseTo(d.deadline);
      await expect(arb.connect(q.outsider).expireDispute(1)).to.emit(arb, "DisputeExpired").withArgs(1);
      expect(await escrow.withdrawable(client)).to.equal(P.minBond);
      expect((await arb.getDispute(1)).status).to.equal(D.Expired);
      expect((await task.getShard(taskId, 0)).state).to.equal(S.Submitted);
      await task.finalizeShard(taskId, 0);
      expect(await escrow.withdrawable(miner)).to.equal(TOKENS * PRICE);
      expect(await escrow.withdrawable(client)).to.equal(P.minBond + BUDGET4 - TOKENS * PRICE);
      await expect(arb.expireDispute(1)).to.be.revertedWithCustomError(arb, "DisputeNotOpen").withArgs(D.Expired);
      await expect(arb.expireDispute(5)).to.be.revertedWithCustomError(arb, "UnknownDispute");
    });
  });

  describe("views", function () {
    it("hashVote, domainSeparator and receiptLeaf match ethers and merkle-tree", async function () {
      const q = await loadFixture(submitted);
      const domain = await domainOf(q.arb);
      expect(await q.arb.domainSeparator()).to.equal(ethers.TypedDataEncoder.hashDomain(domain));
      expect(await q.arb.VOTE_TYPEHASH()).to.equal(ethers.id("Vote(uint256 disputeId,bool minerAtFault)"));
      expect(await q.arb.hashVote(7, true)).to.equal(
        ethers.TypedDataEncoder.hash(domain, VOTE_TYPES, { disputeId: 7, minerAtFault: true }));
      const r = q.res.receipts[2];
      expect(await q.arb.receiptLeaf(r)).to.equal(q.res.tree.leafHash([r.index, receiptStructHash(r)]));
      await expect(q.arb.getDispute(1)).to.be.revertedWithCustomError(q.arb, "UnknownDispute").withArgs(1);
    });
  });
});
