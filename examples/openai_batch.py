"""An ordinary OpenAI Batch script, unchanged but for `base_url` and `api_key`: it runs
against `client gateway` (README "By hand, step by step"), which pays and verifies on Quarry.
No Quarry-specific metadata: on a fresh market the miners are new, and a task lets them
claim it while no established miner serves the model.

    .venv/bin/python examples/openai_batch.py [N]      # N requests (default 20)
"""

from __future__ import annotations

import io
import json
import sys
import time

from openai import OpenAI

client = OpenAI(base_url="http://127.0.0.1:8700/v1",  # the gateway
                api_key="devnet-token")               # [client] gateway_token


def main(n: int) -> int:
    lines = [{"custom_id": f"request-{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "quarry-tiny", "max_tokens": 24,
                       "messages": [{"role": "user", "content": f"Tell me about item {i}."}]}}
             for i in range(n)]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    batch_file = client.files.create(file=("batch.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(input_file_id=batch_file.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    began = time.monotonic()
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        time.sleep(2)
        batch = client.batches.retrieve(batch.id)
        print(f"{batch.status}: {batch.request_counts}", flush=True)
    if batch.status != "completed" or batch.output_file_id is None:
        print(f"batch {batch.id} ended {batch.status}: {batch.errors}", file=sys.stderr)
        return 1
    outputs = client.files.content(batch.output_file_id).text.splitlines()
    first = json.loads(outputs[0])["response"]["body"]["choices"][0]["message"]["content"]
    print(f"{len(outputs)} outputs in {time.monotonic() - began:.0f} s; the first: {first!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 20))
