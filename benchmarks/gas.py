"""Gas of one whole task life cycle (createTask, claimShard, submitResult, finalizeShard) for a
task of 10 requests and one of 10,000, each a single shard.

Only Merkle roots, hashes and counts go on-chain, so the two should cost the same to within a
few percent whatever the batch size. The roots are real: the input tree over the requests'
hashes and the result tree over the receipts' EIP-712 struct hashes, built by
`market.protocol`. Runs its own Anvil (stopped at the end); prints one JSON object last.
"""

from __future__ import annotations

import json
import time

from market.chain.client import Chain, anvil_account
from market.chain.contracts import GpuSpec
from market.chain.deploy import Quarry, deploy
from market.chain.devnet import start_anvil
from market.protocol import (
    Receipt,
    input_tree,
    keccak,
    output_hash,
    receipts_tree,
    request_hash,
)

MODEL_ID = keccak(b"benchmark model manifest")
MAX_TOKENS = 16
PRICE = 10**9
SIZES = (10, 10_000)


def requests(n: int) -> list[dict]:
    return [
        {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/completions",
         "body": {"model": "tiny", "prompt": f"Question {i}: what is {i} + {i}?",
                  "max_tokens": MAX_TOKENS, "temperature": 0, "seed": i}}
        for i in range(n)
    ]


def lifecycle(q: Quarry, chain: Chain, n: int) -> dict[str, int]:
    client, miner, anyone = anvil_account(1), anvil_account(2), anvil_account(3)
    hashes = [request_hash(r) for r in requests(n)]
    root = input_tree(hashes).root
    task_id, create = q.tasks.create_task(
        client, model_id=MODEL_ID, input_root=root, input_uri=f"store://inputs/{root.hex()}",
        num_requests=n, shard_size=n, max_tokens_per_request=MAX_TOKENS,
        price_per_token=PRICE, deadline=chain.timestamp() + 3600,
    )
    claim = q.tasks.claim_shard(miner, task_id, 0)
    receipts = []
    for i, h in enumerate(hashes):
        ids = [(i * 7 + k) % 50_000 for k in range(1 + i % MAX_TOKENS)]
        receipts.append(Receipt(task_id, 0, i, h, output_hash(f"{2 * i}", ids), len(ids),
                                MODEL_ID))
    result_root = receipts_tree(receipts).root
    tokens = sum(r.output_tokens for r in receipts)
    submit = q.tasks.submit_result(miner, task_id, 0, result_root,
                                   f"store://results/{result_root.hex()}", tokens)
    chain.advance_time(q.tasks.params()["challenge_window"])
    finalize = q.tasks.finalize_shard(anyone, task_id, 0)
    steps = {"createTask": create.gas_used, "claimShard": claim.gas_used,
             "submitResult": submit.gas_used, "finalizeShard": finalize.gas_used}
    return steps | {"total": sum(steps.values())}


def main() -> int:
    anvil = start_anvil(silent=True, die_with_parent=True)
    try:
        chain = Chain(anvil.rpc_url)
        deployment, _ = deploy(chain, anvil_account(0))
        q = Quarry(deployment, chain)
        q.gpu.register(anvil_account(2), [MODEL_ID], GpuSpec("NVIDIA H100", 81920, 1),
                       "http://127.0.0.1:9100", PRICE, 10**18)
        # One warm-up cycle so both measured tasks see the same storage (first-write costs of
        # taskCount, escrow totals and the miner's lock slot are paid here, not by either).
        lifecycle(q, chain, 2)
        results = {}
        for n in SIZES:
            started = time.perf_counter()
            results[n] = lifecycle(q, chain, n)
            print(f"{n:>6} requests: {results[n]} ({time.perf_counter() - started:.1f}s)")
    finally:
        anvil.stop()
    small, large = results[SIZES[0]]["total"], results[SIZES[1]]["total"]
    ratio = large / small
    print(json.dumps({
        "gas_lifecycle_10": small,
        "gas_lifecycle_10000": large,
        "ratio": round(ratio, 4),
        "within_5pct": abs(ratio - 1) <= 0.05,
        "steps_10": results[SIZES[0]],
        "steps_10000": results[SIZES[1]],
    }))
    return 0 if abs(ratio - 1) <= 0.05 else 1


if __name__ == "__main__":
    raise SystemExit(main())
