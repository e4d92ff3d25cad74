"""What does `Job.wait` cost the client while a job with many shards runs?

A private Anvil with the contracts and a market (for the deployment only); one task of
`--shards` shards of one request each, created directly on TaskRegistry; a miner thread
claims and submits one shard every `--pace-s` seconds (the result documents are not
fetched: `wait` reads only the chain). The client's `Job.wait(poll_s=0.25)` runs in the
main thread; measured: its thread CPU time, its wall time, and the JSON-RPC requests its
chain connection sent (`getShard` eth_calls apart). Run it at two commits to compare.

Prints one JSON object as the last line of stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from client.sdk import Client  # noqa: E402
from market.chain.client import Chain, anvil_account  # noqa: E402
from market.chain.contracts import GpuSpec  # noqa: E402
from market.chain.deploy import Quarry, deploy  # noqa: E402
from market.chain.devnet import free_port, start_anvil  # noqa: E402
from market.marketapi import MarketAPI  # noqa: E402
from market.service.app import serve_in_thread  # noqa: E402
from market.service.settings import MarketSettings  # noqa: E402

PRICE = 10**9
MODEL_ID = b"\x11" * 32


def count_requests(chain: Chain, calls: Counter[str]) -> None:
    """Count every JSON-RPC request `chain` sends (eth_call to getShard apart)."""
    provider = chain.w3.provider
    inner = provider._make_request  # type: ignore[attr-defined]
    selector = "0x" + chain.w3.keccak(text="getShard(uint256,uint32)")[:4].hex()

    def make_request(method: Any, request_data: bytes) -> Any:
        if method == "eth_call" and selector in request_data.decode():
            calls["getShard"] += 1
        else:
            calls[str(method)] += 1
        return inner(method, request_data)

    provider._make_request = make_request  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=200)
    parser.add_argument("--pace-s", type=float, default=0.05)
    parser.add_argument("--smoke", action="store_true",
                        help="5 shards: checks that the script runs (make test), not its figures")
    args = parser.parse_args(argv)
    if args.smoke:
        args.shards = 5

    anvil = start_anvil(silent=True, die_with_parent=True)
    try:
        chain = Chain(anvil.rpc_url)
        deployer, client, miner = anvil_account(0), anvil_account(1), anvil_account(3)
        deployment, _ = deploy(chain, deployer)
        q = Quarry(deployment, chain)
        probation = q.gpu.probation_params()
        q.gpu.set_probation(deployer, 0, probation[1])
        q.gpu.register(miner, [MODEL_ID], GpuSpec("H100", 81920, 1), "http://127.0.0.1:9",
                       PRICE, 10**20)
        root = Path(tempfile.mkdtemp(prefix="wait-cost-"))
        settings = MarketSettings(deployment=deployment.save(root / "deployment.json"),
                                  store_dir=root / "store", db_path=root / "board.sqlite",
                                  port=free_port())
        n = args.shards
        task_id, _ = q.tasks.create_task(
            client, model_id=MODEL_ID, input_root=b"\x01" * 32, input_uri="sha256:" + "0" * 64,
            num_requests=n, shard_size=1, max_tokens_per_request=4, price_per_token=PRICE,
            deadline=chain.timestamp() + 3600)

        def mine() -> None:
            for k in range(n):
                q.tasks.claim_shard(miner, task_id, k)
                q.tasks.submit_result(miner, task_id, k, bytes([1]) * 32,
                                      "sha256:" + "1" * 64, 1)
                time.sleep(args.pace_s)

        with serve_in_thread(settings):
            MarketAPI(settings.url).close()
            c = Client(None, client.key, settings.url)
            job = c.job(task_id)
            calls: Counter[str] = Counter()
            count_requests(c.chain, calls)
            worker = threading.Thread(target=mine, daemon=True)
            wall0, cpu0 = time.monotonic(), time.thread_time()
            worker.start()
            job.wait(progress=False, timeout=600)
            cpu, wall = time.thread_time() - cpu0, time.monotonic() - wall0
            worker.join()
            c.close()
    finally:
        anvil.stop()
    print(json.dumps({"shards": n, "wait_cpu_s": round(cpu, 3), "wait_wall_s": round(wall, 2),
                      "rpc_requests": sum(calls.values()), "getShard_calls": calls["getShard"],
                      "by_method": dict(calls)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
