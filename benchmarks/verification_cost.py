"""How much cheaper is verifying an output than generating it?

Creates the embedded tiny model in a temporary directory, generates `--tokens`-token
outputs for a batch of `--batch` prompts with the torch engine (EOS disabled so every row
runs to the full length), then scores the same outputs with one teacher-forced pass per
batch. Generation is sequential in the output length; scoring is one parallel pass, which
is why a verifier can afford to re-check miners. Also timed: the verifier's whole check
(`verifier.scoring.score_outputs`, which reads the full tempered distribution at every
position of a sampled output for the two-sided test) on the same outputs treated as
sampled at temperature 1 (`evidence_to_generate_time_ratio`). Prints one JSON object as
the last line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

PROMPTS = [
    "The market opens early.",
    "Once upon a time there was a small village",
    "Water boils at one hundred degrees",
    "Write a poem about the ocean.",
    "What is the capital of France?",
    "def add(a, b):",
    "The weather today is cloudy",
    "In mathematics, a prime number is",
    "Music is made of sound and silence.",
    "Doctors say that sleep, exercise and",
    "The library was quiet.",
    "History is the study of the past.",
    "To make a cup of tea,",
    "Computers store numbers in binary.",
    "Good morning! How are you today?",
    "The engine turns the fuel into motion.",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=16, help="prompts per batch (16)")
    parser.add_argument("--tokens", type=int, default=128, help="output tokens per prompt (128)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs; median kept (5)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    parser.add_argument("--smoke", action="store_true",
                        help="2 prompts x 8 tokens, one run: checks that the script runs (make "
                        "test), not its figures")
    args = parser.parse_args(argv)
    if args.smoke:
        args.batch, args.tokens, args.repeats = 2, 8, 1
    if args.batch < 1 or args.tokens < 1 or args.repeats < 1:
        parser.error("--batch, --tokens and --repeats must be >= 1")

    import torch

    from market.engine.base import GenerationRequest
    from market.engine.threads import set_threads
    from market.engine.torch_engine import TorchEngine
    from market.model.create import create_model

    if args.threads:
        set_threads(args.threads)  # engines loaded later keep it
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "tiny"
        manifest = create_model(model_dir)
        engine = TorchEngine(model_dir, device=args.device, max_batch_size=args.batch,
                             stop_token_ids=())
        prompts = [engine.encode_prompt(PROMPTS[i % len(PROMPTS)] + f" ({i})")
                   for i in range(args.batch)]
        requests = [GenerationRequest(p, args.tokens) for p in prompts]
        engine.generate([GenerationRequest(p, 4) for p in prompts])  # warm-up

        def timed(fn):  # type: ignore[no-untyped-def]
            if engine.device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            result = fn()
            if engine.device.type == "cuda":
                torch.cuda.synchronize()
            return result, time.perf_counter() - start

        # Alternate the two measurements so both see the same background load.
        outputs, _ = timed(lambda: engine.generate(requests))
        output_ids = [o.token_ids for o in outputs]
        from verifier.scoring import score_outputs

        sampled = [GenerationRequest(p, args.tokens, temperature=1.0) for p in prompts]
        gen_times, score_times, evidence_times, max_diff = [], [], [], 0.0
        for _ in range(args.repeats):
            again, t = timed(lambda: engine.generate(requests))
            gen_times.append(t)
            if [o.token_ids for o in again] != output_ids:
                raise SystemExit("greedy generation is not repeatable")
            scores, t = timed(lambda: engine.score(prompts, output_ids))
            score_times.append(t)
            _, t = timed(lambda: score_outputs(engine, sampled, output_ids))
            evidence_times.append(t)
            max_diff = max(
                abs(s.total_logprob - sum(o.logprobs))
                for s, o in zip(scores, outputs, strict=True)
            )
        gen_s, score_s = statistics.median(gen_times), statistics.median(score_times)
        evidence_s = statistics.median(evidence_times)
        out_tokens = sum(len(o) for o in output_ids)
        result = {
            "benchmark": "verification_cost",
            "model_id": manifest.model_id_hex,
            "model": {k: manifest.architecture[k] for k in (
                "num_hidden_layers", "hidden_size", "vocab_size")},
            "device": str(engine.device),
            "dtype": str(engine.dtype).removeprefix("torch."),
            "threads": torch.get_num_threads(),
            "batch_size": args.batch,
            "output_tokens_per_prompt": args.tokens,
            "prompt_tokens_total": sum(len(p) for p in prompts),
            "output_tokens_total": out_tokens,
            "repeats": args.repeats,
            "generate_time_s": round(gen_s, 4),
            "score_time_s": round(score_s, 4),
            "generate_tokens_per_s": round(out_tokens / gen_s, 1),
            "score_tokens_per_s": round(out_tokens / score_s, 1),
            "score_to_generate_time_ratio": round(score_s / gen_s, 4),
            "evidence_time_s": round(evidence_s, 4),
            "evidence_to_generate_time_ratio": round(evidence_s / gen_s, 4),
            "target_ratio": 0.1,
            "max_abs_score_minus_generate_logprob_sum": max_diff,
        }
        print(f"generate {gen_s:.3f}s, score {score_s:.3f}s, verifier check {evidence_s:.3f}s "
              f"for {out_tokens} tokens",
              file=sys.stderr)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
