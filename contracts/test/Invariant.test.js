// Randomized sequences of every value-moving call, with time jumps across epoch boundaries.
// After every step:
//   balance(escrow) == totalEscrowed + totalWithdrawable
// and every few steps (and at the end) the wider accounting against a JS model that predicts
// every outcome (revert or event, amount to the wei) before the call is made:
//   - per-task escrow, per-account withdrawable, TaskRegistry holds nothing;
//   - GPURegistry balance == sum of miner stakes; locked collateral per miner == sum of the
//     collateral of its Claimed/Submitted/Disputed shards; reputation and probation (only
//     reports of epochs that started at or after the registration count), registeredAt;
//     untrusted reports in a row, each after the first burning a share of the free stake;
//   - Arbitration balance == bonds of open disputes + bonds of open availability challenges;
//   - VerifierCommittee balance == sum of verifierInfo.stake over every verifier registered and
//     not withdrawn; each verifier's record, strikes, seats and the weight snapshots per epoch;
//   - every shard's state, miner, times, collateral and tokens, the swarm that claimed it, and
//     the precision recorded at its claim (a miner's or its swarm's least exact member's
//     declaration, which the task's accepted mask must include; miners re-declare at random);
//   - swarms (formed by the miners' EIP-712 consents): whether each still takes claims, every
//     miner's consent nonce; a swarm shard's pay split over its members by share (floor each,
//     the remainder to the head), its collateral locked from and every fault (reclaim penalty,
//     unanswered challenge, billing fault, lost dispute) slashed from the head alone, so no
//     other member's stake or lock ever moves for it;
//   - a slash never takes another open shard's collateral (only free stake), so every open
//     shard stays settleable: heavy tasks (collateral a large part of a stake) lock miners and
//     heads fully across several shards, and faults then hit them with other shards open.
// Every transaction's block timestamp is pinned to latest + 1, so the model knows the exact
// `block.timestamp` (and epoch) each call runs at.
const { expect } = require("chai");
const { ethers } = require("hardhat");
const { loadFixture, time } = require("@nomicfoundation/hardhat-network-helpers");
const {
  P, MODEL, PRECISION, SWARM_TYPES, deployQuarry, termsOf, domainOf, resultTree, receiptLeaf, signVotes, signReport, gasCost,
} = require("./helpers");
const { LyingSumTree } = require("./resultTree");

const S = { Open: 0, Claimed: 1, Submitted: 2, Disputed: 3, Finalized: 4, Refunded: 5 };
const DS = { open: 1n, fault: 2n, nofault: 3n, expired: 4n };
const CS = { open: 1n, answered: 2n, unanswered: 3n };
const BPS = 10000n;
const MAX64 = 2n ** 64n - 1n;
const LIVE = [S.Claimed, S.Submitted, S.Disputed];
const coder = ethers.AbiCoder.defaultAbiCoder();
const MAX_MEMBERS = 6n; // small, so joins displace the least stake
const CHURN = 2; // small, so joins around a boundary compete for its slots by stake

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

/** Arbitration's outputHash: keccak256(abi.encode(textHash, keccak256(abi.encodePacked(uint32[] ids)))). */
function outputHashOf(textHash, ids) {
  const packed = ids.length ? ethers.concat(ids.map((i) => ethers.zeroPadValue(ethers.toBeHex(i), 32))) : "0x";
  return ethers.keccak256(coder.encode(["bytes32", "bytes32"], [textHash, ethers.keccak256(packed)]));
}

const min = (a, b) => (a < b ? a : b);
const max = (a, b) => (a > b ? a : b);
const byAddress = (a, b) => (BigInt(a) < BigInt(b) ? -1 : 1);

/** Runs `steps` random actions from `seed` (drawn by `weightsOver`'s weights when given, else
 * the full mix) and checks the invariants after each; returns how often each outcome came up. */
async function run(seed, steps, wideEvery, weightsOver) {
  const q = await loadFixture(deployQuarry);
  const { escrow, gpu, task, committee, arb, client, arbiter, miner, miner2, outsider, verifiers, signers } = q;
  const miner3 = signers[10];
  const client2 = signers[11];
  const vsigners = [...verifiers, ...signers.slice(12, 20)];
  const vByAddr = new Map(vsigners.map((v) => [v.address, v]));
  const miners = [miner, miner2, miner3];
  const clients = [client, client2];
  const actors = [...new Set([...clients, arbiter, ...miners, outsider, ...vsigners, q.owner])];
  const rnd = prng(seed);
  const counts = {};
  const bump = (k) => { counts[k] = (counts[k] || 0) + 1; };

  // ---------------------------------------------------------------- time
  const genesis = await committee.genesisTime();
  const EPOCH = P.epochDuration;
  const epochOf = (ts) => (ts - genesis) / EPOCH;
  const epochStart = (e) => genesis + e * EPOCH;
  /** Pins the next block to latest + 1 and returns that timestamp. */
  const pin = async () => {
    const ts = BigInt(await time.latest()) + 1n;
    await time.setNextBlockTimestamp(ts);
    return ts;
  };

  // ---------------------------------------------------------------- model
  const w = new Map(actors.map((a) => [a.address, 0n])); // escrow withdrawable
  const credit = (addr, amt) => { w.set(addr, w.get(addr) + amt); };
  const mstate = new Map(); // miner -> { stake, rep, onProbation, passed, registeredAt }
  const tasks = [];
  const disputes = [];
  const challenges = [];
  const swarms = []; // { id, head, members (addresses, ascending), shares, headIndex, ask, active }
  const nonces = new Map(); // miner -> swarm-consent nonce
  // committee
  const vinfo = new Map(vsigners.map((v) => [v.address, null])); // current record or null
  const regs = []; // every registration ever (records stay here after a withdrawal)
  const strikes = new Map(vsigners.map((v) => [v.address, 0n]));
  const activations = new Map();
  let seats = [];
  let lastKey = 0n;
  let nextReportEpoch = 0n;

  // the fixture's state, and miner3 registering (on probation), and a small committee
  await gpu.connect(miner3).register([MODEL], [PRECISION.FP16], { name: "g", memoryMiB: 1, count: 1 }, "e", 1, { value: P.minStake });
  // declared precisions for MODEL (the fixture's miners: FP32 and BF16)
  const mprec = new Map([[miner.address, PRECISION.FP32], [miner2.address, PRECISION.BF16], [miner3.address, PRECISION.FP16]]);
  const accepts = (mask, p) => p !== 0 && (mask === 0 || ((mask >> p) & 1) === 1);
  /** The swarm's precision: its members' largest (least exact) declaration. */
  const swarmPrecisionOf = (sw) => Math.max(...sw.members.map((a) => mprec.get(a)));
  const registered3 = BigInt(await time.latest()); // its registration's block
  await committee.setMaxMembers(MAX_MEMBERS);
  await committee.setMembershipParams(1, CHURN);
  for (const m of miners) {
    const i = await gpu.minerInfo(m);
    mstate.set(m.address, {
      stake: i.stake, rep: i.reputationBps, onProbation: i.onProbation, passed: i.passedEpochs, registeredAt: i.registeredAt,
      untrusted: 0n, // reports in a row that left it untrusted
      missed: 0n, // reports in a row that found its challenge unanswered
    });
  }
  // every such report after the first burns a share of the free stake (credited to BURN)
  const BURN = await gpu.BURN();
  const MISSED = Number(await committee.MISSED());
  const MISSED_ALLOWED = 1n; // two misses in a row put a miner back on probation
  await gpu.setMissedReportsAllowed(MISSED_ALLOWED);
  const untrustedBelow = await gpu.untrustedBelowBps();
  const untrustedSlash = await gpu.untrustedSlashBps();
  w.set(BURN, 0n);
  expect(mstate.get(miner3.address).onProbation).to.equal(true);
  expect(mstate.get(miner3.address).registeredAt).to.equal(registered3);
  // reports list the miners strictly ascending by address
  const reportMiners = [...miners].sort((a, b) => byAddress(a.address, b.address));
  // start at the same phase of an epoch whatever the wall clock, so a seed replays exactly
  await time.increaseTo(epochStart(epochOf(BigInt(await time.latest())) + 1n) + 5n);
  seats = [...(await committee.seats())];
  for (const a of seats) {
    const i = await committee.verifierInfo(a);
    const rec = { addr: a, stake: i.stake, weight: i.weight, activeFrom: i.activeFrom, activeUntil: i.activeUntil, withdrawableAt: i.withdrawableAt };
    vinfo.set(a, rec);
    regs.push(rec);
    if (i.activeFrom > lastKey) lastKey = i.activeFrom;
    activations.set(i.activeFrom, Number(await committee.activations(i.activeFrom)));
  }

  /** VerifierCommittee.weightAt: the bonded weight while seated, never more than the stake left. */
  const weightAt = (a, e) => {
    const v = vinfo.get(a);
    if (!v || e < v.activeFrom || e >= v.activeUntil) return 0n;
    return min(v.weight, v.stake);
  };
  const totalAt = (e) => regs.reduce((s, r) => (r.activeFrom <= e && e < r.activeUntil ? s + r.weight : s), 0n);
  const countAt = (e) => regs.reduce((s, r) => (r.activeFrom <= e && e < r.activeUntil ? s + 1n : s), 0n);
  const quorumOf = (e) => (totalAt(e) * 2n) / 3n + 1n;
  const notLeaving = () => [...vinfo.values()].filter((v) => v && v.activeUntil === MAX64);
  const changeEpoch = (ts) => max(epochOf(ts) + 1n, lastKey);
  const unseat = (a, at, ts) => {
    const v = vinfo.get(a);
    v.activeUntil = at;
    if (v.activeFrom === at) {
      // a join that never takes effect: slot and seat back now, stake bonded from now
      activations.set(at, activations.get(at) - 1);
      const i = seats.indexOf(a);
      seats[i] = seats[seats.length - 1];
      seats.pop();
      v.withdrawableAt = ts + P.verifierUnbonding;
    } else {
      // bonded until every dispute its seat could judge has expired, plus the unbonding period
      v.withdrawableAt = epochStart(at) + P.disputeTimeout + P.verifierUnbonding;
    }
    if (at > lastKey) lastKey = at;
  };
  const pruned = (cur) => {
    const out = [...seats];
    let i = 0;
    while (i < out.length) {
      const v = vinfo.get(out[i]);
      if ((v ? v.activeUntil : 0n) <= cur) {
        out[i] = out[out.length - 1];
        out.pop();
      } else {
        ++i;
      }
    }
    return out;
  };
  /** The seated member (not leaving) with the least weight; among equals the one activated
   * last, then the highest address. */
  /** VerifierCommittee._lowestSeat: among seated verifiers not leaving (activated at `from`
   * only, when given), the least weight, then the latest activation, then the highest address. */
  const lowestSeat = (list, from) => {
    let lowest = null;
    let lw = 2n ** 256n - 1n;
    let lf = 0n;
    for (const a of list) {
      const v = vinfo.get(a);
      if (v.activeUntil !== MAX64 || (from !== undefined && v.activeFrom !== from)) continue;
      if (v.weight < lw || (v.weight === lw && (v.activeFrom > lf || (v.activeFrom === lf && BigInt(a) > BigInt(lowest))))) {
        lowest = a; lw = v.weight; lf = v.activeFrom;
      }
    }
    return [lowest, lw];
  };
  /** Signers of epoch `e` (holding weight now) adding up to at least `need`, or null. */
  const quorumSet = (e, need) => {
    const members = rnd.shuffle(vsigners.filter((v) => weightAt(v.address, e) > 0n));
    const out = [];
    let got = 0n;
    for (const v of members) {
      if (got >= need) { if (rnd.chance(0.3)) out.push(v); continue; }
      out.push(v);
      got += weightAt(v.address, e);
    }
    return got >= need ? out : null;
  };

  const shardOf = (t, s) => t.shards[s];
  const settled = (t) => t.shards.every((sh) => sh.state === S.Finalized || sh.state === S.Refunded);
  const budgetOf = (t, s) => BigInt(t.ranges[s][1] - t.ranges[s][0]) * BigInt(t.maxTokens) * t.price;
  const allShards = (pred) => {
    const out = [];
    for (const t of tasks) t.shards.forEach((sh, i) => { if (pred(t, sh, i)) out.push([t, i]); });
    return out;
  };
  const freshShard = () => ({
    state: S.Open, miner: ethers.ZeroAddress, claimExpiry: 0n, windowEnd: 0n, collateral: 0n, tokensUsed: 0n,
    submittedAt: 0n, result: null, avail: {}, swarm: null, precision: 0,
  });
  const eligible = (m, t) => {
    const st = mstate.get(m.address);
    if (st.stake < P.minStake) return false;
    if (st.onProbation && !t.allowProbation) return false;
    return st.rep >= max(BigInt(t.minRep), 4000n);
  };
  /** GPURegistry._split: floor(amount * share / total) per member, the remainder to the head. */
  const splitOf = (sw, amount) => {
    const total = sw.shares.reduce((a, x) => a + BigInt(x), 0n);
    const parts = sw.shares.map((x) => (amount * BigInt(x)) / total);
    parts[sw.headIndex] += amount - parts.reduce((a, x) => a + x, 0n);
    return parts;
  };
  /** The collateral `addr` has locked for shard `sh`: all of it for its miner (a swarm's head). */
  const lockedIn = (sh, addr) => (sh.miner === addr ? sh.collateral : 0n);
  const lockedOf = (addr) => allShards((t, sh) => LIVE.includes(sh.state))
    .reduce((a, [t, s]) => a + lockedIn(shardOf(t, s), addr), 0n);
  /** What a claim may lock (GPURegistry._lock): the free stake less `untrustedSlashBps` of the
   * stake, or less the reserve held for the untrusted burn while a dispute is open, if larger. */
  const lockable = async (addr) => {
    const st = mstate.get(addr);
    const held = await gpu.reserveOf(addr);
    if (held > 0n) bump("claimWithReserve");
    const floor = max((st.stake * untrustedSlash) / BPS, held);
    const free = st.stake - lockedOf(addr);
    return free > floor ? free - floor : 0n;
  };
  /** GPURegistry.slash: up to `amount` of the free stake (the slashed shard is no longer live).
   * A slash paying anyone but BURN may not take the reserve; it never needs to, since the
   * reserve fits in the free stake when a dispute opens and claims cannot use it, so the
   * slashed shard's own collateral covers it (the wider check asserts the reserve fits). */
  const slashMiner = (addr, amount, to) => {
    const st = mstate.get(addr);
    const x = min(amount, st.stake - lockedOf(addr));
    st.stake -= x;
    if (x > 0n) credit(to, x);
    return x;
  };
  /** Slashes the shard's miner: a swarm's head alone, never its other members. */
  const slashLiable = (sh, amount, to) => {
    if (sh.swarm) bump("swarmSlash");
    return slashMiner(sh.miner, amount, to);
  };
  /** Counts a fault or reclaim on a swarm shard, and whether its head still has other shards
   * open (the settlement a rounding slash used to freeze). */
  const bumpSwarmFault = (sh, kind) => {
    if (!sh.swarm) return;
    bump(kind);
    if (lockedOf(sh.miner) > 0n) bump(`${kind}WithOpen`);
  };
  /** Picks a [task, shard] from `c`, a swarm's shard half the time when there is one, so the
   * swarm paths (faults on a head's shards among them) are reached many times per seed. */
  const pickPreferSwarm = (c) => {
    const sw = c.filter(([t, s]) => shardOf(t, s).swarm);
    return rnd.pick(sw.length && rnd.chance(0.5) ? sw : c);
  };
  /** Arbitration._settleFault: budget back to the client, collateral slashed, the voters'
   * reward split by their recorded weights ([address, weight] pairs), the rest to the client. */
  /** Settles a fault on shard `s`: the rest of the slash goes to the client, or to `rest`
   * (BURN for an unanswered availability challenge). */
  const settleFault = (t, s, voters, rest) => {
    const sh = shardOf(t, s);
    const budget = budgetOf(t, s);
    sh.state = S.Refunded;
    bumpSwarmFault(sh, "swarmFault");
    t.committed -= budget;
    credit(t.client.address, budget);
    const slashAmount = (sh.collateral * BigInt(P.faultSlashBps)) / BPS;
    const reward = voters.length ? (slashAmount * BigInt(P.verifierRewardBps)) / BPS : 0n;
    const tally = voters.reduce((a, [, x]) => a + x, 0n);
    let slashed = 0n;
    let paid = 0n;
    for (const [v, x] of voters) {
      const share = (reward * x) / tally;
      paid += share;
      slashed += slashLiable(sh, share, v);
    }
    slashed += slashLiable(sh, slashAmount - paid, rest ?? t.client.address);
    return slashed;
  };

  /** A shard result: receipts with real (textHash, tokenIds) outputs, some deliberately bad. */
  function buildShardResult(t, s, kind) {
    const [start, end] = t.ranges[s];
    const n = end - start;
    const maxT = t.maxTokens;
    const bad = kind === "overcap" || kind === "miscount" ? rnd.int(0, n - 1) : -1;
    const receipts = [];
    const outputs = [];
    let others = 0;
    for (let k = 0; k < n; k++) {
      const L = (kind === "overcap" || kind === "miscount") && k !== bad ? rnd.int(0, maxT - 1)
        : kind === "miscount" ? rnd.int(0, maxT - 1) : rnd.int(0, maxT);
      const ids = Array.from({ length: L }, () => rnd.int(0, 60000));
      const textHash = ethers.id(`text-${seed}-${t.id}-${start + k}-${rnd.int(0, 1e9)}`);
      let outputTokens = L;
      if (k === bad && kind === "miscount") outputTokens = rnd.int(L + 1, maxT); // bills more than its output
      if (k !== bad) others += L;
      receipts.push({
        taskId: t.id, shard: s, index: start + k, requestHash: ethers.id(`req-${t.id}-${start + k}`),
        outputHash: outputHashOf(textHash, ids), outputTokens, modelId: MODEL,
        commitment: rnd.chance(0.5) ? ethers.id(`commitment-${textHash}`) : ethers.ZeroHash,
      });
      outputs.push({ textHash, ids });
    }
    if (kind === "overcap") receipts[bad].outputTokens = maxT + rnd.int(1, (n - 1) * maxT - others);
    let tree = resultTree(receipts);
    const cap = BigInt(n * maxT);
    let tokensUsed = tree.total;
    if (kind === "inflated") tokensUsed = tree.total + BigInt(rnd.int(1, Number(cap - tree.total)));
    const leaves = receipts.map((r) => ({ hash: receiptLeaf(r), sum: BigInt(r.outputTokens) }));
    // `paths` gives every leaf's SumStep path (Arbitration.proveSumFault) as the miner committed it
    let paths = new LyingSumTree(leaves, kind === "inflated" ? { root: tokensUsed } : {});
    let lied = [0, 0]; // the leaves [lo, hi) under a lying inner node: their proofs fail
    if (kind === "lie") {
      // a parent records a false sum for one subtree (up, within the shard's cap, or down)
      const key = rnd.pick([...paths.nodes.keys()].filter((x) => x !== `0:${n}`));
      const truth = paths.nodes.get(key).sum;
      const room = cap - tree.total;
      const delta = room > 0n && (truth === 0n || rnd.chance(0.7)) ? BigInt(rnd.int(1, Number(room))) : -BigInt(rnd.int(1, Number(truth)));
      paths = new LyingSumTree(leaves, { [key]: truth + delta });
      lied = key.split(":").map(Number);
      tree = paths;
      tokensUsed = paths.total;
    }
    const liedAt = (k) => kind === "inflated" || (k >= lied[0] && k < lied[1]); // the commitment's sums lie on k's path
    return { kind, bad, receipts, outputs, tree, tokensUsed, proofOf: (k) => tree.proof(k), paths, liedAt, lied };
  }

  // ---------------------------------------------------------------- checks
  async function checkCore() {
    const bal = await ethers.provider.getBalance(escrow);
    expect(bal).to.equal((await escrow.totalEscrowed()) + (await escrow.totalWithdrawable()));
  }

  async function checkWide() {
    // tasks, shards, escrow per task
    // a task whose shards are all Finalized or Refunded can change no more: it is checked once
    // (its escrow is then 0) and skipped afterwards
    let sumEscrowed = 0n;
    for (const t of tasks) {
      if (t.checkedSettled) continue;
      if (settled(t)) t.checkedSettled = true;
      const onchain = await task.getTask(t.id);
      expect(onchain.committed).to.equal(t.committed, `task ${t.id} committed`);
      expect(onchain.cancelled).to.equal(t.cancelled);
      let held = 0n;
      for (let s = 0; s < t.shards.length; s++) {
        const m = shardOf(t, s);
        const sh = await task.getShard(t.id, s);
        const tag = `task ${t.id} shard ${s}`;
        expect(Number(sh.state)).to.equal(m.state, `${tag} state`);
        expect(sh.miner).to.equal(m.miner, `${tag} miner`);
        expect(sh.claimExpiry).to.equal(m.claimExpiry, `${tag} claimExpiry`);
        expect(sh.windowEnd).to.equal(m.windowEnd, `${tag} windowEnd`);
        expect(sh.collateral).to.equal(m.collateral, `${tag} collateral`);
        expect(sh.tokensUsed).to.equal(m.tokensUsed, `${tag} tokensUsed`);
        expect(sh.submittedAt).to.equal(m.submittedAt, `${tag} submittedAt`);
        expect(Number(sh.precision)).to.equal(m.precision, `${tag} precision`);
        expect(await task.shardSwarm(t.id, s)).to.equal(m.swarm ? m.swarm.id : 0n, `${tag} swarm`);
        if (m.result) expect(sh.resultRoot).to.equal(m.result.tree.root);
        for (const [a, n] of Object.entries(m.avail)) expect(await arb.availabilityChallengesOf(t.id, s, a)).to.equal(n);
        if (m.state === S.Open || LIVE.includes(m.state)) held += budgetOf(t, s);
      }
      const esc = await escrow.escrowed(t.id);
      expect(esc).to.equal(held, `task ${t.id} escrow`);
      sumEscrowed += esc;
    }
    expect(await escrow.totalEscrowed()).to.equal(sumEscrowed);
    // withdrawable, to the wei, per account
    let sumW = 0n;
    for (const a of actors) {
      expect(await escrow.withdrawable(a)).to.equal(w.get(a.address), `withdrawable of ${a.address}`);
      sumW += w.get(a.address);
    }
    expect(await escrow.withdrawable(BURN)).to.equal(w.get(BURN), "burned");
    sumW += w.get(BURN);
    expect(await escrow.totalWithdrawable()).to.equal(sumW);
    expect(await ethers.provider.getBalance(escrow)).to.equal(sumEscrowed + sumW);
    // miners
    let stakes = 0n;
    for (const m of miners) {
      const info = await gpu.minerInfo(m);
      const st = mstate.get(m.address);
      expect(info.stake).to.equal(st.stake, `stake of ${m.address}`);
      expect(await gpu.untrustedReportsOf(m)).to.equal(st.untrusted, `untrusted reports of ${m.address}`);
      expect(await gpu.missedReportsOf(m)).to.equal(st.missed, `missed reports of ${m.address}`);
      expect(info.locked).to.equal(lockedOf(m.address), `locked collateral of ${m.address}`);
      // the reserve always fits in the free stake, so no slash to a client or voter is cut short
      expect(await gpu.reserveOf(m)).to.be.at.most(info.stake - info.locked, `reserve of ${m.address}`);
      expect(info.reputationBps).to.equal(st.rep);
      expect(info.onProbation).to.equal(st.onProbation);
      expect(info.passedEpochs).to.equal(st.passed);
      expect(info.registeredAt).to.equal(st.registeredAt);
      stakes += info.stake;
    }
    expect(await ethers.provider.getBalance(gpu)).to.equal(stakes);
    // swarms
    expect(await gpu.swarmCount()).to.equal(swarms.length);
    for (const sw of swarms) expect((await gpu.swarmInfo(sw.id)).active).to.equal(sw.active, `swarm ${sw.id} active`);
    for (const m of miners) expect(await gpu.nonces(m)).to.equal(nonces.get(m.address) || 0n);
    // arbitration: bonds of open disputes and open availability challenges
    expect(await arb.disputeCount()).to.equal(disputes.length);
    expect(await arb.challengeCount()).to.equal(challenges.length);
    let bonds = 0n;
    for (const d of disputes) {
      const od = await arb.getDispute(d.id);
      expect(od.status).to.equal(DS[d.status], `dispute ${d.id} status`);
      expect(od.epoch).to.equal(d.epoch);
      expect(od.totalWeight).to.equal(d.totalWeight);
      expect(od.faultWeight).to.equal(d.faultW);
      expect(od.noFaultWeight).to.equal(d.noFaultW);
      expect(await arb.votersOf(d.id, true)).to.deep.equal(d.voters.true);
      expect(await arb.votersOf(d.id, false)).to.deep.equal(d.voters.false);
      if (d.status === "open") bonds += od.bond;
    }
    for (const c of challenges) {
      const oc = await arb.getChallenge(c.id);
      expect(oc.status).to.equal(CS[c.status], `challenge ${c.id} status`);
      if (c.status === "open") bonds += oc.bond;
    }
    expect(await ethers.provider.getBalance(arb)).to.equal(bonds);
    // committee: stakes of every verifier registered and not withdrawn, records, snapshots
    let vstakes = 0n;
    for (const v of vsigners) {
      const i = await committee.verifierInfo(v);
      const m = vinfo.get(v.address);
      const want = m ? [m.stake, m.weight, m.activeFrom, m.activeUntil, m.withdrawableAt] : [0n, 0n, 0n, 0n, 0n];
      expect([i.stake, i.weight, i.activeFrom, i.activeUntil, i.withdrawableAt]).to.deep.equal(want, `verifier ${v.address}`);
      expect(await committee.strikesOf(v)).to.equal(strikes.get(v.address));
      vstakes += i.stake;
    }
    expect(await ethers.provider.getBalance(committee)).to.equal(vstakes);
    expect(await committee.seats()).to.deep.equal(seats);
    const cur = epochOf(BigInt(await time.latest()));
    for (let e = cur > 2n ? cur - 2n : 0n; e <= cur + 1n; e++) {
      expect(await committee.totalWeightAt(e)).to.equal(totalAt(e), `total weight at epoch ${e}`);
      expect(await committee.memberCountAt(e)).to.equal(countAt(e), `members at epoch ${e}`);
      expect(await committee.activations(e)).to.equal(activations.get(e) || 0, `activations at epoch ${e}`);
    }
    expect(await committee.nextReportEpoch()).to.equal(nextReportEpoch);
    expect(await ethers.provider.getBalance(task)).to.equal(0);
  }

  // ---------------------------------------------------------------- actions
  const challengerOf = (t) => (t.arbiter !== ethers.ZeroAddress && rnd.chance(0.5) ? arbiter : t.client);

  const actions = {
    async createTask() {
      if (tasks.filter((t) => !settled(t)).length >= 6) return false;
      const c = rnd.pick(clients);
      const numRequests = rnd.int(1, 8);
      const shardSize = rnd.int(1, 4);
      const maxTokens = rnd.int(1, 40);
      // a heavy task's collateral is a large part of a 1 ETH stake, so claims run out of free
      // stake and faults hit miners (swarm heads too) fully locked across several shards
      const heavy = rnd.chance(0.3);
      const price = heavy ? BigInt(rnd.int(1, 100)) * 10n ** 15n : BigInt(rnd.int(1, 1e9));
      const ts = await pin();
      const deadline = ts + BigInt(rnd.int(300, 2500));
      const value = BigInt(numRequests) * BigInt(maxTokens) * price;
      const arbiterAddr = rnd.chance(0.5) ? arbiter.address : ethers.ZeroAddress;
      const minRep = rnd.pick([0, 0, 0, 4500, 6000]);
      const allowProbation = rnd.chance(0.35);
      // accepted precisions: any (most tasks), or a random non-empty set of 1..5
      const precisions = rnd.chance(0.75) ? 0 : rnd.int(1, 31) << 1;
      const requireCommitments = rnd.chance(0.3);
      const terms = termsOf({
        modelId: MODEL, inputRoot: ethers.id("in"), inputURI: "store://in", numRequests, shardSize, maxTokens, price,
        deadline, minRep, arbiter: arbiterAddr, allowProbation, precisions, requireCommitments,
      });
      if (rnd.chance(0.08)) {
        await expect(task.connect(c).createTask(terms, { value: value + 1n }))
          .to.be.revertedWithCustomError(task, "WrongPayment").withArgs(value, value + 1n);
        return "createTaskWrongPayment";
      }
      if (rnd.chance(0.04)) {
        const bad = precisions | rnd.pick([0x01, 0x40, 0x80]);
        await expect(task.connect(c).createTask({ ...terms, precisions: bad }, { value }))
          .to.be.revertedWithCustomError(task, "InvalidPrecisionMask").withArgs(bad);
        return "createTaskBadMask";
      }
      const id = BigInt(tasks.length + 1);
      const n = Math.ceil(numRequests / shardSize);
      await expect(task.connect(c).createTask(terms, { value })).to.emit(task, "TaskCreated")
        .withArgs(id, c.address, MODEL, ethers.id("in"), "store://in", numRequests, shardSize, n, value, deadline, allowProbation,
          precisions, requireCommitments);
      const ranges = [];
      for (let s = 0; s < n; s++) ranges.push([s * shardSize, Math.min(numRequests, (s + 1) * shardSize)]);
      tasks.push({
        id, client: c, arbiter: arbiterAddr, maxTokens, price, deadline, minRep, allowProbation, precisions, cancelled: false,
        committed: 0n, ranges, shards: ranges.map(freshShard),
      });
      return heavy ? "createTaskHeavy" : true;
    },
    async declarePrecision() {
      // a miner re-declares its precision for the model: claims made before keep theirs
      const m = rnd.pick(miners);
      const p = rnd.int(PRECISION.FP32, PRECISION.INT8);
      await pin();
      await expect(gpu.connect(m).update([MODEL], [p], { name: "g", memoryMiB: 1, count: 1 }, "e", 1))
        .to.emit(gpu, "MinerUpdated");
      mprec.set(m.address, p);
      return true;
    },
    async claimShard() {
      const ts = await pin();
      const c = allShards((t, sh) => sh.state === S.Open && ts < t.deadline);
      if (!c.length) return false;
      const [t, s] = rnd.pick(c);
      const m = rnd.pick(miners);
      if (!eligible(m, t)) {
        await expect(task.connect(m).claimShard(t.id, s)).to.be.revertedWithCustomError(task, "NotEligible").withArgs(m.address);
        return mstate.get(m.address).onProbation && !t.allowProbation ? "claimOnProbation" : "claimNotEligible";
      }
      const p = mprec.get(m.address);
      if (!accepts(t.precisions, p)) {
        await expect(task.connect(m).claimShard(t.id, s)).to.be.revertedWithCustomError(task, "PrecisionNotAccepted")
          .withArgs(p, t.precisions);
        return "claimPrecisionNotAccepted";
      }
      const budget = budgetOf(t, s);
      const coll = (budget * BigInt(P.collateralBps)) / BPS;
      const free = await lockable(m.address);
      if (coll > free) {
        await expect(task.connect(m).claimShard(t.id, s)).to.be.revertedWithCustomError(gpu, "InsufficientFreeStake")
          .withArgs(free, coll);
        return "claimNoFreeStake";
      }
      await expect(task.connect(m).claimShard(t.id, s)).to.emit(task, "ShardClaimed")
        .withArgs(t.id, s, m.address, ts + P.claimTimeout, coll, p);
      Object.assign(shardOf(t, s), {
        state: S.Claimed, miner: m.address, claimExpiry: ts + P.claimTimeout, collateral: coll, precision: p,
      });
      t.committed += budget;
      return mstate.get(m.address).onProbation ? "claimOnProbationAllowed" : true;
    },
    async claimShards() {
      const ts = await pin();
      const open = tasks.filter((t) => ts < t.deadline).map((t) => [t, t.shards.flatMap((sh, i) => (sh.state === S.Open ? [i] : []))])
        .filter(([, ks]) => ks.length >= 2);
      if (!open.length) return false;
      const [t, ks] = rnd.pick(open);
      const picked = ks.filter(() => rnd.next() < 0.7).slice(0, 4);
      if (picked.length < 2) picked.splice(0, picked.length, ks[0], ks[1]);
      const m = rnd.pick(miners);
      if (!eligible(m, t)) {
        await expect(task.connect(m).claimShards(t.id, picked)).to.be.revertedWithCustomError(task, "NotEligible").withArgs(m.address);
        return "claimsNotEligible";
      }
      const p = mprec.get(m.address);
      if (!accepts(t.precisions, p)) {
        await expect(task.connect(m).claimShards(t.id, picked)).to.be.revertedWithCustomError(task, "PrecisionNotAccepted")
          .withArgs(p, t.precisions);
        return "claimsPrecisionNotAccepted";
      }
      const colls = picked.map((s) => (budgetOf(t, s) * BigInt(P.collateralBps)) / BPS);
      let free = await lockable(m.address);
      for (const c of colls) {
        if (c > free) {
          // all or none: the first shard that does not fit reverts the whole batch
          await expect(task.connect(m).claimShards(t.id, picked)).to.be.revertedWithCustomError(gpu, "InsufficientFreeStake")
            .withArgs(free, c);
          return "claimsNoFreeStake";
        }
        free -= c;
      }
      const tx = task.connect(m).claimShards(t.id, picked);
      for (const [j, s] of picked.entries()) {
        await expect(tx).to.emit(task, "ShardClaimed").withArgs(t.id, s, m.address, ts + P.claimTimeout, colls[j], p);
      }
      picked.forEach((s, j) => {
        Object.assign(shardOf(t, s), {
          state: S.Claimed, miner: m.address, claimExpiry: ts + P.claimTimeout, collateral: colls[j], precision: p,
        });
        t.committed += budgetOf(t, s);
      });
      return "claimShards";
    },
    async registerSwarm() {
      if (swarms.filter((x) => x.active).length >= 3 || swarms.length >= 12) return false;
      const ts = await pin();
      // mostly of miners off probation, so the swarm can claim ordinary tasks
      const established = miners.filter((m) => !mstate.get(m.address).onProbation);
      const pool = established.length >= 2 && rnd.chance(0.6) ? established : miners;
      const group = rnd.shuffle(pool).slice(0, rnd.int(2, pool.length)).sort((a, b) => byAddress(a.address, b.address));
      const terms = {
        modelId: MODEL,
        head: rnd.pick(group).address,
        members: group.map((m) => m.address),
        shares: group.map(() => rnd.int(1, 5)),
        pricePerToken: BigInt(rnd.int(1, 5e8)),
        deadline: ts + 100n,
      };
      const domain = await domainOf(gpu);
      const sigs = [];
      for (const m of group) {
        sigs.push(await m.signTypedData(domain, SWARM_TYPES, { ...terms, nonce: nonces.get(m.address) || 0n }));
      }
      if (rnd.chance(0.1)) {
        // a forged consent: someone else signs for a member
        const k = rnd.int(0, group.length - 1);
        sigs[k] = await outsider.signTypedData(domain, SWARM_TYPES, { ...terms, nonce: nonces.get(group[k].address) || 0n });
        await expect(gpu.connect(rnd.pick(actors)).registerSwarm(terms, sigs))
          .to.be.revertedWithCustomError(gpu, "InvalidConsent").withArgs(group[k].address);
        return "registerSwarmForged";
      }
      const id = BigInt(swarms.length + 1);
      await expect(gpu.connect(rnd.pick(actors)).registerSwarm(terms, sigs)).to.emit(gpu, "SwarmRegistered")
        .withArgs(id, MODEL, terms.head, terms.members, terms.shares, terms.pricePerToken);
      for (const m of group) nonces.set(m.address, (nonces.get(m.address) || 0n) + 1n);
      swarms.push({
        id, head: terms.head, members: terms.members, shares: terms.shares,
        headIndex: terms.members.indexOf(terms.head), ask: terms.pricePerToken, active: true, terms, sigs,
      });
      return true;
    },
    async leaveSwarm() {
      const c = swarms.filter((x) => x.active);
      if (!c.length) return false;
      const sw = rnd.pick(c);
      const leaver = rnd.pick(sw.members);
      const who = miners.find((m) => m.address === leaver);
      await pin();
      await expect(gpu.connect(who).leaveSwarm(sw.id)).to.emit(gpu, "SwarmLeft").withArgs(sw.id, who.address);
      sw.active = false;
      if (rnd.chance(0.3)) {
        // re-forming it with the same signatures is a replay
        const ts = await pin();
        await expect(gpu.registerSwarm(sw.terms, sw.sigs)).to.be.revertedWithCustomError(
          gpu, ts > sw.terms.deadline ? "ConsentExpired" : "InvalidConsent");
        return "swarmReplay";
      }
      return true;
    },
    async claimShardSwarm() {
      const ts = await pin();
      const c = allShards((t, sh) => sh.state === S.Open && ts < t.deadline);
      if (!c.length || !swarms.length) return false;
      // mostly a swarm that may claim the shard (so swarm shards are common), else any pair
      const fits = c.flatMap(([t, s]) => swarms.filter((sw) => sw.active && t.price >= sw.ask
        && sw.members.every((a) => eligible({ address: a }, t)) && accepts(t.precisions, swarmPrecisionOf(sw)))
        .map((sw) => [t, s, sw]));
      const [t, s, sw] = fits.length && rnd.chance(0.8) ? rnd.pick(fits) : [...rnd.pick(c), rnd.pick(swarms)];
      const head = miners.find((m) => m.address === sw.head);
      if (!sw.active) {
        await expect(task.connect(head).claimShardForSwarm(t.id, s, sw.id))
          .to.be.revertedWithCustomError(gpu, "SwarmInactive").withArgs(sw.id);
        return "claimSwarmInactive";
      }
      if (rnd.chance(0.05)) {
        const other = miners.find((m) => m.address !== sw.head);
        await expect(task.connect(other).claimShardForSwarm(t.id, s, sw.id))
          .to.be.revertedWithCustomError(gpu, "NotSwarmHead").withArgs(sw.id, other.address);
        return "claimSwarmNotHead";
      }
      if (t.price < sw.ask) {
        await expect(task.connect(head).claimShardForSwarm(t.id, s, sw.id))
          .to.be.revertedWithCustomError(gpu, "AskAboveTaskPrice").withArgs(sw.ask, t.price);
        return "claimSwarmAskAbove";
      }
      const bad = sw.members.find((a) => !eligible({ address: a }, t));
      if (bad) {
        await expect(task.connect(head).claimShardForSwarm(t.id, s, sw.id))
          .to.be.revertedWithCustomError(gpu, "MemberNotEligible").withArgs(bad);
        return "claimSwarmMemberNotEligible";
      }
      const p = swarmPrecisionOf(sw);
      expect(await gpu.swarmPrecision(sw.id)).to.equal(p);
      if (!accepts(t.precisions, p)) {
        await expect(task.connect(head).claimShardForSwarm(t.id, s, sw.id))
          .to.be.revertedWithCustomError(task, "PrecisionNotAccepted").withArgs(p, t.precisions);
        return "claimSwarmPrecisionNotAccepted";
      }
      const budget = budgetOf(t, s);
      const coll = (budget * BigInt(P.collateralBps)) / BPS;
      // the head alone locks the collateral: its free stake must cover all of it
      const free = await lockable(head.address);
      if (coll > free) {
        await expect(task.connect(head).claimShardForSwarm(t.id, s, sw.id))
          .to.be.revertedWithCustomError(gpu, "InsufficientFreeStake").withArgs(free, coll);
        return "claimSwarmNoFreeStake";
      }
      const tx = task.connect(head).claimShardForSwarm(t.id, s, sw.id);
      await expect(tx).to.emit(task, "ShardClaimed").withArgs(t.id, s, head.address, ts + P.claimTimeout, coll, p);
      await expect(tx).to.emit(task, "SwarmShardClaimed").withArgs(t.id, s, sw.id);
      Object.assign(shardOf(t, s), {
        state: S.Claimed, miner: head.address, claimExpiry: ts + P.claimTimeout, collateral: coll, swarm: sw, precision: p,
      });
      t.committed += budget;
      return true;
    },
    async submitResult() {
      const ts = await pin();
      const c = allShards((t, sh) => sh.state === S.Claimed && ts < sh.claimExpiry);
      if (!c.length) return false;
      const [t, s] = rnd.pick(c);
      const sh = shardOf(t, s);
      const m = miners.find((x) => x.address === sh.miner);
      const n = t.ranges[s][1] - t.ranges[s][0];
      if (rnd.chance(0.05)) {
        const other = miners.find((x) => x.address !== sh.miner);
        await expect(task.connect(other).submitResult(t.id, s, ethers.id("r"), "u", 0))
          .to.be.revertedWithCustomError(task, "NotShardMiner").withArgs(other.address);
        return "submitNotShardMiner";
      }
      let kind = "honest";
      const x = rnd.next();
      if (x < 0.15 && n >= 2) kind = "overcap";
      else if (x < 0.27) kind = "miscount";
      else if (x < 0.4) kind = "inflated";
      else if (x < 0.62 && n >= 2) kind = "lie";
      let res = buildShardResult(t, s, kind);
      if (kind === "inflated" && res.tree.total === BigInt(n * t.maxTokens)) res = buildShardResult(t, s, (kind = "honest"));
      if (rnd.chance(0.05)) {
        const cap = BigInt(n * t.maxTokens);
        await expect(task.connect(m).submitResult(t.id, s, res.tree.root, "store://out", cap + 1n))
          .to.be.revertedWithCustomError(task, "TooManyTokens").withArgs(cap, cap + 1n);
        return "submitTooManyTokens";
      }
      await expect(task.connect(m).submitResult(t.id, s, res.tree.root, "store://out", res.tokensUsed))
        .to.emit(task, "ResultSubmitted")
        .withArgs(t.id, s, m.address, res.tree.root, "store://out", res.tokensUsed, ts + P.challengeWindow);
      Object.assign(sh, { state: S.Submitted, windowEnd: ts + P.challengeWindow, submittedAt: ts, tokensUsed: res.tokensUsed, result: res });
      if (["lie", "inflated"].includes(kind) && rnd.chance(0.3)) { // a watchful client proves the lie at once
        const r = await actions.proveSumFault({ at: [t, s] });
        bump(r === true ? "proveSumFault" : r);
      }
      return `submit_${kind}`;
    },
    async finalizeShard() {
      const ts = await pin();
      const c = allShards((t, sh) => sh.state === S.Submitted);
      if (!c.length) return false;
      const [t, s] = rnd.pick(c);
      const sh = shardOf(t, s);
      if (ts < sh.windowEnd) {
        await expect(task.finalizeShard(t.id, s)).to.be.revertedWithCustomError(task, "WindowNotClosed").withArgs(sh.windowEnd);
        return "finalizeEarly";
      }
      const budget = budgetOf(t, s);
      const pay = sh.tokensUsed * t.price;
      const tx = task.connect(rnd.pick(actors)).finalizeShard(t.id, s);
      await expect(tx).to.emit(task, "ShardFinalized").withArgs(t.id, s, sh.miner, pay, budget - pay);
      if (sh.swarm) {
        const parts = splitOf(sh.swarm, pay);
        await expect(tx).to.emit(task, "SwarmPaid").withArgs(t.id, s, sh.swarm.id, sh.swarm.members, parts);
        sh.swarm.members.forEach((a, i) => credit(a, parts[i]));
      } else {
        credit(sh.miner, pay);
      }
      credit(t.client.address, budget - pay);
      t.committed -= budget;
      sh.state = S.Finalized;
      return sh.swarm ? "finalizeSwarm" : true;
    },
    async reclaimExpired() {
      const ts = await pin();
      const c = allShards((t, sh) => sh.state === S.Claimed);
      if (!c.length) return false;
      const [t, s] = pickPreferSwarm(c);
      const sh = shardOf(t, s);
      if (ts < sh.claimExpiry) {
        await expect(task.reclaimExpired(t.id, s)).to.be.revertedWithCustomError(task, "ClaimNotExpired").withArgs(sh.claimExpiry);
        return "reclaimEarly";
      }
      const fn = ts >= t.deadline && rnd.chance(0.5) ? "refundUnfinished" : "reclaimExpired";
      await reclaim(t, s, ts, task.connect(rnd.pick(actors))[fn](t.id, s));
      return fn === "refundUnfinished" ? "refundUnfinishedClaimed" : true;
    },
    async refundUnfinished() {
      const ts = await pin();
      const c = allShards((t, sh) => sh.state === S.Open);
      if (!c.length) return false;
      const [t, s] = rnd.pick(c);
      if (ts < t.deadline) {
        await expect(task.refundUnfinished(t.id, s)).to.be.revertedWithCustomError(task, "DeadlineNotPassed").withArgs(t.deadline);
        return "refundEarly";
      }
      const budget = budgetOf(t, s);
      await expect(task.connect(rnd.pick(actors)).refundUnfinished(t.id, s)).to.emit(task, "ShardRefunded").withArgs(t.id, s, budget);
      credit(t.client.address, budget);
      shardOf(t, s).state = S.Refunded;
      return true;
    },
    async cancelTask() {
      const c = tasks.filter((t) => !t.cancelled);
      if (!c.length) return false;
      const t = rnd.pick(c);
      await pin();
      if (rnd.chance(0.2)) {
        await expect(task.connect(outsider).cancelTask(t.id)).to.be.revertedWithCustomError(task, "NotClient").withArgs(outsider.address);
        return "cancelNotClient";
      }
      let refund = 0n;
      t.shards.forEach((sh, s) => { if (sh.state === S.Open) { refund += budgetOf(t, s); sh.state = S.Refunded; } });
      await expect(task.connect(t.client).cancelTask(t.id)).to.emit(task, "TaskCancelled").withArgs(t.id, refund);
      credit(t.client.address, refund);
      t.cancelled = true;
      return true;
    },
    async openDispute() {
      const ts = await pin();
      const c = allShards((t, sh) => sh.state === S.Submitted && ts < sh.windowEnd);
      if (!c.length) return false;
      const [t, s] = pickPreferSwarm(c);
      const sh = shardOf(t, s);
      const res = sh.result;
      const from = challengerOf(t);
      const k = rnd.int(0, res.receipts.length - 1);
      const r = res.receipts[k];
      const bond = P.minBond + BigInt(rnd.int(0, 1e6));
      const open = (who = from) => arb.connect(who).openDispute(t.id, s, r, res.proofOf(k), "ev", { value: bond });
      if (rnd.chance(0.05)) {
        await expect(open(outsider)).to.be.revertedWithCustomError(arb, "NotClientArbiterOrAuditor").withArgs(outsider.address);
        return "disputeNotClient";
      }
      if (BigInt(r.outputTokens) > BigInt(t.maxTokens)) {
        await expect(open()).to.be.revertedWithCustomError(arb, "TooManyOutputTokens").withArgs(t.maxTokens, r.outputTokens);
        return "disputeOverCap";
      }
      if (res.kind === "inflated") {
        await expect(open()).to.be.revertedWithCustomError(arb, "InvalidProof");
        return "disputeInflated";
      }
      if (res.liedAt(k)) {
        await expect(open()).to.be.revertedWithCustomError(arb, "InvalidProof");
        return "disputeLie";
      }
      const e = epochOf(ts);
      const total = totalAt(e);
      if (total === 0n) {
        await expect(open()).to.be.revertedWithCustomError(arb, "NoCommittee").withArgs(e);
        return "disputeNoCommittee";
      }
      const id = BigInt(disputes.length + 1);
      await expect(open()).to.emit(arb, "DisputeOpened");
      disputes.push({
        id, t, s, opener: from.address, bond, epoch: e, totalWeight: total, deadline: ts + P.disputeTimeout, status: "open",
        ballots: new Map(), voteW: new Map(), voters: { true: [], false: [] }, faultW: 0n, noFaultW: 0n,
      });
      sh.state = S.Disputed;
      return true;
    },
    async castVotes() {
      const ts = await pin();
      const c = disputes.filter((d) => d.status === "open" && ts < d.deadline);
      if (!c.length) return false;
      const d = rnd.pick(c);
      const members = vsigners.filter((v) => weightAt(v.address, d.epoch) > 0n);
      if (!members.length) return false;
      const fault = rnd.chance(0.5);
      const outsiders = vsigners.filter((v) => weightAt(v.address, d.epoch) === 0n);
      if (outsiders.length && rnd.chance(0.05)) {
        const o = rnd.pick(outsiders);
        const sigs = await signVotes(arb, [o, ...members.slice(0, 1)], d.id, fault);
        await expect(arb.castVotes(d.id, fault, sigs)).to.be.revertedWithCustomError(arb, "NotCommitteeMember").withArgs(o.address);
        return "voteNotMember";
      }
      // often enough for a verdict, sometimes a partial tally
      const chosen = rnd.chance(0.6)
        ? (quorumSet(d.epoch, (d.totalWeight * 2n) / 3n + 1n) || members)
        : rnd.shuffle(members).slice(0, rnd.int(1, members.length));
      if (!chosen.length) return false;
      const sigs = await signVotes(arb, chosen, d.id, fault);
      const fresh = chosen.filter((v) => !d.ballots.has(v.address)).map((v) => v.address).sort(byAddress);
      if (!fresh.length) {
        await expect(arb.castVotes(d.id, fault, sigs)).to.be.revertedWithCustomError(arb, "NoNewVotes").withArgs(d.id);
        return "noNewVotes";
      }
      const added = fresh.reduce((a, v) => a + weightAt(v, d.epoch), 0n);
      const tally = (fault ? d.faultW : d.noFaultW) + added;
      const resolves = tally * 3n > d.totalWeight * 2n;
      const tx = arb.castVotes(d.id, fault, sigs);
      for (const v of fresh) await expect(tx).to.emit(arb, "VoteCast").withArgs(d.id, v, fault, weightAt(v, d.epoch));
      for (const v of fresh) {
        d.ballots.set(v, fault ? 1 : 2);
        d.voteW.set(v, weightAt(v, d.epoch));
      }
      d.voters[fault].push(...fresh);
      if (fault) d.faultW = tally; else d.noFaultW = tally;
      if (!resolves) {
        await expect(tx).not.to.emit(arb, "DisputeResolved");
        return "votesPartial";
      }
      const sh = shardOf(d.t, d.s);
      let slashed = 0n;
      if (fault) {
        slashed = settleFault(d.t, d.s, d.voters.true.map((v) => [v, d.voteW.get(v)]));
        credit(d.opener, d.bond);
        d.status = "fault";
      } else {
        // the voters' pool is split by weight, the rest (and the dust) to the miner
        const pool = d.bond - (d.bond * BigInt(P.minerBondShareBps)) / BPS;
        let paid = 0n;
        for (const v of d.voters.false) {
          const share = (pool * d.voteW.get(v)) / tally;
          paid += share;
          credit(v, share);
        }
        credit(sh.miner, d.bond - paid);
        sh.state = S.Submitted;
        sh.windowEnd = ts;
        d.status = "nofault";
      }
      await expect(tx).to.emit(arb, "DisputeResolved").withArgs(d.id, fault, d.voters[fault], slashed);
      return fault ? "resolveFault" : "resolveNoFault";
    },
    async expireDispute() {
      const ts = await pin();
      const c = disputes.filter((d) => d.status === "open");
      if (!c.length) return false;
      const d = rnd.pick(c);
      if (ts < d.deadline) {
        await expect(arb.expireDispute(d.id)).to.be.revertedWithCustomError(arb, "DisputeNotExpired").withArgs(d.deadline);
        return "expireEarly";
      }
      await expect(arb.connect(rnd.pick(actors)).expireDispute(d.id)).to.emit(arb, "DisputeExpired").withArgs(d.id);
      credit(d.opener, d.bond);
      d.status = "expired";
      Object.assign(shardOf(d.t, d.s), { state: S.Submitted, windowEnd: ts });
      return true;
    },
    async reportAbsence() {
      const ts = await pin();
      const absentOf = (d) => vsigners.filter((v) => weightAt(v.address, d.epoch) > 0n && !d.ballots.has(v.address));
      const open = disputes.filter((d) => d.status === "open" && absentOf(d).length);
      if (open.length && rnd.chance(0.1)) {
        const d = rnd.pick(open);
        await expect(arb.reportAbsence(d.id, [absentOf(d)[0].address]))
          .to.be.revertedWithCustomError(arb, "DisputeNotExpiredStatus").withArgs(DS.open);
        return "absenceNotExpired";
      }
      const c = disputes.filter((d) => d.status === "expired" && absentOf(d).length);
      if (!c.length) return false;
      const d = rnd.pick(c);
      const absent = rnd.shuffle(absentOf(d)).slice(0, rnd.int(1, absentOf(d).length)).map((v) => v.address);
      const voted = [...d.ballots.entries()].filter(([a, b]) => b !== 3 && weightAt(a, d.epoch) > 0n).map(([a]) => a);
      if (voted.length && rnd.chance(0.1)) {
        await expect(arb.reportAbsence(d.id, [...absent, voted[0]]))
          .to.be.revertedWithCustomError(arb, "NotAbsent").withArgs(voted[0]);
        return "absenceNotAbsent";
      }
      const tx = arb.connect(rnd.pick(actors)).reportAbsence(d.id, absent);
      const expected = [];
      for (const a of absent) {
        const v = vinfo.get(a);
        const k = strikes.get(a) + 1n;
        strikes.set(a, k);
        if (v.activeUntil === MAX64) unseat(a, changeEpoch(ts), ts);
        const slashed = k > 0n ? (v.stake * 1000n) / BPS : 0n; // idleStrikesAllowed 0, idleSlashBps 1000
        v.stake -= slashed;
        if (slashed > 0n) credit(BURN, slashed); // burned: no opener gains from an absence
        d.ballots.set(a, 3);
        expected.push([a, slashed]);
      }
      for (const [a, slashed] of expected) await expect(tx).to.emit(arb, "AbsenceReported").withArgs(d.id, a, slashed);
      return true;
    },
    /** `opts` (from challengeBurst): `at` [task, shard], `from` the challenger, `answer` at once. */
    async challengeAvailability(opts = {}) {
      const ts = await pin();
      const c = opts.at ? [opts.at] : allShards((t, sh) => sh.state === S.Submitted && ts < sh.windowEnd);
      if (!c.length) return false;
      // clients challenge the results they cannot check more often
      // (and, so that answers must extend the window to responseWindow, late in the window)
      const suspect = c.filter(([t, s]) => ["inflated", "overcap", "lie"].includes(shardOf(t, s).result.kind));
      const late = c.filter(([t, s]) => shardOf(t, s).windowEnd - ts < P.responseWindow);
      const [t, s] = pickPreferSwarm(suspect.length && rnd.chance(0.4) ? suspect : late.length && rnd.chance(0.4) ? late : c);
      const sh = shardOf(t, s);
      const [start, end] = t.ranges[s];
      // auditors (members of the current committee) challenge too; each challenger has its own
      // budget of three per shard, so theirs never use up the client's
      const auditors = vsigners.filter((v) => weightAt(v.address, epochOf(ts)) > 0n);
      const from = opts.from ?? (auditors.length && rnd.chance(0.35) ? rnd.pick(auditors) : challengerOf(t));
      const bond = P.minAvailabilityBond + BigInt(rnd.int(0, 1e6));
      const used = sh.avail[from.address] || 0;
      const byOthers = Object.entries(sh.avail).reduce((a, [x, n]) => (x === from.address ? a : a + n), 0);
      if (used >= 3) {
        await expect(arb.connect(from).challengeAvailability(t.id, s, start, { value: bond }))
          .to.be.revertedWithCustomError(arb, "TooManyChallenges").withArgs(3);
        return "challengeTooMany";
      }
      if (!opts.at && rnd.chance(0.06)) {
        await expect(arb.connect(from).challengeAvailability(t.id, s, end, { value: bond }))
          .to.be.revertedWithCustomError(arb, "IndexNotInShard").withArgs(end, start, end);
        return "challengeBadIndex";
      }
      if (!opts.at && rnd.chance(0.04)) {
        await expect(arb.connect(from).challengeAvailability(t.id, s, start, { value: P.minAvailabilityBond - 1n }))
          .to.be.revertedWithCustomError(arb, "InsufficientBond").withArgs(P.minAvailabilityBond, P.minAvailabilityBond - 1n);
        return "challengeLowBond";
      }
      const bad = sh.result.bad >= 0 && sh.result.kind === "overcap" && rnd.chance(0.5);
      const lied = sh.result.kind === "lie" && rnd.chance(0.6);
      const index = bad ? sh.result.receipts[sh.result.bad].index
        : lied ? start + rnd.int(sh.result.lied[0], sh.result.lied[1] - 1) : rnd.int(start, end - 1);
      const id = BigInt(challenges.length + 1);
      await expect(arb.connect(from).challengeAvailability(t.id, s, index, { value: bond })).to.emit(arb, "AvailabilityChallenged")
        .withArgs(id, t.id, s, index, from.address, sh.miner, bond, ts + P.responseWindow);
      const ch = { id, t, s, index, challenger: from.address, bond, openedAt: ts, deadline: ts + P.responseWindow, status: "open" };
      challenges.push(ch);
      sh.state = S.Disputed;
      sh.avail[from.address] = used + 1;
      if (byOthers >= 3) bump("challengeAfterOthersSpent3");
      if (from !== t.client && from.address !== arbiter.address) bump("challengeByAuditor");
      if (opts.answer || rnd.chance(0.4)) { // a watchful miner answers at once
        const r = await answer(ch, await pin());
        bump(r === true ? "answerAvailability" : r);
      }
      return true;
    },
    /** The issue-29 attack, at random: one challenger (an auditor, often: the miner's friend on
     * the committee) spends its whole budget on a shard, the miner answering each; then the
     * client challenges the same shard, which its own budget always allows. */
    async challengeBurst() {
      let ts = await pin();
      const c = allShards((t, sh) => sh.state === S.Submitted && ts < sh.windowEnd);
      if (!c.length) return false;
      const [t, s] = rnd.pick(c);
      const auditors = vsigners.filter((v) => weightAt(v.address, epochOf(ts)) > 0n);
      const spender = auditors.length && rnd.chance(0.7) ? rnd.pick(auditors) : challengerOf(t);
      const open = () => shardOf(t, s).state === S.Submitted && ts < shardOf(t, s).windowEnd;
      for (let i = 0; i < 4 && open(); i++) {
        const r = await actions.challengeAvailability({ at: [t, s], from: spender, answer: true });
        bump(r === true ? "challengeAvailability" : r);
        ts = BigInt(await time.latest()) + 1n;
      }
      if (open() && spender !== t.client) {
        const r = await actions.challengeAvailability({ at: [t, s], from: t.client });
        bump(r === true ? "challengeAvailability" : r);
      }
      return "challengeBurst";
    },
    async answerAvailability() {
      const ts = await pin();
      const c = challenges.filter((x) => x.status === "open" && ts < x.deadline);
      if (!c.length) return false;
      return answer(rnd.pick(c), ts);
    },
    async settleUnanswered() {
      const ts = await pin();
      const c = challenges.filter((x) => x.status === "open");
      if (!c.length) return false;
      const ch = rnd.pick(c);
      if (ts < ch.deadline) {
        await expect(arb.settleUnanswered(ch.id)).to.be.revertedWithCustomError(arb, "ResponseWindowOpen").withArgs(ch.deadline);
        return "settleEarly";
      }
      const slashed = settleFault(ch.t, ch.s, [], BURN); // an outage pays no one
      credit(ch.challenger, ch.bond);
      ch.status = "unanswered";
      await expect(arb.connect(rnd.pick(actors)).settleUnanswered(ch.id)).to.emit(arb, "AvailabilityUnanswered")
        .withArgs(ch.id, ch.t.id, ch.s, slashed);
      return true;
    },
    async proveBillingFault() {
      const ts = await pin();
      const c = allShards((t, sh) => sh.state === S.Submitted && ts < sh.windowEnd && sh.result.kind !== "inflated");
      if (!c.length) return false;
      const [t, s] = pickPreferSwarm(c);
      const sh = shardOf(t, s);
      const res = sh.result;
      const from = challengerOf(t);
      const prove = (k, textHash, ids) =>
        arb.connect(from).proveBillingFault(t.id, s, res.receipts[k], res.proofOf(k), textHash, ids);
      if (res.bad < 0 || rnd.chance(0.15)) {
        // an honest receipt: its true output proves nothing; a made-up one does not hash
        const ok = res.receipts.map((r, k) => k).filter((k) => k !== res.bad && !res.liedAt(k));
        if (!ok.length) return false;
        const k = rnd.pick(ok);
        const { textHash, ids } = res.outputs[k];
        if (rnd.chance(0.5)) {
          await expect(prove(k, textHash, ids)).to.be.revertedWithCustomError(arb, "NoBillingFault");
          return "billingNoFault";
        }
        await expect(prove(k, textHash, [...ids, 7])).to.be.revertedWithCustomError(arb, "OutputHashMismatch");
        return "billingHashMismatch";
      }
      const k = res.bad;
      const { textHash, ids } = res.outputs[k];
      const index = res.receipts[k].index;
      const slashed = settleFault(t, s, []);
      await expect(res.kind === "overcap" ? prove(k, ethers.ZeroHash, []) : prove(k, textHash, ids))
        .to.emit(arb, "BillingFaultProven").withArgs(t.id, s, index, from.address, slashed);
      return `billing_${res.kind}`;
    },
    /** `opts.at`: [task, shard] (a watchful client, right after the submission). */
    async proveSumFault(opts = {}) {
      const ts = await pin();
      const c = opts.at ? [opts.at] : allShards((t, sh) => sh.state === S.Submitted && ts < sh.windowEnd);
      if (!c.length) return false;
      // provers look where the sums do not add up more often
      const suspect = c.filter(([t, s]) => ["inflated", "lie"].includes(shardOf(t, s).result.kind));
      const [t, s] = rnd.pick(suspect.length && rnd.chance(0.6) ? suspect : c);
      const sh = shardOf(t, s);
      const res = sh.result;
      const n = res.receipts.length;
      const from = challengerOf(t);
      const lied = res.receipts.map((r, k) => k).filter((k) => res.liedAt(k));
      const k = lied.length && rnd.chance(0.7) ? rnd.pick(lied) : rnd.int(0, n - 1);
      const prove = (path, who = from) => arb.connect(who).proveSumFault(t.id, s, res.receipts[k], path);
      const path = res.paths.path(k);
      if (!opts.at && rnd.chance(0.05)) {
        await expect(prove(path, outsider)).to.be.revertedWithCustomError(arb, "NotClientArbiterOrAuditor").withArgs(outsider.address);
        return "sumNotClient";
      }
      if (!opts.at && path.length && rnd.chance(0.1)) {
        // a sum the commitment does not hold: the path no longer hashes to resultRoot
        const j = rnd.int(0, path.length - 1);
        const forged = path.map((p, i) => (i === j ? { ...p, sum: p.sum + 1n } : p));
        await expect(prove(forged)).to.be.revertedWithCustomError(arb, "InvalidProof");
        return "sumForged";
      }
      if (!res.liedAt(k)) {
        await expect(prove(path)).to.be.revertedWithCustomError(arb, "NoBillingFault");
        return "sumNoFault";
      }
      const slashed = settleFault(t, s, []);
      await expect(prove(path)).to.emit(arb, "BillingFaultProven").withArgs(t.id, s, res.receipts[k].index, from.address, slashed);
      return `sum_${res.kind}`;
    },
    async withdraw() {
      const c = actors.filter((a) => w.get(a.address) > 0n);
      await pin();
      if (!c.length || rnd.chance(0.05)) {
        const z = actors.filter((a) => w.get(a.address) === 0n);
        if (!z.length) return false;
        await expect(escrow.connect(rnd.pick(z)).withdraw()).to.be.revertedWithCustomError(escrow, "NothingToWithdraw");
        return "withdrawNothing";
      }
      const a = rnd.pick(c);
      const amount = w.get(a.address);
      const before = await ethers.provider.getBalance(a);
      const tx = await escrow.connect(a).withdraw();
      await expect(tx).to.emit(escrow, "Withdrawn").withArgs(a.address, amount);
      expect((await ethers.provider.getBalance(a)) - before + (await gasCost(tx))).to.equal(amount);
      w.set(a.address, 0n);
      return true;
    },
    async addStake() {
      const m = rnd.pick(miners);
      const v = BigInt(rnd.int(1, 150)) * 10n ** 16n; // up to 1.5 ETH: heavy faults drain stakes
      await pin();
      const st = mstate.get(m.address);
      await expect(gpu.connect(m).addStake({ value: v })).to.emit(gpu, "StakeAdded").withArgs(m.address, v, st.stake + v);
      st.stake += v;
      return true;
    },
    async reputation() {
      const ts = await pin();
      const cur = epochOf(ts);
      if (cur < nextReportEpoch) {
        if (nextReportEpoch === 0n) return false;
        const e = nextReportEpoch - 1n;
        const r = { epoch: e, miners: [miner.address], scoresBps: [9000], evidenceRoot: ethers.id("late") };
        const sigs = await signReport(committee, vsigners.slice(0, 1), r); // the order is checked first
        await expect(committee.submitReputation(r.epoch, r.miners, r.scoresBps, r.evidenceRoot, sigs))
          .to.be.revertedWithCustomError(committee, "ReportOutOfOrder").withArgs(e, nextReportEpoch);
        return "reportOutOfOrder";
      }
      const e = BigInt(rnd.int(Number(nextReportEpoch > cur - 2n ? nextReportEpoch : cur - 2n), Number(cur)));
      const need = quorumOf(e);
      const signersE = quorumSet(e, need);
      if (totalAt(e) === 0n || !signersE) return false;
      // mostly passing, with the pass mark (6000) and the untrusted floor (4000) hit exactly,
      // and some challenges missed (MISSED: unavailability, not a score; taken from the draw so
      // that the random stream, and with it every seed's coverage, stays as it was)
      const scores = reportMiners.map(() => (rnd.chance(0.2)
        ? rnd.pick([3999, 4000, 5999, 6000])
        : rnd.chance(0.7) ? rnd.int(6000, 10000) : rnd.int(3500, 5999)))
        .map((x) => (x > 6000 && x % 4 === 1 ? MISSED : x));
      const r = { epoch: e, miners: reportMiners.map((m) => m.address), scoresBps: scores, evidenceRoot: ethers.id(`ev-${e}`) };
      // a quorum-signed report whose miners are out of order, or repeat one, is refused
      if (rnd.chance(0.08)) {
        const bad = [...r.miners];
        const k = rnd.int(1, bad.length - 1);
        if (rnd.chance(0.5)) [bad[k - 1], bad[k]] = [bad[k], bad[k - 1]];
        else bad[k] = bad[k - 1];
        const rb = { ...r, miners: bad };
        await expect(committee.submitReputation(rb.epoch, rb.miners, rb.scoresBps, rb.evidenceRoot, await signReport(committee, signersE, rb)))
          .to.be.revertedWithCustomError(committee, "MinersNotSorted");
        return "reportNotSorted";
      }
      // a proper subset below the quorum is refused
      if (rnd.chance(0.1)) {
        const few = [];
        let got = 0n;
        for (const v of signersE) {
          const x = weightAt(v.address, e);
          if (got + x >= need) break;
          few.push(v);
          got += x;
        }
        if (few.length) {
          await expect(committee.submitReputation(r.epoch, r.miners, r.scoresBps, r.evidenceRoot, await signReport(committee, few, r)))
            .to.be.revertedWithCustomError(committee, "QuorumNotReached").withArgs(need, got);
          return "reportNoQuorum";
        }
      }
      // the reserve each miner holds for the untrusted burn just before the report
      const heldBefore = await Promise.all(reportMiners.map((m) => gpu.reserveOf(m)));
      const tx = committee.submitReputation(r.epoch, r.miners, r.scoresBps, r.evidenceRoot, await signReport(committee, signersE, r));
      await expect(tx).to.emit(committee, "ReputationSubmitted");
      nextReportEpoch = e + 1n;
      let ended = false;
      for (let i = 0; i < reportMiners.length; i++) {
        const st = mstate.get(reportMiners[i].address);
        if (scores[i] === MISSED) {
          // reputation, stake and the probation count stay; past the allowance: probation again
          st.missed += 1n;
          const relapse = st.missed > MISSED_ALLOWED && !st.onProbation;
          if (relapse) [st.onProbation, st.passed] = [true, 0n];
          await expect(tx).to.emit(gpu, "ReportMissed").withArgs(reportMiners[i].address, st.missed, relapse);
          bump(relapse ? "missedToProbation" : "missed");
          continue;
        }
        st.missed = 0n;
        st.rep = BigInt(scores[i]);
        if (st.rep >= untrustedBelow) st.untrusted = 0n;
        else if (++st.untrusted > 1n) {
          const free = st.stake - lockedOf(reportMiners[i].address);
          const burn = min(max((st.stake * untrustedSlash) / BPS, heldBefore[i]), free);
          if (heldBefore[i] > 0n) bump("untrustedSlashReserve");
          if (burn > 0n) {
            await expect(tx).to.emit(gpu, "Slashed").withArgs(reportMiners[i].address, burn, BURN, await committee.getAddress());
            st.stake -= burn;
            credit(BURN, burn);
          }
          bump("untrustedSlash");
        }
        // only an epoch that started at or after the registration counts towards probation
        if (st.onProbation && epochStart(e) < st.registeredAt) {
          bump("reportBeforeRegistration");
        } else if (st.onProbation) {
          if (scores[i] < 6000) st.passed = 0n;
          else if (++st.passed >= 3n) {
            st.onProbation = false;
            ended = true;
            await expect(tx).to.emit(gpu, "ProbationEnded").withArgs(reportMiners[i].address);
          }
        }
      }
      if (!ended) await expect(tx).not.to.emit(gpu, "ProbationEnded");
      if (ended) bump("probationEnded");
      return true;
    },
    async verifierJoin() {
      const c = vsigners.filter((v) => !vinfo.get(v.address));
      if (!c.length) return false;
      const v = rnd.pick(c);
      const ts = await pin();
      const cur = epochOf(ts);
      if (rnd.chance(0.05)) {
        await expect(committee.connect(v).register({ value: P.minVerifierStake - 1n }))
          .to.be.revertedWithCustomError(committee, "InsufficientStake").withArgs(P.minVerifierStake, P.minVerifierStake - 1n);
        return "joinLowStake";
      }
      const stake = P.minVerifierStake + BigInt(rnd.int(0, 200)) * 10n ** 16n + BigInt(rnd.int(0, 1e9));
      const at = changeEpoch(ts);
      const seats2 = pruned(cur);
      // a full boundary: the pending join with the least stake gives way to strictly more
      let bumped = null;
      if ((activations.get(at) || 0) >= CHURN) {
        const [smallest, sw] = lowestSeat(seats2, at);
        if (!smallest || stake <= sw) {
          await expect(committee.connect(v).register({ value: stake }))
            .to.be.revertedWithCustomError(committee, "ChurnLimitReached").withArgs(at, CHURN);
          return "joinChurnLimit";
        }
        bumped = smallest;
      }
      let displaced = null;
      if (BigInt(notLeaving().length - (bumped ? 1 : 0)) >= MAX_MEMBERS) {
        const [lowest, lw] = lowestSeat(seats2.filter((a) => a !== bumped));
        if (stake <= lw) {
          await expect(committee.connect(v).register({ value: stake }))
            .to.be.revertedWithCustomError(committee, "CommitteeFull").withArgs(MAX_MEMBERS, lw);
          return "joinCommitteeFull";
        }
        displaced = lowest;
      }
      const tx = committee.connect(v).register({ value: stake });
      await expect(tx).to.emit(committee, "VerifierRegistered").withArgs(v.address, stake, at);
      seats = seats2;
      for (const d of [bumped, displaced]) {
        if (!d) continue;
        await expect(tx).to.emit(committee, "VerifierDisplaced").withArgs(d, v.address, at);
        const pending = vinfo.get(d).activeFrom === at;
        unseat(d, at, ts);
        if (pending) vinfo.get(d).withdrawableAt = ts; // a displaced join is free at once
      }
      activations.set(at, (activations.get(at) || 0) + 1);
      const rec = { addr: v.address, stake, weight: stake, activeFrom: at, activeUntil: MAX64, withdrawableAt: 0n };
      vinfo.set(v.address, rec);
      regs.push(rec);
      seats.push(v.address);
      if (at > lastKey) lastKey = at;
      return bumped ? "joinChurnDisplacing" : displaced ? "joinDisplacing" : true;
    },
    async verifierExit() {
      const ts = await pin();
      if (rnd.chance(0.1)) {
        const c = vsigners.filter((v) => !vinfo.get(v.address) || vinfo.get(v.address).activeUntil !== MAX64);
        if (!c.length) return false;
        const v = rnd.pick(c);
        await expect(committee.connect(v).requestExit()).to.be.revertedWithCustomError(committee, "NotMember").withArgs(v.address);
        return "exitNotMember";
      }
      const c = notLeaving();
      if (c.length <= 3) return false; // keep a committee
      const v = rnd.pick(c);
      const at = changeEpoch(ts);
      const signer = vByAddr.get(v.addr);
      const cancelled = v.activeFrom === at; // leaving before the seat took effect
      unseat(v.addr, at, ts);
      await expect(committee.connect(signer).requestExit()).to.emit(committee, "VerifierExitRequested")
        .withArgs(v.addr, at, v.withdrawableAt);
      return cancelled ? "joinCancelled" : true;
    },
    async verifierWithdraw() {
      const ts = await pin();
      const c = [...vinfo.values()].filter((v) => v && v.withdrawableAt !== 0n);
      if (!c.length) return false;
      const v = rnd.pick(c);
      const signer = vByAddr.get(v.addr);
      if (ts < v.withdrawableAt) {
        await expect(committee.connect(signer).withdrawStake())
          .to.be.revertedWithCustomError(committee, "UnbondingNotOver").withArgs(v.withdrawableAt);
        return "verifierWithdrawEarly";
      }
      const before = await ethers.provider.getBalance(signer);
      const tx = await committee.connect(signer).withdrawStake();
      await expect(tx).to.emit(committee, "VerifierStakeWithdrawn").withArgs(v.addr, v.stake);
      expect((await ethers.provider.getBalance(signer)) - before + (await gasCost(tx))).to.equal(v.stake);
      vinfo.set(v.addr, null);
      return true;
    },
    async timeJump() {
      await time.increaseTo(BigInt(await time.latest()) + BigInt(rnd.int(1, 500)));
      return true;
    },
    async epochJump() {
      // the next transaction lands exactly on an epoch boundary
      const latest = BigInt(await time.latest());
      let target = epochStart(epochOf(latest) + BigInt(rnd.int(1, 3))) - 1n;
      if (target <= latest) target += EPOCH;
      await time.increaseTo(target);
      return true;
    },
  };

  /** The miner (or anyone) shows the challenged receipt, if the shard's commitment lets it. */
  async function answer(ch, ts) {
    const sh = shardOf(ch.t, ch.s);
    const res = sh.result;
    const k = ch.index - ch.t.ranges[ch.s][0];
    const r = res.receipts[k];
    const who = rnd.chance(0.7) ? miners.find((m) => m.address === sh.miner) : rnd.pick(actors);
    if (res.receipts.length > 1 && rnd.chance(0.05)) {
      const k2 = (k + 1) % res.receipts.length;
      await expect(arb.connect(who).answerAvailability(ch.id, res.receipts[k2], res.proofOf(k2)))
        .to.be.revertedWithCustomError(arb, "ReceiptMismatch");
      return "answerWrongIndex";
    }
    if (BigInt(r.outputTokens) > BigInt(ch.t.maxTokens)) {
      await expect(arb.connect(who).answerAvailability(ch.id, r, res.proofOf(k)))
        .to.be.revertedWithCustomError(arb, "TooManyOutputTokens").withArgs(ch.t.maxTokens, r.outputTokens);
      return "answerOverCap";
    }
    if (res.kind === "inflated") {
      // the receipts do not add up to the tokens billed: no receipt of the shard can be shown
      await expect(arb.connect(who).answerAvailability(ch.id, r, res.proofOf(k))).to.be.revertedWithCustomError(arb, "InvalidProof");
      return "answerInflated";
    }
    if (res.liedAt(k)) {
      // a parent on its path records a false sum: this receipt cannot be shown
      await expect(arb.connect(who).answerAvailability(ch.id, r, res.proofOf(k))).to.be.revertedWithCustomError(arb, "InvalidProof");
      return "answerLie";
    }
    const windowEnd = max(sh.windowEnd + (ts - ch.openedAt), ts + P.responseWindow);
    const tx = arb.connect(who).answerAvailability(ch.id, r, res.proofOf(k));
    await expect(tx).to.emit(arb, "AvailabilityAnswered");
    await expect(tx).to.emit(escrow, "Credited").withArgs(await arb.getAddress(), sh.miner, ch.bond);
    credit(sh.miner, ch.bond);
    ch.status = "answered";
    Object.assign(sh, { state: S.Submitted, windowEnd });
    return windowEnd === ts + P.responseWindow ? "answerLate" : true;
  }

  async function reclaim(t, s, ts, txp) {
    const sh = shardOf(t, s);
    const penalty = (sh.collateral * BigInt(P.reclaimPenaltyBps)) / BPS;
    const budget = budgetOf(t, s);
    const reopen = !t.cancelled && ts < t.deadline;
    await expect(txp).to.emit(task, "ClaimReclaimed").withArgs(t.id, s, sh.miner, penalty, reopen);
    t.committed -= budget;
    if (!reopen) credit(t.client.address, budget);
    const held = { ...sh };
    Object.assign(sh, freshShard(), { state: reopen ? S.Open : S.Refunded, avail: sh.avail });
    bumpSwarmFault(held, "swarmReclaim");
    slashLiable(held, penalty, t.client.address);
  }

  const weights = weightsOver ?? [
    ["createTask", 6], ["claimShard", 10], ["claimShards", 3], ["registerSwarm", 3], ["leaveSwarm", 1], ["claimShardSwarm", 10], ["submitResult", 16], ["finalizeShard", 8], ["reclaimExpired", 4],
    ["declarePrecision", 1], ["refundUnfinished", 3], ["cancelTask", 1], ["openDispute", 6], ["castVotes", 5], ["expireDispute", 3],
    ["reportAbsence", 3], ["challengeAvailability", 8], ["answerAvailability", 7], ["settleUnanswered", 4],
    ["proveBillingFault", 5], ["proveSumFault", 5], ["challengeBurst", 3], ["withdraw", 4], ["addStake", 2], ["reputation", 4], ["verifierJoin", 4],
    ["verifierExit", 2], ["verifierWithdraw", 3], ["timeJump", 7], ["epochJump", 3],
  ];
  const total = weights.reduce((a, [, x]) => a + x, 0);
  for (let i = 0; i < steps; i++) {
    let x = rnd.next() * total;
    let name = weights[0][0];
    for (const [n, wt] of weights) { if ((x -= wt) < 0) { name = n; break; } }
    const did = await actions[name]();
    if (did) bump(typeof did === "string" ? did : name);
    await checkCore();
    if (i % wideEvery === wideEvery - 1) await checkWide();
  }
  await checkWide();
  return counts;
}

describe("Invariant: escrow balance == totalEscrowed + totalWithdrawable", function () {
  this.timeout(300000);
  const seeds = [1, 3, 7, 42, 2024, 99, 21, 8, 5, 13];
  const STEPS = 600;
  const WIDE_EVERY = 10;
  const agg = {};
  for (const seed of seeds) {
    it(`holds over ${STEPS} random steps, with the wider accounting every ${WIDE_EVERY} (seed ${seed})`, async function () {
      const counts = await run(seed, STEPS, WIDE_EVERY);
      for (const [k, v] of Object.entries(counts)) agg[k] = (agg[k] || 0) + v;
      // every seed must exercise the core life of a shard, or the test proves little
      for (const k of ["createTask", "claimShard", "finalizeShard"]) {
        expect(counts[k] || 0, `${k} in seed ${seed}: ${JSON.stringify(counts)}`).to.be.greaterThan(0);
      }
      if (process.env.QUARRY_INVARIANT_VERBOSE) console.log(seed, JSON.stringify(counts));
    });
  }
  it("verifier joins, cancels, exits and withdrawals around epoch boundaries keep the committee's accounting (churn limit 2)", async function () {
    // Issue 29, gap 4: joins compete for a boundary's two slots by stake, pending joins are
    // displaced or cancelled just before the boundary (epochJump lands on its last second).
    const counts = {};
    for (const seed of [5, 11]) {
      const c = await run(seed, 200, 10, [
        ["verifierJoin", 8], ["verifierExit", 5], ["verifierWithdraw", 4], ["timeJump", 2], ["epochJump", 4],
        ["createTask", 1], ["claimShard", 1], ["submitResult", 1], ["openDispute", 1], ["castVotes", 1],
      ]);
      for (const [k, v] of Object.entries(c)) counts[k] = (counts[k] || 0) + v;
    }
    if (process.env.QUARRY_INVARIANT_VERBOSE) console.log("churn", JSON.stringify(counts));
    for (const k of ["joinChurnLimit", "joinChurnDisplacing", "joinDisplacing", "joinCancelled", "verifierWithdraw"]) {
      expect(counts[k] || 0, `${k}: ${JSON.stringify(counts)}`).to.be.greaterThan(0);
    }
  });
  it("the seeds together exercise every action, disputes resolved both ways", function () {
    if (process.env.QUARRY_INVARIANT_VERBOSE) console.log(JSON.stringify(agg));
    for (const k of [
      "openDispute", "resolveFault", "resolveNoFault", "votesPartial", "expireDispute", "reportAbsence",
      "challengeAvailability", "answerAvailability", "answerLate", "settleUnanswered", "answerOverCap", "answerInflated",
      "answerLie", "disputeLie", "challengeTooMany", "challengeByAuditor", "challengeAfterOthersSpent3",
      "sum_lie", "sum_inflated", "sumNoFault", "sumForged", "submit_lie",
      "billing_overcap", "billing_miscount", "billingNoFault", "billingHashMismatch",
      "reclaimExpired", "refundUnfinished", "cancelTask", "withdraw", "reputation", "probationEnded",
      "reportNotSorted", "reportBeforeRegistration",
      "claimOnProbation", "claimOnProbationAllowed", "verifierJoin", "joinDisplacing", "verifierExit", "joinCancelled",
      "joinChurnLimit", "joinChurnDisplacing",
      "verifierWithdraw", "timeJump", "epochJump", "submit_overcap", "submit_miscount", "submit_inflated",
      "registerSwarm", "registerSwarmForged", "leaveSwarm", "swarmReplay", "claimShardSwarm", "claimSwarmInactive",
      "claimSwarmAskAbove", "claimSwarmMemberNotEligible", "finalizeSwarm", "swarmSlash",
      "createTaskHeavy", "claimNoFreeStake", "claimsNoFreeStake", "claimSwarmNoFreeStake",
      "swarmFault", "swarmFaultWithOpen", "swarmReclaim", "swarmReclaimWithOpen",
      "claimShards", "claimsNotEligible", "untrustedSlash", "missed", "missedToProbation",
      "createTaskBadMask", "declarePrecision", "claimPrecisionNotAccepted", "claimsPrecisionNotAccepted",
      "claimSwarmPrecisionNotAccepted", "claimWithReserve",
    ]) {
      expect(agg[k] || 0, `${k}: ${JSON.stringify(agg)}`).to.be.greaterThan(0);
    }
  });
});
