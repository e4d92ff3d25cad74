"""Parallax Phase 1: model allocation (Tong et al., section 3.2).

Which GPUs form how many pipelines, and which contiguous layers each stage holds.

Choices where the paper is silent, garbled or too slow as written (each is measured in
`benchmarks/parallax_timing.py` and tested in `tests/test_parallax_phase1.py`):

* **Layer capacity** c_i = min(L, floor(M_i * (1 - reserve_frac) / (B + kv_tokens * K))),
  with B the bytes of one layer's weights, K the KV bytes per token per layer, and
  kv_tokens = concurrency * (l_in + l_max): every hosted layer keeps room for the KV cache of
  `concurrency` full-length sessions (the same s_c that Sun et al.'s CG-BP reserves, so the
  placers compare like for like). reserve_frac = 0.10 keeps room for activations, the CUDA
  context and fragmentation. A GPU with c_i = 0 cannot hold one layer and is not used.
* **s*(k)**, the minimum total stage count of k pipelines, is computed exactly, but not with
  the paper's per-GPU DP over residual multisets. That DP, memoised (kept here as
  `paper_dp_min_stages`, the reference the tests compare against), took 0.25 s for s*(k)
  at every k on 16 GPUs of 5 capacity types and 44 s on 24; a variant restricted to the m
  largest GPUs (an optimal solution can always use them: swap any used GPU for a larger
  unused one) still took 1.6-6.9 s on 64. The residual-multiset state space explodes.
  Instead:
    1. Group GPUs by capacity ("types": real clusters have few).
    2. Every pipeline of an optimal solution is a *minimal cover*: a multiset of capacities
       summing to >= L from which no GPU can be dropped (else drop it: one stage fewer).
       Enumerate these patterns as count vectors over the types.
    3. s*(k) is then the integer program min sum_p |p| x_p s.t. sum_p x_p = k,
       sum_p p_t x_p <= n_t (GPUs of type t), x integer >= 0: T + 1 rows, P columns. Solve
       its LP relaxation with a small dense simplex; round the LP solution down and complete
       it with a short search over the <= T + 1 missing pipelines; if that meets the LP
       bound (rounded up) it is optimal. Otherwise branch and bound (LP bounds, up-branch
       first). On every instance measured the first LP and its repair were enough.
  Complexity per pool: P = O(prod_t ceil(L / c_t) / max_t ceil(L / c_t)) patterns; one LP
  is O(pivots * (T + 1) * P) with pivots ~ T; branch and bound visits O(T) nodes when the
  LP bound is tight (all measured instances) and is exponential in the worst case (bin
  covering is strongly NP-hard, so no exact method avoids that). `max_bnb_nodes` caps it:
  past the cap the best solution found is used and `optimal=False` is reported. The rest
  of Phase 1 is O(N log N) sorting, an O(N^2) numpy hop matrix, O(n log n) water-filling
  per pipeline and O(leftovers * (N + L)) joins. Measured (benchmarks/parallax_timing.py,
  256 GPUs, 4 regions, 4 capacity types): 3-5 ms for all of Phase 1, one LP of ~0.1 ms
  per solved k, 1-5 values of k solved per pool; 256 GPUs in one pool: 3-4 ms.
* **Which GPU fills which slot**: per capacity type, fastest GPUs first, to the pipelines
  with the fewest stages first (`_assign_gpus` says why).
* **Z(k) = k^alpha / (T_comp + (s*(k)/k) * r_RTT)** with alpha = 1 by default: then Z is the
  aggregate request rate of k pipelines each taking T_comp + (s/k) r_RTT per token, and the
  per-region scores add up to the cluster's rate. T_comp = L * mean per-layer decode time of
  the pool's GPUs; r_RTT = mean one-way hop latency between the pool's GPUs
  (`parallax_phase2.hop_latency_matrix`).
  Only k whose upper bound on Z (from a capacity lower bound on s*) can beat the best score
  so far are solved; ties go to the larger k.
* **Region-first**: each region is planned alone (its own k); GPUs left over in all regions
  are pooled and planned again, which yields cross-region pipelines. GPUs still unused join
  as extra replicas of the least-loaded layers (the churn "join" rule) so Phase 2 can stitch
  them in; `assign_leftovers=False` leaves them out.
* **Water-filling**: lambda is found by binary search over the sorted breakpoints c_i / F_i
  and then solved exactly on the bracketing linear piece (the paper bisects on lambda
  itself; same fixed point, no tolerance). Largest-remainder rounding never exceeds c_i and
  sums exactly to L; ties go to the faster GPU. A GPU rounded to zero layers is dropped
  from its pipeline. Stages are ordered by capacity (then compute), as the DP visits them.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from itertools import accumulate

import numpy as np

from market.errors import QuarryError
from market.scheduler.cluster import Cluster, ModelSpec, Placement, Server
from market.scheduler.parallax_phase2 import hop_latency_matrix

DEFAULT_RESERVE_FRAC = 0.10
DEFAULT_CONCURRENCY = 8
DEFAULT_L_IN = 512
DEFAULT_L_MAX = 256
_EPS = 1e-9


@dataclass(frozen=True)
class Phase1Config:
    """Knobs of Phase 1; the defaults are the choices stated in the module docstring."""

    alpha: float = 1.0
    reserve_frac: float = DEFAULT_RESERVE_FRAC
    kv_tokens: int = DEFAULT_CONCURRENCY * (DEFAULT_L_IN + DEFAULT_L_MAX)
    region_first: bool = True
    assign_leftovers: bool = True
    max_bnb_nodes: int = 5000
    max_patterns: int = 20000

    @classmethod
    def for_workload(cls, concurrency: int = DEFAULT_CONCURRENCY, l_in: int = DEFAULT_L_IN,
                     l_max: int = DEFAULT_L_MAX, **overrides: object) -> Phase1Config:
        """Reserve KV room per hosted layer for `concurrency` sessions of l_in + l_max tokens."""
        if concurrency < 1 or l_in < 0 or l_max < 1:
            raise QuarryError(
                f"need concurrency >= 1, l_in >= 0, l_max >= 1; got {concurrency}, {l_in}, {l_max}"
            )
        return cls(kv_tokens=concurrency * (l_in + l_max), **overrides)  # type: ignore[arg-type]

    def __post_init__(self) -> None:
        if not self.alpha > 0:
            raise QuarryError(f"Parallax alpha must be > 0, got {self.alpha}")
        if not 0 <= self.reserve_frac < 1:
            raise QuarryError(f"reserve_frac must be in [0, 1), got {self.reserve_frac}")
        if self.kv_tokens < 0:
            raise QuarryError(f"kv_tokens must be >= 0, got {self.kv_tokens}")


def layer_capacity(
    server: Server,
    model: ModelSpec,
    kv_tokens: int = DEFAULT_CONCURRENCY * (DEFAULT_L_IN + DEFAULT_L_MAX),
    reserve_frac: float = DEFAULT_RESERVE_FRAC,
) -> int:
    """How many layers fit on `server` after reserving KV room for `kv_tokens` tokens per layer."""
    per_layer = model.bytes_per_layer + kv_tokens * model.kv_bytes_per_token_per_layer
    if per_layer <= 0:
        raise QuarryError(f"model {model.name!r}: a layer must take a positive number of bytes")
    usable = server.memory_bytes * (1.0 - reserve_frac)
    return max(0, min(model.num_layers, int(usable // per_layer)))


# ---------------------------------------------------------------------------------------------
# Exact minimum stage count: cover patterns + branch and bound
# ---------------------------------------------------------------------------------------------


def cover_patterns(type_caps: Sequence[int], L: int, limit: int | None = None) -> list[tuple]:
    """All minimal covers of L as count vectors over `type_caps` (strictly decreasing).

    A cover is minimal when dropping one GPU of its smallest type leaves it below L; larger
    types are never the binding ones, so that single check suffices. Past `limit` patterns
    it raises QuarryError so the caller can fall back.
    """
    T = len(type_caps)
    out: list[tuple] = []
    vec = [0] * T

    def rec(t: int, total: int) -> None:
        if t == T:
            return
        c = type_caps[t]
        need = L - total
        top = -(-need // c)
        for a in range(top + 1):
            vec[t] = a
            s = total + a * c
            if s >= L:
                if a > 0:  # minimal by construction: a - 1 of type t left it short
                    out.append(tuple(vec))
                    if limit is not None and len(out) > limit:
                        raise QuarryError(f"more than {limit} cover patterns")
                break
            rec(t + 1, s)
        vec[t] = 0

    rec(0, 0)
    return out


def _simplex_min(c: np.ndarray, a_eq: np.ndarray, b_eq: np.ndarray, a_ub: np.ndarray,
                 b_ub: np.ndarray) -> tuple[float, np.ndarray] | None:
    """min c.x s.t. a_eq x = b_eq, a_ub x <= b_ub, x >= 0, with b >= 0. None if infeasible.

    A dense big-M tableau: the LPs here have a handful of rows and at most a few thousand
    columns. Dantzig's rule, switching to Bland's after 100 pivots so degenerate cycling ends.
    """
    m_eq, n = a_eq.shape
    m_ub = a_ub.shape[0]
    m = m_eq + m_ub
    width = n + m_ub + m_eq
    tab = np.zeros((m + 1, width + 1))
    tab[:m_eq, :n] = a_eq
    tab[m_eq:m, :n] = a_ub
    tab[m_eq:m, n:n + m_ub] = np.eye(m_ub)
    tab[:m_eq, n + m_ub:width] = np.eye(m_eq)
    tab[:m_eq, -1] = b_eq
    tab[m_eq:m, -1] = b_ub
    big_m = 1e3 * (float(np.abs(c).max(initial=0.0)) + 1.0) * (1.0 + float(b_eq.sum()))
    cost = np.zeros(width)
    cost[:n] = c
    cost[n + m_ub:] = big_m
    basis = [n + m_ub + i for i in range(m_eq)] + [n + i for i in range(m_ub)]
    tab[-1, :width] = cost - cost[basis] @ tab[:m, :width]
    for it in range(5000):
        rc = tab[-1, :width]
        if it < 100:
            j = int(np.argmin(rc))
            if rc[j] >= -_EPS:
                break
        else:
            neg = np.flatnonzero(rc < -_EPS)
            if neg.size == 0:
                break
            j = int(neg[0])
        col = tab[:m, j]
        pos = col > _EPS
        if not pos.any():
            return None  # unbounded; cannot happen with these bounded LPs
        ratios = np.full(m, np.inf)
        ratios[pos] = tab[:m, -1][pos] / col[pos]
        r = int(np.argmin(ratios))
        tab[r] /= tab[r, j]
        f = tab[:, j].copy()
        f[r] = 0.0
        tab -= np.outer(f, tab[r])
        basis[r] = j
    else:
        raise QuarryError("Phase 1 LP did not converge")
    x = np.zeros(width)
    x[basis] = tab[:m, -1]
    if m_eq and x[n + m_ub:].max() > 1e-7:
        return None
    xs = np.maximum(x[:n], 0.0)
    return float(c @ xs), xs


@dataclass
class CoverResult:
    """s*(k) and one optimal multiset of patterns (pattern index -> count)."""

    k: int
    stages: int
    counts: dict[int, int]
    optimal: bool
    nodes: int


class CoverSolver:
    """Exact s*(k) for one pool of GPU capacities (see the module docstring)."""

    def __init__(self, caps: Sequence[int], L: int, *, max_patterns: int = 20000,
                 max_nodes: int = 5000, repair: bool = True) -> None:
        """`repair=False` skips the rounding step and goes straight to branching (tests)."""
        if L <= 0:
            raise QuarryError(f"model must have at least one layer, got L={L}")
        usable = sorted((int(c) for c in caps if c > 0), reverse=True)
        self.L = L
        self.caps_desc = usable
        self.type_caps: list[int] = sorted(set(usable), reverse=True)
        self.type_counts: list[int] = [usable.count(c) for c in self.type_caps]
        self.max_nodes = max_nodes
        self.repair = repair
        self.prefix = list(accumulate(usable))
        pats = cover_patterns(self.type_caps, L, limit=max_patterns) if usable else []
        # Drop patterns that need more GPUs of a type than the pool has.
        counts = self.type_counts
        self.patterns = [p for p in pats if all(a <= n for a, n in zip(p, counts, strict=True))]
        self.sizes = np.array([sum(p) for p in self.patterns], dtype=float)
        self.matrix = (np.array(self.patterns, dtype=float).T if self.patterns
                       else np.zeros((len(self.type_caps), 0)))
        self.k_max = min(len(usable), (sum(usable) // L) if usable else 0)
        self._size_int = [sum(p) for p in self.patterns]
        self._by_size = sorted(range(len(self.patterns)), key=lambda i: self._size_int[i])
        self.min_size = int(self.sizes.min()) if self.patterns else 0

    def capacity_lower_bound(self, k: int) -> int | None:
        """Fewest GPUs whose capacities can reach k*L (the k*L largest), or None."""
        if k <= 0:
            return 0
        m = bisect_left(self.prefix, k * self.L) + 1
        if m > len(self.prefix):
            return None
        return max(m, k * self.min_size)

    def _lp(self, k: int, supply: np.ndarray, hi: dict[int, int], lo: dict[int, int]
            ) -> tuple[float, np.ndarray] | None:
        """LP relaxation with x_p >= lo_p (substituted out) and x_p <= hi_p (extra rows)."""
        P = len(self.patterns)
        k_red = k - sum(lo.values())
        sup_red = supply.copy()
        base = 0.0
        for p, a in lo.items():
            sup_red -= a * self.matrix[:, p]
            base += a * self.sizes[p]
        if k_red < 0 or (sup_red < -_EPS).any():
            return None
        if k_red == 0:
            return base, np.array([float(lo.get(p, 0)) for p in range(P)])
        rows = [self.matrix]
        rhs = [sup_red]
        keep = np.ones(P, dtype=bool)
        for p, h in hi.items():
            room = h - lo.get(p, 0)
            if room < 0:
                return None
            if room == 0:
                keep[p] = False
                continue
            e = np.zeros((1, P))
            e[0, p] = 1.0
            rows.append(e)
            rhs.append(np.array([float(room)]))
        a_ub = np.vstack(rows)[:, keep]
        b_ub = np.concatenate(rhs)
        # rows that only constrained dropped columns are harmless (0 <= room)
        res = _simplex_min(self.sizes[keep], np.ones((1, int(keep.sum()))),
                           np.array([float(k_red)]), a_ub, b_ub)
        if res is None:
            return None
        val, xk = res
        x = np.zeros(P)
        x[keep] = xk
        for p, a in lo.items():
            x[p] += a
        return base + val, x

    def _repair(self, x: np.ndarray, k: int, target: int) -> np.ndarray | None:
        """Round the LP solution down and complete it to k pipelines within `target` stages.

        The missing pipelines (at most T + 1, one per fractional basic variable) are searched
        depth-first over patterns by size, so the first completion found is the cheapest
        order; capped at 2000 nodes. None when no completion meets the target.
        """
        base = np.floor(x + 1e-9).astype(int)
        need = k - int(base.sum())
        budget = target - int(base @ self.sizes.astype(int))
        left = [n - int(u) for n, u in zip(self.type_counts, self.matrix @ base, strict=True)]
        if need < 0 or budget < 0 or min(left, default=0) < 0:
            return None
        picked: list[int] = []
        visits = 0

        def dfs(pos: int, need: int, budget: int) -> bool:
            nonlocal visits
            if need == 0:
                return True
            for q in range(pos, len(self._by_size)):
                idx = self._by_size[q]
                size = self._size_int[idx]
                if size * need > budget:
                    return False
                visits += 1
                if visits > 2000:
                    return False
                pat = self.patterns[idx]
                if all(a <= b for a, b in zip(pat, left, strict=True)):
                    for t, a in enumerate(pat):
                        left[t] -= a
                    picked.append(idx)
                    if dfs(q, need - 1, budget - size):
                        return True
                    picked.pop()
                    for t, a in enumerate(pat):
                        left[t] += a
            return False

        if not dfs(0, need, budget):
            return None
        out = base.astype(float)
        for idx in picked:
            out[idx] += 1
        return out

    def solve(self, k: int) -> CoverResult | None:
        """Minimum total stages of k pipelines, or None when k pipelines cannot be built."""
        if k <= 0 or k > self.k_max or not self.patterns:
            return None
        supply = np.array(self.type_counts, dtype=float)
        best_val = math.inf
        best_x: np.ndarray | None = None
        nodes = 0
        root_bound: int | None = None
        exhausted = False

        def branch(lo: dict[int, int], hi: dict[int, int]) -> bool:
            """Depth-first B&B; returns True to stop (proven optimal or out of budget)."""
            nonlocal best_val, best_x, nodes, root_bound, exhausted
            if nodes >= self.max_nodes:
                exhausted = True
                return True
            nodes += 1
            res = self._lp(k, supply, hi, lo)
            if res is None:
                return False
            val, x = res
            bound = math.ceil(val - 1e-6)
            if root_bound is None:
                root_bound = bound
                repaired = self._repair(x, k, bound) if self.repair else None
                if repaired is not None:  # meets the LP bound: optimal, no branching needed
                    best_val, best_x = float(bound), repaired
                    return True
            if bound >= best_val:
                return False
            frac = np.abs(x - np.round(x))
            j = int(np.argmax(frac))
            if frac[j] < 1e-6:
                best_val = float(bound)
                best_x = np.round(x)
                return best_val <= root_bound
            up = math.ceil(x[j])
            lo_up = dict(lo)
            lo_up[j] = up
            if branch(lo_up, hi):
                return True
            hi_down = dict(hi)
            hi_down[j] = up - 1
            return branch(lo, hi_down)

        branch({}, {})
        if best_x is None:
            return None
        counts = {p: int(v) for p, v in enumerate(best_x) if v > 0.5}
        return CoverResult(k=k, stages=int(best_val), counts=counts,
                           optimal=not exhausted or best_val <= (root_bound or 0), nodes=nodes)

    def pipelines(self, result: CoverResult) -> list[list[int]]:
        """Expand a result into pipelines, each a list of type indices (largest first)."""
        out = []
        for p, cnt in sorted(result.counts.items()):
            pat = self.patterns[p]
            for _ in range(cnt):
                out.append([t for t, a in enumerate(pat) for _ in range(a)])
        return out


def min_stages(caps: Sequence[int], L: int, k: int) -> int | None:
    """s*(k) for a list of capacities: the exact minimum total stages of k pipelines."""
    res = CoverSolver(caps, L).solve(k)
    return None if res is None else res.stages


def paper_dp_min_stages(caps: Sequence[int], L: int, k: int) -> int | None:
    """The paper's DP verbatim: states (i, sorted residuals r, f), moves skip/extend/start.

    Exponential in the number of open pipelines; kept as the reference that tests compare
    the fast solver against on small clusters.
    """
    c = sorted((int(x) for x in caps), reverse=True)
    n = len(c)

    @cache
    def dp(i: int, r: tuple[int, ...], f: int) -> float:
        if f == k and not r:
            return 0
        if i == n:
            return math.inf
        best = dp(i + 1, r, f)  # skip GPU i
        seen = set()
        for j, rj in enumerate(r):  # extend pipeline j
            if rj in seen:
                continue
            seen.add(rj)
            left = rj - c[i]
            if left <= 0:
                cost = 1 + dp(i + 1, r[:j] + r[j + 1:], f + 1)
            else:
                cost = 1 + dp(i + 1, tuple(sorted(r[:j] + (left,) + r[j + 1:])), f)
            best = min(best, cost)
        if f + len(r) < k:  # start a new pipeline
            left = L - c[i]
            if left <= 0:
                cost = 1 + dp(i + 1, r, f + 1)
            else:
                cost = 1 + dp(i + 1, tuple(sorted(r + (left,))), f)
            best = min(best, cost)
        return best

    val = dp(0, (), 0)
    return None if val == math.inf else int(val)


# ---------------------------------------------------------------------------------------------
# Choosing k
# ---------------------------------------------------------------------------------------------


def score(k: int, stages: int, t_comp: float, r_rtt: float, alpha: float) -> float:
    """Z(k) = k^alpha / (T_comp + (s*(k)/k) * r_RTT)."""
    denom = t_comp + (stages / k) * r_rtt
    return math.inf if denom <= 0 else k**alpha / denom


@dataclass
class PoolPlan:
    """Phase 1's answer for one pool of GPUs (one region, or the cross-region leftovers)."""

    name: str
    k: int
    stages: int
    score: float
    t_comp: float
    r_rtt: float
    pipelines: list[list[int]]  # GPU indices into the cluster's server list, stage order
    optimal: bool
    evaluated: dict[int, int] = field(default_factory=dict)  # k -> s*(k) actually solved


def plan_pool(name: str, gpus: Sequence[int], caps: Sequence[int], compute: Sequence[float],
              L: int, t_comp: float, r_rtt: float, config: Phase1Config) -> PoolPlan | None:
    """Pick k = argmax Z(k) for the GPUs `gpus` (cluster indices) and build the pipelines."""
    local = [g for g in gpus if caps[g] > 0]
    if not local:
        return None
    try:
        solver = CoverSolver([caps[g] for g in local], L, max_patterns=config.max_patterns,
                             max_nodes=config.max_bnb_nodes)
    except QuarryError:
        return _plan_pool_fallback(name, local, caps, compute, L, t_comp, r_rtt, config)
    if solver.k_max == 0:
        return None
    bounds = []
    for k in range(1, solver.k_max + 1):
        lb = solver.capacity_lower_bound(k)
        if lb is not None:
            bounds.append((score(k, lb, t_comp, r_rtt, config.alpha), k))
    bounds.sort(reverse=True)
    best: tuple[float, int, CoverResult] | None = None
    evaluated: dict[int, int] = {}
    for ub, k in bounds:
        if best is not None and (ub < best[0] or (ub <= best[0] and k < best[1])):
            continue
        res = solver.solve(k)
        if res is None:
            continue
        evaluated[k] = res.stages
        z = score(k, res.stages, t_comp, r_rtt, config.alpha)
        if best is None or z > best[0] or (z == best[0] and k > best[1]):
            best = (z, k, res)
    if best is None:
        return None
    z, k, res = best
    type_lists = solver.pipelines(res)
    pipelines = _assign_gpus(type_lists, solver.type_caps, local, caps, compute)
    return PoolPlan(name=name, k=k, stages=res.stages, score=z, t_comp=t_comp, r_rtt=r_rtt,
                    pipelines=pipelines, optimal=res.optimal, evaluated=evaluated)


def _plan_pool_fallback(name: str, local: list[int], caps: Sequence[int],
                        compute: Sequence[float], L: int, t_comp: float, r_rtt: float,
                        config: Phase1Config) -> PoolPlan | None:
    """Too many cover patterns (tiny GPUs): greedy next-fit pipelines, flagged non-optimal."""
    order = sorted(local, key=lambda g: (-caps[g], -compute[g]))
    pipelines: list[list[int]] = []
    cur: list[int] = []
    acc = 0
    for g in order:
        cur.append(g)
        acc += caps[g]
        if acc >= L:
            pipelines.append(cur)
            cur, acc = [], 0
    if not pipelines:
        return None
    best_k, best_z = 1, -1.0
    for k in range(1, len(pipelines) + 1):
        z = score(k, sum(len(p) for p in pipelines[:k]), t_comp, r_rtt, config.alpha)
        if z > best_z:
            best_k, best_z = k, z
    chosen = pipelines[:best_k]
    return PoolPlan(name=name, k=best_k, stages=sum(len(p) for p in chosen), score=best_z,
                    t_comp=t_comp, r_rtt=r_rtt, pipelines=chosen, optimal=False)


def _assign_gpus(type_lists: list[list[int]], type_caps: list[int], local: list[int],
                 caps: Sequence[int], compute: Sequence[float]) -> list[list[int]]:
    """Give real GPUs to the pattern slots: per type, fastest first, shortest pipelines first.

    Keeping GPUs of similar speed together lets water-filling balance each pipeline's stages
    (a fast GPU paired with a slow one of the same capacity is capped by its capacity and
    waits on the slow one) and leaves Phase 2 some fast, short chains for light load.
    """
    index = {c: t for t, c in enumerate(type_caps)}
    by_type: dict[int, list[int]] = {}
    for g in sorted(local, key=lambda g: -compute[g]):
        by_type.setdefault(index[caps[g]], []).append(g)
    pipelines: list[list[int]] = []
    for lst in sorted(type_lists, key=len):
        pipelines.append([by_type[t].pop(0) for t in lst])
    for p in pipelines:
        p.sort(key=lambda g: (-caps[g], -compute[g]))
    return pipelines


# ---------------------------------------------------------------------------------------------
# Water-filling
# ---------------------------------------------------------------------------------------------


def water_fill(caps: Sequence[int], flops: Sequence[float], L: int) -> list[int]:
    """Integer layer counts x_i <= c_i summing to L, proportional to F_i where caps allow.

    x_i = min(c_i, lambda F_i) with sum x_i = L, rounded by largest remainder.
    """
    n = len(caps)
    if n == 0 or n != len(flops):
        raise QuarryError("water-filling needs one compute value per GPU and at least one GPU")
    if any(c < 0 for c in caps) or any(not f > 0 for f in flops):
        raise QuarryError("water-filling needs capacities >= 0 and compute > 0")
    if sum(caps) < L:
        raise QuarryError(f"pipeline capacity {sum(caps)} is below the model's {L} layers")
    if L <= 0:
        raise QuarryError(f"model must have at least one layer, got L={L}")
    # g(lam) = sum_i min(c_i, lam F_i) is piecewise linear with breakpoints c_i / F_i.
    order = sorted(range(n), key=lambda i: caps[i] / flops[i])
    brk = [caps[i] / flops[i] for i in order]
    sat_caps = list(accumulate((caps[i] for i in order), initial=0))
    free_f = list(accumulate((flops[i] for i in reversed(order)), initial=0))[::-1]

    def g_at(j: int) -> float:  # value at breakpoint j: GPUs 0..j saturated
        return sat_caps[j + 1] + brk[j] * free_f[j + 1]

    lo, hi = 0, n - 1  # binary search: first breakpoint where g >= L
    while lo < hi:
        mid = (lo + hi) // 2
        if g_at(mid) >= L:
            hi = mid
        else:
            lo = mid + 1
    j = lo  # GPUs before j are saturated; lam lies in [brk[j-1], brk[j]]
    lam = (L - sat_caps[j]) / free_f[j]
    x = [min(float(caps[i]), lam * flops[i]) for i in range(n)]
    ints = [min(caps[i], int(math.floor(x[i] + 1e-9))) for i in range(n)]
    short = L - sum(ints)
    rank = sorted(range(n), key=lambda i: (-(x[i] - ints[i]), -flops[i], i))
    for i in rank:
        if short <= 0:
            break
        if ints[i] < caps[i]:
            ints[i] += 1
            short -= 1
    while short < 0:  # float slack only: take back from the largest remainders' losers
        i = max((i for i in range(n) if ints[i] > 0), key=lambda i: ints[i] - x[i])
        ints[i] -= 1
        short += 1
    return ints


def contiguous_ranges(counts: Sequence[int]) -> list[tuple[int, int]]:
    """Map per-stage layer counts to gap-free [start, end) ranges with a write cursor."""
    out = []
    cursor = 0
    for c in counts:
        out.append((cursor, cursor + c))
        cursor += c
    return out


# ---------------------------------------------------------------------------------------------
# Layer load (shared with churn) and the join rule
# ---------------------------------------------------------------------------------------------


def layer_loads(cluster: Cluster, ranges: dict[str, tuple[int, int]], *,
                reserve_frac: float = DEFAULT_RESERVE_FRAC, mem_weight: float = 0.5
                ) -> np.ndarray:
    """Per-layer load: w * kv/total_mem + (1 - w) * compute/total_flops (paper, footnote 2).

    A GPU holding b layers gives each of them 1/b of its free KV memory (memory after weights)
    and 1/b of its compute: the share of the GPU that layer gets. total_mem and total_flops
    are over every server in the cluster. All zeros when the totals are zero.
    """
    L = cluster.model.num_layers
    kv = np.zeros(L + 1)
    comp = np.zeros(L + 1)
    total_mem = float(sum(s.memory_bytes for s in cluster.servers))
    total_flops = float(sum(s.compute for s in cluster.servers))
    by_name = {s.name: s for s in cluster.servers}
    for name, (a, b) in ranges.items():
        s = by_name.get(name)
        if s is None or b <= a:
            continue
        blocks = b - a
        weights = blocks * cluster.model.bytes_per_layer
        free = max(0.0, s.memory_bytes * (1 - reserve_frac) - weights)
        kv[a] += free / blocks
        kv[b] -= free / blocks
        comp[a] += s.compute / blocks
        comp[b] -= s.compute / blocks
    kv = np.cumsum(kv)[:L]
    comp = np.cumsum(comp)[:L]
    load = np.zeros(L)
    if total_mem > 0:
        load += mem_weight * kv / total_mem
    if total_flops > 0:
        load += (1 - mem_weight) * comp / total_flops
    return load


def join_range(capacity: int, loads: np.ndarray) -> tuple[int, int]:
    """Range for a joining GPU: start at the least-loaded layer, take `capacity` layers.

    When the slice would run past L it is shifted left (still covering the bottleneck layer)
    so the GPU holds all the layers it can.
    """
    L = len(loads)
    c = min(capacity, L)
    if c <= 0:
        raise QuarryError("a GPU that cannot hold one layer cannot join")
    star = int(np.argmin(loads))
    start = max(0, min(star, L - c))
    return start, start + c


# ---------------------------------------------------------------------------------------------
# The whole of Phase 1
# ---------------------------------------------------------------------------------------------


@dataclass
class Phase1Result:
    placement: Placement
    pools: list[PoolPlan]
    capacities: dict[str, int]
    leftovers: list[str]  # servers given a join range outside any pipeline
    unused: list[str]  # servers holding nothing

    @property
    def optimal(self) -> bool:
        return all(p.optimal for p in self.pools)


def allocate(cluster: Cluster, config: Phase1Config | None = None,
             rho: np.ndarray | None = None) -> Phase1Result:
    """Run Phase 1 on `cluster`: pipelines per region, cross-region leftovers, water-filling.

    `rho` is the one-way hop latency matrix over `cluster.servers` (built when not given).
    """
    cfg = config or Phase1Config()
    model = cluster.model
    L = model.num_layers
    if L <= 0:
        raise QuarryError(f"model {model.name!r} has no layers")
    servers = cluster.servers
    if not servers:
        raise QuarryError("cluster has no servers")
    for s in servers:
        if s.decode_s_per_block <= 0 or s.memory_bytes <= 0:
            raise QuarryError(f"server {s.name!r}: memory and decode time must be positive")
    caps = [layer_capacity(s, model, cfg.kv_tokens, cfg.reserve_frac) for s in servers]
    if sum(caps) < L:
        raise QuarryError(
            f"cluster cannot hold model {model.name!r}: total layer capacity {sum(caps)} < {L}"
        )
    compute = [s.compute for s in servers]
    tau0 = np.array([s.decode_s_per_block for s in servers])
    if rho is None:
        rho = hop_latency_matrix(cluster, [s.name for s in servers])

    def stats(members: Sequence[int]) -> tuple[float, float]:
        idx = np.asarray(members)
        t_comp = L * float(tau0[idx].mean())
        if len(idx) < 2:
            return t_comp, 0.0
        sub = rho[np.ix_(idx, idx)]
        r = float((sub.sum() - np.trace(sub)) / (len(idx) * (len(idx) - 1)))
        return t_comp, r

    regions: dict[str, list[int]] = {}
    for g, s in enumerate(servers):
        regions.setdefault(s.region if cfg.region_first else "all", []).append(g)
    pools: list[PoolPlan] = []
    used: set[int] = set()
    for region in sorted(regions):
        members = regions[region]
        t_comp, r = stats(members)
        pp = plan_pool(region, members, caps, compute, L, t_comp, r, cfg)
        if pp is not None:
            pools.append(pp)
            used.update(g for p in pp.pipelines for g in p)
    rest = [g for g in range(len(servers)) if g not in used and caps[g] > 0]
    if len(regions) > 1 and rest and sum(caps[g] for g in rest) >= L:
        t_comp, r = stats(rest)
        pp = plan_pool("cross-region", rest, caps, compute, L, t_comp, r, cfg)
        if pp is not None:
            pools.append(pp)
            used.update(g for p in pp.pipelines for g in p)
    if not pools:
        raise QuarryError("no full pipeline can be formed from this cluster")

    ranges: dict[str, tuple[int, int]] = {}
    pipelines: list[list[str]] = []
    for pp in pools:
        for pipe in pp.pipelines:
            counts = water_fill([caps[g] for g in pipe], [compute[g] for g in pipe], L)
            kept = [(g, c) for g, c in zip(pipe, counts, strict=True) if c > 0]
            for (g, _), rng in zip(kept, contiguous_ranges([c for _, c in kept]), strict=True):
                ranges[servers[g].name] = rng
            pipelines.append([servers[g].name for g, _ in kept])
    leftovers: list[str] = []
    if cfg.assign_leftovers:
        for g in sorted((g for g in range(len(servers)) if g not in used and caps[g] > 0),
                        key=lambda g: (-caps[g], -compute[g])):
            loads = layer_loads(cluster, ranges, reserve_frac=cfg.reserve_frac)
            ranges[servers[g].name] = join_range(caps[g], loads)
            leftovers.append(servers[g].name)
    unused = [s.name for s in servers if s.name not in ranges]
    placement = Placement(ranges=ranges, pipelines=pipelines, algorithm="parallax")
    return Phase1Result(placement=placement, pools=pools,
                        capacities={s.name: c for s, c in zip(servers, caps, strict=True)},
                        leftovers=leftovers, unused=unused)

