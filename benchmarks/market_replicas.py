"""What does the PostgreSQL board cost one `market serve`, and what do two replicas give?

One private stack (Redis, Anvil with the contracts, one registered miner, a few open tasks)
and three boards indexed from it: a SQLite file and a PostgreSQL database (a private
server, durable: fsync on, commits asynchronous like the SQLite board's WAL with
synchronous=NORMAL). Then the same load, `--clients` threads each looping over the mix a
market sees most (a store read, an open-shard long poll that finds shards, a signed
heartbeat, a job read, all through `MarketAPI` as miners and clients send them) for
`--seconds` in all (in `--rounds` that alternate the configurations, after a warm-up
round), against:

- `sqlite_1`: one replica on the SQLite board;
- `postgres_1`: one replica on PostgreSQL;
- `postgres_2`: two replicas on the same PostgreSQL database, the clients spread over both.

Each prints requests/s, p50 and p99 latency (ms). The headline is
`postgres_vs_sqlite_throughput` (postgres_1 over sqlite_1; target at least 0.8) and
`two_vs_one_replica_throughput` (postgres_2 over postgres_1). On a 2-core machine the load
generator, both replicas and PostgreSQL share the same cores, so the second ratio shows
contention, not scaling: see `cores` in the output.

Prints progress on stderr and one JSON object as the last line of stdout (also written to
benchmarks/out/market_replicas.json).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "out" / "market_replicas.json"
TARGET_RATIO = 0.8
MODEL_ID = bytes.fromhex("55" * 32)


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def load(urls: list[str], *, clients: int, seconds: float, uri: str, task_id: int,
         miner: Any) -> tuple[float, list[float]]:
    """`clients` threads, client k on `urls[k % len(urls)]`, each looping over the mix for
    `seconds`; the time it took and every request's latency (s)."""
    from market.marketapi import MarketAPI

    model = "0x" + MODEL_ID.hex()
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors: list[BaseException] = []
    start = threading.Barrier(clients + 1)
    stop_at = [0.0]

    def client(k: int) -> None:
        api = MarketAPI(urls[k % len(urls)], timeout=30)
        calls = (lambda: api.get(uri),
                 lambda: api.open_shards(model, miner.address, wait_seconds=1),
                 lambda: api.heartbeat(miner, {"load": k}),
                 lambda: api.job(task_id))
        mine = latencies[k]
        try:
            start.wait()
            i = k
            while time.perf_counter() < stop_at[0]:
                t = time.perf_counter()
                calls[i % len(calls)]()
                mine.append(time.perf_counter() - t)
                i += 1
        except BaseException as exc:  # reported after the run
            errors.append(exc)
        finally:
            api.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    began = time.perf_counter()
    stop_at[0] = began + seconds
    start.wait()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    if errors:
        raise RuntimeError(f"{len(errors)} load clients failed; first: {errors[0]!r}")
    return elapsed, [x for part in latencies for x in part]


def summary(replicas: int, elapsed: float, latencies: list[float]) -> dict[str, Any]:
    flat = sorted(latencies)
    return {"replicas": replicas, "requests": len(flat),
            "requests_per_s": round(len(flat) / elapsed, 1),
            "p50_ms": round(percentile(flat, 0.50) * 1000, 2),
            "p99_ms": round(percentile(flat, 0.99) * 1000, 2)}


def run(args: argparse.Namespace, home: Path) -> dict[str, Any]:
    from market.chain.client import anvil_account
    from market.chain.contracts import GpuSpec
    from market.local import processes
    from market.local.postgres import start_postgres
    from market.local.stack import LocalStack
    from market.marketapi import MarketAPI
    from market.service.board import Board
    from market.service.boardsql import close_pools

    client_account, miner = anvil_account(1), anvil_account(3)
    markets: list[processes.ManagedProcess] = []
    server = start_postgres(durable=True)
    try:
        with LocalStack(home=home, workers=0, market=False) as stack:
            q = stack.quarry
            q.gpu.register(miner, [MODEL_ID], GpuSpec("bench GPU", 1024, 1),
                           "http://127.0.0.1:9303", 10**9, 10**18)
            task_ids = [int(q.tasks.create_task(
                client_account, model_id=MODEL_ID, input_root=b"\x01" * 32,
                input_uri="sha256:" + "ab" * 32, num_requests=8, shard_size=2,
                max_tokens_per_request=8, price_per_token=10**9,
                deadline=q.chain.timestamp() + 100_000, allow_probation=True)[0])
                for _ in range(3)]
            url = server.create_database("bench")
            boards = {"sqlite": stack.settings.db_path, "postgres": url}
            for location in boards.values():
                Board(location).index(q)
            close_pools()
            settings = {
                "sqlite": [stack.settings.replace(port=processes.free_port())],
                "postgres": [stack.settings.replace(port=processes.free_port(),
                                                    database_url=url) for _ in range(2)]}
            urls: dict[str, list[str]] = {}
            started = []
            for kind, group in settings.items():
                for n, s in enumerate(group):
                    markets.append(processes.start_market(
                        s, log_path=stack.logs / f"market-{kind}{n}.log",
                        env={"QUARRY_HOME": str(stack.home)}, wait=False))
                    started.append(s)
                    urls.setdefault(kind, []).append(s.url)
            for proc, s in zip(markets, started, strict=True):  # the three start together
                processes.wait_market(proc, s)
            with MarketAPI(urls["sqlite"][0]) as api:
                uri = api.put(os.urandom(4096))
            say(f"stack up; {args.clients} clients x {args.seconds:g} s per configuration")
            configs = {"sqlite_1": urls["sqlite"], "postgres_1": urls["postgres"][:1],
                       "postgres_2": urls["postgres"]}
            taken = {name: (0.0, list[float]()) for name in configs}
            # Rounds alternate the configurations, so a machine whose other load changes
            # during the run weighs on each alike; the first round only warms them up.
            for round_ in range(args.rounds + (0 if args.smoke else 1)):
                for name, targets in configs.items():
                    elapsed, latencies = load(
                        targets, clients=args.clients, seconds=args.seconds / args.rounds,
                        uri=uri, task_id=task_ids[0], miner=miner)
                    if round_ or args.smoke:
                        before, seen = taken[name]
                        taken[name] = (before + elapsed, seen + latencies)
            results = {name: summary(len(configs[name]), *taken[name]) for name in configs}
            for name, row in results.items():
                say(f"{name}: {row}")
    finally:
        for proc in markets:
            proc.stop()
        server.stop()
    one_sqlite = results["sqlite_1"]["requests_per_s"]
    one_pg = results["postgres_1"]["requests_per_s"]
    two_pg = results["postgres_2"]["requests_per_s"]
    return {
        "benchmark": "market_replicas",
        "clients": args.clients, "seconds": args.seconds, "rounds": args.rounds,
        "cores": os.cpu_count(),
        "mix": ["store read", "open-shard long poll", "heartbeat", "job read"],
        **results,
        "postgres_vs_sqlite_throughput": round(one_pg / one_sqlite, 3) if one_sqlite else None,
        "two_vs_one_replica_throughput": round(two_pg / one_pg, 3) if one_pg else None,
        "target_postgres_vs_sqlite": TARGET_RATIO,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=8, help="load threads (8)")
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="seconds of load per configuration (10)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="alternating rounds the seconds are split into (5), after one "
                        "warm-up round")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON result file")
    parser.add_argument("--smoke", action="store_true",
                        help="2 clients x 1 s, results not written: checks that the whole "
                        "path runs (make test), not its figures")
    args = parser.parse_args(argv)
    if args.smoke:
        args.clients, args.seconds, args.rounds = 2, 1.0, 1
    if args.clients < 1 or args.rounds < 1 or args.seconds <= 0:
        parser.error("--clients and --rounds must be at least 1 and --seconds positive")

    from market.errors import QuarryError

    home = Path(tempfile.mkdtemp(prefix="quarry-bench-"))
    try:
        result = run(args, home)
    except QuarryError as exc:
        say(f"market_replicas failed: {exc} (logs in {home / 'logs'})")
        return 1
    finally:
        shutil.rmtree(home, ignore_errors=True)
    say(f"PostgreSQL / SQLite, one replica: {result['postgres_vs_sqlite_throughput']} "
        f"(target >= {TARGET_RATIO}); two / one PostgreSQL replicas: "
        f"{result['two_vs_one_replica_throughput']} on {result['cores']} cores")
    if not args.smoke:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
