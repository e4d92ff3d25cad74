// Randomized sequences of every value-moving call, with time jumps. After every step:
//   balance(escrow) == totalEscrowed + totalWithdrawable
// and every 10 steps (and at the end) the wider accounting: per-task escrow, per-actor
// withdrawable, stakes, locked collateral, bonds held, and the shard states of a JS model.
const { expect } = require("chai");
const { ethers } = require("hardhat");
const { loadFixture, time } = require("@nomicfoundation/hardhat-network-helpers");
const { P, MODEL, deployQuarry, buildResult, signVotes, signReport } = require("./helpers");

const S = { Open: 0, Claimed: 1, Submitted: 2, Disputed: 3, Finalized: 4, Refunded: 5 };
// Hardhat stamps blocks with wall-clock time plus the test's offset, so the next block may be a
// second or two later than latest+1. "Still before X" choices keep this margin; "already past
// X" choices need none (later only makes them truer).
const M = 30n;

/** mulberry32: small, seedable, good enough to drive test sequences. */
function prng(seed) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return {
    next,
    int: (lo, hi) => lo + Math.floor(next() * (hi - lo + 1)), // inclusive
    pick: (arr) => arr[Math.floor(next() * arr.length)],
    chance: (p) => next() < p,
    shuffle: (arr) => {
      const a = [...arr];
      for (let i = a.length - 1; i > 0; i--) {
        const j = Math.floor(next() * (i + 1));
        [a[i], a[j]] = [a[j], a[i]];
      }
      return a;
    },
  };
}

async function run(seed, steps) {
  const q = await loadFixture(deployQuarry);
  const { escrow, gpu, task, committee, arb, client, arbiter, miner, miner2, outsider, verifiers, signers } = q;
  const miner3 = signers[10];
  const client2 = signers[11];
  await gpu.connect(miner3).register([MODEL], { name: "g", memoryMiB: 1, count: 1 }, "e", 1, { value: P.minStake });
  const miners = [miner, miner2, miner3];
  const clients = [client, client2];
  const actors = [...new Set([...clients, arbiter, ...miners, outsider, ...verifiers, q.owner])];
  const rnd = prng(seed);
  const tasks = []; // { id, client, numShards, deadline, cancelled, shards: [{state, claimExpiry, windowEnd, miner}] }
  const results = new Map(); // "task:shard" -> buildResult output
  const disputes = []; // { id, taskId, shard, deadline, open }
  const counts = {};
  const now = async () => BigInt(await time.latest());

  const refreshShard = async (t, s) => {
    const sh = await task.getShard(t.id, s);
    t.shards[s] = { state: Number(sh.state), claimExpiry: sh.claimExpiry, windowEnd: sh.windowEnd, miner: sh.miner };
  };
  const allShards = (pred) => {
    const out = [];
    for (const t of tasks) t.shards.forEach((s, i) => { if (pred(t, s, i)) out.push([t, i]); });
    return out;
  };

  async function checkCore() {
    const bal = await ethers.provider.getBalance(escrow);
    expect(bal).to.equal((await escrow.totalEscrowed()) + (await escrow.totalWithdrawable()));
  }

  async function checkWide() {
    let sumEscrowed = 0n;
    for (const t of tasks) {
      const onchain = await task.getTask(t.id);
      let committed = 0n;
      let open = 0n;
      for (let s = 0; s < t.numShards; s++) {
        const sh = await task.getShard(t.id, s);
        expect(Number(sh.state)).to.equal(t.shards[s].state, `task ${t.id} shard ${s} state`);
        const b = await task.shardBudget(t.id, s);
        if ([S.Claimed, S.Submitted, S.Disputed].includes(Number(sh.state))) committed += b;
        if (Number(sh.state) === S.Open) open += b;
      }
      expect(onchain.committed).to.equal(committed);
      const esc = await escrow.escrowed(t.id);
      expect(esc).to.equal(committed + open, `task ${t.id} escrow`);
      sumEscrowed += esc;
    }
    expect(await escrow.totalEscrowed()).to.equal(sumEscrowed);
    let sumW = 0n;
    for (const a of actors) sumW += await escrow.withdrawable(a);
    expect(await escrow.totalWithdrawable()).to.equal(sumW);
    let stakes = 0n;
    for (const m of miners) {
      const info = await gpu.minerInfo(m);
      expect(info.locked <= info.stake).to.equal(true);
      let coll = 0n;
      for (const [t, s] of allShards((t, sh) => sh.miner === m.address && [S.Claimed, S.Submitted, S.Disputed].includes(sh.state))) {
        coll += (await task.getShard(t.id, s)).collateral;
      }
      expect(info.locked).to.equal(coll, `locked collateral of ${m.address}`);
      stakes += info.stake;
    }
    expect(await ethers.provider.getBalance(gpu)).to.equal(stakes);
    let bonds = 0n;
    for (const d of disputes) if (d.open) bonds += (await arb.getDispute(d.id)).bond;
    expect(await ethers.provider.getBalance(arb)).to.equal(bonds);
    expect(await ethers.provider.getBalance(task)).to.equal(0);
  }

  const actions = {
    async createTask() {
      if (tasks.length >= 12) return false;
      const c = rnd.pick(clients);
      const numRequests = rnd.int(1, 10);
      const shardSize = rnd.int(1, 4);
      const maxTokens = rnd.int(1, 50);
      const price = BigInt(rnd.int(1, 1e9));
      const deadline = (await now()) + BigInt(rnd.int(300, 2500));
      const value = BigInt(numRequests) * BigInt(maxTokens) * price;
      const arbiterAddr = rnd.chance(0.5) ? arbiter.address : ethers.ZeroAddress;
      const args = [MODEL, ethers.id("in"), "store://in", numRequests, shardSize, maxTokens, price, deadline, 0, arbiterAddr];
      if (rnd.chance(0.1)) {
        await expect(task.connect(c).createTask(...args, { value: value + 1n })).to.be.revertedWithCustomError(task, "WrongPayment");
        return true;
      }
      await task.connect(c).createTask(...args, { value });
      const id = await task.taskCount();
      const n = Math.ceil(numRequests / shardSize);
      const t = { id, client: c, arbiter: arbiterAddr, numShards: n, deadline, cancelled: false, shards: [] };
      for (let s = 0; s < n; s++) t.shards.push({ state: S.Open, claimExpiry: 0n, windowEnd: 0n, miner: ethers.ZeroAddress });
      tasks.push(t);
      return true;
    },
    async claimShard() {
      const ts = await now();
      const c = allShards((t, s) => s.state === S.Open && ts + M < t.deadline);
      if (!c.length) return false;
      const [t, s] = rnd.pick(c);
      const m = rnd.pick(miners);
      if (!(await gpu.isEligible(m, MODEL, 0))) {
        await expect(task.connect(m).claimShard(t.id, s)).to.be.revertedWithCustomError(task, "NotEligible");
        return true;
      }
      await task.connect(m).claimShard(t.id, s);
      await refreshShard(t, s);
      return true;
    },
    async submitResult() {
      const ts = await now();
      const c = allShards((t, s) => s.state === S.Claimed && ts + M < s.claimExpiry);
      if (!c.length) return false;
      const [t, s] = rnd.pick(c);
      const [start, end] = await task.shardRange(t.id, s);
      const m = miners.find((x) => x.address === t.shards[s].miner);
      const res = await buildResult(task, t.id, s, Number(start), Number(end), m);
      const max = (await task.getTask(t.id)).maxTokensPerRequest * (end - start);
      await task.connect(m).submitResult(t.id, s, res.root, "store://out", BigInt(rnd.int(0, Number(max))));
      results.set(`${t.id}:${s}`, res);
      await refreshShard(t, s);
      return true;
    },
    async finalizeShard() {
      const ts = await now();
      const c = allShards((t, s) => s.state === S.Submitted);
      if (!c.length) return false;
      const [t, s] = rnd.pick(c);
      if (ts + M < t.shards[s].windowEnd) {
        await expect(task.finalizeShard(t.id, s)).to.be.revertedWithCustomError(task, "WindowNotClosed");
        return true;
      }
      if (ts + 1n < t.shards[s].windowEnd) return false; // too close to call
      await task.connect(rnd.pick(actors)).finalizeShard(t.id, s);
      await refreshShard(t, s);
      await expect(task.finalizeShard(t.id, s)).to.be.revertedWithCustomError(task, "AlreadyFinalized");
      return true;
    },
    async reclaimExpired() {
      const ts = await now();
      const c = allShards((t, s) => s.state === S.Claimed && ts + 1n >= s.claimExpiry);
      if (!c.length) return false;
      const [t, s] = rnd.pick(c);
      await task.connect(rnd.pick(actors)).reclaimExpired(t.id, s);
      await refreshShard(t, s);
      return true;
    },
    async refundUnfinished() {
      const ts = await now();
      const c = allShards((t, s) => ts + 1n >= t.deadline &&
        (s.state === S.Open || (s.state === S.Claimed && ts + 1n >= s.claimExpiry)));
      if (!c.length) return false;
      const [t, s] = rnd.pick(c);
      await task.connect(rnd.pick(actors)).refundUnfinished(t.id, s);
      await refreshShard(t, s);
      return true;
    },
    async cancelTask() {
      const c = tasks.filter((t) => !t.cancelled);
      if (!c.length) return false;
      const t = rnd.pick(c);
      await task.connect(t.client).cancelTask(t.id);
      t.cancelled = true;
      for (let s = 0; s < t.numShards; s++) await refreshShard(t, s);
      return true;
    },
    async openDispute() {
      const ts = await now();
      const c = allShards((t, s) => s.state === S.Submitted && ts + M < s.windowEnd);
      if (!c.length) return false;
      const [t, s] = rnd.pick(c);
      const res = results.get(`${t.id}:${s}`);
      const k = rnd.int(0, res.receipts.length - 1);
      const from = t.arbiter !== ethers.ZeroAddress && rnd.chance(0.5) ? arbiter : t.client;
      const bond = P.minBond + BigInt(rnd.int(0, 1e6));
      await arb.connect(from).openDispute(t.id, s, res.receipts[k], res.sigs[k], res.proofOf(k), "ev", { value: bond });
      const id = await arb.disputeCount();
      disputes.push({ id, taskId: t.id, shard: s, open: true, deadline: (await arb.getDispute(id)).deadline });
      await refreshShard(t, s);
      return true;
    },
    async resolve() {
      const ts = await now();
      const c = disputes.filter((d) => d.open && ts + M < d.deadline);
      if (!c.length) return false;
      const d = rnd.pick(c);
      const fault = rnd.chance(0.5);
      const quorum = Number(await committee.quorum());
      // a random subset of at least a quorum; signVotes puts it in address order
      const chosen = rnd.shuffle(verifiers).slice(0, rnd.int(quorum, verifiers.length));
      const sigs = await signVotes(arb, chosen, d.id, fault);
      if (rnd.chance(0.1)) {
        await expect(arb.resolve(d.id, fault, sigs.slice(0, quorum - 1))).to.be.revertedWithCustomError(arb, "QuorumNotReached");
        return true;
      }
      await arb.resolve(d.id, fault, sigs);
      d.open = false;
      const t = tasks.find((x) => x.id === d.taskId);
      await refreshShard(t, d.shard);
      return fault ? "resolveFault" : "resolveNoFault";
    },
    async expireDispute() {
      const ts = await now();
      const c = disputes.filter((d) => d.open && ts + 1n >= d.deadline);
      if (!c.length) return false;
      const d = rnd.pick(c);
      await arb.connect(rnd.pick(actors)).expireDispute(d.id);
      d.open = false;
      await refreshShard(tasks.find((x) => x.id === d.taskId), d.shard);
      return true;
    },
    async withdraw() {
      const c = [];
      for (const a of actors) if ((await escrow.withdrawable(a)) > 0n) c.push(a);
      if (!c.length) return false;
      await escrow.connect(rnd.pick(c)).withdraw();
      return true;
    },
    async reputation() {
      const e = await committee.currentEpoch();
      if (await committee.reported(e)) return false;
      const scores = miners.map(() => rnd.int(3500, 10000));
      const r = { epoch: e, miners: miners.map((m) => m.address), scoresBps: scores, evidenceRoot: ethers.id("ev") };
      const sigs = await signReport(committee, verifiers, r);
      await committee.submitReputation(r.epoch, r.miners, r.scoresBps, r.evidenceRoot, sigs);
      return true;
    },
    async timeJump() {
      await time.increase(rnd.int(1, 700));
      return true;
    },
  };
  const weights = [
    ["createTask", 10], ["claimShard", 14], ["submitResult", 12], ["finalizeShard", 10], ["reclaimExpired", 5],
    ["refundUnfinished", 4], ["cancelTask", 2], ["openDispute", 10], ["resolve", 4], ["expireDispute", 4],
    ["withdraw", 6], ["reputation", 2], ["timeJump", 10],
  ];
  const total = weights.reduce((a, [, w]) => a + w, 0);
  for (let i = 0; i < steps; i++) {
    let x = rnd.next() * total;
    let name = weights[0][0];
    for (const [n, w] of weights) { if ((x -= w) < 0) { name = n; break; } }
    const did = await actions[name]();
    if (did) {
      const key = typeof did === "string" ? did : name;
      counts[key] = (counts[key] || 0) + 1;
    }
    await checkCore();
    if (i % 10 === 9) await checkWide();
  }
  await checkWide();
  return counts;
}

describe("Invariant: escrow balance == totalEscrowed + totalWithdrawable", function () {
  this.timeout(180000);
  const seeds = [1, 3, 7, 42, 2024, 99];
  const STEPS = 120;
  const agg = {};
  for (const seed of seeds) {
    it(`holds over ${STEPS} random steps (seed ${seed})`, async function () {
      const counts = await run(seed, STEPS);
      for (const [k, v] of Object.entries(counts)) agg[k] = (agg[k] || 0) + v;
      // every seed must exercise the core life of a shard, or the test proves little
      for (const k of ["createTask", "claimShard", "submitResult", "finalizeShard"]) {
        expect(counts[k] || 0, `${k} in seed ${seed}: ${JSON.stringify(counts)}`).to.be.greaterThan(0);
      }
      if (process.env.QUARRY_INVARIANT_VERBOSE) console.log(seed, JSON.stringify(counts));
    });
  }
  it("the seeds together exercise every action, disputes resolved both ways", function () {
    for (const k of ["openDispute", "resolveFault", "resolveNoFault", "expireDispute", "reclaimExpired",
      "refundUnfinished", "cancelTask", "withdraw", "reputation", "timeJump"]) {
      expect(agg[k] || 0, `${k}: ${JSON.stringify(agg)}`).to.be.greaterThan(0);
    }
  });
});
