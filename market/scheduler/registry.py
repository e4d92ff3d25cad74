"""A `Cluster` built from the on-chain GPU registry plus measured latencies.

`cluster_from_registry(quarry, model)` lists the miners GPURegistry knows (every
`MinerRegistered` event since the deploy block, then `minerInfo` for the current state),
keeps the registered ones that have not asked to exit (and, given `model_id`, that list it
in `modelsOf`), and makes one `Server` per miner, named by its checksummed address:

* memory: `gpu.memoryMiB * gpu.count` MiB;
* per-block times: estimated from the GPU name through `GPU_TABLE` (below), with the model's
  layer size (`estimate_block_times`);
* region: from the optional `regions` mapping (address -> region), else "default".

Links come from a measured-latency file (`load_latencies`: TOML or JSON, `[[links]]` with
`a`, `b`, `rtt_s`, `bandwidth_bytes_per_s`) when one is given. Otherwise they are measured
live by timing TCP connects from *this machine* to each miner's registered endpoint
(`measure_rtts`: a few samples, the median; a connect costs one round trip). That is the
client-to-miner RTT, not miner-to-miner: it becomes the cluster's client "this-machine",
and a miner pair gets `rtt_a + rtt_b` (the path through this machine, an upper bound on
their direct RTT by the triangle inequality) at the default link's bandwidth. A miner that
does not answer gets a warning and the default link.

GPU speeds. Decoding one token through one block reads the block's weights once, so it is
memory-bandwidth bound; prefilling an `l_in`-token prompt does ~2 * params * l_in FLOPs, so
it is compute bound (roofline). Hence, with params = bytes_per_layer / dtype_bytes:

    decode_s_per_block  = bytes_per_layer / (BANDWIDTH_EFFICIENCY * bandwidth)
    prefill_s_per_block = max(2 * params * l_in / (PREFILL_MFU * flops), decode_s_per_block)

BANDWIDTH_EFFICIENCY = 1.0 and PREFILL_MFU = 0.5 are what examples/clusters/small.toml
(the Parallax paper's RTX 5090/4090 testbed) implies: its decode time is weights / peak
bandwidth and its 512-token prefill runs at half the peak FLOPs. The figures in `GPU_TABLE`
are vendor datasheet peaks: memory bandwidth, and dense (no sparsity) FP16/BF16 tensor
FLOP/s (GeForce cards with FP16 accumulate, as in small.toml). Relative to the A100-80GB
reference (2.04 TB/s, 312 TFLOP/s), bandwidth / FLOPs ratios are: H100 SXM 1.64 / 3.17,
H200 2.35 / 3.17, L40S 0.42 / 1.16, RTX 4090 0.49 / 0.53, RTX 5090 0.88 / 0.67.

* A MIG slice ("MIG 1g.10gb", "3g.40gb", ...) of a known parent gets g/7 of its FLOPs and
  the slice's share of its memory (hence of its memory bandwidth). A parent that is not
  named is taken to be an A100-80GB (Sun et al.'s A100 + MIG testbed).
* A miner with `count` GPUs holds `count` times the memory; its per-block times are one
  GPU's (its layers are split over its GPUs and run one after another), while `flops` (the
  share Parallax water-fills by) is `count` times one GPU's.
* An unknown name falls back to an estimate from its memory size, and says so in a warning:
  bandwidth = memory (GiB) * FALLBACK_BANDWIDTH_PER_GIB (the median bandwidth per GiB over
  the table, ~28 GB/s per GiB), clamped to [100 GB/s, 5 TB/s], and FLOPs at the A100's
  FLOP/byte (153). It is a guess of the right order, not a measurement: register the exact
  name or pass `gpu_speeds` for better estimates.

`market plan --registry` (market/scheduler/cli.py) is the command line for this module.
"""

from __future__ import annotations

import json
import math
import re
import socket
import statistics
import time
import tomllib
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from market.errors import QuarryError
from market.scheduler.cluster import Cluster, Link, ModelSpec, Server

if TYPE_CHECKING:
    from market.chain.contracts import MinerInfo
    from market.chain.deploy import Quarry

MIB = 1024**2
GIB = 1024**3
BANDWIDTH_EFFICIENCY = 1.0
PREFILL_MFU = 0.5
LOCAL_CLIENT = "this-machine"  # the client whose RTTs a live measurement gives


class RegistryWarning(UserWarning):
    """Something `cluster_from_registry` had to guess (unknown GPU, unreachable miner)."""


@dataclass(frozen=True)
class GpuClass:
    """Datasheet peaks of one GPU model: what the per-block time estimates scale by."""

    name: str
    memory_bandwidth_bytes_per_s: float
    flops: float  # dense FP16/BF16 tensor FLOP/s
    memory_gib: float = 0.0  # nominal memory (for MIG shares and the fallback); 0: unknown

    def relative_to(self, ref: GpuClass) -> tuple[float, float]:
        """(bandwidth ratio, FLOPs ratio) against `ref`."""
        return (self.memory_bandwidth_bytes_per_s / ref.memory_bandwidth_bytes_per_s,
                self.flops / ref.flops)


def _g(name: str, tb_s: float, tflops: float, gib: float) -> GpuClass:
    return GpuClass(name, tb_s * 1e12, tflops * 1e12, gib)


# Ordered rules: the first regex that matches the normalised name wins (normalised: lower
# case, every run of other characters a single space; "NVIDIA A100-SXM4-80GB" ->
# "nvidia a100 sxm4 80gb"). Sources: NVIDIA/AMD datasheets and architecture whitepapers.
_D = r"(?<![0-9a-z])"  # no letter or digit just before
_E = r"(?![0-9a-z])"  # none just after
GPU_TABLE: tuple[tuple[str, GpuClass], ...] = (
    (rf"{_D}b200{_E}", _g("B200", 8.0, 2250, 180)),
    (rf"{_D}gh200{_E}", _g("GH200", 4.0, 989, 96)),
    (rf"{_D}h200{_E}", _g("H200 SXM", 4.8, 989, 141)),
    (rf"{_D}h100{_E}.*{_D}nvl{_E}", _g("H100 NVL", 3.9, 835, 94)),
    (rf"{_D}h100{_E}.*{_D}pcie{_E}", _g("H100 PCIe", 2.0, 756, 80)),
    (rf"{_D}h100{_E}", _g("H100 SXM", 3.35, 989, 80)),
    (rf"{_D}a100{_E}.*{_D}40gb{_E}", _g("A100 40GB", 1.555, 312, 40)),
    (rf"{_D}a100{_E}.*{_D}pcie{_E}", _g("A100 80GB PCIe", 1.935, 312, 80)),
    (rf"{_D}a100{_E}", _g("A100 80GB", 2.039, 312, 80)),
    (rf"{_D}mi300x{_E}", _g("MI300X", 5.3, 1307, 192)),
    (rf"{_D}l40s{_E}", _g("L40S", 0.864, 362, 48)),
    (rf"{_D}l40{_E}", _g("L40", 0.864, 181, 48)),
    (rf"{_D}l4{_E}", _g("L4", 0.300, 121, 24)),
    (rf"{_D}a10{_E}", _g("A10", 0.600, 125, 24)),
    (rf"{_D}v100{_E}", _g("V100", 0.900, 125, 32)),
    (rf"{_D}t4{_E}", _g("T4", 0.320, 65, 16)),
    (rf"6000{_E}.*{_D}ada{_E}", _g("RTX 6000 Ada", 0.960, 364, 48)),
    (rf"(?<![0-9])5090{_E}", _g("RTX 5090", 1.792, 209.5, 32)),
    (rf"(?<![0-9])4090{_E}", _g("RTX 4090", 1.008, 165.2, 24)),
    (rf"(?<![0-9])3090{_E}", _g("RTX 3090", 0.936, 142, 24)),
)
_RULES = tuple((re.compile(p), c) for p, c in GPU_TABLE)
REFERENCE = next(c for _, c in GPU_TABLE if c.name == "A100 80GB")
A100_40GB = next(c for _, c in GPU_TABLE if c.name == "A100 40GB")
# A100-40GB's MIG profiles (the 80GB part's are 1g.10gb, 2g.20gb, 3g.40gb, ...).
_A100_40GB_MIG = {(1, 5), (2, 10), (3, 20), (4, 20), (7, 40)}
_MIG = re.compile(r"(?<![0-9a-z])([1-7])g\.([0-9]+)gb")
FALLBACK_BANDWIDTH_PER_GIB = statistics.median(
    c.memory_bandwidth_bytes_per_s / c.memory_gib for _, c in GPU_TABLE)
FALLBACK_BANDWIDTH_RANGE = (100e9, 5e12)


def _normalise(name: str) -> str:
    return " ".join(re.split(r"[^0-9a-z.]+", name.lower())).strip()


@dataclass(frozen=True)
class GpuEstimate:
    """The speeds one GPU is planned with, and how they were found."""

    gpu: GpuClass
    known: bool  # False: the memory-size fallback
    basis: str  # one line: which table row, MIG share or fallback


def estimate_gpu(name: str, memory_mib: int,
                 overrides: Mapping[str, GpuClass] | None = None) -> GpuEstimate:
    """Speeds of the GPU called `name` with `memory_mib` MiB (one GPU's, as registered).

    `overrides` maps a case-insensitive substring of the name to a GpuClass and is tried
    first (longest key first); then the MIG rule; then `GPU_TABLE`; then the fallback.
    """
    if not isinstance(name, str):
        raise QuarryError(f"GPU name must be a string, got {name!r}")
    if not isinstance(memory_mib, int) or isinstance(memory_mib, bool) or memory_mib <= 0:
        raise QuarryError(f"GPU memory must be a positive number of MiB, got {memory_mib!r}")
    norm = _normalise(name)
    for key in sorted(overrides or {}, key=len, reverse=True):
        if key.lower() in name.lower():
            gpu = (overrides or {})[key]
            return GpuEstimate(gpu, True, f"gpu_speeds[{key!r}]: {gpu.name}")
    parent = next((c for rx, c in _RULES if rx.search(norm)), None)
    mig = _MIG.search(norm)
    if mig is not None or "mig" in norm.split():
        return _mig_estimate(name, norm, memory_mib, parent, mig)
    if parent is not None:
        if parent.name == "A100 80GB" and "80gb" not in norm and memory_mib <= 42 * 1024:
            parent = A100_40GB  # "NVIDIA A100" with 40 GiB registered
        return GpuEstimate(parent, True, f"table: {parent.name}")
    gib = memory_mib / 1024
    lo, hi = FALLBACK_BANDWIDTH_RANGE
    bw = min(max(gib * FALLBACK_BANDWIDTH_PER_GIB, lo), hi)
    flops = bw * REFERENCE.flops / REFERENCE.memory_bandwidth_bytes_per_s
    gpu = GpuClass(f"unknown ({name})", bw, flops, gib)
    return GpuEstimate(gpu, False,
                       f"unknown GPU {name!r}: estimated from its {gib:g} GiB as "
                       f"{bw / 1e9:.0f} GB/s and {flops / 1e12:.0f} TFLOP/s (A100's FLOP/byte)")


def _mig_estimate(name: str, norm: str, memory_mib: int, parent: GpuClass | None,
                  mig: re.Match[str] | None) -> GpuEstimate:
    """A MIG slice: g/7 of the parent's FLOPs, its memory share of the parent's bandwidth."""
    slices = int(mig.group(1)) if mig else None
    slice_gb = int(mig.group(2)) if mig else None
    if parent is None:
        parent = REFERENCE
    if parent.name.startswith("A100") and mig and (slices, slice_gb) in _A100_40GB_MIG:
        parent = A100_40GB
    mem_gib = slice_gb if slice_gb is not None else memory_mib / 1024
    mem_share = min(1.0, mem_gib / parent.memory_gib)
    compute_share = slices / 7 if slices is not None else mem_share
    gpu = GpuClass(f"{parent.name} MIG {slices or '?'}g.{slice_gb or '?'}gb",
                   parent.memory_bandwidth_bytes_per_s * mem_share,
                   parent.flops * compute_share, mem_gib)
    return GpuEstimate(gpu, True,
                       f"MIG slice of {parent.name}: {compute_share:.3g} of its FLOPs, "
                       f"{mem_share:.3g} of its bandwidth")


def estimate_block_times(gpu: GpuClass, model: ModelSpec, l_in: int) -> tuple[float, float]:
    """(prefill_s_per_block for an `l_in`-token prompt, decode_s_per_block) on one GPU."""
    if l_in < 0:
        raise QuarryError(f"l_in must be >= 0, got {l_in}")
    decode = model.bytes_per_layer / (BANDWIDTH_EFFICIENCY * gpu.memory_bandwidth_bytes_per_s)
    params = model.bytes_per_layer / (model.dtype_bytes or 2)
    prefill = max(2 * params * l_in / (PREFILL_MFU * gpu.flops), decode)
    return prefill, decode


# ------------------------------------------------------------------ latencies


@dataclass
class Latencies:
    """A measured-latency file: links per miner pair, and optionally regions and a default."""

    links: dict[tuple[str, str], Link] = field(default_factory=dict)
    default_link: Link | None = None
    regions: dict[str, str] = field(default_factory=dict)


def _checksum(value: Any, where: str) -> str:
    from eth_utils import is_hex_address, to_checksum_address

    if not isinstance(value, str) or not is_hex_address(value):
        raise QuarryError(f"{where}: {value!r} is not a miner address (0x + 40 hex digits)")
    return str(to_checksum_address(value))


def _number(value: Any, where: str, *, positive: bool) -> float:
    ok = (isinstance(value, int | float) and not isinstance(value, bool)
          and math.isfinite(value) and (value > 0 if positive else value >= 0))
    if not ok:
        raise QuarryError(f"{where} must be a number {'> 0' if positive else '>= 0'}, "
                          f"got {value!r}")
    return float(value)


def _link(entry: Any, where: str, bandwidth: float | None) -> Link:
    if not isinstance(entry, dict):
        raise QuarryError(f"{where} must be a table, got {entry!r}")
    if "rtt_s" not in entry:
        raise QuarryError(f"{where} has no rtt_s")
    bw = entry.get("bandwidth_bytes_per_s", bandwidth)
    if bw is None:
        raise QuarryError(f"{where} has no bandwidth_bytes_per_s (and the file no "
                          "default_link)")
    return Link(_number(entry["rtt_s"], f"{where} rtt_s", positive=False),
                _number(bw, f"{where} bandwidth_bytes_per_s", positive=True))


def load_latencies(path: str | Path) -> Latencies:
    """Read a measured-latency file (`.toml`, or `.json` with the same keys):

        default_link = { rtt_s = 0.02, bandwidth_bytes_per_s = 125e6 }   # optional
        [regions]                                                        # optional
        "0xf39F...2266" = "us-west"
        [[links]]
        a = "0xf39F...2266"
        b = "0x7099...79C8"
        rtt_s = 0.004
        bandwidth_bytes_per_s = 1.25e9   # optional when default_link is given
    """
    p = Path(path)
    try:
        text = p.read_text()
        data = json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
    except FileNotFoundError:
        raise QuarryError(f"latency file not found: {p}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise QuarryError(f"cannot read latency file {p}: {exc}") from exc
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise QuarryError(f"latency file {p} is not valid: {exc}") from exc
    if not isinstance(data, dict):
        raise QuarryError(f"latency file {p} must hold a table/object")
    unknown = sorted(set(data) - {"links", "default_link", "regions"})
    if unknown:
        raise QuarryError(f"latency file {p}: unknown key(s) {', '.join(unknown)}")
    out = Latencies()
    if "default_link" in data:
        out.default_link = _link(data["default_link"], f"{p}: default_link", None)
    regions = data.get("regions", {})
    if not isinstance(regions, dict):
        raise QuarryError(f"{p}: regions must be a table of address = region")
    for addr, region in regions.items():
        if not isinstance(region, str) or not region:
            raise QuarryError(f"{p}: region of {addr} must be a non-empty string")
        out.regions[_checksum(addr, f"{p}: regions")] = region
    links = data.get("links", [])
    if not isinstance(links, list):
        raise QuarryError(f"{p}: links must be a list of [[links]] tables")
    bw = out.default_link.bandwidth_bytes_per_s if out.default_link else None
    for i, entry in enumerate(links):
        where = f"{p}: links[{i}]"
        if not isinstance(entry, dict) or "a" not in entry or "b" not in entry:
            raise QuarryError(f"{where} needs a and b (miner addresses)")
        extra = sorted(set(entry) - {"a", "b", "rtt_s", "bandwidth_bytes_per_s"})
        if extra:
            raise QuarryError(f"{where}: unknown key(s) {', '.join(extra)}")
        a, b = _checksum(entry["a"], f"{where} a"), _checksum(entry["b"], f"{where} b")
        out.links[(a, b)] = _link(entry, where, bw)
    return out


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """(host, port) of a registered endpoint: a URL (`http://h:p/...`, default port by
    scheme) or a bare `host:port`."""
    if not isinstance(endpoint, str) or not endpoint.strip():
        raise QuarryError(f"endpoint {endpoint!r} is empty")
    text = endpoint.strip()
    parts = urlsplit(text if "://" in text else f"tcp://{text}")
    try:
        port = parts.port
    except ValueError as exc:
        raise QuarryError(f"endpoint {endpoint!r} has a bad port: {exc}") from None
    if port is None:
        port = {"http": 80, "ws": 80, "https": 443, "wss": 443}.get(parts.scheme)
    if not parts.hostname or port is None:
        raise QuarryError(f"endpoint {endpoint!r} names no host and port")
    return parts.hostname, port


def _connect_rtt(host: str, port: int, samples: int, timeout_s: float) -> float | None:
    """Median TCP connect time (one round trip each), or None when any connect fails."""
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                times.append(time.perf_counter() - t0)
        except OSError:
            return None
    return statistics.median(times)


def measure_rtts(endpoints: Mapping[str, str], *, samples: int = 3,
                 timeout_s: float = 1.0) -> dict[str, float | None]:
    """RTT from this machine to each `name -> endpoint` (None: unparseable or unreachable).

    This is client-to-miner RTT as seen from here, not the miners' RTT to each other."""
    if samples < 1:
        raise QuarryError(f"samples must be >= 1, got {samples}")

    def one(endpoint: str) -> float | None:
        try:
            host, port = parse_endpoint(endpoint)
        except QuarryError:
            return None
        return _connect_rtt(host, port, samples, timeout_s)

    names = list(endpoints)
    if not names:
        return {}
    with ThreadPoolExecutor(max_workers=min(16, len(names))) as pool:
        return dict(zip(names, pool.map(one, [endpoints[n] for n in names]), strict=True))


# ------------------------------------------------------------------ the registry


@dataclass(frozen=True)
class RegistryMiner:
    address: str  # checksummed
    info: MinerInfo
    models: tuple[bytes, ...]


def registry_miners(quarry: Quarry, model_id: bytes | None = None
                    ) -> tuple[list[RegistryMiner], dict[str, str]]:
    """Active miners (in registration order) and the skipped ones with the reason.

    Every address that ever emitted `MinerRegistered` since the deploy block is looked up
    with `minerInfo`/`modelsOf`: a withdrawn miner reads as not registered, an exiting one
    has `exitRequestedAt != 0`."""
    if model_id is not None and (not isinstance(model_id, bytes) or len(model_id) != 32):
        raise QuarryError(f"model id must be 32 bytes, got {model_id!r}")
    events = quarry.gpu.events("MinerRegistered", quarry.deployment.deploy_block)
    seen: list[str] = []
    for ev in events:
        if ev["miner"] not in seen:
            seen.append(ev["miner"])
    miners: list[RegistryMiner] = []
    skipped: dict[str, str] = {}
    for addr in seen:
        info = quarry.gpu.miner_info(addr)
        if not info.active:
            skipped[addr] = "withdrawn"
            continue
        if info.exit_requested_at:
            skipped[addr] = "exiting"
            continue
        models = tuple(quarry.gpu.models_of(addr))
        if model_id is not None and model_id not in models:
            skipped[addr] = f"does not serve model 0x{model_id.hex()}"
            continue
        miners.append(RegistryMiner(addr, info, models))
    return miners, skipped


@dataclass
class RegistryCluster:
    """The cluster plus what it was built from (for reports and the plan's JSON)."""

    cluster: Cluster
    miners: list[RegistryMiner]
    skipped: dict[str, str]
    estimates: dict[str, GpuEstimate]
    latency_source: str
    rtts: dict[str, float | None] = field(default_factory=dict)  # live measurement only
    warnings: list[str] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        """A JSON-ready summary, one entry per server."""
        servers = []
        for m, s in zip(self.miners, self.cluster.servers, strict=True):
            est = self.estimates[m.address]
            servers.append({
                "name": s.name, "gpu": m.info.gpu.name, "gpu_count": m.info.gpu.count,
                "gpu_memory_mib": m.info.gpu.memory_mi_b, "endpoint": m.info.endpoint,
                "memory_bytes": s.memory_bytes, "prefill_s_per_block": s.prefill_s_per_block,
                "decode_s_per_block": s.decode_s_per_block, "flops": s.flops,
                "region": s.region, "speed_basis": est.basis, "gpu_known": est.known,
                **({"rtt_s": self.rtts.get(s.name)} if self.rtts else {}),
            })
        return {"servers": servers, "skipped": self.skipped,
                "latencies": self.latency_source, "warnings": self.warnings}


def _emit(warn: Callable[[str], None] | None, sink: list[str], message: str) -> None:
    sink.append(message)
    if warn is None:
        warnings.warn(message, RegistryWarning, stacklevel=3)
    else:
        warn(message)


def build_registry_cluster(
    quarry: Quarry,
    model: ModelSpec,
    *,
    model_id: bytes | None = None,
    latencies: Mapping[tuple[str, str], Link] | None = None,
    default_link: Link | None = None,
    gpu_speeds: Mapping[str, GpuClass] | None = None,
    regions: Mapping[str, str] | None = None,
    l_in: int = 512,
    measure: bool = True,
    samples: int = 3,
    connect_timeout_s: float = 1.0,
    warn: Callable[[str], None] | None = None,
) -> RegistryCluster:
    """`cluster_from_registry` with its provenance: miners, skips, GPU estimates, RTTs.

    Warnings (unknown GPU, unreachable endpoint, latency entries for miners not in the
    cluster) go to `warn`, or to `warnings.warn(..., RegistryWarning)` when it is None."""
    miners, skipped = registry_miners(quarry, model_id)
    if not miners:
        what = f" serving model 0x{model_id.hex()}" if model_id is not None else ""
        raise QuarryError(f"GPURegistry {quarry.gpu.address} lists no active miners{what}"
                          + (f" ({len(skipped)} skipped: exited or other models)"
                             if skipped else ""))
    sink: list[str] = []
    region_of = {_checksum(k, "regions"): v for k, v in (regions or {}).items()}
    servers: list[Server] = []
    estimates: dict[str, GpuEstimate] = {}
    for m in miners:
        gpu = m.info.gpu
        est = estimate_gpu(gpu.name, int(gpu.memory_mi_b), gpu_speeds)
        if not est.known:
            _emit(warn, sink, f"miner {m.address}: {est.basis}")
        prefill, decode = estimate_block_times(est.gpu, model, l_in)
        estimates[m.address] = est
        servers.append(Server(
            name=m.address,
            memory_bytes=int(gpu.memory_mi_b) * int(gpu.count) * MIB,
            prefill_s_per_block=prefill,
            decode_s_per_block=decode,
            region=region_of.get(m.address, "default"),
            flops=est.gpu.flops * int(gpu.count),
        ))
    cluster = Cluster(servers=servers, model=model)
    if default_link is not None:
        cluster.default_link = default_link
    names = {s.name for s in servers}
    rtts: dict[str, float | None] = {}
    if latencies is not None:
        source = "given"
        for (a, b), lk in latencies.items():
            ca, cb = _checksum(a, "latencies"), _checksum(b, "latencies")
            missing = [x for x in (ca, cb) if x not in names]
            if missing:
                _emit(warn, sink, f"latency entry {ca}-{cb} ignored: {missing[0]} is not an "
                      "active miner in this cluster")
                continue
            cluster.links[(ca, cb)] = lk
    elif measure:
        source = ("measured: TCP connect RTT from this machine to each miner (client-to-"
                  "miner; miner pairs get the sum, an upper bound)")
        rtts = measure_rtts({m.address: m.info.endpoint for m in miners}, samples=samples,
                            timeout_s=connect_timeout_s)
        bw = cluster.default_link.bandwidth_bytes_per_s
        for m in miners:
            if rtts[m.address] is None:
                _emit(warn, sink, f"miner {m.address}: endpoint {m.info.endpoint!r} did not "
                      "accept a TCP connection; using the default link "
                      f"(rtt {cluster.default_link.rtt_s:g} s)")
        up = [m.address for m in miners if rtts[m.address] is not None]
        cluster.clients[LOCAL_CLIENT] = {a: Link(rtts[a] or 0.0, bw) for a in up}
        for i, a in enumerate(up):
            for b in up[i + 1:]:
                cluster.links[(a, b)] = Link((rtts[a] or 0.0) + (rtts[b] or 0.0), bw)
    else:
        source = "default link only (not measured)"
    return RegistryCluster(cluster, miners, skipped, estimates, source, rtts, sink)


def cluster_from_registry(quarry: Quarry, model: ModelSpec, **options: Any) -> Cluster:
    """One `Server` per active registered miner (see the module docstring for how memory,
    speeds and links are found): `build_registry_cluster(...).cluster`, with the same
    keyword options. Raises QuarryError when no miner qualifies."""
    return build_registry_cluster(quarry, model, **options).cluster


def cluster_to_dict(cluster: Cluster) -> dict[str, Any]:
    """The cluster-file shape `load_cluster` reads back (JSON-ready; infinite values none)."""

    def link(lk: Link) -> dict[str, float]:
        return {"rtt_s": lk.rtt_s, "bandwidth_bytes_per_s": lk.bandwidth_bytes_per_s}

    return {
        "default_link": link(cluster.default_link),
        "model": {k: getattr(cluster.model, k) for k in ModelSpec.__dataclass_fields__},
        "servers": [{k: getattr(s, k) for k in Server.__dataclass_fields__}
                    for s in cluster.servers],
        "links": [{"a": a, "b": b, **link(lk)} for (a, b), lk in cluster.links.items()],
        "region_links": [{"a": a, "b": b, **link(lk)}
                         for (a, b), lk in cluster.region_links.items()],
        "clients": [{"name": c, "links": {s: link(lk) for s, lk in per.items()}}
                    for c, per in cluster.clients.items()],
    }


def model_spec_from_file(path: str | Path) -> ModelSpec:
    """A ModelSpec from TOML/JSON: a `[model]` table (as in cluster files) or top-level keys
    (name, num_layers, bytes_per_layer, kv_bytes_per_token_per_layer, hidden_size,
    dtype_bytes)."""
    p = Path(path)
    try:
        text = p.read_text()
        data = json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
    except FileNotFoundError:
        raise QuarryError(f"model spec file not found: {p}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise QuarryError(f"cannot read model spec {p}: {exc}") from exc
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise QuarryError(f"model spec {p} is not valid: {exc}") from exc
    table = data.get("model", data) if isinstance(data, dict) else None
    if not isinstance(table, dict):
        raise QuarryError(f"model spec {p} must hold a [model] table")
    try:
        return ModelSpec(**table)
    except TypeError as exc:
        raise QuarryError(f"model spec {p} is invalid: {exc}") from exc


__all__: Sequence[str] = (
    "BANDWIDTH_EFFICIENCY", "FALLBACK_BANDWIDTH_PER_GIB", "GPU_TABLE", "LOCAL_CLIENT",
    "PREFILL_MFU", "REFERENCE", "GpuClass", "GpuEstimate", "Latencies", "RegistryCluster",
    "RegistryMiner", "RegistryWarning", "build_registry_cluster", "cluster_from_registry",
    "cluster_to_dict", "estimate_block_times", "estimate_gpu", "load_latencies",
    "measure_rtts", "model_spec_from_file", "parse_endpoint",
)
