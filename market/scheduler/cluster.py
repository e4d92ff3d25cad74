"""Cluster descriptions for placement and routing: servers, links and the model.

Times are seconds, sizes bytes, bandwidth bytes per second. A cluster loads from TOML or
JSON (see `load_cluster`), or is built from the on-chain GPU registry plus measured
latencies by `market.scheduler.registry.cluster_from_registry`.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from market.errors import QuarryError


@dataclass(frozen=True)
class Server:
    """One miner (or one GPU of one): memory, per-block speeds and where it sits."""

    name: str
    memory_bytes: int
    prefill_s_per_block: float  # tau^I: one block's prefill time for a prompt
    decode_s_per_block: float  # tau: one block's time per generated token
    region: str = "default"
    flops: float = 0.0  # F_i for Parallax water-filling; 0 means derive from decode speed

    @property
    def compute(self) -> float:
        """Relative compute power; Parallax only needs ratios."""
        return self.flops if self.flops > 0 else 1.0 / self.decode_s_per_block


@dataclass(frozen=True)
class Link:
    rtt_s: float
    bandwidth_bytes_per_s: float


@dataclass(frozen=True)
class ModelSpec:
    """The model as the planner sees it: L blocks of equal size."""

    name: str
    num_layers: int
    bytes_per_layer: int
    kv_bytes_per_token_per_layer: int
    hidden_size: int = 0
    dtype_bytes: int = 2


@dataclass
class Cluster:
    servers: list[Server]
    model: ModelSpec
    links: dict[tuple[str, str], Link] = field(default_factory=dict)
    default_link: Link = field(default_factory=lambda: Link(0.005, 125e6))
    # Per-client RTT to each server (client-centric routing, Sun et al.); name -> name -> Link.
    clients: dict[str, dict[str, Link]] = field(default_factory=dict)
    # Links between regions, (region, region) -> Link, used for server pairs without an explicit
    # link (a pair in one region looks up (r, r)), so large clusters need not list every pair.
    region_links: dict[tuple[str, str], Link] = field(default_factory=dict)

    def server(self, name: str) -> Server:
        for s in self.servers:
            if s.name == name:
                return s
        raise QuarryError(f"unknown server {name!r} in cluster")

    def link(self, a: str, b: str) -> Link:
        """Symmetric link lookup; a server talks to itself for free."""
        if a == b:
            return Link(0.0, float("inf"))
        explicit = self.links.get((a, b)) or self.links.get((b, a))
        if explicit is not None:
            return explicit
        if self.region_links:
            region = {s.name: s.region for s in self.servers}
            ra, rb = region.get(a), region.get(b)  # None for a client: no regional link
            if ra is not None and rb is not None:
                regional = self.region_links.get((ra, rb)) or self.region_links.get((rb, ra))
                if regional is not None:
                    return regional
        return self.default_link

    def rtt(self, a: str, b: str) -> float:
        return self.link(a, b).rtt_s


@dataclass
class Placement:
    """Which blocks each server holds: `ranges[name] = (start, end)`, end exclusive.

    `pipelines` lists full chains of servers covering [0, L) when the placer builds them
    explicitly (Parallax); placers that leave chaining to the router (CG-BP, PETALS) leave
    it empty.
    """

    ranges: dict[str, tuple[int, int]]
    pipelines: list[list[str]] = field(default_factory=list)
    algorithm: str = ""

    def blocks(self, name: str) -> int:
        start, end = self.ranges.get(name, (0, 0))
        return end - start

    def to_dict(self) -> dict[str, Any]:
        return {
            "algorithm": self.algorithm,
            "ranges": {k: list(v) for k, v in self.ranges.items()},
            "pipelines": self.pipelines,
        }


def cluster_from_dict(data: dict[str, Any]) -> Cluster:
    """Build a Cluster from the TOML/JSON document shape documented in the README."""
    try:
        model = ModelSpec(**data["model"])
        servers = [Server(**s) for s in data["servers"]]
        links = {
            (lk["a"], lk["b"]): Link(lk["rtt_s"], lk["bandwidth_bytes_per_s"])
            for lk in data.get("links", [])
        }
        region_links = {
            (lk["a"], lk["b"]): Link(lk["rtt_s"], lk["bandwidth_bytes_per_s"])
            for lk in data.get("region_links", [])
        }
        default = data.get("default_link")
        clients = {
            c["name"]: {
                s: Link(v["rtt_s"], v.get("bandwidth_bytes_per_s", 125e6))
                for s, v in c["links"].items()
            }
            for c in data.get("clients", [])
        }
    except (KeyError, TypeError) as exc:
        raise QuarryError(f"invalid cluster description: {exc}") from exc
    names = [s.name for s in servers]
    if len(set(names)) != len(names):
        raise QuarryError("invalid cluster description: duplicate server names")
    cluster = Cluster(
        servers=servers, model=model, links=links, clients=clients, region_links=region_links
    )
    if default:
        cluster.default_link = Link(default["rtt_s"], default["bandwidth_bytes_per_s"])
    return cluster


def load_cluster(path: str | Path) -> Cluster:
    """Load a cluster file (`.toml` or `.json`), naming the file on any error."""
    p = Path(path)
    try:
        text = p.read_text()
        data = tomllib.loads(text) if p.suffix == ".toml" else json.loads(text)
    except FileNotFoundError as exc:
        raise QuarryError(f"cluster file not found: {p}") from exc
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise QuarryError(f"cluster file {p} is not valid: {exc}") from exc
    return cluster_from_dict(data)
