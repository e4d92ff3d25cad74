// Issue 32, "no escape before the verdict": a miner's stake stays bonded until every shard it
// took is settled and the committee has reported the epoch after the last settlement (the
// report that carries any fault found on those shards), with a bounded fallback when the
// committee is silent; a miner that leaves untrusted takes the untrusted burn with it.
const { expect } = require("chai");
const { ethers } = require("hardhat");
const { loadFixture, time } = require("@nomicfoundation/hardhat-network-helpers");
const { P, MODEL, PRICE, deployQuarry, createTask, resultTree, signVotes, signReport, gasCost } = require("./helpers");

const BPS = 10000n;
const BURN = "0x000000000000000000000000000000000000dEaD";
const BUDGET4 = 4n * 100n * PRICE; // shard 0 of the default task: 4 requests x 100 tokens
const COLL4 = (BUDGET4 * BigInt(P.collateralBps)) / BPS;

const balance = (a) => ethers.provider.getBalance(a);
const stampOf = async (tx) => BigInt((await ethers.provider.getBlock((await tx.wait()).blockNumber)).timestamp);

async function load() {
  const q = await loadFixture(deployQuarry);
  await ethers.provider.send("evm_setNextBlockTimestamp", [(await time.latest()) + 1]);
  const { taskId } = await createTask(q.task, q.client);
  return { ...q, taskId };
}

/** `miner` claims shard 0 and commits to 4 receipts of 10 tokens; returns the tree. */
async function submit(q, delay = 0) {
  const receipts = [];
  for (let i = 0; i < 4; i++) {
    receipts.push({
      taskId: q.taskId, shard: 0, index: i, requestHash: ethers.id(`req-${i}`), outputHash: ethers.id(`out-${i}`),
      outputTokens: 10, modelId: MODEL, commitment: ethers.ZeroHash,
    });
  }
  const tree = resultTree(receipts);
  await q.task.connect(q.miner).claimShard(q.taskId, 0);
  if (delay) await time.increase(delay);
  await q.task.connect(q.miner).submitResult(q.taskId, 0, tree.root, "store://out", tree.total);
  return { receipts, tree };
}

/** `from` (a client) posts a one-shard task (4 requests x 100 tokens) at `price` wei per token,
 * so its shard's collateral is 200 x `price`; returns its id. */
async function oneShardTask(q, from, price) {
  const { taskId } = await createTask(q.task, from, { numRequests: 4, shardSize: 4, price });
  return taskId;
}

/** The miner claims and submits shard 0 of `taskId` billing request 1 at 101 tokens, over the
 * task's 100 per request: a billing fault anyone may prove; returns the receipts' tree. */
async function submitOverBilled(q, taskId) {
  const receipts = [0, 1, 2, 3].map((i) => ({
    taskId, shard: 0, index: i, requestHash: ethers.id(`self-req-${i}`), outputHash: ethers.id(`self-out-${i}`),
    outputTokens: i === 1 ? 101 : 10, modelId: MODEL, commitment: ethers.ZeroHash,
  }));
  const tree = resultTree(receipts);
  await q.task.connect(q.miner).claimShard(taskId, 0);
  await q.task.connect(q.miner).submitResult(taskId, 0, tree.root, "store://self", tree.total);
  return { receipts, tree };
}

/** `from` proves the over-billed request 1 of `taskId` (submitOverBilled): the shard's whole
 * collateral (faultSlashBps 100%) is slashed to the task's client. */
async function proveOverBilled(q, from, taskId, { receipts, tree }) {
  return q.arb.connect(from).proveBillingFault(taskId, 0, receipts[1], tree.proof(1), ethers.ZeroHash, []);
}

/** What a claim may still lock: free stake less max(10% of the stake, the reserve). */
async function lockable(q, who) {
  const info = await q.gpu.minerInfo(who);
  const tenth = (info.stake * 1000n) / BPS;
  const held = await q.gpu.reserveOf(who);
  return info.stake - info.locked - (held > tenth ? held : tenth);
}

/** The epoch whose report carries a settlement stamped `t`: the next one. */
async function verdictEpochOf(q, t) {
  return (t - (await q.committee.genesisTime())) / P.epochDuration + 1n;
}

/** The committee's report of `epoch` (three of four equal stakes: a quorum). */
async function report(q, epoch, miners, scores) {
  const start = await q.committee.epochStart(epoch);
  if (BigInt(await time.latest()) < start) await time.increaseTo(start);
  const sorted = miners.map((m, i) => [m.address, scores[i]]).sort((x, y) => (BigInt(x[0]) < BigInt(y[0]) ? -1 : 1));
  const r = { epoch, miners: sorted.map((x) => x[0]), scoresBps: sorted.map((x) => x[1]), evidenceRoot: ethers.id(`ev-${epoch}`) };
  const sigs = await signReport(q.committee, q.verifiers.slice(0, 3), r);
  return q.committee.submitReputation(r.epoch, r.miners, r.scoresBps, r.evidenceRoot, sigs);
}

describe("Exit: no escape before the verdict (issue 32)", function () {
  it("ATTACK fails: a cheater exits right after its last submission; an audit dispute appears; its stake stays bonded through the verdict and the report, and leaving untrusted burns 10%, to the wei", async function () {
    const q = await load();
    const { gpu, task, arb, escrow, miner, verifiers } = q;
    const { receipts, tree } = await submit(q);
    // The cheater leaves at once, before anyone has looked at its shard.
    await gpu.connect(miner).requestExit();
    // An auditor (a sitting member) draws the shard and disputes it inside its window.
    await arb.connect(verifiers[0]).openDispute(q.taskId, 0, receipts[1], tree.proof(1), "store://ev", { value: P.minBond });
    await time.increase(P.minerUnbonding);
    await expect(gpu.connect(miner).withdrawStake()).to.be.revertedWithCustomError(gpu, "StakeLocked").withArgs(COLL4);

    // The verdict: at fault, the collateral slashed (faultSlashBps 100%), the budget refunded.
    const vtx = await arb.castVotes(1, true, await signVotes(arb, verifiers, 1, true));
    await expect(vtx).to.emit(task, "ShardDisputeResolved").withArgs(q.taskId, 0, true);
    const stake = P.minStake - COLL4;
    expect((await gpu.minerInfo(miner)).stake).to.equal(stake);
    expect((await gpu.minerInfo(miner)).locked).to.equal(0n);

    // Nothing is locked any more, yet the stake waits for the report that carries the fault.
    const v = await verdictEpochOf(q, await stampOf(vtx));
    const until = await q.committee.epochStart(v + BigInt(await gpu.verdictGraceEpochs()));
    expect(await gpu.verdictWait(miner)).to.deep.equal([v, until]);
    await expect(gpu.connect(miner).withdrawStake()).to.be.revertedWithCustomError(gpu, "VerdictPending").withArgs(v, until);

    // The committee's report of epoch v names the fault: the miner is untrusted (the first
    // untrusted report in a row burns nothing, so that a wrongly judged miner can ask again).
    await expect(report(q, v, [miner], [3000])).to.emit(gpu, "ReputationSet").withArgs(miner.address, 3000);
    expect(await gpu.untrustedReportsOf(miner)).to.equal(1n);
    expect((await gpu.minerInfo(miner)).stake).to.equal(stake);
    expect(await gpu.verdictWait(miner)).to.deep.equal([v, 0n]);

    // Leaving untrusted takes that burn with it: 10% of the stake held when the dispute opened
    // (the reserve, GPURegistry.reserveOf) to BURN, the rest to the miner.
    const burn = (P.minStake * 1000n) / BPS;
    const burnedBefore = await escrow.withdrawable(BURN);
    const before = await balance(miner);
    const wtx = await gpu.connect(miner).withdrawStake();
    await expect(wtx).to.emit(gpu, "Slashed").withArgs(miner.address, burn, BURN, miner.address);
    await expect(wtx).to.emit(gpu, "StakeWithdrawn").withArgs(miner.address, stake - burn);
    expect((await balance(miner)) - before + (await gasCost(wtx))).to.equal(stake - burn);
    expect((await escrow.withdrawable(BURN)) - burnedBefore).to.equal(burn);
    expect(stake - burn).to.equal(ethers.parseEther("0.8999998")); // 1 ETH - 0.0000002 ETH, less 0.1 ETH
    expect(await gpu.isRegistered(miner)).to.equal(false);
    expect(await escrow.withdrawable(miner)).to.equal(0n); // it earned nothing for the shard
  });

  it("ATTACK fails: a captured miner stays and leaves later, or pays for a re-challenge, answers it honestly and leaves trusted: either way the first report's 10% is burned once, to the wei", async function () {
    const q = await load();
    const { gpu, escrow, miner, miner2 } = q;
    const e = await q.committee.currentEpoch();
    await report(q, e, [miner, miner2], [3000, 3000]);
    const burn = (P.minStake * 1000n) / BPS;
    const fee = await gpu.rechallengeFee();
    const burnedBefore = await escrow.withdrawable(BURN);
    // miner2 pays to be challenged again: the fee and the first report's burn, then passes.
    await expect(gpu.connect(miner2).requestRechallenge({ value: fee }))
      .to.emit(gpu, "Slashed").withArgs(miner2.address, burn, BURN, miner2.address);
    await report(q, e + 1n, [miner2], [5000]);
    expect(await gpu.untrustedReportsOf(miner2)).to.equal(0n);
    for (const m of [miner, miner2]) await gpu.connect(m).requestExit();
    await time.increase(P.minerUnbonding);
    await expect(gpu.connect(miner).withdrawStake()).to.emit(gpu, "StakeWithdrawn").withArgs(miner.address, P.minStake - burn);
    await expect(gpu.connect(miner2).withdrawStake()).to.emit(gpu, "StakeWithdrawn").withArgs(miner2.address, P.minStake - burn)
      .and.not.to.emit(gpu, "Slashed"); // paid once, at the re-challenge
    expect((await escrow.withdrawable(BURN)) - burnedBefore).to.equal(2n * burn + fee);
  });

  it("an honest slow miner (submits near its claim's expiry) exits with its whole stake and pay once the verdict epoch is reported, to the wei", async function () {
    const q = await load();
    const { gpu, task, escrow, miner } = q;
    await submit(q, P.claimTimeout - 5n); // slow, not late
    await gpu.connect(miner).requestExit();
    await time.increase(P.challengeWindow);
    const ftx = await task.finalizeShard(q.taskId, 0);
    const pay = 40n * PRICE;
    expect(await escrow.withdrawable(miner)).to.equal(pay);
    const v = await verdictEpochOf(q, await stampOf(ftx));
    const until = await q.committee.epochStart(v + BigInt(await gpu.verdictGraceEpochs()));
    await expect(gpu.connect(miner).withdrawStake()).to.be.revertedWithCustomError(gpu, "VerdictPending").withArgs(v, until);
    // The report of epoch v names nobody (no fault was found): the stake is free.
    await report(q, v, [], []);
    const before = await balance(miner);
    const wtx = await gpu.connect(miner).withdrawStake();
    await expect(wtx).to.emit(gpu, "StakeWithdrawn").withArgs(miner.address, P.minStake).and.not.to.emit(gpu, "Slashed");
    expect((await balance(miner)) - before + (await gasCost(wtx))).to.equal(P.minStake);
    expect(await escrow.withdrawable(miner)).to.equal(pay); // its pay waits in escrow, untouched
  });

  it("bounded fallback: a silent committee holds the stake until verdictGraceEpochs after the verdict epoch's start, not a second longer", async function () {
    const q = await load();
    const { gpu, task, miner } = q;
    await submit(q);
    await gpu.connect(miner).requestExit();
    await time.increase(P.challengeWindow);
    const ftx = await task.finalizeShard(q.taskId, 0);
    const v = await verdictEpochOf(q, await stampOf(ftx));
    const until = await q.committee.epochStart(v + 3n);
    expect(await gpu.verdictGraceEpochs()).to.equal(3n);
    await time.setNextBlockTimestamp(until - 1n);
    await expect(gpu.connect(miner).withdrawStake()).to.be.revertedWithCustomError(gpu, "VerdictPending").withArgs(v, until);
    expect(await q.committee.nextReportEpoch()).to.equal(0n); // the committee never reported
    await time.setNextBlockTimestamp(until);
    await expect(gpu.connect(miner).withdrawStake()).to.emit(gpu, "StakeWithdrawn").withArgs(miner.address, P.minStake);
    // The owner may change the bound; it applies to exits already requested.
    await expect(gpu.connect(miner).setVerdictGrace(1)).to.be.revertedWithCustomError(gpu, "OwnableUnauthorizedAccount");
    await expect(gpu.setVerdictGrace(1)).to.emit(gpu, "VerdictGraceSet").withArgs(1);
  });

  it("ATTACK fails: a cheater that sees an audit dispute open drains its stake to a client key of its own (proven over-billing, an expired claim's penalty), yet the burn still takes 10% of its stake at the dispute's opening, to the wei", async function () {
    const q = await load();
    const { gpu, task, arb, escrow, miner, verifiers } = q;
    const self = q.signers[12]; // a client key the cheater holds
    // A stake well above minStake, so that it stays eligible to claim while it drains.
    const stake0 = ethers.parseEther("3");
    await gpu.connect(miner).addStake({ value: stake0 - P.minStake });
    // Pre-positioned: a claim on its own client's task, to let expire later (collateral 0.3 ETH).
    const expiring = await oneShardTask(q, self, ethers.parseUnits("1.5", "finney"));
    await task.connect(miner).claimShard(expiring, 0);
    const { receipts, tree } = await submit(q); // the cheated shard of an honest client
    // An auditor disputes it: 10% of the stake is held for the untrusted burn.
    const otx = await arb.connect(verifiers[0]).openDispute(q.taskId, 0, receipts[1], tree.proof(1), "store://ev", { value: P.minBond });
    const reserve = (stake0 * 1000n) / BPS; // 0.3 ETH
    await expect(otx).to.emit(gpu, "ReserveHeld").withArgs(miner.address, reserve, 1);
    expect(await gpu.reserveOf(miner)).to.equal(reserve);

    // A claim cannot lock the reserve: 2.4 ETH of collateral does not fit in 2.4 ETH - COLL4.
    const free0 = stake0 - ethers.parseEther("0.3") - COLL4 - reserve;
    expect(await lockable(q, miner)).to.equal(free0);
    const tooBig = await oneShardTask(q, self, ethers.parseUnits("12", "finney"));
    await expect(task.connect(miner).claimShard(tooBig, 0))
      .to.be.revertedWithCustomError(gpu, "InsufficientFreeStake").withArgs(free0, ethers.parseEther("2.4"));

    // Route 1: over-bill its own client and prove it: the whole collateral (0.5 ETH) to itself.
    const own1 = await oneShardTask(q, self, ethers.parseUnits("2.5", "finney"));
    const b1 = await proveOverBilled(q, self, own1, await submitOverBilled(q, own1));
    await expect(b1).to.emit(gpu, "Slashed").withArgs(miner.address, ethers.parseEther("0.5"), self.address, await arb.getAddress());
    // Route 2: let its own claim expire: 20% of 0.3 ETH to itself.
    await time.increaseTo((await task.getShard(expiring, 0)).claimExpiry);
    await expect(task.reclaimExpired(expiring, 0))
      .to.emit(gpu, "Slashed").withArgs(miner.address, ethers.parseEther("0.06"), self.address, await task.getAddress());
    expect(await gpu.reserveOf(miner)).to.equal(reserve); // the dispute is still open

    // The verdict: at fault; the shard's own collateral pays its voters and client in full.
    const vtx = await arb.castVotes(1, true, await signVotes(arb, verifiers, 1, true));
    await expect(vtx).to.emit(arb, "DisputeResolved");
    let stake = stake0 - ethers.parseEther("0.56") - COLL4;
    expect((await gpu.minerInfo(miner)).stake).to.equal(stake);
    expect(await gpu.reserveOf(miner)).to.equal(reserve); // until the report of the next epoch

    // Route 1 again, with everything a claim may still lock: the reserve stays.
    const rest = await lockable(q, miner);
    expect(rest).to.equal(stake - reserve);
    const price = (rest * BPS) / BigInt(P.collateralBps) / 400n;
    const coll = (price * 400n * BigInt(P.collateralBps)) / BPS;
    const own2 = await oneShardTask(q, self, price);
    const b2 = await proveOverBilled(q, self, own2, await submitOverBilled(q, own2));
    await expect(b2).to.emit(gpu, "Slashed").withArgs(miner.address, coll, self.address, await arb.getAddress());
    stake -= coll;
    expect(stake).to.be.lessThan(reserve + ethers.parseUnits("1", "gwei")); // drained to the reserve
    expect(await lockable(q, miner)).to.equal(stake - reserve);

    // The committee's report of the epoch after the last dispute closed: untrusted.
    const v = await verdictEpochOf(q, await stampOf(b2));
    await report(q, v, [miner], [3000]);
    expect(await gpu.untrustedReportsOf(miner)).to.equal(1n);
    expect(await gpu.reserveOf(miner)).to.equal(reserve); // held until its burn is paid

    // Leaving pays the burn: the reserve, 10% of the stake the dispute found, not 10% of the rest.
    await gpu.connect(miner).requestExit();
    await time.increase(P.minerUnbonding);
    const burnedBefore = await escrow.withdrawable(BURN);
    const before = await balance(miner);
    const wtx = await gpu.connect(miner).withdrawStake();
    await expect(wtx).to.emit(gpu, "Slashed").withArgs(miner.address, reserve, BURN, miner.address);
    await expect(wtx).to.emit(gpu, "StakeWithdrawn").withArgs(miner.address, stake - reserve);
    expect((await escrow.withdrawable(BURN)) - burnedBefore).to.equal(reserve);
    expect(reserve).to.equal(ethers.parseEther("0.3"));
    // Before the reserve, the last drain could have locked (and paid itself) all the free stake,
    // leaving the burn 10% of about nothing.
    expect((await balance(miner)) - before + (await gasCost(wtx))).to.equal(stake - reserve);
    expect(await gpu.reserveOf(miner)).to.equal(0n);
  });

  it("an honest slow miner under a dispute it wins: its client's expiry penalty is paid in full, it claims as much as without the dispute, and the reserve frees at the next report, to the wei", async function () {
    const q = await load();
    const { gpu, task, arb, escrow, client, miner, verifiers } = q;
    await task.connect(miner).claimShard(q.taskId, 1); // too slow for this one
    const { receipts, tree } = await submit(q);
    const before = await lockable(q, miner);
    await arb.connect(verifiers[0]).openDispute(q.taskId, 0, receipts[1], tree.proof(1), "store://ev", { value: P.minBond });
    const reserve = (P.minStake * 1000n) / BPS;
    expect(await gpu.reserveOf(miner)).to.equal(reserve);
    // The reserve is the 10% no claim may lock anyway: the dispute takes no claim capacity.
    expect(await lockable(q, miner)).to.equal(before);
    const big = await oneShardTask(q, q.signers[13], ethers.parseUnits("4", "finney")); // 0.8 ETH
    await expect(task.connect(miner).claimShard(big, 0)).to.emit(task, "ShardClaimed");
    // Its slow claim expires: the client's penalty comes from that shard's collateral, in full.
    await time.increaseTo((await task.getShard(q.taskId, 1)).claimExpiry);
    const penalty = (COLL4 * BigInt(P.reclaimPenaltyBps)) / BPS;
    const credited = await escrow.withdrawable(client);
    await expect(task.reclaimExpired(q.taskId, 1)).to.emit(gpu, "Slashed").withArgs(miner.address, penalty, client.address, await task.getAddress());
    expect((await escrow.withdrawable(client)) - credited).to.equal(penalty);
    // The committee finds no fault; the reserve waits for the report of the next epoch.
    const vtx = await arb.castVotes(1, false, await signVotes(arb, verifiers, 1, false));
    await expect(vtx).to.emit(arb, "DisputeResolved");
    expect(await gpu.reserveOf(miner)).to.equal(reserve);
    const v = await verdictEpochOf(q, await stampOf(vtx));
    await report(q, v, [miner], [8000]);
    expect(await gpu.reserveOf(miner)).to.equal(0n);
    expect((await gpu.minerInfo(miner)).stake).to.equal(P.minStake - penalty); // nothing else taken
    expect(await gpu.untrustedReportsOf(miner)).to.equal(0n);
  });

  it("bounded fallback: a silent committee holds the reserve until verdictGraceEpochs after the verdict epoch's start, not a second longer", async function () {
    const q = await load();
    const { gpu, arb, miner, verifiers } = q;
    const { receipts, tree } = await submit(q);
    await arb.connect(verifiers[0]).openDispute(q.taskId, 0, receipts[1], tree.proof(1), "store://ev", { value: P.minBond });
    const vtx = await arb.castVotes(1, false, await signVotes(arb, verifiers, 1, false));
    const v = await verdictEpochOf(q, await stampOf(vtx));
    const until = await q.committee.epochStart(v + 3n);
    await time.increaseTo(until - 1n);
    expect(await gpu.reserveOf(miner)).to.equal((P.minStake * 1000n) / BPS);
    await time.increaseTo(until);
    expect(await gpu.reserveOf(miner)).to.equal(0n);
    expect(await q.committee.nextReportEpoch()).to.equal(0n); // the committee never reported
  });
});
