"""What do strangers' requests cost the market (and the client's gateway)?

A private stack (redis-server, Anvil with the contracts, `market serve`; no worker, so
nothing else reads the chain) whose market reaches the chain through a counting JSON-RPC
front, and a `client gateway` process. For each kind of request anyone can send, 8 client
threads send it as fast as they are answered for `--seconds` (ignoring any Retry-After, as
a hostile caller would), while another client, a process of its own, reads `GET /jobs`
(for uploads: the gateway's `GET /v1/batches`) in a loop. Measured: the requests answered
and refused (429) a second, the server's CPU time per request and per second (during the
burst, and while idle), the JSON-RPC calls per request, and that other client's median read
time against the same read on the idle server, just before and just after the burst (the
machine's load drifts). The kinds (`--kinds`): `/ui`, `/ui/tx/{random hash}`, `/metrics`
(after `--uploads` small store uploads), swarm joins of a registered miner for a manifest
declaring 300,000 layers, and gateway uploads of `--upload-mib` MiB. Target: every median
within 1.5x of idle.

Prints one JSON object as the last line of stdout; `--smoke` runs tiny sizes in seconds.
Any exception ends it with a non-zero status.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from conftest import RpcFront  # noqa: E402

from market.chain.client import anvil_account  # noqa: E402
from market.chain.contracts import GpuSpec  # noqa: E402
from market.chain.deployment import Deployment  # noqa: E402
from market.chain.devnet import free_port  # noqa: E402
from market.local.processes import ManagedProcess, spawn  # noqa: E402
from market.local.stack import LocalStack  # noqa: E402
from market.marketapi import MarketAPI  # noqa: E402
from market.model.create import llama_config  # noqa: E402
from market.protocol.messages import swarm_join  # noqa: E402

TARGET = 1.5
KINDS = ("ui", "ui_tx", "metrics", "swarm_join", "gateway_upload")
CONCURRENCY = 8
TOKEN = "hostile-cost-token"
TICK_S = os.sysconf("SC_CLK_TCK")
SETTLE_S = 1.5
"""Pause before idle reads: what a burst left (held answers) is done by then."""


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK_S


def load_average() -> list[float]:
    """The machine's load over 1, 5 and 15 minutes (other processes share it)."""
    return [round(x, 2) for x in os.getloadavg()]


READER = """
import json, sys, threading, time
import httpx
url, headers, count = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
times = []
with httpx.Client(timeout=60, headers=headers) as c:
    print("ready", flush=True)
    while len(times) < count if count else not stop.is_set() or len(times) < 5:
        began = time.perf_counter()
        c.get(url).raise_for_status()
        times.append(time.perf_counter() - began)
        time.sleep(0.02)
print(json.dumps(times), flush=True)
"""


class Reader:
    """The other client, in a process of its own (so its reads wait for the server, not for
    the senders' share of this process): `GET url` one at a time, `count` reads, or
    (count 0) until `times()` stops it."""

    def __init__(self, url: str, headers: dict[str, str], count: int = 0) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", READER, url, json.dumps(headers),
                                      str(count)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the reader of {url} did not start")

    def times(self) -> list[float]:
        """Seconds of each read (stops a reader without a count)."""
        out, _ = self.proc.communicate("stop\n", timeout=300)
        if self.proc.returncode != 0:
            raise RuntimeError(f"the reader failed (exit {self.proc.returncode})")
        return [float(t) for t in json.loads(out.strip().splitlines()[-1])]


def idle_reads_of(url: str, reads: int, headers: dict[str, str], pid: int
                  ) -> tuple[list[float], float, float]:
    """`reads` timed reads of `url` on the idle server, after `SETTLE_S`; with the server's
    CPU seconds and the wall seconds they took."""
    time.sleep(SETTLE_S)  # held 429s of a burst are sent by then
    reader = Reader(url, headers, reads)
    cpu0, began = cpu_s(pid), time.monotonic()
    times = reader.times()
    return times, cpu_s(pid) - cpu0, time.monotonic() - began


def burst(send: Callable[[httpx.Client, int], int], seconds: float, pid: int,
          front: RpcFront, observed: str, idle_reads: int,
          headers: dict[str, str] | None = None) -> dict[str, Any]:
    """`CONCURRENCY` threads calling `send(client, i)` (which returns the status) for
    `seconds`, while one client reads `observed`, against the same read idle just before
    and just after (the machine's load drifts); the server's cost per request."""
    idle_before = idle_reads_of(observed, idle_reads, headers or {}, pid)
    stop, lock = threading.Event(), threading.Lock()
    statuses: dict[int, int] = {}
    errors: list[BaseException] = []

    clients = [httpx.Client(timeout=120) for _ in range(CONCURRENCY)]  # made before timing

    def sender(k: int) -> None:
        i = k
        try:
            while not stop.is_set():
                status = send(clients[k], i)
                with lock:
                    statuses[status] = statuses.get(status, 0) + 1
                i += CONCURRENCY
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            errors.append(exc)

    reader = Reader(observed, headers or {})
    cpu0, rpc0 = cpu_s(pid), front.singles + len(front.batches)
    threads = [threading.Thread(target=sender, args=(k,)) for k in range(CONCURRENCY)]
    began = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    observer_times = reader.times()
    for t in threads:
        t.join()
    for c in clients:
        c.close()
    if errors:
        raise errors[0]
    wall = time.monotonic() - began
    cpu = cpu_s(pid) - cpu0
    idle_after = idle_reads_of(observed, idle_reads, headers or {}, pid)
    idle = statistics.median(idle_before[0] + idle_after[0])
    idle_cpu_share = (idle_before[1] + idle_after[1]) / (idle_before[2] + idle_after[2])
    n = sum(statuses.values())
    refused = statuses.get(429, 0)
    p50 = statistics.median(observer_times)
    return {"requests": n, "per_s": round(n / wall, 1),
            "answered_per_s": round((n - refused) / wall, 1),
            "refused_per_s": round(refused / wall, 1), "statuses": statuses,
            "cpu_ms_per_request": round(1000 * cpu / max(n, 1), 3),
            "cpu_share": round(cpu / wall, 3), "idle_cpu_share": round(idle_cpu_share, 3),
            "rpc_per_request": round((front.singles + len(front.batches) - rpc0)
                                     / max(n, 1), 3),
            "other_p50_ms": round(1000 * p50, 2), "idle_p50_ms": round(1000 * idle, 2),
            "p50_ratio": round(p50 / idle, 2)}


def start_gateway(stack: LocalStack, home: Path) -> tuple[ManagedProcess, str]:
    port = free_port()
    env = {**os.environ, "QUARRY_HOME": str(home),
           "QUARRY_CLIENT_KEY": "0x" + bytes(anvil_account(1).key).hex(),
           "QUARRY_CLIENT_MARKET_URL": stack.market_url,
           "QUARRY_CLIENT_GATEWAY_TOKEN": TOKEN}
    proc = spawn([str(Path(sys.executable).parent / "client"), "gateway", "--port", str(port)],
                 name="client gateway", env=env, log_path=stack.logs / "gateway.log")
    proc.wait_port(port, timeout=60)
    return proc, f"http://127.0.0.1:{port}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per kind of request")
    parser.add_argument("--uploads", type=int, default=3000,
                        help="small store uploads before the /metrics burst")
    parser.add_argument("--upload-mib", type=float, default=4.0,
                        help="each gateway upload's size")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help=f"which of {','.join(KINDS)} (default all)")
    args = parser.parse_args()
    kinds = [k for k in KINDS if k in args.kinds.split(",")]
    if args.smoke:
        args.seconds, args.uploads, args.upload_mib = 0.5, 20, 0.1
    idle_reads = 10 if args.smoke else 60

    with tempfile.TemporaryDirectory(prefix="hostile-cost-") as tmp, \
            LocalStack(home=Path(tmp), workers=0) as stack:
        front = RpcFront(stack.rpc_url, refuse_batches=False)
        d = Deployment.load(stack.settings.deployment)
        Deployment(d.chain_id, front.url, dict(d.addresses), d.deploy_block, d.deployer,
                   dict(d.params)).save(stack.settings.deployment)  # the market follows it
        assert stack.market is not None
        market, pid = stack.market_url, stack.market.pid
        jobs = f"{market}/jobs"
        out: dict[str, Any] = {"load_average": {"start": load_average()}}

        if "ui" in kinds:
            out["ui"] = burst(lambda c, i: c.get(f"{market}/ui?refresh=0").status_code,
                              args.seconds, pid, front, jobs, idle_reads)
        if "ui_tx" in kinds:
            out["ui_tx"] = burst(
                lambda c, i: c.get(f"{market}/ui/tx/0x{i:064x}").status_code,
                args.seconds, pid, front, jobs, idle_reads)
        if "metrics" in kinds:
            with httpx.Client(timeout=30) as c:
                for i in range(args.uploads):
                    c.post(f"{market}/store", content=b"%d" % i).raise_for_status()
            out["metrics"] = burst(lambda c, i: c.get(f"{market}/metrics").status_code,
                                   args.seconds, pid, front, jobs, idle_reads)
            out["metrics"]["store_files"] = args.uploads
        if "swarm_join" in kinds:
            out["swarm_join"] = swarm_joins(stack, front, args.seconds, idle_reads)
        if "gateway_upload" in kinds:
            out["gateway_upload"] = gateway_uploads(stack, Path(tmp) / "gateway-home",
                                                    front, args, idle_reads)
        front.close()

    for kind in kinds:
        if set(out[kind]["statuses"]) - {200, 404, 409, 429}:
            raise SystemExit(f"{kind}: unexpected statuses {out[kind]['statuses']}")
    out["worst_p50_ratio"] = max(out[k]["p50_ratio"] for k in kinds)
    out["target_p50_ratio"] = TARGET
    out["met"] = out["worst_p50_ratio"] <= TARGET
    out["smoke"] = args.smoke
    out["load_average"]["end"] = load_average()
    print(json.dumps(out))
    return 0


def swarm_joins(stack: LocalStack, front: RpcFront, seconds: float,
                idle_reads: int) -> dict[str, Any]:
    """Joins signed by one registered miner (100 bodies, prices a wei apart) for a
    manifest declaring 300,000 layers."""
    market = stack.market_url
    assert stack.market is not None
    arch = llama_config(layers=8, hidden=64, vocab_size=300, heads=2, kv_heads=1,
                        intermediate=192, max_positions=256)
    manifest = {"format": "quarry-manifest/1", "name": "hostile-huge",
                "architecture": {**arch, "num_hidden_layers": 300_000},
                "files": {"model.safetensors": "ab" * 32}}
    with MarketAPI(market) as api:
        model_id = api.register_model(manifest)
    member = anvil_account(12)
    stack.quarry.gpu.register(member, [bytes.fromhex(model_id[2:])],
                              GpuSpec("H100", 81920, 1), "http://127.0.0.1:1", 10**9, 10**18)
    # Distinct bodies by price, all stamped now: stamps spread over the market's 60 s skew
    # window went stale on a busy machine before the burst began (400s, not the limiter's).
    now = int(time.time())
    joins = [swarm_join(member, model_id, timestamp=now, memory_mib=1 << 24,
                        tflops=1000.0, endpoint="tcp://127.0.0.1:9500",
                        public_key="9" * 40, price_per_token=10**9 + k)
             for k in range(100)]
    out = burst(lambda c, i: c.post(f"{market}/swarms/{model_id}/members",
                                    json=joins[i % len(joins)]).status_code,
                seconds, stack.market.pid, front, f"{market}/jobs", idle_reads)
    out["declared_layers"] = 300_000
    return out


def gateway_uploads(stack: LocalStack, home: Path, front: RpcFront, args: argparse.Namespace,
                    idle_reads: int) -> dict[str, Any]:
    """Uploads of `--upload-mib` MiB to a `client gateway`, each deleted once answered;
    the other client reads `GET /v1/batches`."""
    gateway, gw_url = start_gateway(stack, home)
    try:
        auth = {"authorization": f"Bearer {TOKEN}"}
        data = b'{"custom_id": "x"}\n' * int(args.upload_mib * (1 << 20) / 19)

        def upload(c: httpx.Client, i: int) -> int:
            files = {"file": ("in.jsonl", io.BytesIO(data))}
            r = c.post(f"{gw_url}/v1/files", files=files, data={"purpose": "batch"},
                       headers=auth)
            if r.status_code == 200:
                c.delete(f"{gw_url}/v1/files/{r.json()['id']}", headers=auth)
            return r.status_code

        out = burst(upload, args.seconds, gateway.pid, front, f"{gw_url}/v1/batches",
                    idle_reads, auth)
        out["upload_bytes"] = len(data)
        return out
    finally:
        gateway.stop()


if __name__ == "__main__":
    sys.exit(main())
