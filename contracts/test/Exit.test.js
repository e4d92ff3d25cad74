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

    // Leaving untrusted takes that burn with it: 10% to BURN, the rest to the miner.
    const burn = (stake * 1000n) / BPS;
    const burnedBefore = await escrow.withdrawable(BURN);
    const before = await balance(miner);
    const wtx = await gpu.connect(miner).withdrawStake();
    await expect(wtx).to.emit(gpu, "Slashed").withArgs(miner.address, burn, BURN, miner.address);
    await expect(wtx).to.emit(gpu, "StakeWithdrawn").withArgs(miner.address, stake - burn);
    expect((await balance(miner)) - before + (await gasCost(wtx))).to.equal(stake - burn);
    expect((await escrow.withdrawable(BURN)) - burnedBefore).to.equal(burn);
    expect(stake - burn).to.equal(ethers.parseEther("0.89999982")); // 1 ETH - 0.0000002 ETH, less 10%
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
});
