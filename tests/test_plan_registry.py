"""`market plan --registry`: the cluster built from GPURegistry on a real Anvil, the GPU
speed table and its fallback, latency files, live TCP timing and the CLI end to end."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from market.errors import QuarryError
from market.scheduler.cluster import Link, ModelSpec, load_cluster
from market.scheduler.registry import (
    FALLBACK_BANDWIDTH_PER_GIB,
    LOCAL_CLIENT,
    MIB,
    REFERENCE,
    GpuClass,
    RegistryWarning,
    build_registry_cluster,
    cluster_from_registry,
    estimate_block_times,
    estimate_gpu,
    load_latencies,
    measure_rtts,
    parse_endpoint,
)

ROOT = Path(__file__).resolve().parents[1]
PLAN_MODEL_ID = bytes.fromhex("33" * 32)  # served only by this file's three miners
MODEL = ModelSpec("test-model", num_layers=24, bytes_per_layer=500_000_000,
                  kv_bytes_per_token_per_layer=4096, hidden_size=4096)
# (GPU name, MiB per GPU, count): three classes of very different speed.
GPUS = [("NVIDIA H100 80GB HBM3", 81559, 1), ("NVIDIA GeForce RTX 4090", 24564, 2),
        ("NVIDIA A100-SXM4-80GB MIG 1g.10gb", 9728, 1)]

pytestmark = pytest.mark.timeout(120)


# ------------------------------------------------------------------ GPU table (pure)


@pytest.mark.parametrize("name, mib, expected", [
    ("NVIDIA H100", 81920, "H100 SXM"),
    ("NVIDIA H100 80GB HBM3", 81559, "H100 SXM"),
    ("NVIDIA H100 PCIe", 81559, "H100 PCIe"),
    ("NVIDIA H100 NVL", 95830, "H100 NVL"),
    ("NVIDIA H200", 143771, "H200 SXM"),
    ("NVIDIA GH200 480GB", 97871, "GH200"),
    ("NVIDIA A100-SXM4-80GB", 81920, "A100 80GB"),
    ("NVIDIA A100-SXM4-40GB", 40960, "A100 40GB"),
    ("NVIDIA A100", 40960, "A100 40GB"),  # no size in the name: the registered memory says
    ("NVIDIA L40S", 46068, "L40S"),
    ("NVIDIA L40", 46068, "L40"),
    ("NVIDIA L4", 23034, "L4"),
    ("NVIDIA GeForce RTX 4090", 24564, "RTX 4090"),
    ("RTX5090", 32607, "RTX 5090"),
    ("Tesla T4", 15360, "T4"),
])
def test_known_gpu_names(name, mib, expected):
    est = estimate_gpu(name, mib)
    assert est.known and est.gpu.name == expected, est.basis


def test_gpu_table_orders_classes_sensibly():
    def gpu(name: str, mib: int = 81920) -> GpuClass:
        return estimate_gpu(name, mib).gpu

    bw = [gpu(n).memory_bandwidth_bytes_per_s
          for n in ("NVIDIA L4", "NVIDIA L40S", "RTX 4090", "RTX 5090", "NVIDIA A100-SXM4-80GB",
                    "NVIDIA H100", "NVIDIA H200")]
    assert bw == sorted(bw) and len(set(bw)) == len(bw)
    h100 = gpu("NVIDIA H100")
    assert h100.relative_to(REFERENCE) == pytest.approx((3.35 / 2.039, 989 / 312))


def test_mig_slices_take_their_share_of_the_parent():
    a100 = estimate_gpu("NVIDIA A100-SXM4-80GB", 81920).gpu
    one = estimate_gpu("NVIDIA A100-SXM4-80GB MIG 1g.10gb", 9728)
    assert one.known and "MIG" in one.basis
    assert one.gpu.memory_bandwidth_bytes_per_s == pytest.approx(
        a100.memory_bandwidth_bytes_per_s / 8)
    assert one.gpu.flops == pytest.approx(a100.flops / 7)
    three = estimate_gpu("NVIDIA H100 80GB HBM3 MIG 3g.40gb", 40448).gpu
    h100 = estimate_gpu("NVIDIA H100", 81920).gpu
    assert three.flops == pytest.approx(h100.flops * 3 / 7)
    assert three.memory_bandwidth_bytes_per_s == pytest.approx(
        h100.memory_bandwidth_bytes_per_s / 2)
    # A100-40GB's profile names its parent; an unnamed parent is an A100-80GB.
    small = estimate_gpu("MIG 1g.5gb", 4864).gpu
    assert small.memory_bandwidth_bytes_per_s == pytest.approx(1.555e12 / 8)
    bare = estimate_gpu("MIG 2g.20gb", 19968).gpu
    assert bare.memory_bandwidth_bytes_per_s == pytest.approx(2.039e12 / 4)


def test_unknown_gpu_falls_back_to_its_memory_size():
    est = estimate_gpu("Acme Tensor X1", 24 * 1024)
    assert not est.known
    assert "unknown GPU 'Acme Tensor X1'" in est.basis and "24 GiB" in est.basis
    assert est.gpu.memory_bandwidth_bytes_per_s == pytest.approx(24 * FALLBACK_BANDWIDTH_PER_GIB)
    ratio = REFERENCE.flops / REFERENCE.memory_bandwidth_bytes_per_s
    assert est.gpu.flops == pytest.approx(est.gpu.memory_bandwidth_bytes_per_s * ratio)
    # More memory, more bandwidth, within the clamp.
    sizes = [1, 8, 24, 80, 192, 100_000]
    bws = [estimate_gpu("Acme", g * 1024).gpu.memory_bandwidth_bytes_per_s for g in sizes]
    assert bws == sorted(bws)
    assert bws[0] == 100e9 and bws[-1] == 5e12
    # The median ratio over the table is a plausible GB/s per GiB.
    assert 15e9 < FALLBACK_BANDWIDTH_PER_GIB < 60e9


def test_gpu_speeds_override_the_table_and_bad_input_is_named():
    mine = GpuClass("A10G", 600e9, 70e12, 24)
    est = estimate_gpu("NVIDIA A10G", 23028, {"a10g": mine})
    assert est.known and est.gpu is mine and "a10g" in est.basis
    assert not estimate_gpu("NVIDIA A10G", 23028).known
    with pytest.raises(QuarryError, match="memory"):
        estimate_gpu("NVIDIA H100", 0)


def test_block_times_follow_the_roofline():
    h100 = estimate_gpu("NVIDIA H100", 81920).gpu
    prefill, decode = estimate_block_times(h100, MODEL, l_in=512)
    assert decode == pytest.approx(MODEL.bytes_per_layer / 3.35e12)
    params = MODEL.bytes_per_layer / MODEL.dtype_bytes
    assert prefill == pytest.approx(2 * params * 512 / (0.5 * 989e12))
    assert estimate_block_times(h100, MODEL, l_in=0) == (decode, decode)
    # The example cluster's RTX 5090 figures come out of the table.
    small = load_cluster(ROOT / "examples/clusters/small.toml")
    s = small.server("us-5090-a")
    p5090, d5090 = estimate_block_times(estimate_gpu("RTX 5090", 32607).gpu, small.model, 512)
    assert d5090 == pytest.approx(s.decode_s_per_block, rel=0.01)
    assert p5090 == pytest.approx(s.prefill_s_per_block, rel=0.01)


# ------------------------------------------------------------------ latencies (pure)


def test_parse_endpoint():
    assert parse_endpoint("http://127.0.0.1:9100") == ("127.0.0.1", 9100)
    assert parse_endpoint("https://miner.example.org/v1") == ("miner.example.org", 443)
    assert parse_endpoint("10.0.0.2:7000") == ("10.0.0.2", 7000)
    assert parse_endpoint("tcp://[::1]:5555") == ("::1", 5555)
    for bad in ("", "http://", "ftp://host", "host:notaport"):
        with pytest.raises(QuarryError, match="endpoint"):
            parse_endpoint(bad)


A = "0x" + "aa" * 20
B = "0x" + "bb" * 20


def test_latency_files_toml_and_json(tmp_path):
    toml = tmp_path / "lat.toml"
    toml.write_text(f'default_link = {{ rtt_s = 0.02, bandwidth_bytes_per_s = 1e8 }}\n'
                    f'[regions]\n"{A}" = "eu"\n'
                    f'[[links]]\na = "{A}"\nb = "{B}"\nrtt_s = 0.004\n')
    lat = load_latencies(toml)
    (pair, link), = lat.links.items()
    assert {p.lower() for p in pair} == {A, B} and link == Link(0.004, 1e8)
    assert lat.default_link == Link(0.02, 1e8)
    assert list(lat.regions.values()) == ["eu"]
    js = tmp_path / "lat.json"
    js.write_text(json.dumps({"links": [{"a": A, "b": B, "rtt_s": 0.001,
                                         "bandwidth_bytes_per_s": 1.25e9}]}))
    assert list(load_latencies(js).links.values()) == [Link(0.001, 1.25e9)]
    bad = {
        "neg.json": ({"links": [{"a": A, "b": B, "rtt_s": -1, "bandwidth_bytes_per_s": 1}]},
                     "rtt_s"),
        "nobw.json": ({"links": [{"a": A, "b": B, "rtt_s": 0.1}]}, "bandwidth_bytes_per_s"),
        "addr.json": ({"links": [{"a": "miner-1", "b": B, "rtt_s": 0.1,
                                  "bandwidth_bytes_per_s": 1}]}, "not a miner address"),
        "key.json": ({"link": []}, "unknown key"),
    }
    for name, (data, needle) in bad.items():
        (tmp_path / name).write_text(json.dumps(data))
        with pytest.raises(QuarryError, match=needle):
            load_latencies(tmp_path / name)
    with pytest.raises(QuarryError, match="not found"):
        load_latencies(tmp_path / "missing.toml")


@pytest.fixture
def listener() -> Iterator[str]:
    """A local TCP port that accepts connections (the kernel completes the handshake)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        srv.close()


@pytest.fixture
def closed_endpoint() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: connects are refused
    return f"http://127.0.0.1:{port}"


def test_measure_rtts(listener, closed_endpoint):
    rtts = measure_rtts({"up": listener, "down": closed_endpoint, "bad": "http://"},
                        samples=3, timeout_s=1.0)
    assert rtts["up"] is not None and 0 < rtts["up"] < 1.0
    assert rtts["down"] is None and rtts["bad"] is None


# ------------------------------------------------------------------ against Anvil


def register_three(devnet, endpoints: list[str]) -> list[str]:
    """Register three fresh funded accounts with GPUS; returns their addresses."""
    from market.chain.client import anvil_account
    from market.chain.contracts import GpuSpec

    addrs = []
    for i, ((name, mib, count), endpoint) in enumerate(zip(GPUS, endpoints, strict=True)):
        acct = anvil_account(13 + i)
        devnet.q.gpu.register(acct, [PLAN_MODEL_ID], GpuSpec(name, mib, count), endpoint,
                              devnet.PRICE, devnet.MINER_STAKE)
        addrs.append(acct.address)
    return addrs


@pytest.mark.chain
def test_cluster_from_registry_measured_live(devnet, listener, closed_endpoint):
    addrs = register_three(devnet, [listener, listener, closed_endpoint])
    seen: list[str] = []
    built = build_registry_cluster(devnet.q, MODEL, model_id=PLAN_MODEL_ID, l_in=256,
                                   warn=seen.append)
    cluster = built.cluster
    assert [s.name for s in cluster.servers] == addrs
    for s, (_, mib, count) in zip(cluster.servers, GPUS, strict=True):
        assert s.memory_bytes == mib * count * MIB
    h100, rtx, mig = cluster.servers
    assert h100.decode_s_per_block == pytest.approx(MODEL.bytes_per_layer / 3.35e12)
    assert rtx.decode_s_per_block == pytest.approx(MODEL.bytes_per_layer / 1.008e12)
    assert h100.decode_s_per_block < rtx.decode_s_per_block < mig.decode_s_per_block
    assert h100.prefill_s_per_block < rtx.prefill_s_per_block < mig.prefill_s_per_block
    assert rtx.flops == pytest.approx(2 * 165.2e12)  # two GPUs
    # Live timing: two reachable miners, one refused (warned, default link).
    assert built.rtts[addrs[0]] > 0 and built.rtts[addrs[1]] > 0
    assert built.rtts[addrs[2]] is None
    assert len(seen) == 1 and addrs[2] in seen[0] and "default link" in seen[0]
    assert set(cluster.clients[LOCAL_CLIENT]) == set(addrs[:2])
    assert cluster.link(addrs[0], addrs[1]).rtt_s == pytest.approx(
        built.rtts[addrs[0]] + built.rtts[addrs[1]])
    assert cluster.link(addrs[0], addrs[2]) == cluster.default_link
    # The fixture's two H100 miners serve another model: left out, with the reason.
    assert len(built.skipped) == 2 and all("does not serve" in r for r in built.skipped.values())


@pytest.mark.chain
def test_cluster_from_registry_with_given_latencies(devnet, closed_endpoint):
    addrs = register_three(devnet, [closed_endpoint] * 3)
    fast, slow = Link(0.001, 1.25e9), Link(0.05, 1e7)
    default = Link(0.02, 5e7)
    lat = {(addrs[0].lower(), addrs[1]): fast, (addrs[1], addrs[2]): slow,
           (addrs[0], "0x" + "cd" * 20): fast}  # the last names no miner: ignored, warned
    with pytest.warns(RegistryWarning, match="not an active miner"):
        cluster = cluster_from_registry(devnet.q, MODEL, model_id=PLAN_MODEL_ID,
                                        latencies=lat, default_link=default,
                                        regions={addrs[2]: "eu"})
    assert cluster.link(addrs[1], addrs[0]) == fast
    assert cluster.link(addrs[2], addrs[1]) == slow
    assert cluster.link(addrs[0], addrs[2]) == default
    assert [s.region for s in cluster.servers] == ["default", "default", "eu"]
    assert not cluster.clients  # nothing measured


@pytest.mark.chain
def test_exited_and_withdrawn_miners_are_skipped(devnet, closed_endpoint):
    from market.chain.client import anvil_account

    addrs = register_three(devnet, [closed_endpoint] * 3)
    devnet.q.gpu.request_exit(anvil_account(13))
    devnet.q.gpu.request_exit(anvil_account(14))
    devnet.chain.advance_time(devnet.deployment.params["miner_unbonding_period"] + 1)
    devnet.q.gpu.withdraw_stake(anvil_account(14))
    built = build_registry_cluster(devnet.q, MODEL, measure=False)  # every model
    names = [s.name for s in built.cluster.servers]
    assert names == [devnet.miner.address, devnet.miner2.address, addrs[2]]
    assert built.skipped == {addrs[0]: "exiting", addrs[1]: "withdrawn"}
    with pytest.raises(QuarryError, match="no active miners serving model 0x4444"):
        cluster_from_registry(devnet.q, MODEL, model_id=bytes.fromhex("44" * 32),
                              measure=False)


def plan(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "market.cli", "plan", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


MODEL_FLAGS = ["--layers", "24", "--layer-bytes", "500000000", "--kv-bytes-per-token", "4096",
               "--hidden", "4096"]


@pytest.mark.chain
def test_market_plan_registry_cli(devnet, deployment_file, tmp_path, listener):
    addrs = register_three(devnet, [listener] * 3)
    lat = tmp_path / "lat.toml"
    lat.write_text("".join(f'[[links]]\na = "{a}"\nb = "{b}"\nrtt_s = {r}\n'
                           f"bandwidth_bytes_per_s = 1.25e9\n"
                           for a, b, r in [(addrs[0], addrs[1], 0.002),
                                           (addrs[1], addrs[2], 0.003),
                                           (addrs[0], addrs[2], 0.004)]))
    out, saved = tmp_path / "plan.json", tmp_path / "cluster.json"
    res = plan("--registry", *MODEL_FLAGS, "--model-id", "0x" + PLAN_MODEL_ID.hex(),
               "--latencies", str(lat), "--out", str(out), "--save-cluster", str(saved))
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
    assert "registry: 3 miners" in res.stdout and "expected per-token time" in res.stdout
    doc = json.loads(out.read_text())
    held: set[int] = set()
    for name, (a, b) in doc["ranges"].items():
        assert name in addrs and 0 <= a <= b <= 24
        held.update(range(a, b))
    assert held == set(range(24))
    for pipe in doc["pipelines"]:
        cursor = 0
        for name in pipe:
            assert doc["ranges"][name][0] == cursor
            cursor = doc["ranges"][name][1]
        assert cursor == 24
    reg = doc["registry"]
    assert reg["model_id"] == "0x" + PLAN_MODEL_ID.hex()
    assert [s["name"] for s in reg["servers"]] == addrs
    assert [s["gpu"] for s in reg["servers"]] == [g[0] for g in GPUS]
    assert reg["latencies"] == "given"
    # The saved cluster plans again without the chain, to the same placement.
    assert load_cluster(saved).link(addrs[0], addrs[2]) == Link(0.004, 1.25e9)
    out2 = tmp_path / "plan2.json"
    res = plan(str(saved), "--out", str(out2))
    assert res.returncode == 0, res.stderr
    assert json.loads(out2.read_text())["ranges"] == doc["ranges"]
    # Live measurement (the default): every miner answers on the listener.
    res = plan("--registry", *MODEL_FLAGS, "--model-id", "0x" + PLAN_MODEL_ID.hex(),
               "--client", LOCAL_CLIENT, "--out", str(out))
    assert res.returncode == 0, res.stderr
    live = json.loads(out.read_text())["registry"]
    assert live["latencies"].startswith("measured")
    assert all(s["rtt_s"] > 0 for s in live["servers"])
    # A model spec file works like the flags.
    spec = tmp_path / "model.toml"
    spec.write_text('[model]\nname = "m"\nnum_layers = 24\nbytes_per_layer = 500000000\n'
                    "kv_bytes_per_token_per_layer = 4096\n")
    res = plan("--registry", "--model-spec", str(spec), "--no-measure", "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert len(json.loads(out.read_text())["registry"]["servers"]) == 5  # + fixture miners


@pytest.mark.chain
def test_market_plan_registry_without_miners_fails_in_one_line(devnet, tmp_path):
    from market.chain.deploy import deploy

    empty, _ = deploy(devnet.chain, devnet.deployer)  # fresh contracts, nobody registered
    path = empty.save(tmp_path / "deployment.json")
    res = plan("--registry", *MODEL_FLAGS, "--deployment", str(path), "--no-measure")
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("market: error:") and "no active miners" in lines[0]


@pytest.mark.parametrize("args, needle", [
    ([], "give a cluster file or --registry"),
    (["examples/clusters/small.toml", "--registry", *MODEL_FLAGS], "not both"),
    (["examples/clusters/small.toml", "--model-id", "0x00"], "--model-id only apply"),
    (["--registry"], "--registry needs the model"),
    (["--registry", "--layers", "4"], "missing --layer-bytes"),
    (["--registry", "--model-spec", "m.toml", "--layers", "4"], "not both"),
    (["--registry", *MODEL_FLAGS, "--model-id", "0x1234"], "64 hex digits"),
    (["--registry", *MODEL_FLAGS, "--latencies", "x.toml", "--no-measure"], "not both"),
    (["--registry", *MODEL_FLAGS, "--deployment", "/nonexistent/deployment.json"],
     "no deployment file"),
])
def test_bad_registry_flags_fail_in_one_line(args, needle):
    res = plan(*args)
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("market: error:") and needle in lines[0], lines[0]
