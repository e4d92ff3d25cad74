const { expect } = require("chai");
const { ethers } = require("hardhat");
const { loadFixture, time } = require("@nomicfoundation/hardhat-network-helpers");
const {
  P, MODEL, OTHER_MODEL, GPU, PRICE, PRECISION, RECEIPT_TYPES, domainOf, deployQuarry, createTask, termsOf, maskOf,
  receiptStructHash, buildResult, signVotes,
} = require("./helpers");

const S = { Open: 0n, Claimed: 1n, Submitted: 2n, Disputed: 3n, Finalized: 4n, Refunded: 5n };
const BUDGET4 = 4n * 100n * PRICE; // shard of 4 requests
const BUDGET2 = 2n * 100n * PRICE; // last shard of 2 requests
const COLL4 = (BUDGET4 * BigInt(P.collateralBps)) / 10000n;
const ROOT = ethers.keccak256(ethers.toUtf8Bytes("result-root"));
const TOK0 = [100, 50, 60, 40]; // output tokens of shard 0's receipts: 250 in all

describe("TaskRegistry", function () {
  async function withTask() {
    const q = await deployQuarry();
    const t = await createTask(q.task, q.client);
    return { ...q, taskId: t.taskId, targs: t.args, payment: t.value };
  }
  async function claimed() {
    const q = await withTask();
    await q.task.connect(q.miner).claimShard(q.taskId, 0);
    return q;
  }
  async function submitted() {
    const q = await claimed();
    const res = await buildResult(q.task, q.taskId, 0, 0, 4, q.miner, MODEL, (i) => TOK0[i]);
    await q.task.connect(q.miner).submitResult(q.taskId, 0, res.root, "store://out", res.total);
    return { ...q, res };
  }
  /** Signs and submits shard `shard` of the task with receipts of `tokens` output tokens. */
  async function submit(q, taskId, shard, m, tokens) {
    const [start, end] = await q.task.shardRange(taskId, shard);
    const res = await buildResult(q.task, taskId, shard, Number(start), Number(end), m, MODEL, tokens);
    const tx = await q.task.connect(m).submitResult(taskId, shard, res.root, "store://out", res.total);
    return { ...res, tx };
  }

  describe("params and wiring", function () {
    it("exposes constructor params; owner setters validate", async function () {
      const { task, outsider, gpu } = await loadFixture(deployQuarry);
      expect(await task.collateralBps()).to.equal(P.collateralBps);
      expect(await task.claimTimeout()).to.equal(P.claimTimeout);
      expect(await task.challengeWindow()).to.equal(P.challengeWindow);
      expect(await task.reclaimPenaltyBps()).to.equal(P.reclaimPenaltyBps);
      expect(await task.maxShardsPerTask()).to.equal(1024);
      await expect(task.setParams(1, 2, 3, 4)).to.emit(task, "ParamsSet").withArgs(1, 2, 3, 4);
      await expect(task.setParams(10001, 2, 3, 4)).to.be.revertedWithCustomError(task, "InvalidBps");
      await expect(task.setParams(1, 2, 3, 10001)).to.be.revertedWithCustomError(task, "InvalidBps");
      await expect(task.setMaxShardsPerTask(0)).to.be.revertedWithCustomError(task, "InvalidMaxShards");
      await expect(task.setMaxShardsPerTask(1025)).to.be.revertedWithCustomError(task, "InvalidMaxShards");
      await expect(task.setMaxShardsPerTask(8)).to.emit(task, "MaxShardsPerTaskSet").withArgs(8);
      await expect(task.connect(outsider).setParams(1, 2, 3, 4)).to.be.revertedWithCustomError(task, "OwnableUnauthorizedAccount");
      for (const f of ["setGPURegistry", "setEscrow", "setArbitration"]) {
        await expect(task[f](gpu)).to.be.revertedWithCustomError(task, "AlreadySet");
      }
      const F = await ethers.getContractFactory("TaskRegistry");
      await expect(F.deploy(10001, 1, 1, 1)).to.be.revertedWithCustomError(task, "InvalidBps");
      const fresh = await F.deploy(1, 1, 1, 1);
      for (const f of ["setGPURegistry", "setEscrow", "setArbitration"]) {
        await expect(fresh[f](ethers.ZeroAddress)).to.be.revertedWithCustomError(fresh, "ZeroAddress");
      }
      const now = BigInt(await time.latest());
      const terms = termsOf({
        modelId: MODEL, inputRoot: ROOT, inputURI: "u", numRequests: 1, shardSize: 1, maxTokens: 1, price: 1,
        deadline: now + 100n, minRep: 0, arbiter: ethers.ZeroAddress, allowProbation: false, precisions: 0,
        requireCommitments: false,
      });
      await expect(fresh.createTask(terms, { value: 1 }))
        .to.be.revertedWithCustomError(fresh, "NotWired");
    });
  });

  describe("createTask", function () {
    it("escrows exactly the maximum cost and records the task", async function () {
      const { task, escrow, client, arbiter } = await loadFixture(deployQuarry);
      const before = await ethers.provider.getBalance(escrow);
      const { taskId, args, value, tx } = await createTask(task, client, { arbiter: arbiter.address, minRep: 4500 });
      expect(taskId).to.equal(1n);
      expect(value).to.equal(10n * 100n * PRICE);
      await expect(tx).to.emit(task, "TaskCreated")
        .withArgs(1, client.address, MODEL, args.inputRoot, args.inputURI, 10, 4, 3, value, args.deadline, false, 0, false);
      await expect(tx).to.emit(escrow, "Deposited").withArgs(1, value);
      expect(await ethers.provider.getBalance(escrow)).to.equal(before + value);
      expect(await escrow.escrowed(1)).to.equal(value);
      const t = await task.getTask(1);
      expect(t.client).to.equal(client.address);
      expect(t.arbiter).to.equal(arbiter.address);
      expect(t.modelId).to.equal(MODEL);
      expect(t.inputURI).to.equal("store://inputs");
      expect(t.numRequests).to.equal(10);
      expect(t.shardSize).to.equal(4);
      expect(t.maxTokensPerRequest).to.equal(100);
      expect(t.numShards).to.equal(3);
      expect(t.pricePerToken).to.equal(PRICE);
      expect(t.deadline).to.equal(args.deadline);
      expect(t.minReputationBps).to.equal(4500);
      expect(t.allowProbation).to.equal(false);
      expect(t.cancelled).to.equal(false);
      expect(t.committed).to.equal(0);
      expect(await task.numShards(1)).to.equal(3);
      expect(await task.taskCount()).to.equal(1);
      expect(await task.shardRange(1, 0)).to.deep.equal([0n, 4n]);
      expect(await task.shardRange(1, 2)).to.deep.equal([8n, 10n]);
      expect(await task.shardBudget(1, 1)).to.equal(BUDGET4);
      expect(await task.shardBudget(1, 2)).to.equal(BUDGET2);
      const s = await task.getShard(1, 2);
      expect(s.state).to.equal(S.Open);
      expect(s.miner).to.equal(ethers.ZeroAddress);
    });
    it("stores allowProbation and emits it as TaskCreated's last field", async function () {
      const { task, client } = await loadFixture(deployQuarry);
      const a = await createTask(task, client, { allowProbation: true });
      await expect(a.tx).to.emit(task, "TaskCreated").withArgs(
        a.taskId, client.address, MODEL, a.args.inputRoot, a.args.inputURI, 10, 4, 3, a.value, a.args.deadline, true, 0, false);
      expect((await task.getTask(a.taskId)).allowProbation).to.equal(true);
      const b = await createTask(task, client, { allowProbation: false });
      expect((await task.getTask(b.taskId)).allowProbation).to.equal(false);
      expect((await task.getTask(a.taskId)).allowProbation).to.equal(true);
    });
    it("reverts with the wrong payment", async function () {
      const { task, client } = await loadFixture(deployQuarry);
      const expected = 10n * 100n * PRICE;
      await expect(createTask(task, client, { value: expected - 1n }))
        .to.be.revertedWithCustomError(task, "WrongPayment").withArgs(expected, expected - 1n);
      await expect(createTask(task, client, { value: expected + 1n }))
        .to.be.revertedWithCustomError(task, "WrongPayment").withArgs(expected, expected + 1n);
      await expect(createTask(task, client, { value: 0n }))
        .to.be.revertedWithCustomError(task, "WrongPayment").withArgs(expected, 0);
    });
    it("reverts on each bad parameter", async function () {
      const { task, client } = await loadFixture(deployQuarry);
      const now = BigInt(await time.latest());
      await expect(createTask(task, client, { numRequests: 0, value: 0n })).to.be.revertedWithCustomError(task, "ZeroRequests");
      await expect(createTask(task, client, { shardSize: 0 })).to.be.revertedWithCustomError(task, "ZeroShardSize");
      await expect(createTask(task, client, { maxTokens: 0, value: 0n })).to.be.revertedWithCustomError(task, "ZeroMaxTokens");
      await expect(createTask(task, client, { price: 0n, value: 0n })).to.be.revertedWithCustomError(task, "ZeroPrice");
      await expect(createTask(task, client, { deadline: now })).to.be.revertedWithCustomError(task, "DeadlineInPast");
      await expect(createTask(task, client, { minRep: 10001 })).to.be.revertedWithCustomError(task, "InvalidBps");
      await expect(createTask(task, client, { numRequests: 1025, shardSize: 1 }))
        .to.be.revertedWithCustomError(task, "TooManyShards").withArgs(1024, 1025);
      await task.setMaxShardsPerTask(2);
      await expect(createTask(task, client)).to.be.revertedWithCustomError(task, "TooManyShards").withArgs(2, 3);
      await createTask(task, client, { numRequests: 8 });
    });
    it("stores and emits the accepted precisions and requireCommitments; refuses bits outside 1..5", async function () {
      const { task, escrow, client } = await loadFixture(deployQuarry);
      const mask = maskOf(PRECISION.FP32, PRECISION.BF16);
      expect(mask).to.equal(0x0a);
      const a = await createTask(task, client, { precisions: mask, requireCommitments: true });
      await expect(a.tx).to.emit(task, "TaskCreated").withArgs(
        a.taskId, client.address, MODEL, a.args.inputRoot, a.args.inputURI, 10, 4, 3, a.value, a.args.deadline, false,
        mask, true);
      const t = await task.getTask(a.taskId);
      expect(t.precisions).to.equal(mask);
      expect(t.requireCommitments).to.equal(true);
      expect(await task.PRECISION_BITS()).to.equal(0x3e);
      const all = await createTask(task, client, { precisions: 0x3e });
      expect((await task.getTask(all.taskId)).precisions).to.equal(0x3e);
      const held = await escrow.totalEscrowed();
      for (const bad of [0x01, 0x40, 0x80, 0xff, 0x3f]) {
        await expect(createTask(task, client, { precisions: bad }))
          .to.be.revertedWithCustomError(task, "InvalidPrecisionMask").withArgs(bad);
      }
      expect(await escrow.totalEscrowed()).to.equal(held);
      expect(await task.taskCount()).to.equal(all.taskId);
    });
  });

  describe("claimShard", function () {
    it("locks collateral and sets the claim expiry", async function () {
      const { task, gpu, miner, taskId } = await loadFixture(withTask);
      const tx = await task.connect(miner).claimShard(taskId, 0);
      const now = BigInt(await time.latest());
      await expect(tx).to.emit(task, "ShardClaimed").withArgs(taskId, 0, miner.address, now + P.claimTimeout, COLL4, PRECISION.FP32);
      await expect(tx).to.emit(gpu, "CollateralLocked").withArgs(miner.address, COLL4, COLL4);
      const s = await task.getShard(taskId, 0);
      expect(s.state).to.equal(S.Claimed);
      expect(s.miner).to.equal(miner.address);
      expect(s.claimExpiry).to.equal(now + P.claimTimeout);
      expect(s.collateral).to.equal(COLL4);
      expect((await gpu.minerInfo(miner)).locked).to.equal(COLL4);
      expect((await task.getTask(taskId)).committed).to.equal(BUDGET4);
    });
    it("reverts for an ineligible miner", async function () {
      const { task, gpu, client, miner, outsider, taskId } = await loadFixture(withTask);
      await expect(task.connect(outsider).claimShard(taskId, 0))
        .to.be.revertedWithCustomError(task, "NotEligible").withArgs(outsider.address);
      const t2 = await createTask(task, client, { minRep: 6000 });
      await expect(task.connect(miner).claimShard(t2.taskId, 0))
        .to.be.revertedWithCustomError(task, "NotEligible").withArgs(miner.address);
      const t3 = await createTask(task, client, { modelId: OTHER_MODEL });
      await expect(task.connect(miner).claimShard(t3.taskId, 0)).to.be.revertedWithCustomError(task, "NotEligible");
      await gpu.connect(miner).requestExit();
      await expect(task.connect(miner).claimShard(taskId, 0)).to.be.revertedWithCustomError(task, "NotEligible");
    });
    it("a miner on probation claims only tasks that allow probation, and their other floors still apply", async function () {
      const { task, gpu, client, miner, outsider, taskId } = await loadFixture(withTask);
      await gpu.connect(outsider).register([MODEL], [1], GPU, "http://new", PRICE, { value: P.minStake });
      expect(await gpu.onProbation(outsider)).to.equal(true);
      await expect(task.connect(outsider).claimShard(taskId, 0))
        .to.be.revertedWithCustomError(task, "NotEligible").withArgs(outsider.address);
      const open = await createTask(task, client, { allowProbation: true });
      const tx = await task.connect(outsider).claimShard(open.taskId, 0);
      const now = BigInt(await time.latest());
      await expect(tx).to.emit(task, "ShardClaimed").withArgs(open.taskId, 0, outsider.address, now + P.claimTimeout, COLL4, PRECISION.FP32);
      await expect(tx).to.emit(gpu, "CollateralLocked").withArgs(outsider.address, COLL4, COLL4);
      // an established miner may claim such a task too
      await task.connect(miner).claimShard(open.taskId, 1);
      // the reputation floor and the model still apply with allowProbation
      const high = await createTask(task, client, { allowProbation: true, minRep: 5001 });
      await expect(task.connect(outsider).claimShard(high.taskId, 0))
        .to.be.revertedWithCustomError(task, "NotEligible").withArgs(outsider.address);
      const other = await createTask(task, client, { allowProbation: true, modelId: OTHER_MODEL });
      await expect(task.connect(outsider).claimShard(other.taskId, 0))
        .to.be.revertedWithCustomError(task, "NotEligible").withArgs(outsider.address);
      // at the floor it may
      const at = await createTask(task, client, { allowProbation: true, minRep: 5000 });
      await task.connect(outsider).claimShard(at.taskId, 0);
      expect((await gpu.minerInfo(outsider)).locked).to.equal(COLL4 * 2n);
    });
    it("reverts on a taken shard, bad ids, after the deadline and without free stake", async function () {
      const { task, gpu, client, miner, miner2, taskId, targs } = await loadFixture(withTask);
      await task.connect(miner).claimShard(taskId, 0);
      await expect(task.connect(miner2).claimShard(taskId, 0))
        .to.be.revertedWithCustomError(task, "ShardNotOpen").withArgs(S.Claimed);
      await expect(task.connect(miner).claimShard(taskId, 3)).to.be.revertedWithCustomError(task, "BadShard").withArgs(taskId, 3);
      await expect(task.connect(miner).claimShard(99, 0)).to.be.revertedWithCustomError(task, "UnknownTask").withArgs(99);
      const big = await createTask(task, client, { price: ethers.parseEther("0.01") }); // collateral 2 ETH > stake
      await expect(task.connect(miner2).claimShard(big.taskId, 0))
        .to.be.revertedWithCustomError(gpu, "InsufficientFreeStake").withArgs(P.minStake - P.minStake / 10n, ethers.parseEther("2"));
      await time.increaseTo(targs.deadline);
      await expect(task.connect(miner2).claimShard(taskId, 1))
        .to.be.revertedWithCustomError(task, "DeadlinePassed").withArgs(targs.deadline);
    });
  });

  describe("declared precision at claim", function () {
    it("records the claimant's precision in the shard; a mask that refuses it reverts, locking nothing", async function () {
      const { task, gpu, escrow, client, miner, miner2 } = await loadFixture(deployQuarry); // FP32, BF16
      const fp32 = await createTask(task, client, { precisions: maskOf(PRECISION.FP32) });
      const held = await escrow.totalEscrowed();
      await expect(task.connect(miner2).claimShard(fp32.taskId, 0))
        .to.be.revertedWithCustomError(task, "PrecisionNotAccepted").withArgs(PRECISION.BF16, maskOf(PRECISION.FP32));
      await expect(task.connect(miner2).claimShards(fp32.taskId, [0, 1]))
        .to.be.revertedWithCustomError(task, "PrecisionNotAccepted").withArgs(PRECISION.BF16, maskOf(PRECISION.FP32));
      expect((await gpu.minerInfo(miner2)).locked).to.equal(0n);
      expect((await task.getTask(fp32.taskId)).committed).to.equal(0n);
      expect(await escrow.totalEscrowed()).to.equal(held);
      expect((await task.getShard(fp32.taskId, 0)).state).to.equal(S.Open);
      const tx = await task.connect(miner).claimShard(fp32.taskId, 0);
      const now = BigInt(await time.latest());
      await expect(tx).to.emit(task, "ShardClaimed")
        .withArgs(fp32.taskId, 0, miner.address, now + P.claimTimeout, COLL4, PRECISION.FP32);
      expect((await task.getShard(fp32.taskId, 0)).precision).to.equal(PRECISION.FP32);
      // a mask of several precisions, and the mask 0, accept BF16
      const either = await createTask(task, client, { precisions: maskOf(PRECISION.FP32, PRECISION.BF16) });
      await task.connect(miner2).claimShards(either.taskId, [1, 2]);
      const any = await createTask(task, client);
      await task.connect(miner2).claimShard(any.taskId, 0);
      for (const [id, k] of [[either.taskId, 1], [either.taskId, 2], [any.taskId, 0]]) {
        expect((await task.getShard(id, k)).precision).to.equal(PRECISION.BF16);
      }
      // an Open shard records nothing yet
      expect((await task.getShard(either.taskId, 0)).precision).to.equal(0);
    });
    it("a later update does not change what a claimed shard is judged at; a reclaim forgets it", async function () {
      const { task, gpu, client, miner, miner2 } = await loadFixture(deployQuarry);
      const t = await createTask(task, client);
      await task.connect(miner2).claimShard(t.taskId, 0);
      await gpu.connect(miner2).update([MODEL], [PRECISION.INT8], GPU, "http://m2", PRICE);
      expect(await gpu.precisionOf(miner2, MODEL)).to.equal(PRECISION.INT8);
      expect((await task.getShard(t.taskId, 0)).precision).to.equal(PRECISION.BF16);
      await task.connect(miner2).claimShard(t.taskId, 1);
      expect((await task.getShard(t.taskId, 1)).precision).to.equal(PRECISION.INT8);
      await time.increase(P.claimTimeout);
      await task.reclaimExpired(t.taskId, 0);
      expect((await task.getShard(t.taskId, 0)).precision).to.equal(0);
      await task.connect(miner).claimShard(t.taskId, 0);
      expect((await task.getShard(t.taskId, 0)).precision).to.equal(PRECISION.FP32);
    });
  });

  describe("claimShards", function () {
    it("claims several shards in one transaction, each as claimShard would", async function () {
      const { task, gpu, miner, taskId } = await loadFixture(withTask);
      const tx = await task.connect(miner).claimShards(taskId, [2, 0]);
      const now = BigInt(await time.latest());
      const coll2 = (BUDGET2 * BigInt(P.collateralBps)) / 10000n;
      await expect(tx).to.emit(task, "ShardClaimed").withArgs(taskId, 2, miner.address, now + P.claimTimeout, coll2, PRECISION.FP32);
      await expect(tx).to.emit(task, "ShardClaimed").withArgs(taskId, 0, miner.address, now + P.claimTimeout, COLL4, PRECISION.FP32);
      expect((await gpu.minerInfo(miner)).locked).to.equal(COLL4 + coll2);
      expect((await task.getTask(taskId)).committed).to.equal(BUDGET4 + BUDGET2);
      expect((await task.getShard(taskId, 1)).state).to.equal(S.Open);
      for (const k of [0, 2]) expect((await task.getShard(taskId, k)).miner).to.equal(miner.address);
    });
    it("is all or none: a taken, repeated or bad shard, an empty or oversized list", async function () {
      const { task, gpu, miner, miner2, outsider, taskId } = await loadFixture(withTask);
      await task.connect(miner).claimShard(taskId, 1);
      await expect(task.connect(miner2).claimShards(taskId, [0, 1]))
        .to.be.revertedWithCustomError(task, "ShardNotOpen").withArgs(S.Claimed);
      await expect(task.connect(miner2).claimShards(taskId, [0, 0]))
        .to.be.revertedWithCustomError(task, "ShardNotOpen").withArgs(S.Claimed);
      await expect(task.connect(miner2).claimShards(taskId, [0, 3]))
        .to.be.revertedWithCustomError(task, "BadShard").withArgs(taskId, 3);
      await expect(task.connect(miner2).claimShards(taskId, []))
        .to.be.revertedWithCustomError(task, "BadClaimBatch").withArgs(0, 64);
      await expect(task.connect(miner2).claimShards(taskId, Array(65).fill(0)))
        .to.be.revertedWithCustomError(task, "BadClaimBatch").withArgs(65, 64);
      await expect(task.connect(outsider).claimShards(taskId, [0, 2]))
        .to.be.revertedWithCustomError(task, "NotEligible").withArgs(outsider.address);
      expect((await task.getShard(taskId, 0)).state).to.equal(S.Open);
      expect((await gpu.minerInfo(miner2)).locked).to.equal(0n);
      expect((await task.getTask(taskId)).committed).to.equal(BUDGET4);
    });
  });

  describe("submitResult", function () {
    it("records the result tree's root and sum and opens the challenge window", async function () {
      const q = await loadFixture(claimed);
      const { task, arb, miner, taskId } = q;
      const res = await submit(q, taskId, 0, miner, (i) => TOK0[i]);
      expect(res.total).to.equal(250n);
      const now = BigInt(await time.latest());
      await expect(res.tx).to.emit(task, "ResultSubmitted")
        .withArgs(taskId, 0, miner.address, res.root, "store://out", 250, now + P.challengeWindow);
      const s = await task.getShard(taskId, 0);
      expect(s.state).to.equal(S.Submitted);
      expect(s.submittedAt).to.equal(now);
      expect(s.windowEnd).to.equal(now + P.challengeWindow);
      expect(s.resultRoot).to.equal(res.root);
      expect(s.resultURI).to.equal("store://out");
      expect(s.tokensUsed).to.equal(250);
      // every receipt is proven under (resultRoot, tokensUsed); a wrong proof or receipt is not
      for (let k = 0; k < 4; k++) {
        expect(await arb.proves(taskId, 0, res.receipts[k], res.proofOf(k))).to.equal(true);
        expect(await arb.proves(taskId, 0, res.receipts[k], res.proofOf((k + 1) % 4))).to.equal(false);
        expect(await arb.proves(taskId, 0, { ...res.receipts[k], outputTokens: TOK0[k] + 1 }, res.proofOf(k))).to.equal(false);
      }
    });
    it("a root submitted with another total than its sum proves no receipt", async function () {
      const q = await loadFixture(claimed);
      const { task, arb, miner, taskId } = q;
      const res = await buildResult(task, taskId, 0, 0, 4, miner, MODEL, (i) => TOK0[i]);
      await task.connect(miner).submitResult(taskId, 0, res.root, "store://out", res.total + 1n); // bills 251
      expect((await task.getShard(taskId, 0)).tokensUsed).to.equal(251);
      for (let k = 0; k < 4; k++) {
        expect(await arb.proves(taskId, 0, res.receipts[k], res.proofOf(k))).to.equal(false);
      }
    });
    it("reverts for too many tokens, the wrong miner, an expired claim, an unclaimed shard, a zero root", async function () {
      const { task, miner, miner2, taskId } = await loadFixture(claimed);
      await expect(task.connect(miner).submitResult(taskId, 0, ROOT, "u", 401))
        .to.be.revertedWithCustomError(task, "TooManyTokens").withArgs(400, 401);
      await expect(task.connect(miner2).submitResult(taskId, 0, ROOT, "u", 1))
        .to.be.revertedWithCustomError(task, "NotShardMiner").withArgs(miner2.address);
      await expect(task.connect(miner).submitResult(taskId, 1, ROOT, "u", 1))
        .to.be.revertedWithCustomError(task, "ShardNotClaimed").withArgs(S.Open);
      await expect(task.connect(miner).submitResult(taskId, 0, ethers.ZeroHash, "u", 1))
        .to.be.revertedWithCustomError(task, "ZeroResultRoot");
      const s = await task.getShard(taskId, 0);
      await time.increaseTo(s.claimExpiry);
      await expect(task.connect(miner).submitResult(taskId, 0, ROOT, "u", 1))
        .to.be.revertedWithCustomError(task, "ClaimExpired").withArgs(s.claimExpiry);
    });
    it("caps tokens of the short last shard at its own size", async function () {
      const { task, miner, taskId } = await loadFixture(withTask);
      await task.connect(miner).claimShard(taskId, 2);
      await expect(task.connect(miner).submitResult(taskId, 2, ROOT, "u", 201))
        .to.be.revertedWithCustomError(task, "TooManyTokens").withArgs(200, 201);
      const res = await submit({ task }, taskId, 2, miner, 100);
      expect(res.total).to.equal(200n);
      expect((await task.getShard(taskId, 2)).tokensUsed).to.equal(200);
    });
  });

  describe("finalizeShard", function () {
    it("pays tokensUsed * price, refunds the rest, unlocks collateral, to the wei", async function () {
      const { task, escrow, gpu, client, miner, outsider, taskId, payment } = await loadFixture(submitted);
      const s = await task.getShard(taskId, 0);
      await expect(task.connect(outsider).finalizeShard(taskId, 0))
        .to.be.revertedWithCustomError(task, "WindowNotClosed").withArgs(s.windowEnd);
      await time.increaseTo(s.windowEnd);
      const pay = 250n * PRICE;
      const refund = BUDGET4 - pay;
      const tx = await task.connect(outsider).finalizeShard(taskId, 0);
      await expect(tx).to.emit(task, "ShardFinalized").withArgs(taskId, 0, miner.address, pay, refund);
      await expect(tx).to.emit(gpu, "CollateralUnlocked").withArgs(miner.address, COLL4, 0);
      expect(await escrow.withdrawable(miner)).to.equal(pay);
      expect(await escrow.withdrawable(client)).to.equal(refund);
      expect(await escrow.escrowed(taskId)).to.equal(payment - BUDGET4);
      expect((await gpu.minerInfo(miner)).locked).to.equal(0);
      expect((await task.getShard(taskId, 0)).state).to.equal(S.Finalized);
      expect((await task.getTask(taskId)).committed).to.equal(0);
      await expect(task.finalizeShard(taskId, 0)).to.be.revertedWithCustomError(task, "AlreadyFinalized");
      const bal = await ethers.provider.getBalance(escrow);
      expect(bal).to.equal((await escrow.totalEscrowed()) + (await escrow.totalWithdrawable()));
    });
    it("pays nothing for zero tokens and everything for the full budget", async function () {
      const { task, escrow, client, miner, miner2, taskId } = await loadFixture(withTask);
      await task.connect(miner).claimShard(taskId, 0);
      await task.connect(miner2).claimShard(taskId, 2);
      expect((await submit({ task }, taskId, 0, miner, 0)).total).to.equal(0n);
      expect((await submit({ task }, taskId, 2, miner2, 100)).total).to.equal(200n);
      await time.increase(P.challengeWindow);
      await task.finalizeShard(taskId, 0);
      await task.finalizeShard(taskId, 2);
      expect(await escrow.withdrawable(miner)).to.equal(0);
      expect(await escrow.withdrawable(miner2)).to.equal(BUDGET2);
      expect(await escrow.withdrawable(client)).to.equal(BUDGET4);
    });
    it("reverts on a shard that is not submitted", async function () {
      const { task, taskId } = await loadFixture(claimed);
      await expect(task.finalizeShard(taskId, 0)).to.be.revertedWithCustomError(task, "ShardNotSubmitted").withArgs(S.Claimed);
      await expect(task.finalizeShard(taskId, 1)).to.be.revertedWithCustomError(task, "ShardNotSubmitted").withArgs(S.Open);
    });
  });

  describe("reclaimExpired", function () {
    it("reopens the shard, slashes the penalty to the client, unlocks the rest, to the wei", async function () {
      const { task, escrow, gpu, client, miner, miner2, outsider, taskId, payment } = await loadFixture(claimed);
      const s = await task.getShard(taskId, 0);
      await expect(task.connect(outsider).reclaimExpired(taskId, 0))
        .to.be.revertedWithCustomError(task, "ClaimNotExpired").withArgs(s.claimExpiry);
      await time.increaseTo(s.claimExpiry);
      const penalty = (COLL4 * BigInt(P.reclaimPenaltyBps)) / 10000n;
      const stakeBefore = (await gpu.minerInfo(miner)).stake;
      const tx = await task.connect(outsider).reclaimExpired(taskId, 0);
      await expect(tx).to.emit(task, "ClaimReclaimed").withArgs(taskId, 0, miner.address, penalty, true);
      await expect(tx).to.emit(gpu, "Slashed").withArgs(miner.address, penalty, client.address, await task.getAddress());
      const info = await gpu.minerInfo(miner);
      expect(info.stake).to.equal(stakeBefore - penalty);
      expect(info.locked).to.equal(0);
      expect(await escrow.withdrawable(client)).to.equal(penalty);
      expect(await escrow.escrowed(taskId)).to.equal(payment);
      const sh = await task.getShard(taskId, 0);
      expect(sh.state).to.equal(S.Open);
      expect(sh.miner).to.equal(ethers.ZeroAddress);
      expect((await task.getTask(taskId)).committed).to.equal(0);
      await task.connect(miner2).claimShard(taskId, 0);
      await expect(task.reclaimExpired(taskId, 1)).to.be.revertedWithCustomError(task, "ShardNotClaimed").withArgs(S.Open);
    });
    it("refunds the shard when the deadline has passed", async function () {
      const { task, escrow, client, miner, taskId, targs } = await loadFixture(claimed);
      await time.increaseTo(targs.deadline);
      const penalty = (COLL4 * BigInt(P.reclaimPenaltyBps)) / 10000n;
      const tx = await task.reclaimExpired(taskId, 0);
      await expect(tx).to.emit(task, "ClaimReclaimed").withArgs(taskId, 0, miner.address, penalty, false);
      await expect(tx).to.emit(task, "ShardRefunded").withArgs(taskId, 0, BUDGET4);
      expect(await escrow.withdrawable(client)).to.equal(BUDGET4 + penalty);
      expect((await task.getShard(taskId, 0)).state).to.equal(S.Refunded);
    });
  });

  describe("cancelTask", function () {
    it("refunds every open shard; claimed shards run to their end", async function () {
      const { task, escrow, client, miner, miner2, taskId, payment } = await loadFixture(claimed);
      await expect(task.connect(miner).cancelTask(taskId)).to.be.revertedWithCustomError(task, "NotClient").withArgs(miner.address);
      const tx = await task.connect(client).cancelTask(taskId);
      await expect(tx).to.emit(task, "TaskCancelled").withArgs(taskId, BUDGET4 + BUDGET2);
      expect(await escrow.withdrawable(client)).to.equal(BUDGET4 + BUDGET2);
      expect(await escrow.escrowed(taskId)).to.equal(payment - BUDGET4 - BUDGET2);
      expect((await task.getShard(taskId, 1)).state).to.equal(S.Refunded);
      expect((await task.getShard(taskId, 2)).state).to.equal(S.Refunded);
      expect((await task.getShard(taskId, 0)).state).to.equal(S.Claimed);
      expect((await task.getTask(taskId)).cancelled).to.equal(true);
      await expect(task.connect(client).cancelTask(taskId)).to.be.revertedWithCustomError(task, "AlreadyCancelled");
      await expect(task.connect(miner2).claimShard(taskId, 1))
        .to.be.revertedWithCustomError(task, "ShardNotOpen").withArgs(S.Refunded);
      expect((await submit({ task }, taskId, 0, miner, 25)).total).to.equal(100n);
      await time.increase(P.challengeWindow);
      await task.finalizeShard(taskId, 0);
      expect(await escrow.withdrawable(miner)).to.equal(100n * PRICE);
      expect(await escrow.withdrawable(client)).to.equal(payment - 100n * PRICE);
      expect(await escrow.escrowed(taskId)).to.equal(0);
    });
    it("an expired claim of a cancelled task is refunded, not reopened", async function () {
      const { task, escrow, client, taskId, payment } = await loadFixture(claimed);
      await task.connect(client).cancelTask(taskId);
      await time.increase(P.claimTimeout);
      await task.reclaimExpired(taskId, 0);
      expect((await task.getShard(taskId, 0)).state).to.equal(S.Refunded);
      const penalty = (COLL4 * BigInt(P.reclaimPenaltyBps)) / 10000n;
      expect(await escrow.withdrawable(client)).to.equal(payment + penalty);
      expect(await escrow.escrowed(taskId)).to.equal(0);
    });
  });

  describe("refundUnfinished", function () {
    it("after the deadline refunds open shards and expired claims only", async function () {
      const { task, escrow, client, miner, miner2, taskId, targs } = await loadFixture(withTask);
      await task.connect(miner).claimShard(taskId, 0);
      await task.connect(miner2).claimShard(taskId, 1);
      expect((await submit({ task }, taskId, 1, miner2, (i) => (i === 4 ? 5 : 0))).total).to.equal(5n);
      await expect(task.refundUnfinished(taskId, 2))
        .to.be.revertedWithCustomError(task, "DeadlineNotPassed").withArgs(targs.deadline);
      await time.increaseTo(targs.deadline); // shard 0's claim (600 s) has expired by now
      await expect(task.refundUnfinished(taskId, 2)).to.emit(task, "ShardRefunded").withArgs(taskId, 2, BUDGET2);
      expect(await escrow.withdrawable(client)).to.equal(BUDGET2);
      await expect(task.refundUnfinished(taskId, 2))
        .to.be.revertedWithCustomError(task, "ShardNotRefundable").withArgs(S.Refunded);
      await expect(task.refundUnfinished(taskId, 1))
        .to.be.revertedWithCustomError(task, "ShardNotRefundable").withArgs(S.Submitted);
      const penalty = (COLL4 * BigInt(P.reclaimPenaltyBps)) / 10000n;
      await expect(task.refundUnfinished(taskId, 0)).to.emit(task, "ClaimReclaimed").withArgs(taskId, 0, miner.address, penalty, false);
      expect(await escrow.withdrawable(client)).to.equal(BUDGET2 + BUDGET4 + penalty);
    });
    it("reverts ClaimNotExpired for a live claim past the deadline", async function () {
      const { task, client, miner } = await loadFixture(deployQuarry);
      const now = BigInt(await time.latest());
      const { taskId } = await createTask(task, client, { deadline: now + 10n });
      await task.connect(miner).claimShard(taskId, 0);
      await time.increase(10);
      await expect(task.refundUnfinished(taskId, 0)).to.be.revertedWithCustomError(task, "ClaimNotExpired");
    });
  });

  describe("arbitration hooks", function () {
    it("markDisputed and resolveDispute are Arbitration only", async function () {
      const { task, owner, miner, client, outsider, taskId } = await loadFixture(submitted);
      for (const who of [outsider, owner, miner, client]) {
        await expect(task.connect(who).markDisputed(taskId, 0))
          .to.be.revertedWithCustomError(task, "Unauthorized").withArgs(who.address);
        for (const fault of [false, true]) {
          await expect(task.connect(who).resolveDispute(taskId, 0, fault, 0))
            .to.be.revertedWithCustomError(task, "Unauthorized").withArgs(who.address);
        }
      }
      expect((await task.getShard(taskId, 0)).state).to.equal(S.Submitted);
    });

    // A TaskRegistry whose Arbitration is an EOA (`hook`), to drive the hooks directly.
    async function hooked() {
      const signers = await ethers.getSigners();
      const [, client, , miner, , outsider] = signers;
      const hook = signers[12];
      const escrow = await (await ethers.getContractFactory("PaymentEscrow")).deploy();
      const gpu = await (await ethers.getContractFactory("GPURegistry")).deploy(
        P.minStake, P.minerUnbonding, P.initialRepBps);
      const task = await (await ethers.getContractFactory("TaskRegistry")).deploy(
        P.collateralBps, P.claimTimeout, P.challengeWindow, P.reclaimPenaltyBps);
      await escrow.setTaskRegistry(task);
      await escrow.setArbitration(hook);
      await escrow.setGPURegistry(gpu);
      await gpu.setTaskRegistry(task);
      await gpu.setArbitration(hook);
      await gpu.setEscrow(escrow);
      await gpu.setProbation(0, 6000);
      await gpu.connect(miner).register([MODEL], [1], GPU, "http://m", PRICE, { value: P.minStake });
      await task.setGPURegistry(gpu);
      await task.setEscrow(escrow);
      await task.setArbitration(hook);
      const { taskId, value } = await createTask(task, client);
      await task.connect(miner).claimShard(taskId, 0);
      const res = await submit({ task }, taskId, 0, miner, (i) => TOK0[i]);
      return { escrow, gpu, task, hook, client, miner, outsider, taskId, payment: value, res };
    }

    it("markDisputed freezes a Submitted shard inside its window only", async function () {
      const { task, hook, miner, taskId } = await loadFixture(hooked);
      await expect(task.connect(hook).markDisputed(taskId, 1))
        .to.be.revertedWithCustomError(task, "ShardNotSubmitted").withArgs(S.Open);
      await task.connect(miner).claimShard(taskId, 1);
      await expect(task.connect(hook).markDisputed(taskId, 1))
        .to.be.revertedWithCustomError(task, "ShardNotSubmitted").withArgs(S.Claimed);
      await expect(task.connect(hook).markDisputed(taskId, 3)).to.be.revertedWithCustomError(task, "BadShard").withArgs(taskId, 3);
      await expect(task.connect(hook).markDisputed(9, 0)).to.be.revertedWithCustomError(task, "UnknownTask").withArgs(9);
      await expect(task.connect(hook).markDisputed(taskId, 0)).to.emit(task, "ShardDisputed").withArgs(taskId, 0);
      expect((await task.getShard(taskId, 0)).state).to.equal(S.Disputed);
      await expect(task.connect(hook).markDisputed(taskId, 0))
        .to.be.revertedWithCustomError(task, "ShardNotSubmitted").withArgs(S.Disputed);
      await expect(task.finalizeShard(taskId, 0)).to.be.revertedWithCustomError(task, "DisputeOpen");
      await expect(task.connect(hook).resolveDispute(taskId, 1, false, 0))
        .to.be.revertedWithCustomError(task, "ShardNotDisputed").withArgs(S.Claimed);
      // a shard whose window closed cannot be frozen
      await task.connect(hook).resolveDispute(taskId, 0, false, 0);
      const we = (await task.getShard(taskId, 0)).windowEnd;
      expect(we).to.equal(0);
      await expect(task.connect(hook).markDisputed(taskId, 0)).to.be.revertedWithCustomError(task, "OutsideWindow").withArgs(0);
    });

    it("resolveDispute without fault: back to Submitted with exactly the given windowEnd, nothing paid", async function () {
      const { task, escrow, gpu, hook, client, miner, taskId, payment } = await loadFixture(hooked);
      const s0 = await task.getShard(taskId, 0);
      await task.connect(hook).markDisputed(taskId, 0);
      const W = s0.windowEnd + 1000n;
      expect(await task.connect(hook).resolveDispute.staticCall(taskId, 0, false, W))
        .to.deep.equal([miner.address, COLL4, client.address]);
      const tx = await task.connect(hook).resolveDispute(taskId, 0, false, W);
      await expect(tx).to.emit(task, "ShardDisputeResolved").withArgs(taskId, 0, false);
      await expect(tx).not.to.emit(escrow, "Released");
      await expect(tx).not.to.emit(gpu, "CollateralUnlocked");
      const s = await task.getShard(taskId, 0);
      expect(s.state).to.equal(S.Submitted);
      expect(s.windowEnd).to.equal(W);
      expect(s.submittedAt).to.equal(s0.submittedAt);
      expect(s.resultRoot).to.equal(s0.resultRoot);
      expect(s.tokensUsed).to.equal(250);
      expect((await gpu.minerInfo(miner)).locked).to.equal(COLL4);
      expect((await task.getTask(taskId)).committed).to.equal(BUDGET4);
      expect(await escrow.escrowed(taskId)).to.equal(payment);
      await expect(task.connect(hook).resolveDispute(taskId, 0, false, W))
        .to.be.revertedWithCustomError(task, "ShardNotDisputed").withArgs(S.Submitted);
      // the longer window holds: it can be frozen again until W and finalized only from W
      await time.increaseTo(s0.windowEnd + 10n);
      await expect(task.finalizeShard(taskId, 0)).to.be.revertedWithCustomError(task, "WindowNotClosed").withArgs(W);
      await task.connect(hook).markDisputed(taskId, 0);
      await task.connect(hook).resolveDispute(taskId, 0, false, W);
      await time.increaseTo(W);
      await expect(task.finalizeShard(taskId, 0)).to.emit(task, "ShardFinalized")
        .withArgs(taskId, 0, miner.address, 250n * PRICE, BUDGET4 - 250n * PRICE);
      expect(await escrow.withdrawable(miner)).to.equal(250n * PRICE);
      expect(await escrow.withdrawable(client)).to.equal(BUDGET4 - 250n * PRICE);
    });

    it("resolveDispute with fault: the whole budget back to the client, collateral unlocked, to the wei", async function () {
      const { task, escrow, gpu, hook, client, miner, taskId, payment } = await loadFixture(hooked);
      await task.connect(hook).markDisputed(taskId, 0);
      const we = (await task.getShard(taskId, 0)).windowEnd;
      const stake = (await gpu.minerInfo(miner)).stake;
      const tx = await task.connect(hook).resolveDispute(taskId, 0, true, 12345);
      await expect(tx).to.emit(task, "ShardDisputeResolved").withArgs(taskId, 0, true);
      await expect(tx).to.emit(task, "ShardRefunded").withArgs(taskId, 0, BUDGET4);
      await expect(tx).to.emit(escrow, "Released").withArgs(taskId, client.address, BUDGET4);
      await expect(tx).to.emit(gpu, "CollateralUnlocked").withArgs(miner.address, COLL4, 0);
      await expect(tx).not.to.emit(gpu, "Slashed"); // Arbitration slashes, not TaskRegistry
      const s = await task.getShard(taskId, 0);
      expect(s.state).to.equal(S.Refunded);
      expect(s.windowEnd).to.equal(we); // the windowEnd argument only matters without fault
      expect((await gpu.minerInfo(miner)).stake).to.equal(stake);
      expect((await gpu.minerInfo(miner)).locked).to.equal(0);
      expect((await task.getTask(taskId)).committed).to.equal(0);
      expect(await escrow.escrowed(taskId)).to.equal(payment - BUDGET4);
      expect(await escrow.withdrawable(client)).to.equal(BUDGET4);
      await expect(task.connect(hook).resolveDispute(taskId, 0, true, 0))
        .to.be.revertedWithCustomError(task, "ShardNotDisputed").withArgs(S.Refunded);
      await expect(task.finalizeShard(taskId, 0)).to.be.revertedWithCustomError(task, "ShardNotSubmitted").withArgs(S.Refunded);
    });

    it("through Arbitration: a no-fault verdict closes the window now; an answered challenge extends it", async function () {
      const q = await loadFixture(submitted);
      const { task, arb, escrow, client, miner, verifiers, taskId, res } = q;
      // a committee verdict of no fault: Submitted with windowEnd = the verdict's block, final at once
      await arb.connect(client).openDispute(taskId, 0, res.receipts[1], res.proofOf(1), "ev", { value: P.minBond });
      expect((await task.getShard(taskId, 0)).state).to.equal(S.Disputed);
      const vtx = await arb.castVotes(1, false, await signVotes(arb, verifiers.slice(0, 3), 1, false));
      await expect(vtx).to.emit(task, "ShardDisputeResolved").withArgs(taskId, 0, false);
      const vAt = BigInt((await ethers.provider.getBlock((await vtx.wait()).blockNumber)).timestamp);
      const s = await task.getShard(taskId, 0);
      expect(s.state).to.equal(S.Submitted);
      expect(s.windowEnd).to.equal(vAt);
      await expect(task.finalizeShard(taskId, 0)).to.emit(task, "ShardFinalized");

      // availability challenges on shard 1: answered early, the window grows by the challenge's
      // duration; answered late, at least responseWindow is left
      await task.connect(miner).claimShard(taskId, 1);
      const r1 = await submit(q, taskId, 1, miner, 7);
      const w0 = (await task.getShard(taskId, 1)).windowEnd;
      await arb.connect(client).challengeAvailability(taskId, 1, 5, { value: P.minAvailabilityBond });
      const c1 = await arb.getChallenge(1);
      expect((await task.getShard(taskId, 1)).state).to.equal(S.Disputed);
      await time.increase(50);
      const a1 = await arb.connect(miner).answerAvailability(1, r1.receipts[1], r1.proofOf(1));
      const t1 = BigInt((await ethers.provider.getBlock((await a1.wait()).blockNumber)).timestamp);
      const w1 = w0 + (t1 - c1.openedAt);
      expect(w1 > t1 + P.responseWindow).to.equal(true);
      await expect(a1).to.emit(task, "ShardDisputeResolved").withArgs(taskId, 1, false);
      expect((await task.getShard(taskId, 1)).windowEnd).to.equal(w1);
      expect((await task.getShard(taskId, 1)).state).to.equal(S.Submitted);
      await time.increaseTo(w1 - 20n);
      await arb.connect(client).challengeAvailability(taskId, 1, 6, { value: P.minAvailabilityBond });
      const a2 = await arb.connect(miner).answerAvailability(2, r1.receipts[2], r1.proofOf(2));
      const t2 = BigInt((await ethers.provider.getBlock((await a2.wait()).blockNumber)).timestamp);
      expect((await task.getShard(taskId, 1)).windowEnd).to.equal(t2 + P.responseWindow);
      // the challenge bonds went to the miner (besides its share of the dispute bond and shard 0's pay)
      const each = (P.minBond - (P.minBond * BigInt(P.minerBondShareBps)) / 10000n) / 3n;
      expect(await escrow.withdrawable(miner))
        .to.equal(P.minBond - each * 3n + 250n * PRICE + P.minAvailabilityBond * 2n);
      await time.increaseTo(t2 + P.responseWindow);
      await expect(task.finalizeShard(taskId, 1)).to.emit(task, "ShardFinalized")
        .withArgs(taskId, 1, miner.address, 28n * PRICE, BUDGET4 - 28n * PRICE);
    });
  });

  describe("EIP-712 receipts", function () {
    it("type hash, struct hash, digest and domain match ethers", async function () {
      const { task, miner } = await loadFixture(deployQuarry);
      expect(await task.RECEIPT_TYPEHASH()).to.equal(ethers.id(
        "Receipt(uint256 taskId,uint32 shard,uint32 index,bytes32 requestHash,bytes32 outputHash,uint32 outputTokens,bytes32 modelId,bytes32 commitment)"));
      const r = {
        taskId: 5n, shard: 1, index: 6, requestHash: ethers.id("req"), outputHash: ethers.id("out"),
        outputTokens: 42, modelId: MODEL, commitment: ethers.id("commitment"),
      };
      const domain = await domainOf(task);
      expect(await task.receiptStructHash(r)).to.equal(receiptStructHash(r));
      expect(await task.domainSeparator()).to.equal(ethers.TypedDataEncoder.hashDomain(domain));
      const digest = await task.hashReceipt(r);
      expect(digest).to.equal(ethers.TypedDataEncoder.hash(domain, RECEIPT_TYPES, r));
      const sig = await miner.signTypedData(domain, RECEIPT_TYPES, r);
      expect(ethers.recoverAddress(digest, sig)).to.equal(miner.address);
    });
  });
});
