// Shared deploy+wire fixture and EIP-712 / Merkle helpers for the Quarry contract tests.
const { ethers } = require("hardhat");
const { time } = require("@nomicfoundation/hardhat-network-helpers");
const { leafHash, SumTree } = require("./resultTree");

const P = {
  minStake: ethers.parseEther("1"),
  minerUnbonding: 100n,
  initialRepBps: 5000,
  collateralBps: 5000,
  claimTimeout: 600n,
  challengeWindow: 300n,
  reclaimPenaltyBps: 2000,
  minVerifierStake: ethers.parseEther("1"),
  verifierUnbonding: 100n,
  epochDuration: 60n,
  minBond: ethers.parseEther("0.1"),
  disputeTimeout: 600n,
  faultSlashBps: 10000,
  verifierRewardBps: 2000,
  minerBondShareBps: 5000,
  minAvailabilityBond: ethers.parseEther("0.05"),
  responseWindow: 120n,
};

const MODEL = ethers.keccak256(ethers.toUtf8Bytes("tiny-llama"));
const OTHER_MODEL = ethers.keccak256(ethers.toUtf8Bytes("other-model"));
const GPU = { name: "NVIDIA H100", memoryMiB: 81920, count: 1 };
const PRICE = ethers.parseUnits("1", "gwei");
/** Declared precisions as the contracts number them (market/protocol/precision.py). */
const PRECISION = { FP32: 1, FP16: 2, BF16: 3, FP8: 4, INT8: 5 };
/** A task's accepted-precision mask: bit p for each precision p listed (none: any). */
const maskOf = (...precisions) => precisions.reduce((m, p) => m | (1 << p), 0);

const RECEIPT_TYPES = {
  Receipt: [
    { name: "taskId", type: "uint256" },
    { name: "shard", type: "uint32" },
    { name: "index", type: "uint32" },
    { name: "requestHash", type: "bytes32" },
    { name: "outputHash", type: "bytes32" },
    { name: "outputTokens", type: "uint32" },
    { name: "modelId", type: "bytes32" },
    { name: "commitment", type: "bytes32" },
  ],
};
const VOTE_TYPES = {
  Vote: [
    { name: "disputeId", type: "uint256" },
    { name: "minerAtFault", type: "bool" },
  ],
};
const REPORT_TYPES = {
  Report: [
    { name: "epoch", type: "uint256" },
    { name: "miners", type: "address[]" },
    { name: "scoresBps", type: "uint16[]" },
    { name: "evidenceRoot", type: "bytes32" },
  ],
};
const CHALLENGE_TYPES = {
  ChallengeSet: [
    { name: "epoch", type: "uint256" },
    { name: "challengeSetHash", type: "bytes32" },
  ],
};

/** GPURegistry's swarm consent: every member signs the whole formation and its own nonce. */
const SWARM_TYPES = {
  SwarmConsent: [
    { name: "modelId", type: "bytes32" },
    { name: "head", type: "address" },
    { name: "members", type: "address[]" },
    { name: "shares", type: "uint32[]" },
    { name: "pricePerToken", type: "uint256" },
    { name: "nonce", type: "uint256" },
    { name: "deadline", type: "uint64" },
  ],
};

async function domainOf(contract, chainId) {
  const cid = chainId ?? (await ethers.provider.getNetwork()).chainId;
  return { name: "Quarry", version: "1", chainId: cid, verifyingContract: await contract.getAddress() };
}

function sortByAddress(signers) {
  return [...signers].sort((a, b) => (BigInt(a.address) < BigInt(b.address) ? -1 : 1));
}

async function deployQuarry() {
  const signers = await ethers.getSigners();
  const [owner, client, arbiter, miner, miner2, outsider] = signers;
  const verifiers = signers.slice(6, 10);

  const escrow = await (await ethers.getContractFactory("PaymentEscrow")).deploy();
  const gpu = await (await ethers.getContractFactory("GPURegistry")).deploy(
    P.minStake, P.minerUnbonding, P.initialRepBps);
  const task = await (await ethers.getContractFactory("TaskRegistry")).deploy(
    P.collateralBps, P.claimTimeout, P.challengeWindow, P.reclaimPenaltyBps);
  const committee = await (await ethers.getContractFactory("VerifierCommittee")).deploy(
    P.minVerifierStake, P.verifierUnbonding, P.epochDuration, 0);
  const arb = await (await ethers.getContractFactory("Arbitration")).deploy(
    P.minBond, P.disputeTimeout, P.faultSlashBps, P.verifierRewardBps, P.minerBondShareBps,
    P.minAvailabilityBond, P.responseWindow);

  await escrow.setTaskRegistry(task);
  await escrow.setArbitration(arb);
  await escrow.setGPURegistry(gpu);
  await escrow.setCommittee(committee);
  await gpu.setTaskRegistry(task);
  await gpu.setArbitration(arb);
  await gpu.setCommittee(committee);
  await gpu.setEscrow(escrow);
  await task.setGPURegistry(gpu);
  await task.setEscrow(escrow);
  await task.setArbitration(arb);
  await committee.setGPURegistry(gpu);
  await committee.setEscrow(escrow);
  await committee.setArbitration(arb);
  await arb.setTaskRegistry(task);
  await arb.setGPURegistry(gpu);
  await arb.setCommittee(committee);
  await arb.setEscrow(escrow);

  // The fixture's two miners are established (off probation); miners registered later in a
  // test start on probation, as the contract's defaults say. `miner` serves the model in FP32,
  // `miner2` in BF16.
  const probation = [await gpu.probationEpochs(), await gpu.probationPassBps()];
  await gpu.setProbation(0, probation[1]);
  for (const [m, p] of [[miner, PRECISION.FP32], [miner2, PRECISION.BF16]]) {
    await gpu.connect(m).register([MODEL], [p], GPU, "http://miner.local", PRICE, { value: P.minStake });
  }
  await gpu.setProbation(...probation);
  for (const v of verifiers) {
    await committee.connect(v).register({ value: P.minVerifierStake });
  }
  await activate(committee);
  return { escrow, gpu, task, committee, arb, owner, client, arbiter, miner, miner2, outsider, verifiers, signers };
}

/** Moves the clock to the start of the epoch at which every pending join or exit has taken
 * effect (the committee's last scheduled change); returns that epoch. */
async function activate(committee) {
  const cur = await committee.currentEpoch();
  const at = cur + (await committee.activationDelay());
  const start = await committee.epochStart(at);
  if (BigInt(await time.latest()) < start) await time.increaseTo(start);
  return at;
}

/** The TaskTerms struct createTask takes, from the helper's short names. */
function termsOf(a) {
  return {
    modelId: a.modelId, inputRoot: a.inputRoot, inputURI: a.inputURI, numRequests: a.numRequests,
    shardSize: a.shardSize, maxTokensPerRequest: a.maxTokens, pricePerToken: a.price, deadline: a.deadline,
    minReputationBps: a.minRep, arbiter: a.arbiter, allowProbation: a.allowProbation,
    precisions: a.precisions, requireCommitments: a.requireCommitments,
  };
}

/** Default task: 10 requests, shards of 4 (sizes 4, 4, 2), 100 tokens max, 1 gwei per token,
 * any precision, commitments not required. */
async function createTask(task, client, over = {}) {
  // Pin the creating block to latest+1: after a fixture snapshot is restored, Hardhat would
  // otherwise stamp the next block with the wall-clock time elapsed since the snapshot.
  const now = BigInt((await ethers.provider.getBlock("latest")).timestamp) + 1n;
  await ethers.provider.send("evm_setNextBlockTimestamp", [Number(now)]);
  const a = {
    modelId: MODEL,
    inputRoot: ethers.keccak256(ethers.toUtf8Bytes("inputs")),
    inputURI: "store://inputs",
    numRequests: 10,
    shardSize: 4,
    maxTokens: 100,
    price: PRICE,
    deadline: now + 3600n,
    minRep: 0,
    arbiter: ethers.ZeroAddress,
    allowProbation: false,
    precisions: 0,
    requireCommitments: false,
    ...over,
  };
  const value = over.value ?? BigInt(a.numRequests) * BigInt(a.maxTokens) * a.price;
  const tx = await task.connect(client).createTask(termsOf(a), { value });
  const rc = await tx.wait();
  const ev = rc.logs.map((l) => { try { return task.interface.parseLog(l); } catch { return null; } })
    .find((e) => e && e.name === "TaskCreated");
  return { taskId: ev.args.taskId, args: a, value, tx };
}

function receiptStructHash(r) {
  return ethers.TypedDataEncoder.hashStruct("Receipt", RECEIPT_TYPES, r);
}

/**
 * Builds signed receipts and the result (sum) tree for a shard's index range. `tokens` is the
 * output tokens of every receipt, or a function of the request index.
 * Returns { root, total, receipts, sigs, tree, proofOf(k) }: submit `root` as resultRoot and
 * `total` as tokensUsed; `proofOf(k)` proves receipts[k] ([{hash, sum}] from the leaf up).
 */
async function buildResult(task, taskId, shard, start, end, minerSigner, modelId = MODEL, tokens = 10) {
  const domain = await domainOf(task);
  const receipts = [];
  const sigs = [];
  for (let i = start; i < end; i++) {
    const r = {
      taskId,
      shard,
      index: i,
      requestHash: ethers.keccak256(ethers.toUtf8Bytes(`req-${taskId}-${i}`)),
      outputHash: ethers.keccak256(ethers.toUtf8Bytes(`out-${taskId}-${i}`)),
      outputTokens: typeof tokens === "function" ? tokens(i) : tokens,
      modelId,
      commitment: ethers.keccak256(ethers.toUtf8Bytes(`commitment-${taskId}-${i}`)),
    };
    receipts.push(r);
    sigs.push(await minerSigner.signTypedData(domain, RECEIPT_TYPES, r));
  }
  const tree = resultTree(receipts);
  const proofOf = (k) => tree.proof(k);
  return { root: tree.root, total: tree.total, receipts, sigs, tree, proofOf };
}

/** The result tree of receipts in index order. */
function resultTree(receipts) {
  return new SumTree(receipts.map((r) => ({ hash: receiptLeaf(r), sum: BigInt(r.outputTokens) })));
}

/** A receipt's result-tree leaf hash (Arbitration.receiptLeaf). */
function receiptLeaf(r) {
  return leafHash(BigInt(r.index), receiptStructHash(r));
}

async function signVotes(arb, signers, disputeId, minerAtFault, domainOver = {}) {
  const domain = { ...(await domainOf(arb)), ...domainOver };
  const sorted = sortByAddress(signers);
  return Promise.all(sorted.map((s) => s.signTypedData(domain, VOTE_TYPES, { disputeId, minerAtFault })));
}

async function signReport(committee, signers, report, domainOver = {}) {
  const domain = { ...(await domainOf(committee)), ...domainOver };
  const sorted = sortByAddress(signers);
  return Promise.all(sorted.map((s) => s.signTypedData(domain, REPORT_TYPES, report)));
}

async function signChallengeSet(committee, signers, value, domainOver = {}) {
  const domain = { ...(await domainOf(committee)), ...domainOver };
  const sorted = sortByAddress(signers);
  return Promise.all(sorted.map((s) => s.signTypedData(domain, CHALLENGE_TYPES, value)));
}

/** Gas cost in wei of a mined transaction. */
async function gasCost(tx) {
  const rc = await tx.wait();
  return rc.gasUsed * rc.gasPrice;
}

module.exports = {
  P, MODEL, OTHER_MODEL, GPU, PRICE, PRECISION, maskOf, termsOf,
  RECEIPT_TYPES, VOTE_TYPES, REPORT_TYPES, CHALLENGE_TYPES, SWARM_TYPES,
  domainOf, sortByAddress, deployQuarry, activate, createTask, receiptStructHash, receiptLeaf,
  resultTree, buildResult, signVotes, signReport, signChallengeSet, gasCost,
};
