const { expect } = require("chai");
const { ethers } = require("hardhat");
const { loadFixture, time } = require("@nomicfoundation/hardhat-network-helpers");
const {
  P, MODEL, OTHER_MODEL, PRICE, RECEIPT_TYPES, VOTE_TYPES, domainOf, sortByAddress, deployQuarry, activate,
  createTask, buildResult, resultTree, receiptLeaf, receiptStructHash, signVotes, signReport, gasCost,
} = require("./helpers");
const { LyingSumTree, findSumLie } = require("./resultTree");

const S = { Open: 0n, Claimed: 1n, Submitted: 2n, Disputed: 3n, Finalized: 4n, Refunded: 5n };
const D = { None: 0n, Open: 1n, MinerAtFault: 2n, MinerNotAtFault: 3n, Expired: 4n };
const C = { None: 0n, Open: 1n, Answered: 2n, Unanswered: 3n };
const B = { None: 0n, Fault: 1n, NoFault: 2n, Absent: 3n };
const ETH = ethers.parseEther("1");
const BPS = 10000n;
// The default task: shards of 4 requests, 100 tokens max each, 1 gwei per token.
const MAX_TOKENS = 100n;
const BUDGET4 = 4n * MAX_TOKENS * PRICE;
const COLL4 = (BUDGET4 * BigInt(P.collateralBps)) / BPS;
const SLASH4 = (COLL4 * BigInt(P.faultSlashBps)) / BPS;
const REWARD4 = (SLASH4 * BigInt(P.verifierRewardBps)) / BPS;
const TOKENS = 40n; // 4 receipts x 10 tokens
const IDLE_SLASH = (P.minVerifierStake * 1000n) / BPS; // VerifierCommittee: idleSlashBps 1000, idleStrikesAllowed 0
const BURN = "0x000000000000000000000000000000000000dEaD"; // Arbitration.BURN: absences are burned
const coder = ethers.AbiCoder.defaultAbiCoder();

// ------------------------------------------------------------------ small helpers

const balance = (a) => ethers.provider.getBalance(a);
const stampOf = async (tx) => BigInt((await ethers.provider.getBlock((await tx.wait()).blockNumber)).timestamp);
const blockOf = async (tx) => (await tx.wait()).blockNumber;
/** The next transaction (a reverted one too: Hardhat mines it) is stamped exactly `t`. */
const nextAt = (t) => time.setNextBlockTimestamp(t);

/** A restored snapshot would stamp the next block with the wall-clock time since it was taken:
 * pin the next block to latest + 1 so every test starts where its fixture ended. */
async function load(fixture) {
  const q = await loadFixture(fixture);
  await ethers.provider.send("evm_setNextBlockTimestamp", [(await time.latest()) + 1]);
  return q;
}

/** Unsigned receipts of requests [start, end) of a shard; `over(i)` overrides fields. */
function receiptsFor(taskId, shard, start, end, over = () => ({})) {
  const out = [];
  for (let i = start; i < end; i++) {
    out.push({
      taskId,
      shard,
      index: i,
      requestHash: ethers.id(`req-${taskId}-${i}`),
      outputHash: ethers.id(`out-${taskId}-${i}`),
      outputTokens: 10,
      modelId: MODEL,
      commitment: i % 2 ? ethers.id(`commitment-${taskId}-${i}`) : ethers.ZeroHash,
      ...over(i),
    });
  }
  return out;
}

/** `miner` claims `shard` and commits to `receipts` with `tokensUsed` (default: their sum). */
async function commit(q, receipts, tokensUsed, shard = 0, miner = q.miner) {
  const tree = resultTree(receipts);
  await q.task.connect(miner).claimShard(q.taskId, shard);
  await q.task.connect(miner).submitResult(q.taskId, shard, tree.root, "store://out", tokensUsed ?? tree.total);
  return { root: tree.root, total: tree.total, receipts, tree, proofOf: (k) => tree.proof(k) };
}

/** outputHash = keccak256(abi.encode(keccak256(text), keccak256(abi.encodePacked(uint32[] ids)))),
 * where encodePacked pads every array element to 32 bytes. */
function outputHashOf(text, ids) {
  const packed = ethers.concat(ids.map((i) => ethers.zeroPadValue(ethers.toBeHex(i), 32)));
  return ethers.keccak256(coder.encode(["bytes32", "bytes32"], [ethers.id(text), ethers.keccak256(packed)]));
}

const receiptTuple = (r) => [
  BigInt(r.taskId), BigInt(r.shard), BigInt(r.index), r.requestHash, r.outputHash, BigInt(r.outputTokens), r.modelId, r.commitment];
const proofTuple = (p) => p.map((n) => [n.hash, BigInt(n.sum)]);

/** Args of every `name` event `contract` emitted in `tx`, in log order. */
async function eventsOf(tx, contract, name) {
  const rc = await tx.wait();
  const addr = (await contract.getAddress()).toLowerCase();
  return rc.logs
    .filter((l) => l.address.toLowerCase() === addr)
    .map((l) => contract.interface.parseLog(l))
    .filter((e) => e && e.name === name)
    .map((e) => e.args);
}

/** PaymentEscrow.withdrawable of every account: the listed [signer, wei] pairs (summed), 0 for the rest. */
async function expectWithdrawable(q, pairs) {
  const want = new Map();
  for (const [s, v] of pairs) want.set(s.address, (want.get(s.address) ?? 0n) + v);
  for (const [i, s] of q.signers.entries()) {
    expect(await q.escrow.withdrawable(s), `withdrawable of signer #${i}`).to.equal(want.get(s.address) ?? 0n);
  }
}

/** Escrow holds exactly what it owes; Arbitration holds exactly the bonds still open. */
async function expectSolvent(q, heldByArbitration = 0n) {
  expect(await balance(q.escrow)).to.equal((await q.escrow.totalEscrowed()) + (await q.escrow.totalWithdrawable()));
  expect(await balance(q.arb)).to.equal(heldByArbitration);
}

async function expectMiner(q, stake, locked, miner = q.miner) {
  const info = await q.gpu.minerInfo(miner);
  expect(info.stake, "miner stake").to.equal(stake);
  expect(info.locked, "miner locked").to.equal(locked);
}

/** A proven billing fault (`tx`, on request `index`, proven by the client) settled at once:
 * the 4-request shard refunded, the client paid its budget and the slash, the miner slashed. */
async function expectBillingFaultSettled(q, tx, index, gpuBalBefore) {
  const { arb, task, gpu, client, taskId, payment } = q;
  await expect(tx).to.emit(arb, "BillingFaultProven").withArgs(taskId, 0, index, client.address, SLASH4);
  await expect(tx).to.emit(task, "ShardDisputed").withArgs(taskId, 0);
  await expect(tx).to.emit(task, "ShardDisputeResolved").withArgs(taskId, 0, true);
  await expect(tx).to.emit(task, "ShardRefunded").withArgs(taskId, 0, BUDGET4);
  await expectWithdrawable(q, [[client, BUDGET4 + SLASH4]]);
  await expectMiner(q, P.minStake - SLASH4, 0n);
  expect(await balance(gpu)).to.equal(gpuBalBefore - SLASH4);
  expect(await q.escrow.escrowed(taskId)).to.equal(payment - BUDGET4);
  await expectSolvent(q);
  expect((await task.getShard(taskId, 0)).state).to.equal(S.Refunded);
}

// ------------------------------------------------------------------ fixtures

async function taskCreated() {
  const q = await deployQuarry();
  const { taskId, value } = await createTask(q.task, q.client, { arbiter: q.arbiter.address });
  return { ...q, taskId, payment: value };
}

/** Shard 0 (requests 0..3, 10 tokens each) submitted by `miner` with signed receipts. */
async function submitted() {
  const q = await taskCreated();
  await q.task.connect(q.miner).claimShard(q.taskId, 0);
  const res = await buildResult(q.task, q.taskId, 0, 0, 4, q.miner);
  await q.task.connect(q.miner).submitResult(q.taskId, 0, res.root, "store://out", res.total);
  return { ...q, res };
}

async function disputed() {
  const q = await submitted();
  await open(q, 2);
  return { ...q, disputeId: 1n };
}

/** A committee of unequal stakes: the four fixture verifiers (1 ETH each), `whale` (6 ETH) and
 * `mid` (2 ETH); total 12 ETH, a verdict needs more than 8 ETH. Dispute 1 opened on shard 0. */
async function weightedDisputed() {
  const q0 = await deployQuarry();
  const [whale, mid] = q0.signers.slice(10, 12);
  await q0.committee.connect(whale).register({ value: 6n * ETH });
  await q0.committee.connect(mid).register({ value: 2n * ETH });
  await activate(q0.committee);
  const { taskId, value } = await createTask(q0.task, q0.client, { arbiter: q0.arbiter.address });
  const q = { ...q0, taskId, payment: value, whale, mid, small: sortByAddress(q0.verifiers) };
  await q.task.connect(q.miner).claimShard(taskId, 0);
  q.res = await buildResult(q.task, taskId, 0, 0, 4, q.miner);
  await q.task.connect(q.miner).submitResult(taskId, 0, q.res.root, "store://out", q.res.total);
  await open(q, 2);
  return q;
}

/** The attack of gap 1: a non-zero resultRoot over nothing, billing the shard maximum. */
async function withheld() {
  const q = await taskCreated();
  await q.task.connect(q.miner).claimShard(q.taskId, 0);
  await q.task.connect(q.miner).submitResult(q.taskId, 0, ethers.id("nothing behind this root"), "store://nowhere", 4n * MAX_TOKENS);
  return q;
}

/** Gap 2: honest receipts (40 tokens) but tokensUsed = 45. */
async function inflated() {
  const q = await taskCreated();
  return { ...q, res: await commit(q, receiptsFor(q.taskId, 0, 0, 4), TOKENS + 5n) };
}

/** Receipt 1 bills 300 tokens (3x the cap); the total 390 still fits the shard maximum 400. */
async function overCap() {
  const q = await taskCreated();
  const res = await commit(q, receiptsFor(q.taskId, 0, 0, 4, (i) => ({ outputTokens: i === 1 ? 300 : 30 })));
  return { ...q, res };
}

// Outputs with token ids: receipt 0 bills its 3 tokens; receipt 2 bills 20 for 7 tokens;
// receipt 3 bills 3 for 4 tokens (under-billing).
const OUT = {
  0: { text: "the quick brown", ids: [1820, 4062, 7586], bills: 3 },
  2: { text: "hello world", ids: [15339, 1917, 0, 70000, 4294967295, 1, 2], bills: 20 },
  3: { text: "a b c d", ids: [64, 65, 66, 67], bills: 3 },
};
async function withTokenIds() {
  const q = await taskCreated();
  const res = await commit(q, receiptsFor(q.taskId, 0, 0, 4, (i) => (OUT[i]
    ? { outputHash: outputHashOf(OUT[i].text, OUT[i].ids), outputTokens: OUT[i].bills } : {})));
  return { ...q, res };
}

// ------------------------------------------------------------------ actions

function open(q, k = 1, over = {}) {
  const res = over.res ?? q.res;
  return q.arb.connect(over.from ?? q.client).openDispute(
    over.taskId ?? q.taskId, over.shard ?? 0, over.receipt ?? res.receipts[k], over.proof ?? res.proofOf(k),
    "store://evidence", { value: over.value ?? P.minBond });
}

async function vote(q, disputeId, minerAtFault, signers) {
  return q.arb.castVotes(disputeId, minerAtFault, await signVotes(q.arb, signers, disputeId, minerAtFault));
}

function challenge(q, index, over = {}) {
  return q.arb.connect(over.from ?? q.client).challengeAvailability(
    over.taskId ?? q.taskId, over.shard ?? 0, index, { value: over.value ?? P.minAvailabilityBond });
}

function answer(q, challengeId, k, over = {}) {
  const res = over.res ?? q.res;
  return q.arb.connect(over.from ?? q.miner).answerAvailability(
    challengeId, over.receipt ?? res.receipts[k], over.proof ?? res.proofOf(k));
}

function prove(q, k, text, ids, over = {}) {
  const res = over.res ?? q.res;
  return q.arb.connect(over.from ?? q.client).proveBillingFault(
    q.taskId, 0, over.receipt ?? res.receipts[k], over.proof ?? res.proofOf(k),
    text === null ? ethers.ZeroHash : ethers.id(text), ids);
}

/** Arbitration's split of `pool` in proportion to the recorded `weights`: floor(pool * w / sum). */
function byWeight(pool, weights) {
  const total = weights.reduce((a, b) => a + b, 0n);
  return weights.map((w) => (pool * w) / total);
}

/** The money of a fault on shard 0 judged by `voters` recorded fault voters of equal weight. */
function faultSplit(voters) {
  const each = voters === 0 ? 0n : REWARD4 / BigInt(voters);
  return { each, toClient: BUDGET4 + SLASH4 - each * BigInt(voters) };
}

describe("Arbitration", function () {
  describe("params and wiring", function () {
    it("exposes constructor params; owner setters validate", async function () {
      const { arb, outsider, task } = await load(deployQuarry);
      expect(await arb.minBond()).to.equal(P.minBond);
      expect(await arb.disputeTimeout()).to.equal(P.disputeTimeout);
      expect(await arb.faultSlashBps()).to.equal(P.faultSlashBps);
      expect(await arb.verifierRewardBps()).to.equal(P.verifierRewardBps);
      expect(await arb.minerBondShareBps()).to.equal(P.minerBondShareBps);
      expect(await arb.minAvailabilityBond()).to.equal(P.minAvailabilityBond);
      expect(await arb.responseWindow()).to.equal(P.responseWindow);
      expect(await arb.MAX_AVAILABILITY_CHALLENGES()).to.equal(3);
      await expect(arb.setParams(1, 2, 3, 4, 5)).to.emit(arb, "ParamsSet").withArgs(1, 2, 3, 4, 5);
      for (const bad of [[1, 2, 10001, 4, 5], [1, 2, 3, 10001, 5], [1, 2, 3, 4, 10001]]) {
        await expect(arb.setParams(...bad)).to.be.revertedWithCustomError(arb, "InvalidBps").withArgs(10001);
      }
      await expect(arb.connect(outsider).setParams(1, 2, 3, 4, 5))
        .to.be.revertedWithCustomError(arb, "OwnableUnauthorizedAccount").withArgs(outsider.address);
      await expect(arb.setAvailabilityParams(7, 9)).to.emit(arb, "AvailabilityParamsSet").withArgs(7, 9);
      expect(await arb.minAvailabilityBond()).to.equal(7);
      expect(await arb.responseWindow()).to.equal(9);
      await expect(arb.setAvailabilityParams(0, 9)).to.be.revertedWithCustomError(arb, "InsufficientBond").withArgs(1, 0);
      await expect(arb.connect(outsider).setAvailabilityParams(7, 9))
        .to.be.revertedWithCustomError(arb, "OwnableUnauthorizedAccount").withArgs(outsider.address);
      for (const f of ["setTaskRegistry", "setGPURegistry", "setCommittee", "setEscrow"]) {
        await expect(arb[f](task)).to.be.revertedWithCustomError(arb, "AlreadySet");
      }
      const F = await ethers.getContractFactory("Arbitration");
      await expect(F.deploy(1, 1, 1, 1, 1, 0, 1)).to.be.revertedWithCustomError(arb, "InsufficientBond").withArgs(1, 0);
      const fresh = await F.deploy(1, 1, 1, 1, 1, 1, 1);
      for (const f of ["setTaskRegistry", "setGPURegistry", "setCommittee", "setEscrow"]) {
        await expect(fresh[f](ethers.ZeroAddress)).to.be.revertedWithCustomError(fresh, "ZeroAddress");
      }
      const r = receiptsFor(1, 0, 0, 1)[0];
      await expect(fresh.openDispute(1, 0, r, [], "e", { value: 1 })).to.be.revertedWithCustomError(fresh, "NotWired");
      await expect(fresh.challengeAvailability(1, 0, 0, { value: 1 })).to.be.revertedWithCustomError(fresh, "NotWired");
    });
  });

  describe("openDispute", function () {
    it("opens from the proof alone: takes the bond, freezes the shard, records the epoch snapshot", async function () {
      const q = await load(submitted);
      const { arb, task, committee, client, miner, taskId, res } = q;
      expect(arb.interface.getFunction("openDispute").inputs.map((i) => i.type))
        .to.deep.equal(["uint256", "uint32", "tuple", "tuple[]", "string"]); // no signature argument
      const tx = await open(q, 1);
      const now = await stampOf(tx);
      const epoch = await committee.currentEpoch({ blockTag: await blockOf(tx) });
      await expect(tx).to.emit(arb, "DisputeOpened").withArgs(
        1, taskId, 0, client.address, miner.address, P.minBond, now + P.disputeTimeout, receiptTuple(res.receipts[1]),
        "store://evidence");
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
      expect(d.epoch).to.equal(epoch);
      expect(d.totalWeight).to.equal(4n * P.minVerifierStake);
      expect(d.totalWeight).to.equal(await committee.totalWeightAt(epoch));
      expect(d.faultWeight).to.equal(0);
      expect(d.noFaultWeight).to.equal(0);
      expect([...d.receipt]).to.deep.equal(receiptTuple(res.receipts[1]));
      expect(d.evidenceURI).to.equal("store://evidence");
      expect(await arb.disputeCount()).to.equal(1);
      await expectSolvent(q, P.minBond);
      expect((await task.getShard(taskId, 0)).state).to.equal(S.Disputed);
      await time.increase(P.challengeWindow);
      await expect(task.finalizeShard(taskId, 0)).to.be.revertedWithCustomError(task, "DisputeOpen");
      await expect(open(q, 0)).to.be.revertedWithCustomError(arb, "ShardNotSubmitted").withArgs(S.Disputed);
    });
    it("the named arbiter may dispute for the client; others may not", async function () {
      const q = await load(submitted);
      for (const who of [q.outsider, q.miner, q.miner2]) {
        await expect(open(q, 0, { from: who }))
          .to.be.revertedWithCustomError(q.arb, "NotClientArbiterOrAuditor").withArgs(who.address);
      }
      await open(q, 0, { from: q.arbiter });
      expect((await q.arb.getDispute(1)).opener).to.equal(q.arbiter.address);
    });
    it("auditors: a member of the current committee may dispute any client's shard at its own bond; a pending join may not", async function () {
      const q = await load(submitted);
      const late = q.signers[12];
      await q.committee.connect(late).register({ value: P.minVerifierStake });
      await expect(open(q, 0, { from: late }))
        .to.be.revertedWithCustomError(q.arb, "NotClientArbiterOrAuditor").withArgs(late.address);
      const auditor = q.verifiers[0];
      const tx = await open(q, 0, { from: auditor });
      const d = await q.arb.getDispute(1);
      expect(d.opener).to.equal(auditor.address);
      expect(d.bond).to.equal(P.minBond);
      await expect(tx).to.emit(q.arb, "DisputeOpened");
      await expectSolvent(q, P.minBond);
    });
    it("bond: below the minimum or zero reverts, a larger bond is held whole", async function () {
      const q = await load(submitted);
      await expect(open(q, 0, { value: P.minBond - 1n }))
        .to.be.revertedWithCustomError(q.arb, "InsufficientBond").withArgs(P.minBond, P.minBond - 1n);
      await expect(open(q, 0, { value: 0n }))
        .to.be.revertedWithCustomError(q.arb, "InsufficientBond").withArgs(P.minBond, 0);
      await q.arb.setParams(0, P.disputeTimeout, P.faultSlashBps, P.verifierRewardBps, P.minerBondShareBps);
      await expect(open(q, 0, { value: 0n })).to.be.revertedWithCustomError(q.arb, "InsufficientBond").withArgs(0, 0);
      await open(q, 0, { value: 3n * P.minBond });
      expect((await q.arb.getDispute(1)).bond).to.equal(3n * P.minBond);
      await expectSolvent(q, 3n * P.minBond);
    });
    it("window: only a Submitted shard, strictly before windowEnd", async function () {
      let q = await load(submitted);
      await q.task.connect(q.miner2).claimShard(q.taskId, 1);
      await expect(open(q, 0, { shard: 1 })).to.be.revertedWithCustomError(q.arb, "ShardNotSubmitted").withArgs(S.Claimed);
      await expect(open(q, 0, { shard: 2 })).to.be.revertedWithCustomError(q.arb, "ShardNotSubmitted").withArgs(S.Open);
      const { windowEnd } = await q.task.getShard(q.taskId, 0);
      await nextAt(windowEnd);
      await expect(open(q, 0)).to.be.revertedWithCustomError(q.arb, "OutsideWindow").withArgs(windowEnd);
      await q.task.finalizeShard(q.taskId, 0);
      await expect(open(q, 0)).to.be.revertedWithCustomError(q.arb, "ShardNotSubmitted").withArgs(S.Finalized);
      q = await load(submitted);
      await nextAt(windowEnd - 1n);
      await expect(open(q, 0)).to.emit(q.arb, "DisputeOpened"); // the last second still counts
    });
    it("reverts when the receipt does not match the task and shard (ReceiptMismatch)", async function () {
      const q = await load(submitted);
      const base = q.res.receipts[0];
      for (const bad of [{ taskId: q.taskId + 1n }, { shard: 1 }, { modelId: OTHER_MODEL }, { index: 4 }, { index: 99 }]) {
        await expect(open(q, 0, { receipt: { ...base, ...bad } })).to.be.revertedWithCustomError(q.arb, "ReceiptMismatch");
      }
    });
    it("reverts on a proven receipt that bills more than maxTokensPerRequest (TooManyOutputTokens)", async function () {
      let q = await load(overCap);
      expect(await q.arb.proves(q.taskId, 0, q.res.receipts[1], q.res.proofOf(1))).to.equal(true);
      await expect(open(q, 1)).to.be.revertedWithCustomError(q.arb, "TooManyOutputTokens").withArgs(MAX_TOKENS, 300);
      await open(q, 0); // its 30-token neighbour is disputable
      q = await load(submitted);
      await expect(open(q, 0, { receipt: { ...q.res.receipts[0], outputTokens: 101 } }))
        .to.be.revertedWithCustomError(q.arb, "TooManyOutputTokens").withArgs(MAX_TOKENS, 101);
    });
    it("reverts on another index's, short, long, empty or tampered proofs (InvalidProof); proves() agrees", async function () {
      const q = await load(submitted);
      const { arb, taskId, res } = q;
      const r = res.receipts[0];
      const good = res.proofOf(0);
      expect(good.length).to.equal(2);
      const bad = [
        res.proofOf(1),
        good.slice(0, 1),
        [...good, good[0]],
        [],
        [good[0], { ...good[1], sum: good[1].sum + 1n }],
        [{ ...good[0], hash: ethers.id("x") }, good[1]],
      ];
      expect(await arb.proves(taskId, 0, r, good)).to.equal(true);
      for (const proof of bad) {
        expect(await arb.proves(taskId, 0, r, proof)).to.equal(false);
        await expect(open(q, 0, { proof })).to.be.revertedWithCustomError(arb, "InvalidProof");
      }
      // a field the shard check does not cover breaks the leaf
      await expect(open(q, 0, { receipt: { ...r, requestHash: ethers.id("other request") } }))
        .to.be.revertedWithCustomError(arb, "InvalidProof");
    });
    it("a receipt the miner signed but never committed to is not provable (InvalidProof)", async function () {
      const q = await load(submitted);
      const r = { ...q.res.receipts[0], outputHash: ethers.id("another output"), outputTokens: 50 };
      const sig = await q.miner.signTypedData(await domainOf(q.task), RECEIPT_TYPES, r);
      expect(ethers.verifyTypedData(await domainOf(q.task), RECEIPT_TYPES, r, sig)).to.equal(q.miner.address);
      expect(await q.arb.proves(q.taskId, 0, r, q.res.proofOf(0))).to.equal(false);
      await expect(open(q, 0, { receipt: r })).to.be.revertedWithCustomError(q.arb, "InvalidProof");
    });
    it("reverts NoCommittee when the current epoch's committee is empty", async function () {
      const q = await load(submitted);
      for (const v of q.verifiers) await q.committee.connect(v).requestExit();
      const epoch = await activate(q.committee);
      expect(await q.committee.currentEpoch()).to.equal(epoch);
      expect(await q.committee.totalWeightAt(epoch)).to.equal(0);
      expect(await q.committee.members()).to.deep.equal([]);
      expect(BigInt(await time.latest())).to.be.lessThan((await q.task.getShard(q.taskId, 0)).windowEnd);
      await expect(open(q, 0)).to.be.revertedWithCustomError(q.arb, "NoCommittee").withArgs(epoch);
      // an availability challenge needs no committee
      await challenge(q, 0);
    });
  });

  describe("gap 7: a dispute needs no miner signature", function () {
    it("a receipt nobody signed is disputed and judged from the result commitment alone", async function () {
      // A miner whose receipts carry no ECDSA signature (formerly: a contract account, which
      // GPURegistry.register now refuses) used to be undisputable: openDispute needed one.
      const q = await load(taskCreated);
      const res = await commit(q, receiptsFor(q.taskId, 0, 0, 4));
      const tx = await open(q, 3, { res });
      await expect(tx).to.emit(q.arb, "DisputeOpened");
      await expect(vote(q, 1, true, q.verifiers)).to.emit(q.arb, "DisputeResolved");
      const { each, toClient } = faultSplit(4);
      await expectWithdrawable(q, [[q.client, toClient + P.minBond], ...q.verifiers.map((v) => [v, each])]);
      await expectMiner(q, P.minStake - SLASH4, 0n);
      await expectSolvent(q);
    });
  });

  describe("castVotes", function () {
    it("partial votes are recorded and the dispute stays open; later votes complete it", async function () {
      const q = await load(disputed);
      const { arb } = q;
      const [a, b, c, d] = sortByAddress(q.verifiers);
      const first = await signVotes(arb, [a, b], 1n, true);
      expect(await arb.castVotes.staticCall(1, true, first)).to.equal(false);
      const tx = await arb.castVotes(1, true, first);
      expect(await eventsOf(tx, arb, "VoteCast")).to.deep.equal([[1n, a.address, true, ETH], [1n, b.address, true, ETH]]);
      await expect(tx).not.to.emit(arb, "DisputeResolved");
      let dd = await arb.getDispute(1);
      expect(dd.status).to.equal(D.Open);
      expect(dd.faultWeight).to.equal(2n * ETH);
      expect(dd.noFaultWeight).to.equal(0);
      expect(await arb.votersOf(1, true)).to.deep.equal([a.address, b.address]);
      expect(await arb.votersOf(1, false)).to.deep.equal([]);
      for (const [v, ballot] of [[a, B.Fault], [b, B.Fault], [c, B.None], [d, B.None]]) {
        expect(await arb.ballotOf(1, v)).to.equal(ballot);
      }
      await expectSolvent(q, P.minBond);
      // a, b again (skipped) with c: only c is new, and three of four is more than two thirds
      const second = await signVotes(arb, [a, b, c], 1n, true);
      expect(await arb.castVotes.staticCall(1, true, second)).to.equal(true);
      const tx2 = await arb.castVotes(1, true, second);
      expect(await eventsOf(tx2, arb, "VoteCast")).to.deep.equal([[1n, c.address, true, ETH]]);
      await expect(tx2).to.emit(arb, "DisputeResolved").withArgs(1, true, [a.address, b.address, c.address], SLASH4);
      dd = await arb.getDispute(1);
      expect(dd.status).to.equal(D.MinerAtFault);
      expect(dd.faultWeight).to.equal(3n * ETH);
      expect(await arb.ballotOf(1, d)).to.equal(B.None);
      await expect(vote(q, 1, true, [d])).to.be.revertedWithCustomError(arb, "DisputeNotOpen").withArgs(D.MinerAtFault);
    });
    it("already-voted signers are skipped; NoNewVotes when nothing is new", async function () {
      const q = await load(disputed);
      const { arb } = q;
      const [a, b, , d] = sortByAddress(q.verifiers);
      await vote(q, 1, true, [a, b]);
      await expect(vote(q, 1, true, [a, b])).to.be.revertedWithCustomError(arb, "NoNewVotes").withArgs(1);
      await expect(vote(q, 1, false, [a])).to.be.revertedWithCustomError(arb, "NoNewVotes").withArgs(1);
      await expect(arb.castVotes(1, false, [])).to.be.revertedWithCustomError(arb, "NoNewVotes").withArgs(1);
      // a changes nothing by signing the other verdict; d's vote counts
      const tx = await vote(q, 1, false, [a, d]);
      expect(await eventsOf(tx, arb, "VoteCast")).to.deep.equal([[1n, d.address, false, ETH]]);
      const dd = await arb.getDispute(1);
      expect([dd.faultWeight, dd.noFaultWeight]).to.deep.equal([2n * ETH, ETH]);
      expect(await arb.ballotOf(1, a)).to.equal(B.Fault);
      expect(await arb.ballotOf(1, d)).to.equal(B.NoFault);
      expect(await arb.votersOf(1, false)).to.deep.equal([d.address]);
      expect(dd.status).to.equal(D.Open);
    });
    it("fault: slashes, refunds the shard, returns the bond; rewards only the fault voters, to the wei", async function () {
      const q = await load(disputed);
      const { arb, task, gpu, escrow, client, taskId, payment } = q;
      const [a, b, c, d] = sortByAddress(q.verifiers);
      const gpuBal = await balance(gpu);
      await vote(q, 1, false, [d]);
      const tx = await vote(q, 1, true, [a, b, c]);
      await expect(tx).to.emit(arb, "DisputeResolved").withArgs(1, true, [a.address, b.address, c.address], SLASH4);
      await expect(tx).to.emit(task, "ShardDisputeResolved").withArgs(taskId, 0, true);
      await expect(tx).to.emit(task, "ShardRefunded").withArgs(taskId, 0, BUDGET4);
      const { each, toClient } = faultSplit(3);
      expect(each * 3n).to.not.equal(REWARD4); // the rounding dust goes to the client
      await expectWithdrawable(q, [[client, toClient + P.minBond], [a, each], [b, each], [c, each]]);
      await expectMiner(q, P.minStake - SLASH4, 0n);
      expect(await balance(gpu)).to.equal(gpuBal - SLASH4);
      expect(await escrow.escrowed(taskId)).to.equal(payment - BUDGET4);
      expect((await task.getTask(taskId)).committed).to.equal(0);
      expect((await task.getShard(taskId, 0)).state).to.equal(S.Refunded);
      expect((await arb.getDispute(1)).status).to.equal(D.MinerAtFault);
      await expectSolvent(q);
      await expect(task.finalizeShard(taskId, 0)).to.be.revertedWithCustomError(task, "ShardNotSubmitted").withArgs(S.Refunded);
      const before = await balance(client);
      const wtx = await escrow.connect(client).withdraw();
      expect((await balance(client)) - before + (await gasCost(wtx))).to.equal(toClient + P.minBond);
      await expectSolvent(q);
    });
    it("fault opened by the arbiter returns its (larger) bond to the arbiter; the rest to the client", async function () {
      const q = await load(submitted);
      await open(q, 3, { from: q.arbiter, value: 2n * P.minBond });
      await vote(q, 1, true, q.verifiers);
      const { each, toClient } = faultSplit(4);
      await expectWithdrawable(q, [[q.arbiter, 2n * P.minBond], [q.client, toClient], ...q.verifiers.map((v) => [v, each])]);
      await expectMiner(q, P.minStake - SLASH4, 0n);
      await expectSolvent(q);
    });
    it("no fault: bond to the miner and the no-fault voters only, shard finalizable at once, to the wei", async function () {
      const q = await load(disputed);
      const { arb, task, escrow, client, miner, taskId } = q;
      const [a, b, c, d] = sortByAddress(q.verifiers);
      await vote(q, 1, true, [a]);
      const tx = await vote(q, 1, false, [b, c, d]);
      await expect(tx).to.emit(arb, "DisputeResolved").withArgs(1, false, [b.address, c.address, d.address], 0);
      await expect(tx).to.emit(task, "ShardDisputeResolved").withArgs(taskId, 0, false);
      const toMiner = (P.minBond * BigInt(P.minerBondShareBps)) / BPS;
      const each = (P.minBond - toMiner) / 3n;
      expect(toMiner + each * 3n).to.be.lessThan(P.minBond); // dust to the miner
      await expectWithdrawable(q, [[miner, P.minBond - each * 3n], [b, each], [c, each], [d, each]]);
      const s = await task.getShard(taskId, 0);
      expect(s.state).to.equal(S.Submitted);
      expect(s.windowEnd).to.equal(await stampOf(tx));
      expect((await arb.getDispute(1)).status).to.equal(D.MinerNotAtFault);
      await expectMiner(q, P.minStake, COLL4);
      await expectSolvent(q);
      await expect(open(q, 0)).to.be.revertedWithCustomError(arb, "OutsideWindow").withArgs(s.windowEnd);
      await task.finalizeShard(taskId, 0);
      await expectWithdrawable(q, [
        [miner, P.minBond - each * 3n + TOKENS * PRICE], [client, BUDGET4 - TOKENS * PRICE], [b, each], [c, each], [d, each]]);
      await expectMiner(q, P.minStake, 0n);
      await expectSolvent(q);
      await expect(open(q, 0)).to.be.revertedWithCustomError(arb, "ShardNotSubmitted").withArgs(S.Finalized);
    });
    it("reverts on repeated or unsorted signers, unparsable signatures and unknown disputes", async function () {
      const q = await load(disputed);
      const { arb } = q;
      const sorted = sortByAddress(q.verifiers);
      const sigs = await signVotes(arb, sorted, 1n, true);
      await expect(arb.castVotes(1, true, [sigs[0], sigs[1], sigs[1]]))
        .to.be.revertedWithCustomError(arb, "DuplicateSigner").withArgs(sorted[1].address);
      await expect(arb.castVotes(1, true, [sigs[1], sigs[0], sigs[2]])).to.be.revertedWithCustomError(arb, "SignersNotSorted");
      await expect(arb.castVotes(1, true, ["0x00"])).to.be.revertedWithCustomError(arb, "InvalidSignature");
      await expect(arb.castVotes(1, true, [sigs[0], "0x1234"])).to.be.revertedWithCustomError(arb, "InvalidSignature");
      await expect(arb.castVotes(9, true, sigs)).to.be.revertedWithCustomError(arb, "UnknownDispute").withArgs(9);
      expect((await arb.getDispute(1)).faultWeight).to.equal(0); // nothing was recorded
    });
    it("signatures over another verdict, dispute, chain or contract recover to strangers (NotCommitteeMember)", async function () {
      const q = await load(disputed);
      const { arb, task } = q;
      const v = [q.verifiers[0]];
      const cases = [
        await signVotes(arb, v, 1n, false),
        await signVotes(arb, v, 2n, true),
        await signVotes(arb, v, 1n, true, { chainId: 1n }),
        await signVotes(arb, v, 1n, true, { verifyingContract: await task.getAddress() }),
      ];
      const digest = await arb.hashVote(1, true);
      for (const sigs of cases) {
        const stranger = ethers.recoverAddress(digest, sigs[0]);
        expect(stranger).to.not.equal(v[0].address);
        await expect(arb.castVotes(1, true, sigs)).to.be.revertedWithCustomError(arb, "NotCommitteeMember").withArgs(stranger);
      }
    });
    it("reverts after the dispute deadline", async function () {
      const q = await load(disputed);
      const d = await q.arb.getDispute(1);
      const sigs = await signVotes(q.arb, q.verifiers, 1n, true);
      await nextAt(d.deadline);
      await expect(q.arb.castVotes(1, true, sigs))
        .to.be.revertedWithCustomError(q.arb, "DisputeDeadlinePassed").withArgs(d.deadline);
    });
    it("only the dispute's epoch snapshot votes: an outsider and a verifier that joined after it opened cannot", async function () {
      const q = await load(disputed);
      const { arb, committee, outsider } = q;
      const late = q.signers[12];
      await committee.connect(late).register({ value: P.minVerifierStake });
      await activate(committee);
      const d = await arb.getDispute(1);
      expect(await committee.isMember(late)).to.equal(true);
      expect(await committee.weightAt(late, d.epoch)).to.equal(0);
      expect(await committee.totalWeightAt(await committee.currentEpoch())).to.equal(5n * ETH);
      const three = sortByAddress(q.verifiers).slice(0, 3);
      await expect(vote(q, 1, true, [late, ...three]))
        .to.be.revertedWithCustomError(arb, "NotCommitteeMember").withArgs(late.address);
      await expect(vote(q, 1, true, [outsider, ...three]))
        .to.be.revertedWithCustomError(arb, "NotCommitteeMember").withArgs(outsider.address);
      // three of the snapshot's four (3 of 4 ETH) decide, though they are not 2/3 of today's 5 ETH
      await expect(vote(q, 1, true, three)).to.emit(arb, "DisputeResolved");
      expect((await arb.getDispute(1)).status).to.equal(D.MinerAtFault);
    });
    it("a member who left after the dispute opened still votes on it", async function () {
      const q = await load(disputed);
      const { arb, committee } = q;
      const [a, b, c] = sortByAddress(q.verifiers);
      await committee.connect(a).requestExit();
      await activate(committee);
      expect(await committee.isMember(a)).to.equal(false);
      const tx = await vote(q, 1, true, [a, b, c]);
      expect(await eventsOf(tx, arb, "VoteCast")).to.deep.equal(
        [a, b, c].map((v) => [1n, v.address, true, ETH]));
      await expect(tx).to.emit(arb, "DisputeResolved").withArgs(1, true, [a.address, b.address, c.address], SLASH4);
      const { each, toClient } = faultSplit(3);
      await expectWithdrawable(q, [[q.client, toClient + P.minBond], [a, each], [b, each], [c, each]]);
    });
  });

  describe("castVotes with unequal stakes (1, 1, 1, 1, 2 and 6 ETH)", function () {
    it("the dispute records the stake snapshot", async function () {
      const q = await load(weightedDisputed);
      const d = await q.arb.getDispute(1);
      expect(d.totalWeight).to.equal(12n * ETH);
      expect(await q.committee.memberCountAt(d.epoch)).to.equal(6);
      expect(await q.committee.weightAt(q.whale, d.epoch)).to.equal(6n * ETH);
      expect(await q.committee.weightAt(q.mid, d.epoch)).to.equal(2n * ETH);
      expect(await q.committee.quorumWeight(d.epoch)).to.equal(8n * ETH + 1n);
    });
    it("a head-count majority without the stake does not resolve, nor does the whale alone", async function () {
      const q = await load(weightedDisputed);
      const { arb, small, mid, whale } = q;
      const tx = await vote(q, 1, true, [...small, mid]); // 5 of 6 heads, 6 of 12 ETH
      expect((await eventsOf(tx, arb, "VoteCast")).map((e) => e[3])).to.deep.equal(
        sortByAddress([...small, mid]).map((v) => (v === mid ? 2n * ETH : ETH)));
      await expect(tx).not.to.emit(arb, "DisputeResolved");
      await vote(q, 1, false, [whale]); // 1 of 6 heads, 6 of 12 ETH
      const d = await arb.getDispute(1);
      expect([d.status, d.faultWeight, d.noFaultWeight]).to.deep.equal([D.Open, 6n * ETH, 6n * ETH]);
      // deadlock: it expires with no fault, bond back
      await time.increaseTo(d.deadline);
      await arb.expireDispute(1);
      await expectWithdrawable(q, [[q.client, P.minBond]]);
    });
    it("a stake supermajority that is a head-count minority resolves; exactly two thirds does not; rewards by weight", async function () {
      const q = await load(weightedDisputed);
      const { arb, gpu, small, mid, whale, miner, client } = q;
      await vote(q, 1, true, [whale, mid]); // 8 ETH: exactly two thirds
      expect((await arb.getDispute(1)).status).to.equal(D.Open);
      const tx = await vote(q, 1, true, [small[0]]); // 9 ETH, 3 of 6 heads
      const ordered = [...sortByAddress([whale, mid]), small[0]];
      await expect(tx).to.emit(arb, "DisputeResolved").withArgs(1, true, ordered.map((v) => v.address), SLASH4);
      // the voter reward is split 6 : 2 : 1 by recorded weight; the rounding dust goes to the client
      const weightOf = (v) => (v === whale ? 6n * ETH : v === mid ? 2n * ETH : ETH);
      const [toWhale, toMid, toSmall] = byWeight(REWARD4, [6n * ETH, 2n * ETH, ETH]);
      expect([toWhale, toMid, toSmall]).to.deep.equal([26666666666n, 8888888888n, 4444444444n]);
      const toClient = BUDGET4 + SLASH4 - toWhale - toMid - toSmall;
      expect(toClient).to.equal(BUDGET4 + SLASH4 - REWARD4 + 2n);
      const paid = { [whale.address]: toWhale, [mid.address]: toMid, [small[0].address]: toSmall };
      const arbAddr = await arb.getAddress();
      expect(await eventsOf(tx, gpu, "Slashed")).to.deep.equal([
        ...ordered.map((v) => [miner.address, paid[v.address], v.address, arbAddr]),
        [miner.address, toClient - BUDGET4, client.address, arbAddr]]);
      expect(ordered.map(weightOf).reduce((a, b) => a + b, 0n)).to.equal((await arb.getDispute(1)).faultWeight);
      await expectWithdrawable(q, [[client, toClient + P.minBond], [whale, toWhale], [mid, toMid], [small[0], toSmall]]);
      await expectMiner(q, P.minStake - SLASH4, 0n);
      await expectSolvent(q);
    });
    it("a member slashed to zero for equivocation no longer votes in the open dispute (NotCommitteeMember) and earns nothing", async function () {
      // The attack of the first round: the whale, slashed to zero, voted with its full 6 ETH
      // and took a third of the voter reward. Its weight is now min(weight, stake) = 0.
      const q = await load(weightedDisputed);
      const { arb, committee, whale, mid, small, outsider, owner, client } = q;
      const d = await arb.getDispute(1);
      const ra = { epoch: d.epoch, miners: [], scoresBps: [], evidenceRoot: ethers.id("a") };
      const rb = { ...ra, evidenceRoot: ethers.id("b") };
      const [sa] = await signReport(committee, [whale], ra);
      const [sb] = await signReport(committee, [whale], rb);
      await committee.connect(outsider).proveEquivocation(whale, ra, sa, rb, sb);
      expect((await committee.verifierInfo(whale)).stake).to.equal(0);
      expect(await committee.weightAt(whale, d.epoch)).to.equal(0);
      expect(await committee.totalWeightAt(d.epoch)).to.equal(12n * ETH); // the snapshot's total is fixed
      await expect(vote(q, 1, true, [whale, mid, small[0]]))
        .to.be.revertedWithCustomError(arb, "NotCommitteeMember").withArgs(whale.address);
      expect(await arb.ballotOf(1, whale)).to.equal(B.None);
      // everyone else holds 6 of the snapshot's 12 ETH: recorded, no verdict
      const tx = await vote(q, 1, true, [mid, ...small]);
      await expect(tx).not.to.emit(arb, "DisputeResolved");
      const dd = await arb.getDispute(1);
      expect([dd.status, dd.totalWeight, dd.faultWeight]).to.deep.equal([D.Open, 12n * ETH, 6n * ETH]);
      await time.increaseTo(d.deadline);
      await arb.expireDispute(1);
      // nothing is left to take from the whale: it cannot be reported either
      await expect(arb.reportAbsence(1, [whale]))
        .to.be.revertedWithCustomError(arb, "NotCommitteeMember").withArgs(whale.address);
      // its 6 ETH went half to the prover, half to the owner (no treasury set); it earned nothing
      await expectWithdrawable(q, [[client, P.minBond], [outsider, 3n * ETH], [owner, 3n * ETH]]);
      await expectMiner(q, P.minStake, COLL4);
      await expectSolvent(q);
    });
    it("a vote recorded before its voter is slashed keeps its recorded weight in the tally and the reward", async function () {
      // Weights are recorded when votes are cast: a later slash does not undo a vote (by design).
      const q = await load(weightedDisputed);
      const { arb, committee, whale, mid, small, outsider, owner, client } = q;
      const d = await arb.getDispute(1);
      await vote(q, 1, true, [whale]);
      const ra = { epoch: d.epoch, miners: [], scoresBps: [], evidenceRoot: ethers.id("a") };
      const rb = { ...ra, evidenceRoot: ethers.id("b") };
      const [sa] = await signReport(committee, [whale], ra);
      const [sb] = await signReport(committee, [whale], rb);
      await committee.connect(outsider).proveEquivocation(whale, ra, sa, rb, sb);
      expect(await committee.weightAt(whale, d.epoch)).to.equal(0);
      await expect(vote(q, 1, true, [mid, small[0]]))
        .to.emit(arb, "DisputeResolved").withArgs(1, true, [whale.address, ...sortByAddress([mid, small[0]]).map((v) => v.address)], SLASH4);
      const [toWhale, toMid, toSmall] = byWeight(REWARD4, [6n * ETH, 2n * ETH, ETH]);
      await expectWithdrawable(q, [
        [client, BUDGET4 + SLASH4 - toWhale - toMid - toSmall + P.minBond], [whale, toWhale], [mid, toMid], [small[0], toSmall],
        [outsider, 3n * ETH], [owner, 3n * ETH]]);
      await expectSolvent(q);
    });
    it("no fault by stake against a fault head count: the fault voters get nothing", async function () {
      const q = await load(weightedDisputed);
      const { arb, small, mid, whale } = q;
      await vote(q, 1, true, small.slice(0, 3)); // 3 ETH
      const tx = await vote(q, 1, false, [whale, mid, small[3]]); // 9 ETH
      const ordered = sortByAddress([whale, mid, small[3]]);
      await expect(tx).to.emit(arb, "DisputeResolved").withArgs(1, false, ordered.map((v) => v.address), 0);
      const weightOf = (v) => (v === whale ? 6n * ETH : v === mid ? 2n * ETH : ETH);
      expect(await eventsOf(tx, arb, "VoteCast")).to.deep.equal(ordered.map((v) => [1n, v.address, false, weightOf(v)]));
      // the non-miner half of the bond is split 6 : 2 : 1 by recorded weight; the dust goes to the miner
      const pool = P.minBond - (P.minBond * BigInt(P.minerBondShareBps)) / BPS;
      const [toWhale, toMid, toSmall] = byWeight(pool, [6n * ETH, 2n * ETH, ETH]);
      expect([toWhale, toMid, toSmall]).to.deep.equal([33333333333333333n, 11111111111111111n, 5555555555555555n]);
      const toMiner = P.minBond - toWhale - toMid - toSmall;
      expect(toMiner).to.equal(P.minBond / 2n + 1n);
      await expectWithdrawable(q, [[q.miner, toMiner], [whale, toWhale], [mid, toMid], [small[3], toSmall]]);
      await expectMiner(q, P.minStake, COLL4);
      await expectSolvent(q);
    });
  });

  describe("expireDispute", function () {
    it("after the timeout: no fault, bond back to the opener, shard proceeds", async function () {
      const q = await load(disputed);
      const { arb, task, client, miner, taskId } = q;
      const d = await arb.getDispute(1);
      await expect(arb.expireDispute(1)).to.be.revertedWithCustomError(arb, "DisputeNotExpired").withArgs(d.deadline);
      await nextAt(d.deadline - 1n);
      await expect(arb.expireDispute(1)).to.be.revertedWithCustomError(arb, "DisputeNotExpired").withArgs(d.deadline);
      await nextAt(d.deadline);
      const tx = await arb.connect(q.outsider).expireDispute(1);
      await expect(tx).to.emit(arb, "DisputeExpired").withArgs(1);
      await expect(tx).to.emit(task, "ShardDisputeResolved").withArgs(taskId, 0, false);
      await expectWithdrawable(q, [[client, P.minBond]]);
      await expectSolvent(q);
      expect((await arb.getDispute(1)).status).to.equal(D.Expired);
      const s = await task.getShard(taskId, 0);
      expect([s.state, s.windowEnd]).to.deep.equal([S.Submitted, d.deadline]);
      await task.finalizeShard(taskId, 0);
      await expectWithdrawable(q, [[miner, TOKENS * PRICE], [client, P.minBond + BUDGET4 - TOKENS * PRICE]]);
      await expectMiner(q, P.minStake, 0n);
      await expect(arb.expireDispute(1)).to.be.revertedWithCustomError(arb, "DisputeNotOpen").withArgs(D.Expired);
      await expect(arb.expireDispute(5)).to.be.revertedWithCustomError(arb, "UnknownDispute").withArgs(5);
    });
  });

  describe("reportAbsence", function () {
    /** Dispute 1 opened by the arbiter; a votes fault, b no fault; expired. */
    async function expiredWithTwoVotes() {
      const q = await submitted();
      await open(q, 2, { from: q.arbiter });
      const [a, b, c, d] = sortByAddress(q.verifiers);
      await vote(q, 1, true, [a]);
      await vote(q, 1, false, [b]);
      await time.increaseTo((await q.arb.getDispute(1)).deadline);
      await q.arb.expireDispute(1);
      return { ...q, a, b, c, d };
    }

    it("absent members lose their seat at the next boundary, get a strike and 10% of stake is burned (no opener can farm it)", async function () {
      const q = await load(expiredWithTwoVotes);
      const { arb, committee, arbiter, a, b, c, d } = q;
      const committeeBal = await balance(committee);
      const tx = await arb.connect(q.outsider).reportAbsence(1, [c.address, d.address]);
      const at = (await committee.currentEpoch({ blockTag: await blockOf(tx) })) + 1n;
      expect(await eventsOf(tx, arb, "AbsenceReported")).to.deep.equal(
        [[1n, c.address, IDLE_SLASH], [1n, d.address, IDLE_SLASH]]);
      expect(await eventsOf(tx, committee, "AbsencePenalized")).to.deep.equal(
        [[c.address, 1n, IDLE_SLASH, BURN], [d.address, 1n, IDLE_SLASH, BURN]]);
      for (const v of [c, d]) {
        const info = await committee.verifierInfo(v);
        expect(info.stake).to.equal(P.minVerifierStake - IDLE_SLASH);
        expect(info.weight).to.equal(P.minVerifierStake);
        expect(info.activeUntil).to.equal(at);
        // bonded until every dispute its seat could judge has expired, plus unbonding
        expect(info.withdrawableAt).to.equal((await committee.epochStart(at)) + P.disputeTimeout + P.verifierUnbonding);
        expect(await committee.strikesOf(v)).to.equal(1);
        expect(await arb.ballotOf(1, v)).to.equal(B.Absent);
      }
      for (const v of [a, b]) {
        expect((await committee.verifierInfo(v)).stake).to.equal(P.minVerifierStake);
        expect(await committee.strikesOf(v)).to.equal(0);
      }
      expect(await balance(committee)).to.equal(committeeBal - 2n * IDLE_SLASH);
      // the opener (the arbiter here) got its bond back at expiry, nothing more: the slashes
      // are burned
      await expectWithdrawable(q, [[arbiter, P.minBond]]);
      expect(await q.escrow.withdrawable(BURN)).to.equal(2n * IDLE_SLASH);
      await expectSolvent(q);
      // seated until the boundary, gone after it
      expect(await committee.isMember(c)).to.equal(true);
      await time.increaseTo(await committee.epochStart(at));
      expect(await committee.isMember(c)).to.equal(false);
      expect(await committee.isMember(d)).to.equal(false);
      expect(await committee.members()).to.deep.equal([a.address, b.address]);
    });
    it("voters, outsiders, late joiners and members already reported revert", async function () {
      const q = await load(expiredWithTwoVotes);
      const { arb, committee, a, b, c, d } = q;
      const late = q.signers[12];
      await committee.connect(late).register({ value: P.minVerifierStake });
      await activate(committee);
      await expect(arb.reportAbsence(1, [a])).to.be.revertedWithCustomError(arb, "NotAbsent").withArgs(a.address);
      await expect(arb.reportAbsence(1, [c, b])).to.be.revertedWithCustomError(arb, "NotAbsent").withArgs(b.address);
      await expect(arb.reportAbsence(1, [q.outsider])).to.be.revertedWithCustomError(arb, "NotCommitteeMember").withArgs(q.outsider.address);
      await expect(arb.reportAbsence(1, [late])).to.be.revertedWithCustomError(arb, "NotCommitteeMember").withArgs(late.address);
      await expect(arb.reportAbsence(1, [d, d])).to.be.revertedWithCustomError(arb, "NotAbsent").withArgs(d.address);
      expect(await committee.strikesOf(c)).to.equal(0); // the reverted calls left no trace
      expect(await committee.strikesOf(d)).to.equal(0);
      await arb.reportAbsence(1, [d]);
      await expect(arb.reportAbsence(1, [d])).to.be.revertedWithCustomError(arb, "NotAbsent").withArgs(d.address);
      await expect(arb.reportAbsence(1, [])).not.to.emit(arb, "AbsenceReported");
      await expectWithdrawable(q, [[q.arbiter, P.minBond]]);
      expect(await q.escrow.withdrawable(BURN)).to.equal(IDLE_SLASH);
    });
    it("only on an Expired dispute (DisputeNotExpiredStatus)", async function () {
      const q = await load(disputed);
      const { arb, verifiers } = q;
      const v = sortByAddress(verifiers)[3];
      await expect(arb.reportAbsence(1, [v])).to.be.revertedWithCustomError(arb, "DisputeNotExpiredStatus").withArgs(D.Open);
      await vote(q, 1, true, sortByAddress(verifiers).slice(0, 3));
      await expect(arb.reportAbsence(1, [v]))
        .to.be.revertedWithCustomError(arb, "DisputeNotExpiredStatus").withArgs(D.MinerAtFault);
      await expect(arb.reportAbsence(2, [v])).to.be.revertedWithCustomError(arb, "UnknownDispute").withArgs(2);
      // a no-fault verdict too
      const q2 = await load(disputed);
      await vote(q2, 1, false, sortByAddress(q2.verifiers).slice(0, 3));
      await expect(q2.arb.reportAbsence(1, [v]))
        .to.be.revertedWithCustomError(q2.arb, "DisputeNotExpiredStatus").withArgs(D.MinerNotAtFault);
    });
    it("with strikes allowed the first absence costs the seat only, a later one stake", async function () {
      const q = await load(submitted);
      const { arb, committee, client } = q;
      await committee.setIdlePenalty(1, 1000);
      const res1 = await commit(q, receiptsFor(q.taskId, 1, 4, 8), undefined, 1, q.miner2);
      await open(q, 0); // dispute 1, shard 0
      await open(q, 0, { shard: 1, res: res1 }); // dispute 2, shard 1, same epoch
      await time.increaseTo((await arb.getDispute(2)).deadline);
      await arb.expireDispute(1);
      await arb.expireDispute(2);
      const v = q.verifiers[0];
      await expect(arb.reportAbsence(1, [v])).to.emit(committee, "AbsencePenalized").withArgs(v.address, 1, 0, BURN);
      const until = (await committee.verifierInfo(v)).activeUntil;
      expect((await committee.verifierInfo(v)).stake).to.equal(P.minVerifierStake);
      await expect(arb.reportAbsence(2, [v])).to.emit(arb, "AbsenceReported").withArgs(2, v.address, IDLE_SLASH);
      const info = await committee.verifierInfo(v);
      expect([info.stake, info.activeUntil]).to.deep.equal([P.minVerifierStake - IDLE_SLASH, until]);
      expect(await committee.strikesOf(v)).to.equal(2);
      await expectWithdrawable(q, [[client, 2n * P.minBond]]);
      expect(await q.escrow.withdrawable(BURN)).to.equal(IDLE_SLASH);
      await expectSolvent(q);
    });
    it("a member partly slashed for absence votes with what is left of its stake; rewards follow the recorded weights", async function () {
      const q = await load(submitted);
      const { arb, committee, client, miner2 } = q;
      const [a, b, c] = sortByAddress(q.verifiers);
      await open(q, 0); // dispute 1, shard 0
      const d1 = await arb.getDispute(1);
      // miner2 submits shard 1 late enough that its window outlasts dispute 1
      await time.increaseTo(d1.deadline - 100n);
      const res1 = await commit(q, receiptsFor(q.taskId, 1, 4, 8), undefined, 1, miner2);
      await time.increaseTo(d1.deadline);
      await arb.expireDispute(1);
      // at the start of an epoch (shard 1's window is still open), c is reported and dispute 2
      // opens in the same epoch: c still sits in its snapshot, with 0.9 ETH
      await time.increaseTo(await committee.epochStart((await committee.currentEpoch()) + 1n));
      const rtx = await arb.reportAbsence(1, [c]);
      expect((await committee.verifierInfo(c)).stake).to.equal(P.minVerifierStake - IDLE_SLASH);
      expect((await committee.verifierInfo(c)).activeUntil)
        .to.equal((await committee.currentEpoch({ blockTag: await blockOf(rtx) })) + 1n);
      await open(q, 0, { shard: 1, res: res1 });
      const d2 = await arb.getDispute(2);
      expect(d2.totalWeight).to.equal(4n * ETH);
      expect(await committee.weightAt(c, d2.epoch)).to.equal(ETH - IDLE_SLASH);
      const tx = await vote(q, 2, true, [a, b, c]); // 2.9 of 4 ETH
      expect(await eventsOf(tx, arb, "VoteCast")).to.deep.equal(
        [[2n, a.address, true, ETH], [2n, b.address, true, ETH], [2n, c.address, true, ETH - IDLE_SLASH]]);
      await expect(tx).to.emit(arb, "DisputeResolved").withArgs(2, true, [a.address, b.address, c.address], SLASH4);
      const [toA, toB, toC] = byWeight(REWARD4, [ETH, ETH, ETH - IDLE_SLASH]);
      expect([toA, toB, toC]).to.deep.equal([13793103448n, 13793103448n, 12413793103n]);
      const toClient = BUDGET4 + SLASH4 - toA - toB - toC;
      await expectWithdrawable(q, [[client, P.minBond + P.minBond + toClient], [a, toA], [b, toB], [c, toC]]);
      expect(await q.escrow.withdrawable(BURN)).to.equal(IDLE_SLASH);
      await expectMiner(q, P.minStake - SLASH4, 0n, miner2);
      await expectMiner(q, P.minStake, COLL4); // shard 0 waits to be finalized
      await expectSolvent(q);
    });
    it("an absent member that asks to leave cannot withdraw before the dispute expires: reported, 10% of its stake is burned", async function () {
      // The escape of the first round: with unbonding (100 s) below the dispute timeout (600 s),
      // a member that requested exit after the dispute opened withdrew before it expired and
      // could no longer be reported. Its stake now stays bonded until epochStart(activeUntil) +
      // disputeTimeout + unbondingPeriod.
      const q = await load(disputed);
      const { arb, committee, client } = q;
      const quitter = sortByAddress(q.verifiers)[3];
      const d = await arb.getDispute(1);
      const tx = await committee.connect(quitter).requestExit();
      const at = (await committee.currentEpoch({ blockTag: await blockOf(tx) })) + 1n;
      const wAt = (await committee.epochStart(at)) + P.disputeTimeout + P.verifierUnbonding;
      await expect(tx).to.emit(committee, "VerifierExitRequested").withArgs(quitter.address, at, wAt);
      expect(wAt).to.be.greaterThan(d.deadline);
      // where the old rule released the stake, and at the deadline: still bonded
      await nextAt((await committee.epochStart(at)) + P.verifierUnbonding);
      await expect(committee.connect(quitter).withdrawStake())
        .to.be.revertedWithCustomError(committee, "UnbondingNotOver").withArgs(wAt);
      await nextAt(d.deadline);
      await expect(committee.connect(quitter).withdrawStake())
        .to.be.revertedWithCustomError(committee, "UnbondingNotOver").withArgs(wAt);
      await arb.expireDispute(1);
      await expect(arb.reportAbsence(1, [quitter])).to.emit(arb, "AbsenceReported").withArgs(1, quitter.address, IDLE_SLASH)
        .and.to.emit(committee, "AbsencePenalized").withArgs(quitter.address, 1, IDLE_SLASH, BURN);
      const info = await committee.verifierInfo(quitter);
      expect([info.stake, info.activeUntil, info.withdrawableAt]).to.deep.equal([P.minVerifierStake - IDLE_SLASH, at, wAt]);
      await expectWithdrawable(q, [[client, P.minBond]]);
      expect(await q.escrow.withdrawable(BURN)).to.equal(IDLE_SLASH);
      await expectSolvent(q);
      // at wAt it gets back what is left, to the wei
      await nextAt(wAt - 1n);
      await expect(committee.connect(quitter).withdrawStake())
        .to.be.revertedWithCustomError(committee, "UnbondingNotOver").withArgs(wAt);
      await nextAt(wAt);
      const before = await balance(quitter);
      const wtx = await committee.connect(quitter).withdrawStake();
      await expect(wtx).to.emit(committee, "VerifierStakeWithdrawn").withArgs(quitter.address, P.minVerifierStake - IDLE_SLASH);
      expect((await balance(quitter)) - before + (await gasCost(wtx))).to.equal(P.minVerifierStake - IDLE_SLASH);
    });
  });

  describe("issue 29 gap 6: an honest participant's downtime pays no one", function () {
    it("ATTACK fails: a client that challenges an offline honest miner is made whole, nothing more; the collateral is burned", async function () {
      // the miner published an honest result, then went offline for the whole response window
      const q = await load(submitted);
      const { arb, gpu, escrow, client, miner, taskId } = q;
      const wallet0 = await balance(client);
      const gpuBal = await balance(gpu);
      let gas = await gasCost(await challenge(q, 2));
      await time.increase(P.responseWindow);
      const stx = await arb.connect(client).settleUnanswered(1);
      gas += await gasCost(stx);
      await expect(stx).to.emit(gpu, "Slashed").withArgs(miner.address, SLASH4, BURN, await arb.getAddress());
      // credited: the shard's own budget and the bond, not a wei of the miner's collateral
      await expectWithdrawable(q, [[client, BUDGET4 + P.minAvailabilityBond]]);
      expect(await escrow.withdrawable(BURN)).to.equal(SLASH4);
      gas += await gasCost(await escrow.connect(client).withdraw());
      // the client's wallet: the budget it had paid for this shard back, minus its gas
      expect(await balance(client)).to.equal(wallet0 + BUDGET4 - gas);
      await expectMiner(q, P.minStake - SLASH4, 0n);
      expect(await balance(gpu)).to.equal(gpuBal - SLASH4);
      expect(await escrow.withdrawable(miner)).to.equal(0n);
      await expectSolvent(q);
    });
    it("ATTACK fails: an opener that lets a dispute expire while the whole committee is down gains nothing from reporting it", async function () {
      // the four members (1 ETH each) are down for maintenance; the client opens a dispute on an
      // honest shard, waits out the timeout and reports every member absent
      const q = await load(submitted);
      const { arb, committee, escrow, client } = q;
      const wallet0 = await balance(client);
      const committeeBal = await balance(committee);
      let gas = await gasCost(await open(q, 2));
      await time.increaseTo((await arb.getDispute(1)).deadline);
      gas += await gasCost(await arb.connect(client).expireDispute(1));
      const rtx = await arb.connect(client).reportAbsence(1, q.verifiers.map((v) => v.address));
      gas += await gasCost(rtx);
      expect(await eventsOf(rtx, committee, "AbsencePenalized")).to.deep.equal(
        q.verifiers.map((v) => [v.address, 1n, IDLE_SLASH, BURN]));
      await expectWithdrawable(q, [[client, P.minBond]]); // its own bond back, nothing more
      expect(await escrow.withdrawable(BURN)).to.equal(4n * IDLE_SLASH);
      gas += await gasCost(await escrow.connect(client).withdraw());
      expect(await balance(client)).to.equal(wallet0 - gas);
      expect(await balance(committee)).to.equal(committeeBal - 4n * IDLE_SLASH);
      for (const v of q.verifiers) expect((await committee.verifierInfo(v)).stake).to.equal(P.minVerifierStake - IDLE_SLASH);
      await expectSolvent(q);
    });
  });

  describe("availability challenges (gap 1)", function () {
    it("without a challenge, a shard that published nothing is paid in full (the attack)", async function () {
      const q = await load(withheld);
      const s = await q.task.getShard(q.taskId, 0);
      expect(s.tokensUsed).to.equal(4n * MAX_TOKENS);
      await time.increaseTo(s.windowEnd);
      await q.task.finalizeShard(q.taskId, 0);
      await expectWithdrawable(q, [[q.miner, BUDGET4]]);
    });
    it("ATTACK closed: the unanswered challenge refunds the client, slashes the miner (burned) and pays it nothing", async function () {
      const q = await load(withheld);
      const { arb, task, gpu, escrow, client, miner, outsider, taskId, payment } = q;
      const gpuBal = await balance(gpu);
      const tx = await challenge(q, 1);
      const now = await stampOf(tx);
      const deadline = now + P.responseWindow;
      await expect(tx).to.emit(arb, "AvailabilityChallenged")
        .withArgs(1, taskId, 0, 1, client.address, miner.address, P.minAvailabilityBond, deadline);
      await expect(tx).to.emit(task, "ShardDisputed").withArgs(taskId, 0);
      const c = await arb.getChallenge(1);
      expect([c.taskId, c.shard, c.index, c.status, c.challenger, c.miner, c.bond, c.openedAt, c.deadline]).to.deep.equal(
        [taskId, 0n, 1n, C.Open, client.address, miner.address, P.minAvailabilityBond, now, deadline]);
      expect(await arb.challengeCount()).to.equal(1);
      expect(await arb.availabilityChallengesOf(taskId, 0, client)).to.equal(1);
      await expectSolvent(q, P.minAvailabilityBond);
      // the miner cannot finalize, even once its window is over
      const { windowEnd } = await task.getShard(taskId, 0);
      expect(windowEnd).to.be.greaterThan(deadline);
      await time.increaseTo(windowEnd);
      await expect(task.finalizeShard(taskId, 0)).to.be.revertedWithCustomError(task, "DisputeOpen");
      // nobody answered: anyone settles
      const stx = await arb.connect(outsider).settleUnanswered(1);
      await expect(stx).to.emit(arb, "AvailabilityUnanswered").withArgs(1, taskId, 0, SLASH4);
      await expect(stx).to.emit(task, "ShardDisputeResolved").withArgs(taskId, 0, true);
      await expect(stx).to.emit(task, "ShardRefunded").withArgs(taskId, 0, BUDGET4);
      await expect(stx).to.emit(gpu, "Slashed").withArgs(miner.address, SLASH4, BURN, await arb.getAddress());
      // the client is made whole (budget and bond), nothing more: the collateral is burned
      await expectWithdrawable(q, [[client, BUDGET4 + P.minAvailabilityBond]]);
      expect(await escrow.withdrawable(BURN)).to.equal(SLASH4);
      await expectMiner(q, P.minStake - SLASH4, 0n);
      expect(await balance(gpu)).to.equal(gpuBal - SLASH4);
      expect(await escrow.escrowed(taskId)).to.equal(payment - BUDGET4);
      expect((await task.getTask(taskId)).committed).to.equal(0);
      await expectSolvent(q);
      expect((await task.getShard(taskId, 0)).state).to.equal(S.Refunded);
      expect((await arb.getChallenge(1)).status).to.equal(C.Unanswered);
      await expect(task.finalizeShard(taskId, 0)).to.be.revertedWithCustomError(task, "ShardNotSubmitted").withArgs(S.Refunded);
      await expect(arb.settleUnanswered(1)).to.be.revertedWithCustomError(arb, "ChallengeNotOpen").withArgs(C.Unanswered);
      await expect(answer(q, 1, 0, { receipt: receiptsFor(taskId, 0, 1, 2)[0], proof: [] }))
        .to.be.revertedWithCustomError(arb, "ChallengeNotOpen").withArgs(C.Unanswered);
    });
    it("an honest answer: bond to the miner, receipt and proof in the event, window extended by the challenge's duration", async function () {
      const q = await load(submitted);
      const { arb, task, client, miner, taskId, res } = q;
      const before = await task.getShard(taskId, 0);
      const openedAt = await stampOf(await challenge(q, 2));
      await time.increase(30);
      const tx = await answer(q, 1, 2);
      const answeredAt = await stampOf(tx);
      const windowEnd = before.windowEnd + (answeredAt - openedAt);
      expect(windowEnd).to.be.greaterThan(answeredAt + P.responseWindow); // the extension, not the floor
      await expect(tx).to.emit(arb, "AvailabilityAnswered")
        .withArgs(1, taskId, 0, 2, receiptTuple(res.receipts[2]), proofTuple(res.proofOf(2)), windowEnd);
      await expect(tx).to.emit(task, "ShardDisputeResolved").withArgs(taskId, 0, false);
      const s = await task.getShard(taskId, 0);
      expect([s.state, s.windowEnd]).to.deep.equal([S.Submitted, windowEnd]);
      expect((await arb.getChallenge(1)).status).to.equal(C.Answered);
      await expectWithdrawable(q, [[miner, P.minAvailabilityBond]]);
      await expectMiner(q, P.minStake, COLL4);
      await expectSolvent(q);
      await expect(arb.settleUnanswered(1)).to.be.revertedWithCustomError(arb, "ChallengeNotOpen").withArgs(C.Answered);
      await expect(answer(q, 1, 2)).to.be.revertedWithCustomError(arb, "ChallengeNotOpen").withArgs(C.Answered);
      // the client disputes the receipt it now holds, taken from the event
      const [ev] = await eventsOf(tx, arb, "AvailabilityAnswered");
      const receipt = Object.fromEntries(Object.keys(res.receipts[2]).map((k) => [k, ev.receipt[k]]));
      const proof = ev.proof.map((n) => ({ hash: n.hash, sum: n.sum }));
      await arb.connect(client).openDispute(taskId, 0, receipt, proof, "store://evidence", { value: P.minBond });
      await vote(q, 1, true, q.verifiers);
      const { each, toClient } = faultSplit(4);
      await expectWithdrawable(q, [
        [miner, P.minAvailabilityBond], [client, toClient + P.minBond], ...q.verifiers.map((v) => [v, each])]);
      await expectMiner(q, P.minStake - SLASH4, 0n);
      await expectSolvent(q);
    });
    it("an answer late in the window leaves at least responseWindow to dispute", async function () {
      const q = await load(submitted);
      const { arb, task, taskId } = q;
      const before = await task.getShard(taskId, 0);
      await time.increaseTo(before.windowEnd - 20n);
      const openedAt = await stampOf(await challenge(q, 0));
      const answeredAt = await stampOf(await answer(q, 1, 0));
      const windowEnd = answeredAt + P.responseWindow;
      expect(before.windowEnd + (answeredAt - openedAt)).to.be.lessThan(windowEnd); // the floor
      expect((await task.getShard(taskId, 0)).windowEnd).to.equal(windowEnd);
      await expect(task.finalizeShard(taskId, 0)).to.be.revertedWithCustomError(task, "WindowNotClosed").withArgs(windowEnd);
      await time.increaseTo(windowEnd - 2n);
      await expect(open(q, 0)).to.emit(arb, "DisputeOpened");
    });
    it("anyone may answer; the bond still goes to the miner", async function () {
      const q = await load(submitted);
      await challenge(q, 3, { from: q.arbiter });
      await expect(answer(q, 1, 3, { from: q.outsider })).to.emit(q.arb, "AvailabilityAnswered");
      await expectWithdrawable(q, [[q.miner, P.minAvailabilityBond]]);
      await expectSolvent(q);
    });
    it("answers with a wrong index, receipt or proof revert; the response window is exact", async function () {
      const q = await load(submitted);
      const { arb, res } = q;
      const deadline = (await stampOf(await challenge(q, 2))) + P.responseWindow;
      const r = res.receipts[2];
      const p = res.proofOf(2);
      await expect(answer(q, 1, 1)).to.be.revertedWithCustomError(arb, "ReceiptMismatch");
      await expect(answer(q, 1, 2, { receipt: { ...r, modelId: OTHER_MODEL } })).to.be.revertedWithCustomError(arb, "ReceiptMismatch");
      await expect(answer(q, 1, 2, { receipt: { ...r, taskId: 9 } })).to.be.revertedWithCustomError(arb, "ReceiptMismatch");
      await expect(answer(q, 1, 2, { receipt: { ...r, outputTokens: 101 } }))
        .to.be.revertedWithCustomError(arb, "TooManyOutputTokens").withArgs(MAX_TOKENS, 101);
      await expect(answer(q, 1, 2, { receipt: { ...r, outputHash: ethers.id("forged") } }))
        .to.be.revertedWithCustomError(arb, "InvalidProof");
      for (const proof of [res.proofOf(1), p.slice(1), [...p, p[0]], []]) {
        await expect(answer(q, 1, 2, { proof })).to.be.revertedWithCustomError(arb, "InvalidProof");
      }
      await expect(answer(q, 7, 2)).to.be.revertedWithCustomError(arb, "UnknownChallenge").withArgs(7);
      await expect(arb.settleUnanswered(7)).to.be.revertedWithCustomError(arb, "UnknownChallenge").withArgs(7);
      await nextAt(deadline - 1n);
      await expect(arb.settleUnanswered(1)).to.be.revertedWithCustomError(arb, "ResponseWindowOpen").withArgs(deadline);
      await nextAt(deadline);
      await expect(answer(q, 1, 2)).to.be.revertedWithCustomError(arb, "ResponseWindowClosed").withArgs(deadline);
      await arb.settleUnanswered(1);
      await expectWithdrawable(q, [[q.client, BUDGET4 + P.minAvailabilityBond]]);
      expect(await q.escrow.withdrawable(BURN)).to.equal(SLASH4);
    });
    it("the last second before the deadline still answers; settling at the deadline works", async function () {
      const q = await load(submitted);
      const deadline = (await stampOf(await challenge(q, 2))) + P.responseWindow;
      await nextAt(deadline - 1n);
      await expect(answer(q, 1, 2)).to.emit(q.arb, "AvailabilityAnswered");
      const deadline2 = (await stampOf(await challenge(q, 3))) + P.responseWindow;
      await nextAt(deadline2);
      await expect(q.arb.settleUnanswered(2)).to.emit(q.arb, "AvailabilityUnanswered").withArgs(2, q.taskId, 0, SLASH4);
      await expectWithdrawable(q, [[q.miner, P.minAvailabilityBond], [q.client, BUDGET4 + P.minAvailabilityBond]]);
      expect(await q.escrow.withdrawable(BURN)).to.equal(SLASH4);
    });
    it("client, arbiter or auditor only, with at least the minimum bond, on a request of the shard", async function () {
      const q = await load(submitted);
      const { arb, client } = q;
      for (const who of [q.outsider, q.miner]) {
        await expect(challenge(q, 0, { from: who })).to.be.revertedWithCustomError(arb, "NotClientArbiterOrAuditor").withArgs(who.address);
      }
      await expect(challenge(q, 0, { value: P.minAvailabilityBond - 1n }))
        .to.be.revertedWithCustomError(arb, "InsufficientBond").withArgs(P.minAvailabilityBond, P.minAvailabilityBond - 1n);
      await expect(challenge(q, 0, { value: 0n }))
        .to.be.revertedWithCustomError(arb, "InsufficientBond").withArgs(P.minAvailabilityBond, 0);
      await expect(challenge(q, 4)).to.be.revertedWithCustomError(arb, "IndexNotInShard").withArgs(4, 0, 4);
      await expect(challenge(q, 100)).to.be.revertedWithCustomError(arb, "IndexNotInShard").withArgs(100, 0, 4);
      await expect(challenge(q, 0, { shard: 1 })).to.be.revertedWithCustomError(arb, "ShardNotSubmitted").withArgs(S.Open);
      // the arbiter challenges; unanswered, its bond returns to it, the budget to the client and
      // the slash is burned
      await challenge(q, 3, { from: q.arbiter, value: 2n * P.minAvailabilityBond });
      await expect(challenge(q, 0)).to.be.revertedWithCustomError(arb, "ShardNotSubmitted").withArgs(S.Disputed);
      await expect(open(q, 0)).to.be.revertedWithCustomError(arb, "ShardNotSubmitted").withArgs(S.Disputed);
      await time.increase(P.responseWindow);
      await arb.settleUnanswered(1);
      await expectWithdrawable(q, [[q.arbiter, 2n * P.minAvailabilityBond], [client, BUDGET4]]);
      expect(await q.escrow.withdrawable(BURN)).to.equal(SLASH4);
      await expectSolvent(q);
    });
    it("only inside the challenge window", async function () {
      const q = await load(submitted);
      const { windowEnd } = await q.task.getShard(q.taskId, 0);
      await nextAt(windowEnd);
      await expect(challenge(q, 0)).to.be.revertedWithCustomError(q.arb, "OutsideWindow").withArgs(windowEnd);
    });
    it("at most three challenges per shard and challenger (TooManyChallenges); others keep their own; an ordinary dispute stays possible", async function () {
      const q = await load(submitted);
      let id = 0;
      const auditor = q.verifiers[0];
      for (const who of [q.client, q.arbiter, auditor]) {
        for (let round = 1; round <= 3; round++) {
          await challenge(q, round, { from: who });
          await answer(q, ++id, round);
        }
        expect(await q.arb.availabilityChallengesOf(q.taskId, 0, who)).to.equal(3);
        await expect(challenge(q, 0, { from: who })).to.be.revertedWithCustomError(q.arb, "TooManyChallenges").withArgs(3);
      }
      expect(await q.arb.availabilityChallengesOf(q.taskId, 0, q.verifiers[1])).to.equal(0);
      await expectWithdrawable(q, [[q.miner, 9n * P.minAvailabilityBond]]);
      await expect(open(q, 0)).to.emit(q.arb, "DisputeOpened");
    });
    it("an honest miner's answer costs less gas than the bond it receives", async function () {
      // a 128-request shard: a 7-node proof
      const q0 = await load(deployQuarry);
      const { taskId } = await createTask(q0.task, q0.client, { numRequests: 128, shardSize: 128 });
      const q = { ...q0, taskId };
      const res = await commit(q, receiptsFor(taskId, 0, 0, 128));
      await challenge(q, 77);
      expect(res.proofOf(77).length).to.equal(7);
      const before = await balance(q.miner);
      const tx = await answer(q, 1, 77, { res });
      const rc = await tx.wait();
      const cost = rc.gasUsed * rc.gasPrice;
      expect(cost).to.equal(await gasCost(tx));
      expect(cost).to.be.lessThan(P.minAvailabilityBond);
      // and at 100 gwei too
      expect(rc.gasUsed * ethers.parseUnits("100", "gwei")).to.be.lessThan(P.minAvailabilityBond);
      const wtx = await q.escrow.connect(q.miner).withdraw();
      const net = (await balance(q.miner)) - before;
      expect(net).to.equal(P.minAvailabilityBond - cost - (await gasCost(wtx)));
      expect(net).to.be.greaterThan(0n);
    });
  });

  describe("provable billing (gap 2)", function () {
    it("tokensUsed above what the receipts sum to: no receipt is provable, so the availability challenge is lost", async function () {
      const q = await load(inflated);
      const { arb, task, taskId, res } = q;
      expect(res.total).to.equal(TOKENS);
      expect((await task.getShard(taskId, 0)).tokensUsed).to.equal(TOKENS + 5n);
      for (let k = 0; k < 4; k++) {
        expect(await arb.proves(taskId, 0, res.receipts[k], res.proofOf(k))).to.equal(false);
        await expect(open(q, k)).to.be.revertedWithCustomError(arb, "InvalidProof");
      }
      // a sibling sum raised by the excess fixes the root sum but breaks the root hash
      const p = res.proofOf(0);
      const forged = [p[0], { ...p[1], sum: p[1].sum + 5n }];
      expect(await arb.proves(taskId, 0, res.receipts[0], forged)).to.equal(false);
      await challenge(q, 0);
      for (const proof of [p, forged]) {
        await expect(answer(q, 1, 0, { proof })).to.be.revertedWithCustomError(arb, "InvalidProof");
      }
      await time.increase(P.responseWindow);
      await expect(arb.settleUnanswered(1)).to.emit(arb, "AvailabilityUnanswered").withArgs(1, taskId, 0, SLASH4);
      await expectWithdrawable(q, [[q.client, BUDGET4 + P.minAvailabilityBond]]);
      expect(await q.escrow.withdrawable(BURN)).to.equal(SLASH4);
      await expectMiner(q, P.minStake - SLASH4, 0n);
      await expectSolvent(q);
    });
    it("proveBillingFault: a receipt over maxTokensPerRequest is a fault at once, to the wei", async function () {
      const q = await load(overCap);
      const { arb, gpu } = q;
      const gpuBal = await balance(gpu);
      await expectBillingFaultSettled(q, await prove(q, 1, null, []), 1, gpuBal);
      await expect(prove(q, 1, null, [])).to.be.revertedWithCustomError(arb, "ShardNotSubmitted").withArgs(S.Refunded);
    });
    it("proveBillingFault with token ids: the right count is NoBillingFault, ids off the outputHash OutputHashMismatch, a wrong count a fault", async function () {
      const q = await load(withTokenIds);
      const { arb, client, arbiter, taskId } = q;
      await expect(prove(q, 0, OUT[0].text, OUT[0].ids)).to.be.revertedWithCustomError(arb, "NoBillingFault");
      await expect(prove(q, 2, OUT[2].text, OUT[2].ids.slice(0, 6))).to.be.revertedWithCustomError(arb, "OutputHashMismatch");
      await expect(prove(q, 2, "hello world!", OUT[2].ids)).to.be.revertedWithCustomError(arb, "OutputHashMismatch");
      await expect(prove(q, 2, OUT[2].text, [...OUT[2].ids].reverse())).to.be.revertedWithCustomError(arb, "OutputHashMismatch");
      await expect(prove(q, 1, "", [])).to.be.revertedWithCustomError(arb, "OutputHashMismatch");
      // receipt 2 bills 20 tokens for an output of 7: proven by the arbiter, the money goes to the client
      const tx = await prove(q, 2, OUT[2].text, OUT[2].ids, { from: arbiter });
      await expect(tx).to.emit(arb, "BillingFaultProven").withArgs(taskId, 0, 2, arbiter.address, SLASH4);
      await expectWithdrawable(q, [[client, BUDGET4 + SLASH4]]);
      await expectMiner(q, P.minStake - SLASH4, 0n);
      await expectSolvent(q);
    });
    it("proveBillingFault: under-billing (3 tokens billed for an output of 4) is no fault (NoBillingFault); nothing moves", async function () {
      // The attack of the first round: a client slashed a miner that billed it less than it got.
      const q = await load(withTokenIds);
      const { arb, task, client, arbiter, taskId } = q;
      expect([OUT[3].bills, OUT[3].ids.length]).to.deep.equal([3, 4]);
      const before = await task.getShard(taskId, 0);
      await expect(prove(q, 3, OUT[3].text, OUT[3].ids)).to.be.revertedWithCustomError(arb, "NoBillingFault");
      await expect(prove(q, 3, OUT[3].text, OUT[3].ids, { from: arbiter })).to.be.revertedWithCustomError(arb, "NoBillingFault");
      const after = await task.getShard(taskId, 0);
      expect([after.state, after.windowEnd]).to.deep.equal([S.Submitted, before.windowEnd]);
      await expectWithdrawable(q, []);
      await expectMiner(q, P.minStake, COLL4);
      await expectSolvent(q);
      expect(await q.escrow.withdrawable(client)).to.equal(0);
    });
    it("limit: an expired dispute closes the shard's window, so an over-billing not proven before it can no longer be proven", async function () {
      const q = await load(overCap);
      await open(q, 0);
      const d = await q.arb.getDispute(1);
      await nextAt(d.deadline);
      await q.arb.expireDispute(1);
      const { windowEnd } = await q.task.getShard(q.taskId, 0);
      expect(windowEnd).to.equal(d.deadline);
      await expect(prove(q, 1, null, [])).to.be.revertedWithCustomError(q.arb, "OutsideWindow").withArgs(windowEnd);
      await expect(challenge(q, 1)).to.be.revertedWithCustomError(q.arb, "OutsideWindow").withArgs(windowEnd);
      await q.task.finalizeShard(q.taskId, 0); // the 300-token receipt is paid
      await expectWithdrawable(q, [[q.miner, 390n * PRICE], [q.client, P.minBond + BUDGET4 - 390n * PRICE]]);
    });
    it("proveBillingFault: client or arbiter only, a proven receipt, a Submitted shard inside its window", async function () {
      let q = await load(overCap);
      const { arb, res } = q;
      for (const who of [q.outsider, q.miner]) {
        await expect(prove(q, 1, null, [], { from: who })).to.be.revertedWithCustomError(arb, "NotClientArbiterOrAuditor").withArgs(who.address);
      }
      await expect(prove(q, 1, null, [], { receipt: { ...res.receipts[1], modelId: OTHER_MODEL } }))
        .to.be.revertedWithCustomError(arb, "ReceiptMismatch");
      await expect(prove(q, 1, null, [], { proof: res.proofOf(0) })).to.be.revertedWithCustomError(arb, "InvalidProof");
      await expect(prove(q, 1, null, [], { receipt: { ...res.receipts[1], outputTokens: 400 } }))
        .to.be.revertedWithCustomError(arb, "InvalidProof"); // an unproven over-cap receipt proves nothing
      await open(q, 0);
      await expect(prove(q, 1, null, [])).to.be.revertedWithCustomError(arb, "ShardNotSubmitted").withArgs(S.Disputed);
      q = await load(overCap);
      const { windowEnd } = await q.task.getShard(q.taskId, 0);
      await nextAt(windowEnd);
      await expect(prove(q, 1, null, [])).to.be.revertedWithCustomError(q.arb, "OutsideWindow").withArgs(windowEnd);
    });
  });

  describe("billing lies in inner nodes and the challenge budget (issue 29, gap 3)", function () {
    const X = 50n; // the lie: leaf 0 billed 10, its parent records 60
    const leavesOf = (receipts) => receipts.map((r) => ({ hash: receiptLeaf(r), sum: BigInt(r.outputTokens) }));
    /** `lies` (LyingSumTree) committed by `miner` over honest receipts of shard 0. */
    async function commitLie(q, lies, miner = q.miner) {
      const receipts = receiptsFor(q.taskId, 0, 0, 4);
      const tree = new LyingSumTree(leavesOf(receipts), lies);
      await q.task.connect(miner).claimShard(q.taskId, 0);
      await q.task.connect(miner).submitResult(q.taskId, 0, tree.root, "store://out", tree.total);
      return { root: tree.root, total: tree.total, receipts, tree, proofOf: (k) => tree.proof(k) };
    }
    /** The miner: it also holds a committee seat (1 ETH), so it is an auditor. */
    async function lyingAuditor() {
      const q = await taskCreated();
      await q.committee.connect(q.miner).register({ value: P.minVerifierStake });
      await activate(q.committee);
      return { ...q, res: await commitLie(q, { "0:1": 10n + X }) };
    }
    async function lying() {
      const q = await taskCreated();
      return { ...q, res: await commitLie(q, { "0:1": 10n + X }) };
    }
    const proveSum = (q, k, over = {}) => q.arb.connect(over.from ?? q.client).proveSumFault(
      q.taskId, 0, over.receipt ?? q.res.receipts[k], over.path ?? q.res.tree.path(k));

    it("the lie: tokensUsed grows by X while every other receipt still proves", async function () {
      const q = await load(lying);
      expect((await q.task.getShard(q.taskId, 0)).tokensUsed).to.equal(TOKENS + X);
      for (let k = 1; k < 4; k++) expect(await q.arb.proves(q.taskId, 0, q.res.receipts[k], q.res.proofOf(k))).to.equal(true);
      expect(await q.arb.proves(q.taskId, 0, q.res.receipts[0], q.res.proofOf(0))).to.equal(false);
      await expect(open(q, 1)).to.emit(q.arb, "DisputeOpened"); // a proven receipt is disputable
    });
    it("ATTACK closed: the miner on the committee spends its own three challenges, not the client's; the client's challenge of the lying leaf wins, to the wei", async function () {
      const q = await load(lyingAuditor);
      const { arb, miner, client, taskId } = q;
      for (let k = 1; k <= 3; k++) {
        await challenge(q, k, { from: miner });
        await answer(q, k, k); // its bonds come back to it
      }
      expect(await arb.availabilityChallengesOf(taskId, 0, miner)).to.equal(3);
      await expect(challenge(q, 1, { from: miner })).to.be.revertedWithCustomError(arb, "TooManyChallenges").withArgs(3);
      expect(await arb.availabilityChallengesOf(taskId, 0, client)).to.equal(0);
      await challenge(q, 0); // was TooManyChallenges(3)
      for (const proof of [q.res.proofOf(0), q.res.proofOf(1)]) {
        await expect(answer(q, 4, 0, { proof })).to.be.revertedWithCustomError(arb, "InvalidProof");
      }
      await time.increase(P.responseWindow);
      await expect(arb.settleUnanswered(4)).to.emit(arb, "AvailabilityUnanswered").withArgs(4, taskId, 0, SLASH4);
      // the slash is burned (gap 6): the client gets back what it put in, no more
      await expectWithdrawable(q, [[miner, 3n * P.minAvailabilityBond], [client, BUDGET4 + P.minAvailabilityBond]]);
      expect(await q.escrow.withdrawable(BURN)).to.equal(SLASH4);
      await expectMiner(q, P.minStake - SLASH4, 0n);
      await expectSolvent(q);
    });
    it("ATTACK closed: proveSumFault proves the inner-node lie from the lying leaf's path at once (O(log n) calldata), to the wei", async function () {
      const q = await load(lying);
      const { arb, gpu, res } = q;
      const path = res.tree.path(0);
      expect(path.length).to.equal(2);
      expect(path[0].sum).to.equal(10n + X);
      expect(findSumLie(0, 4, { hash: receiptLeaf(res.receipts[0]), sum: 10n }, res.total, path))
        .to.deep.equal({ ok: true, root: res.root, lie: true });
      const gpuBal = await balance(gpu);
      await expectBillingFaultSettled(q, await proveSum(q, 0), 0, gpuBal);
      await expect(proveSum(q, 0)).to.be.revertedWithCustomError(arb, "ShardNotSubmitted").withArgs(S.Refunded);
    });
    it("a lie one level up is proven from either leaf below it, by the arbiter or an auditor; leaves outside it show NoBillingFault", async function () {
      for (const [k, who] of [[0, "arbiter"], [1, "auditor"]]) {
        const q = await load(taskCreated);
        q.res = await commitLie(q, { "0:2": 20n + X });
        const from = who === "arbiter" ? q.arbiter : q.verifiers[0];
        for (const j of [2, 3]) await expect(proveSum(q, j, { from })).to.be.revertedWithCustomError(q.arb, "NoBillingFault");
        await expect(proveSum(q, k, { from })).to.emit(q.arb, "BillingFaultProven").withArgs(q.taskId, 0, k, from.address, SLASH4);
        await expectWithdrawable(q, [[q.client, BUDGET4 + SLASH4]]);
        await expectSolvent(q);
      }
    });
    it("an inflated tokensUsed (gap 2) and a lie that moves tokens between leaves are proven too; a sum past 2^256 does not overflow", async function () {
      for (const lies of [{ root: TOKENS + 5n }, { "0:1": 15n, "1:2": 5n }, { "0:1": ethers.MaxUint256, "0:2": 20n }]) {
        const q = await load(taskCreated);
        q.res = await commitLie(q, lies.root ? lies : { ...lies, root: TOKENS });
        await expect(proveSum(q, 1)).to.emit(q.arb, "BillingFaultProven").withArgs(q.taskId, 0, 1, q.client.address, SLASH4);
        await expectWithdrawable(q, [[q.client, BUDGET4 + SLASH4]]);
        await expectMiner(q, P.minStake - SLASH4, 0n);
        await expectSolvent(q);
      }
    });
    it("an honest tree: every path is NoBillingFault; forged sums, short or long paths and strangers revert; nothing moves", async function () {
      const q = await load(submitted);
      const tree = new LyingSumTree(leavesOf(q.res.receipts));
      expect(tree.root).to.equal(q.res.root);
      q.res.tree = tree;
      for (let k = 0; k < 4; k++) await expect(proveSum(q, k)).to.be.revertedWithCustomError(q.arb, "NoBillingFault");
      const p = tree.path(0);
      const forged = [[{ ...p[0], sum: p[0].sum + 1n }, p[1]], [p[0], { ...p[1], siblingSum: p[1].siblingSum + 1n }],
        [p[0]], [...p, p[1]], [], tree.path(1)];
      for (const path of forged) await expect(proveSum(q, 0, { path })).to.be.revertedWithCustomError(q.arb, "InvalidProof");
      await expect(proveSum(q, 0, { receipt: { ...q.res.receipts[0], outputTokens: 9 } })).to.be.revertedWithCustomError(q.arb, "InvalidProof");
      await expect(proveSum(q, 0, { receipt: { ...q.res.receipts[0], modelId: OTHER_MODEL } })).to.be.revertedWithCustomError(q.arb, "ReceiptMismatch");
      for (const who of [q.outsider, q.miner]) {
        await expect(proveSum(q, 0, { from: who })).to.be.revertedWithCustomError(q.arb, "NotClientArbiterOrAuditor").withArgs(who.address);
      }
      await expectWithdrawable(q, []);
      await expectMiner(q, P.minStake, COLL4);
      await expectSolvent(q);
    });
    it("on a 128-request shard the path is 7 steps and the proof costs less than a dispute bond", async function () {
      const q0 = await load(deployQuarry);
      const { taskId } = await createTask(q0.task, q0.client, { numRequests: 128, shardSize: 128 });
      const q = { ...q0, taskId };
      const receipts = receiptsFor(taskId, 0, 0, 128);
      const tree = new LyingSumTree(leavesOf(receipts), { "64:96": 320n + X });
      await q.task.connect(q.miner).claimShard(taskId, 0);
      await q.task.connect(q.miner).submitResult(taskId, 0, tree.root, "store://out", tree.total);
      q.res = { receipts, tree };
      expect(tree.path(77).length).to.equal(7);
      await expect(proveSum(q, 100)).to.be.revertedWithCustomError(q.arb, "NoBillingFault");
      const tx = await proveSum(q, 77);
      await expect(tx).to.emit(q.arb, "BillingFaultProven");
      expect((await tx.wait()).gasUsed).to.be.lessThan(300000n);
    });
  });

  describe("views", function () {
    it("hashVote, domainSeparator and receiptLeaf match ethers and the JS result tree", async function () {
      const q = await load(submitted);
      const { arb, task, res } = q;
      const domain = await domainOf(arb);
      expect(await arb.domainSeparator()).to.equal(ethers.TypedDataEncoder.hashDomain(domain));
      expect(await arb.VOTE_TYPEHASH()).to.equal(ethers.id("Vote(uint256 disputeId,bool minerAtFault)"));
      expect(await arb.hashVote(7, true)).to.equal(
        ethers.TypedDataEncoder.hash(domain, VOTE_TYPES, { disputeId: 7, minerAtFault: true }));
      expect(await arb.hashVote(7, false)).to.not.equal(await arb.hashVote(7, true));
      for (const [k, r] of res.receipts.entries()) {
        expect(await arb.receiptLeaf(r)).to.equal(receiptLeaf(r));
        expect(await arb.receiptLeaf(r)).to.equal(res.tree.leaves[k].hash);
        expect(await task.receiptStructHash(r)).to.equal(receiptStructHash(r));
        expect(await arb.proves(q.taskId, 0, r, res.proofOf(k))).to.equal(true);
      }
      await expect(arb.getDispute(1)).to.be.revertedWithCustomError(arb, "UnknownDispute").withArgs(1);
      await expect(arb.getDispute(0)).to.be.revertedWithCustomError(arb, "UnknownDispute").withArgs(0);
      await expect(arb.getChallenge(1)).to.be.revertedWithCustomError(arb, "UnknownChallenge").withArgs(1);
      await expect(arb.getChallenge(0)).to.be.revertedWithCustomError(arb, "UnknownChallenge").withArgs(0);
      expect(await arb.ballotOf(1, q.verifiers[0])).to.equal(B.None);
      expect(await arb.votersOf(1, true)).to.deep.equal([]);
      expect(await arb.challengeCount()).to.equal(0);
      expect(await arb.disputeCount()).to.equal(0);
    });
  });
});
