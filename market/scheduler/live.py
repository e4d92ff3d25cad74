"""Live swarm placement: the members a market hears from -> a `Cluster` -> a layer plan.

A swarm member declares its memory (MiB), its speed (dense TFLOP/s), its stage endpoint and
the RTTs it measured to the other members (`market.protocol.messages.swarm_join`). The
market turns the live members into a `Cluster` (`live_cluster`):

* memory: `memory_mib` MiB; `flops`: the declared TFLOP/s (what Parallax water-fills by);
* per-block times: `registry.estimate_block_times` for a GPU of that speed and the A100's
  bandwidth per FLOP (a member declares one number, so decode time scales as 1 / tflops);
* links: a pair's RTT is the mean of what the two members reported of each other (one
  report is used alone), at the default link's bandwidth; an unreported pair gets the
  default link.

The model comes from its manifest's architecture (`model_spec_from_architecture`, the
Hugging Face config keys); every layer also reserves KV room for the default workload
(`Phase1Config.for_workload`), as `market plan` does.

`plan_live` places the layers (Parallax Phase 1 by default; `cgbp` or `petals`). Given the
previous plan (`PlanState`), Parallax goes on under `churn.ParallaxScheduler`'s rules:
members that left (or changed their declared memory or speed) leave, then members that
joined join, in address order; a joiner takes the bottleneck range, and Phase 1 runs again
only when a layer is uncovered or the layer-load CV trips. CG-BP and PETALS have no churn
rules here: they place from scratch on every change. The head (who drives the pipeline,
claims and signs receipts for the group) is the member serving layer 0 with the most
memory, the lowest address on a tie: the driver holds the embedding and the batch's
activations, so the roomiest first stage carries that best. Everything is a function of
the members sorted by address, so the same members give the same plan.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from market.errors import QuarryError
from market.scheduler.churn import ParallaxScheduler, uncovered_layers
from market.scheduler.cluster import Cluster, Link, ModelSpec, Placement, Server
from market.scheduler.parallax_phase1 import Phase1Config, layer_capacity
from market.scheduler.parallax_phase2 import DEFAULT_L_IN, DEFAULT_L_MAX, Router
from market.scheduler.registry import MIB, REFERENCE, GpuClass, estimate_block_times

ALGORITHMS = ("parallax", "cgbp", "petals")
MAX_LAYERS = 1024
"""The most layers a swarm plans for (today's largest models have under 200): a manifest is
anyone's upload, and planning time grows with the layers it declares."""
CONCURRENCY = 8
"""Sessions each hosted layer keeps KV room for (`market plan`'s default)."""
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2,
               "float8_e4m3fn": 1, "int8": 1}
"""Bytes per weight by the config's `torch_dtype`; Quarry's engine runs fp32 when none."""


class CannotCover(QuarryError):
    """The live members cannot hold every layer of the model."""


@dataclass(frozen=True)
class LiveMember:
    """What one swarm member declared in its last join."""

    address: str
    memory_mib: int
    tflops: float
    endpoint: str = ""
    public_key: str = ""
    rtts: Mapping[str, float] = field(default_factory=dict)
    price_per_token: int = 0

    @property
    def declared(self) -> tuple[int, float]:
        """What placement depends on: a change re-places the member."""
        return (int(self.memory_mib), float(self.tflops))


def model_spec_from_architecture(name: str, arch: Mapping[str, Any]) -> ModelSpec:
    """The planner's view of a decoder-only model from its Hugging Face config: weights of
    one layer (attention + gated MLP + two norms) and its KV bytes per token."""
    try:
        layers = int(arch["num_hidden_layers"])
        h = int(arch["hidden_size"])
        inter = int(arch["intermediate_size"])
        heads = int(arch["num_attention_heads"])
        kv_heads = int(arch.get("num_key_value_heads") or heads)
        head_dim = int(arch.get("head_dim") or h // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise QuarryError(f"model {name!r}: its manifest's architecture cannot be planned "
                          f"(needs num_hidden_layers, hidden_size, intermediate_size, "
                          f"num_attention_heads): {exc!r}") from exc
    if min(layers, h, inter, heads, kv_heads, head_dim) < 1:
        raise QuarryError(f"model {name!r}: architecture sizes must be positive")
    if layers > MAX_LAYERS:
        raise QuarryError(f"model {name!r} declares {layers} layers; swarms are planned for "
                          f"at most {MAX_LAYERS}")
    dtype = DTYPE_BYTES.get(str(arch.get("torch_dtype", "float32")), 4)
    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    params = 2 * h * q_out + 2 * h * kv_out + 3 * h * inter + 2 * h
    return ModelSpec(name=name, num_layers=layers, bytes_per_layer=params * dtype,
                     kv_bytes_per_token_per_layer=2 * kv_out * dtype, hidden_size=h,
                     dtype_bytes=dtype)


def _server(m: LiveMember, model: ModelSpec, l_in: int) -> Server:
    flops = float(m.tflops) * 1e12
    gpu = GpuClass(f"{m.tflops:g} TFLOP/s", flops * REFERENCE.memory_bandwidth_bytes_per_s
                   / REFERENCE.flops, flops, m.memory_mib / 1024)
    prefill, decode = estimate_block_times(gpu, model, l_in)
    return Server(name=m.address, memory_bytes=int(m.memory_mib) * MIB,
                  prefill_s_per_block=prefill, decode_s_per_block=decode, flops=flops)


def live_cluster(model: ModelSpec, members: Sequence[LiveMember], *,
                 l_in: int = DEFAULT_L_IN) -> Cluster:
    """The cluster of `members` (see the module doc), servers in address order."""
    ordered = sorted(members, key=lambda m: int(m.address, 16))
    cluster = Cluster(servers=[_server(m, model, l_in) for m in ordered], model=model)
    names = {m.address for m in ordered}
    reports: dict[tuple[str, str], list[float]] = {}
    for m in ordered:
        for other, rtt in m.rtts.items():
            if other in names and other != m.address and math.isfinite(rtt) and rtt >= 0:
                key = (m.address, other) if int(m.address, 16) < int(other, 16) \
                    else (other, m.address)
                reports.setdefault(key, []).append(float(rtt))
    bandwidth = cluster.default_link.bandwidth_bytes_per_s
    cluster.links = {k: Link(sum(v) / len(v), bandwidth) for k, v in sorted(reports.items())}
    return cluster


@dataclass
class PlanState:
    """What the next re-plan needs of a plan: its placement, the CV of the fresh plan it
    descends from (churn's no-storm floor) and what each member had declared."""

    algorithm: str
    ranges: dict[str, tuple[int, int]]
    pipelines: list[list[str]]
    cv_floor: float
    declared: dict[str, tuple[int, float]]

    def to_dict(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm,
                "ranges": {k: list(v) for k, v in self.ranges.items()},
                "pipelines": self.pipelines, "cv_floor": self.cv_floor,
                "declared": {k: list(v) for k, v in self.declared.items()}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PlanState:
        return cls(str(d["algorithm"]), {k: (int(v[0]), int(v[1])) for k, v in
                                         d["ranges"].items()},
                   [list(p) for p in d["pipelines"]], float(d["cv_floor"]),
                   {k: (int(v[0]), float(v[1])) for k, v in d["declared"].items()})


@dataclass
class LivePlan:
    """A placement of the model on the live members."""

    algorithm: str
    num_layers: int
    ranges: dict[str, tuple[int, int]]  # members serving layers, [start, end)
    standby: list[str]  # members with no layers
    head: str
    predicted_s_per_token: float
    state: PlanState
    how: str  # "fresh", or the churn events and any re-plan they triggered


def plan_live(model: ModelSpec, members: Sequence[LiveMember], *,
              algorithm: str = "parallax", previous: PlanState | None = None,
              concurrency: int = CONCURRENCY, l_in: int = DEFAULT_L_IN,
              l_max: int = DEFAULT_L_MAX) -> LivePlan:
    """Place `model` on `members` (see the module doc); CannotCover when they cannot hold
    every layer, QuarryError for an unknown algorithm."""
    if algorithm not in ALGORITHMS:
        raise QuarryError(f"unknown swarm algorithm {algorithm!r} (one of {', '.join(ALGORITHMS)})")
    if not members:
        raise CannotCover(f"model {model.name!r} has no live swarm members")
    if len({m.address for m in members}) != len(members):
        raise QuarryError("swarm members must have distinct addresses")
    cfg = Phase1Config.for_workload(concurrency, l_in, l_max)
    cluster = live_cluster(model, members, l_in=l_in)
    declared = {m.address: m.declared for m in members}
    try:
        if algorithm == "parallax":
            placement, cv_floor, how = _parallax(cluster, model, members, previous, cfg, l_in,
                                                 l_max)
        else:
            module = importlib.import_module(f"market.scheduler.{algorithm}")
            placement = module.place(cluster, concurrency, l_in, l_max)
            placement.algorithm = algorithm
            cv_floor, how = 0.0, "fresh"
        missing = uncovered_layers(placement.ranges, model.num_layers)
        if missing:
            raise CannotCover(f"no live member can hold layers {missing[0]}..{missing[-1]}")
        route = Router(cluster, placement, l_in=l_in, l_max=l_max,
                       reserve_frac=cfg.reserve_frac).route()
    except CannotCover:
        raise
    except (QuarryError, ValueError, ZeroDivisionError) as exc:
        raise CannotCover(f"the {len(members)} live members cannot hold model "
                          f"{model.name!r}: {exc}") from exc
    ranges = {n: r for n, r in sorted(placement.ranges.items(), key=lambda kv: int(kv[0], 16))
              if r[1] > r[0]}
    standby = sorted((m.address for m in members if m.address not in ranges),
                     key=lambda a: int(a, 16))
    memory = {m.address: m.memory_mib for m in members}
    head = min((n for n, (a, _) in ranges.items() if a == 0),
               key=lambda n: (-memory[n], int(n, 16)))
    state = PlanState(algorithm, dict(ranges), [list(p) for p in placement.pipelines],
                      cv_floor, declared)
    return LivePlan(algorithm, model.num_layers, ranges, standby, head, route.per_token_s,
                    state, how)


def _parallax(cluster: Cluster, model: ModelSpec, members: Sequence[LiveMember],
              previous: PlanState | None, cfg: Phase1Config, l_in: int,
              l_max: int) -> tuple[Placement, float, str]:
    """Parallax placement: fresh Phase 1, or the previous plan under the churn rules."""
    if previous is None or previous.algorithm != "parallax":
        sched = ParallaxScheduler(cluster, phase1=cfg, l_in=l_in, l_max=l_max)
        return sched.placement, sched.cv_floor, "fresh"
    now = {m.address: m for m in members}
    gone = sorted((a for a in previous.declared
                   if a not in now or now[a].declared != previous.declared[a]),
                  key=lambda a: int(a, 16))
    joining = sorted((m for m in members if m.address not in previous.declared
                      or m.address in gone), key=lambda m: int(m.address, 16))
    if not gone and not joining:
        return Placement(dict(previous.ranges), [list(p) for p in previous.pipelines],
                         "parallax"), previous.cv_floor, "unchanged"
    # The cluster as it was: the members that stay, plus the leavers as they had declared.
    stay = [s for s in cluster.servers if s.name in previous.declared and s.name not in gone]
    old = [_server(LiveMember(a, *previous.declared[a]), model, l_in) for a in gone]
    before = Cluster(servers=stay + old, model=model, links=dict(cluster.links))
    kept = {n: r for n, r in previous.ranges.items() if n in previous.declared}
    sched = ParallaxScheduler(before, phase1=cfg, l_in=l_in, l_max=l_max,
                              placement=Placement(kept, previous.pipelines, "parallax"),
                              cv_floor=previous.cv_floor)
    events = []
    for name in gone:
        ev = sched.leave(name)
        events.append(f"leave {name}" + (f" (re-plan: {ev.replanned})" if ev.replanned else ""))
    for m in joining:
        ev = sched.join(next(s for s in cluster.servers if s.name == m.address))
        events.append(f"join {m.address} -> {ev.range}"
                      + (f" (re-plan: {ev.replanned})" if ev.replanned else ""))
    return sched.placement, sched.cv_floor, "; ".join(events)


def plan_terms(plan: LivePlan, model_id: str, members: Sequence[LiveMember],
               deadline: int) -> dict[str, Any] | None:
    """The SwarmConsent terms of `plan`: the serving members ascending, shares = layers
    served, the head, price = the highest ask among them, `deadline`. None when fewer than
    2 or more than 16 members serve (GPURegistry's swarm size; one member needs no swarm)."""
    if not 2 <= len(plan.ranges) <= 16:
        return None
    asks = {m.address: int(m.price_per_token) for m in members}
    order = sorted(plan.ranges, key=lambda a: int(a, 16))
    return {"model_id": model_id, "head": plan.head, "members": order,
            "shares": [plan.ranges[a][1] - plan.ranges[a][0] for a in order],
            "price_per_token": max(asks[a] for a in order), "deadline": int(deadline)}


def check_plan(plan: Mapping[str, Any], model: ModelSpec, member: str,
               memory_mib: int) -> tuple[int, int] | None:
    """What a member checks of a plan (`GET /swarms/{id}/plan`) before loading: the model's
    layer count, every layer covered, and its own range within what its `memory_mib` holds
    (with the KV room the planner reserves). Returns its [start, end), None on standby;
    QuarryError naming the problem otherwise."""
    if int(plan["num_layers"]) != model.num_layers:
        raise QuarryError(f"the plan places {plan['num_layers']} layers, the model has "
                          f"{model.num_layers}")
    ranges = {str(m["address"]): (int(m["layers"][0]), int(m["layers"][1]))
              for m in plan["members"]}
    for name, (a, b) in ranges.items():
        if not 0 <= a < b <= model.num_layers:
            raise QuarryError(f"the plan gives {name} layers [{a}, {b}), outside "
                              f"[0, {model.num_layers})")
    missing = uncovered_layers(ranges, model.num_layers)
    if missing:
        raise QuarryError(f"the plan leaves layers {missing[0]}..{missing[-1]} uncovered")
    mine = next((r for n, r in ranges.items() if n.lower() == member.lower()), None)
    if mine is None:
        return None
    cfg = Phase1Config.for_workload(CONCURRENCY, DEFAULT_L_IN, DEFAULT_L_MAX)
    server = Server(member, int(memory_mib) * MIB, 1.0, 1.0)
    cap = layer_capacity(server, model, cfg.kv_tokens, cfg.reserve_frac)
    if mine[1] - mine[0] > cap:
        raise QuarryError(f"the plan gives {member} {mine[1] - mine[0]} layers; its "
                          f"{memory_mib} MiB hold {cap}")
    return mine
