"""Calibrate the verifier's error model: how far do honest miners' numbers drift?

For each model (the embedded tiny one and the trained `testmodels/quarry-pydoc`), honest
miners in every precision and batch shape (`_numerics.HONEST_SETUPS`: fp32, fp16, bf16,
int8 and fp8 weights; batch 32, 1 and shuffled batches of 5; sdpa and eager attention)
answer the same greedy requests; each verifier precision (fp32, bf16) re-reads them:

- **Greedy flips.** At every position, each token's gap below the reference's argmax after
  forgiving both sides' logit rounding (`market.engine.sampling.forgiven_gaps`); the honest
  token's gap is binned (`_numerics.FlipTable`), against the flips the Gumbel bound would
  allow at each scale beta. `smallest_beta` is the smallest scale under which, beyond every
  gap, the observed flips stay at most half the allowed.
- **Commitment chunks.** Each output's activation commitment against the verifier's own
  hidden states (`market.protocol.commitments.check`): the worst chunk's sign/exponent
  mismatches and mantissa errors, and the mean error that at most `DRIFT_FALSE_RATE` /
  `DRIFT_SAFETY` (1 in 30) of honest chunks exceed in every setup: the drift threshold
  (`verifier.error_models.DRIFT`, kept for `DRIFT_PAIRS`, times its room). The threshold
  is taken over the chunks the verifier tests (`market.protocol.commitments.
  checked_chunks`: not an output's short last chunk, whose points include ordinary
  activations that round worse); the tolerance over every chunk, which can only widen it.

- **The nucleus' edge** (`--edge-outputs`). The same honest miners (fp32, bf16 and fp16
  only) answer sampled requests at top_p 0.9 and 0.95 (temperatures 0.5, 0.8 and 1.0);
  at each of their tokens each verifier computes how far beyond its nucleus' edge the
  token lies (`market.engine.sampling.edge_distances`, logit nats; 0 inside), and the
  distances of the tokens outside its nucleus are tallied. The margin
  (`verifier.error_models.EDGE`) is `EDGE_SAFETY` times the largest honest distance of the
  pair on the model (at least `EDGE_FLOOR`); against a bf16 verifier, the fp32 margins of
  the miner's precision and of bf16 added up, as below. The JSON also gives, per pair, the
  nucleus-limited tokens seen and the 95% upper bound on the honest rate beyond the margin
  that none of them reaching it allows (3 / tokens), for `verifier.scoring.EDGE_FALSE_RATE`.

The error models (`models` in the JSON, what `verifier.scoring.ERROR_MODELS` holds):
- against an fp32 verifier, beta is `SAFETY` times the largest smallest_beta over both
  models and every setup of the precision (at least `FP32_FLOOR`: fp32 shows no flip at all
  here, and a GPU's fp32 may use TF32 products); the chunk tolerance is `SAFETY` times the
  worst honest chunk, plus `CHUNK_SLACK`;
- against a bf16 verifier, the miner's error and the verifier's own add up: beta(P, bf16)
  = beta(P, fp32) + beta(bf16, fp32), and so do the tolerances. (Measured directly, a bf16
  miner and a bf16 verifier on this CPU agree far better than that, but only because they
  share kernels; a GPU miner would not.) `covered` checks each composed model against
  what was measured for its pair.

The numbers `verifier.scoring.ERROR_MODELS` holds come from a full run of this script (its
JSON is in README "Verification under real numerics"). Prints one JSON object as its last
line; `--smoke` runs tiny sizes on the tiny model only (seconds).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _numerics import (  # noqa: E402
    HONEST_SETUPS,
    TRAINED_MODEL,
    VERIFIER_PRECISIONS,
    Engines,
    FlipTable,
    draw_lines,
    generate,
    outputs_for,
    reference_logits,
    say,
)

SAFETY = 2.0
"""The error model's scale and tolerances, as a multiple of the smallest that fit here."""
FP32_FLOOR = 0.005
"""The least greedy scale of an fp32 miner (nats)."""
CHUNK_SLACK = (2, 0.5, 1.0)
"""Added to SAFETY times the worst honest chunk: mismatches, mean and median ulps."""
DRIFT_SAFETY = 3
"""The drift threshold leaves this many times fewer honest chunks above it than
`verifier.scoring.DRIFT_FALSE_RATE` allows."""
DRIFT_PAIRS = {"bf16/fp32": 1.0, "fp16/fp32": 3.0}
"""Where a drift threshold is calibrated (where int8 weights hide inside the tolerance), and
how many times the measured quantile it sits at: room for hardware not measured here (a
GPU's fp16 products may be reduced in fp16). fp16's cheats sit far above its honest chunks
(int8 weights' median 0.89 ulps against 0.10), so its line takes three times the quantile;
bf16's sit just above (0.88 against 0.74), so its line has no room to give."""
EDGE_SAFETY = 2.0
"""The nucleus-edge margin, as a multiple of the largest honest edge distance."""
EDGE_FLOOR = 0.005
"""The least nucleus-edge margin (a GPU's fp32 may use TF32 products)."""
EDGE_PRECISIONS = ("fp32", "bf16", "fp16")
EDGE_TOP_PS = (0.9, 0.95)
EDGE_TEMPERATURES = (0.5, 0.8, 1.0)
DEFAULT_OUT = Path(__file__).resolve().parent / "out" / "calibrate_numerics.json"


def edge_tally(reference: Any, requests: list[Any], ids: list[Any]) -> dict[str, Any]:
    """The nucleus-limited sampled tokens of honest outputs against `reference`: how many,
    how many lie outside its nucleus, and how far (`distances`, the 20 largest)."""
    import torch

    from market.engine.sampling import edge_distances

    prompts = [r.prompt_ids for r in requests]
    tokens, distances = 0, []
    for logits, out, req in zip(reference_logits(reference, prompts, ids), ids, requests,
                                strict=True):
        if not out or req.greedy or req.top_p >= 1.0:
            continue
        found = edge_distances(logits, torch.tensor(list(out)), float(req.temperature),
                               float(req.top_p))
        tokens += len(out)
        distances += [x for x in found.tolist() if x > 0]
    return {"tokens": tokens, "outside": len(distances),
            "distances": sorted((round(x, 6) for x in distances), reverse=True)[:20]}


def edge_models(pairs: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per model, the nucleus-edge margin of each (miner, verifier) pair (module doc)."""
    out: dict[str, dict[str, float]] = {}
    for key, pair in pairs.items():
        model, label = key.split("/", 1)
        if label.endswith("/fp32"):
            largest = max(pair["distances"], default=0.0)
            out.setdefault(model, {})[label] = round(max(EDGE_SAFETY * largest, EDGE_FLOOR), 4)
    for margins in out.values():
        verifier = margins.get("bf16/fp32")
        for label in [k for k in margins if k.endswith("/fp32")]:
            if verifier is not None:
                margins[label.replace("/fp32", "/bf16")] = round(margins[label] + verifier, 4)
    return out


def calibrate_edge(args: argparse.Namespace, engines: Engines, models: dict[str, Path]
                   ) -> dict[str, Any]:
    """Honest sampled outputs under top_p < 1 from every fp32, bf16 and fp16 setup, and
    each verifier precision's M(y) - top_p at their tokens (module doc)."""
    pairs: dict[str, dict[str, Any]] = {}
    per_setup: dict[str, dict[str, Any]] = {}
    setups = [s for s in HONEST_SETUPS if s.precision in EDGE_PRECISIONS]
    if args.smoke:
        setups = [s for s in setups if s.precision == "bf16"][:1]
    for name in args.models:
        model_dir = models[name]
        rng = random.Random(f"{args.seed}-edge-{name}")
        probe = engines.get(model_dir, "fp32")
        for setup in setups:
            t0 = time.monotonic()
            lines = draw_lines(outputs_for(setup, args.edge_outputs), rng,
                               model_name=probe.manifest.name,
                               temperatures=EDGE_TEMPERATURES, max_tokens=args.max_tokens,
                               top_ps=EDGE_TOP_PS)
            engine = engines.get(model_dir, setup.precision, setup.attention, miner=True)
            requests = [engine.request_from_line(line) for line in lines]
            ids = [o.token_ids for o in generate(engine, requests, setup.batching, rng)]
            for v in VERIFIER_PRECISIONS:
                found = edge_tally(engines.get(model_dir, v), requests, ids)
                per_setup[f"{name}/{setup.label}/{v}"] = found
                pair = pairs.setdefault(f"{name}/{setup.precision}/{v}",
                                        {"tokens": 0, "outside": 0, "distances": []})
                pair["tokens"] += found["tokens"]
                pair["outside"] += found["outside"]
                pair["distances"] = sorted(pair["distances"] + found["distances"],
                                           reverse=True)[:20]
            say(f"edge {name} {setup.label}: {len(lines)} outputs in "
                f"{time.monotonic() - t0:.0f}s; " + ", ".join(
                    f"{v}: {per_setup[f'{name}/{setup.label}/{v}']['outside']} of "
                    f"{per_setup[f'{name}/{setup.label}/{v}']['tokens']} outside, farthest "
                    f"{max(per_setup[f'{name}/{setup.label}/{v}']['distances'], default=0)}"
                    for v in VERIFIER_PRECISIONS))
    margins = edge_models(pairs)
    for key, pair in pairs.items():
        model, label = key.split("/", 1)
        margin = margins.get(model, {}).get(label)
        pair["margin"] = margin
        pair["beyond_margin"] = (None if margin is None else
                                 sum(x > margin for x in pair["distances"]))
        pair["rate_bound_95"] = round(3 / pair["tokens"], 6) if pair["tokens"] else None
    return {"edge_models": margins, "edge_pairs": pairs, "edge_per_setup": per_setup,
            "edge_outputs_per_setup": args.edge_outputs, "edge_safety": EDGE_SAFETY,
            "edge_top_ps": list(EDGE_TOP_PS), "edge_temperatures": list(EDGE_TEMPERATURES)}


def chunk_summary(checks: list[Any]) -> dict[str, Any]:
    """The worst of `checks` (every chunk: the tolerance's side, module doc)."""
    if not checks:
        return {"chunks": 0}
    mism = sorted(c.mismatches for c in checks)
    means = sorted(c.mant_err_mean for c in checks)
    medians = sorted(c.mant_err_median for c in checks)
    q = max(0, math.ceil(0.999 * len(checks)) - 1)
    return {"chunks": len(checks), "max_mismatches": mism[-1], "p999_mismatches": mism[q],
            "max_mant_err_mean": round(means[-1], 3), "p999_mant_err_mean": round(means[q], 3),
            "max_mant_err_median": medians[-1]}


def drift_quantile(tested: list[Any]) -> dict[str, Any]:
    """The mean error that at most DRIFT_FALSE_RATE / DRIFT_SAFETY of `tested` exceed."""
    from verifier.scoring import DRIFT_FALSE_RATE

    if not tested:
        return {}
    means = sorted(c.mant_err_mean for c in tested)
    d = max(0, math.ceil((1 - DRIFT_FALSE_RATE / DRIFT_SAFETY) * len(tested)) - 1)
    return {"tested_chunks": len(tested), "drift_quantile_mant_err_mean": round(means[d], 3)}


def error_models(pairs: dict[str, Any], tables: dict[str, FlipTable]) -> dict[str, Any]:
    """The error model of every (miner, verifier) pair from the measured ones (module doc)."""
    from market.protocol.precision import Precision

    fp32_models: dict[str, dict[str, Any]] = {}
    for p in Precision:
        pair = pairs.get(f"{p.label}/fp32")
        if pair is None:
            continue
        beta = pair["smallest_beta"]
        fp32_models[p.label] = {
            "beta": None if beta is None else round(max(SAFETY * beta, FP32_FLOOR), 4),
            "chunks": [math.ceil(SAFETY * pair.get("max_mismatches", 0)) + CHUNK_SLACK[0],
                       round(SAFETY * pair.get("max_mant_err_mean", 0) + CHUNK_SLACK[1], 2),
                       SAFETY * pair.get("max_mant_err_median", 0) + CHUNK_SLACK[2]]}
        room = DRIFT_PAIRS.get(f"{p.label}/fp32")
        if room is not None and "drift_quantile_mant_err_mean" in pair:
            fp32_models[p.label]["drift"] = math.ceil(
                room * pair["drift_quantile_mant_err_mean"] * 100) / 100  # up to 0.01 ulps
    out: dict[str, Any] = {f"{k}/fp32": v for k, v in fp32_models.items()}
    verifier = fp32_models.get("bf16")
    for label, m in fp32_models.items():
        if verifier is None or m["beta"] is None or verifier["beta"] is None:
            continue
        composed = {"beta": round(m["beta"] + verifier["beta"], 4),
                    "chunks": [a + b for a, b in zip(m["chunks"], verifier["chunks"],
                                                     strict=True)]}
        measured = pairs.get(f"{label}/bf16")
        table = tables.get(f"{label}/bf16")
        if measured is not None and table is not None:
            fits = table.smallest_beta(slack=1.0)
            composed["covered"] = bool(
                fits is not None and fits <= composed["beta"]
                and measured.get("max_mismatches", 0) <= composed["chunks"][0]
                and measured.get("max_mant_err_mean", 0) <= composed["chunks"][1]
                and measured.get("max_mant_err_median", 0) <= composed["chunks"][2])
        out[f"{label}/bf16"] = composed
    return out


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from market.engine.threads import set_threads  # engines loaded later keep it
    from market.model.create import create_model
    from market.protocol.commitments import checked_chunks
    from market.protocol.precision import parse_precision
    from verifier.scoring import EXPONENTS, MANTISSA_BITS

    set_threads(args.threads)
    started = time.monotonic()
    engines = Engines(args.device, args.miner_device)
    models = {"tiny": work / "tiny", "trained": TRAINED_MODEL}
    create_model(models["tiny"])
    tables: dict[str, FlipTable] = {}
    per_setup: dict[str, dict[str, Any]] = {}
    chunks: dict[str, list[Any]] = {}
    drift: dict[str, dict[str, float]] = {}  # per pair, the worst setup's drift quantile
    setups = HONEST_SETUPS if not args.smoke else HONEST_SETUPS[:1] + HONEST_SETUPS[4:5]
    edge = calibrate_edge(args, engines, models) if args.edge_outputs else {}
    for name in args.models if args.outputs else ():
        model_dir = models[name]
        rng = random.Random(f"{args.seed}-{name}")
        probe = engines.get(model_dir, "fp32")
        lines = draw_lines(args.outputs, rng, model_name=probe.manifest.name,
                           temperatures=(0.0,), max_tokens=args.max_tokens)
        for setup in setups:
            t0 = time.monotonic()
            engine = engines.get(model_dir, setup.precision, setup.attention, miner=True)
            requests = [engine.request_from_line(line) for line in lines]
            outputs = generate(engine, requests, setup.batching, rng)
            prompts = [r.prompt_ids for r in requests]
            ids = [o.token_ids for o in outputs]
            gen_s = time.monotonic() - t0
            for v in VERIFIER_PRECISIONS:
                reference = engines.get(model_dir, v)
                key = f"{setup.precision}/{v}"
                roundings = (MANTISSA_BITS[parse_precision(setup.precision)],
                             MANTISSA_BITS[parse_precision(v)])
                table = tables.setdefault(key, FlipTable())
                own = FlipTable()
                for logits, out in zip(reference_logits(reference, prompts, ids), ids,
                                       strict=True):
                    if out:
                        table.add(logits, out, roundings)
                        own.add(logits, out, roundings)
                results = reference.evidence(prompts, ids, [(0.0, 1.0)] * len(ids), EXPONENTS,
                                             commitments=[o.commitment for o in outputs])
                found = [c for r in results for c in r.commitment_checks]
                tested = [c for out, r in zip(ids, results, strict=True)
                          for c, t in zip(r.commitment_checks,
                                          checked_chunks(len(out), reference.hidden_size),
                                          strict=True) if t]
                chunks.setdefault(key, []).extend(found)
                summary = {**chunk_summary(found), **drift_quantile(tested)}
                if "drift_quantile_mant_err_mean" in summary:  # the worst setup's (module doc)
                    worst = max(drift.get(key, {}).get("drift_quantile_mant_err_mean", 0.0),
                                summary["drift_quantile_mant_err_mean"])
                    drift[key] = {"drift_quantile_mant_err_mean": worst}
                per_setup[f"{name}/{setup.label}/{v}"] = {
                    "positions": own.positions, "off_argmax": own.positions - own.argmax,
                    "largest_gap": round(own.largest_gap, 4),
                    "smallest_beta": own.smallest_beta(), **summary}
            say(f"{name} {setup.label}: {len(lines)} outputs in {gen_s:.0f}s; "
                + ", ".join(f"{v}: {per_setup[f'{name}/{setup.label}/{v}']['off_argmax']} off "
                            f"argmax, largest gap "
                            f"{per_setup[f'{name}/{setup.label}/{v}']['largest_gap']}"
                            for v in VERIFIER_PRECISIONS))
    pairs: dict[str, Any] = {}
    for key, table in sorted(tables.items()):
        beta = table.smallest_beta()
        pairs[key] = {"positions": table.positions, "off_argmax": table.positions - table.argmax,
                      "largest_gap": round(table.largest_gap, 4), "smallest_beta": beta,
                      "beta": None if beta is None else round(beta * SAFETY, 6),
                      "observed_by_bin": table.observed,
                      **chunk_summary(chunks.get(key, [])), **drift.get(key, {})}
    models = error_models(pairs, tables)
    return {"benchmark": "calibrate_numerics", "models": list(args.models),
            "error_models": models, **edge,
            "tables": {k: {"positions": t.positions, "argmax": t.argmax,
                           "observed": t.observed, "expected": t.expected,
                           "largest_gap": t.largest_gap,
                           "chunks": {**chunk_summary(chunks[k]), **drift.get(k, {})}}
                       for k, t in tables.items()},
            "outputs_per_setup": args.outputs, "max_tokens": args.max_tokens,
            "safety": SAFETY, "setups": [s.label for s in setups], "pairs": pairs,
            "per_setup": per_setup, "seconds": round(time.monotonic() - started, 1)}


def merge(paths: list[Path]) -> dict[str, Any]:
    """The error models from several runs' tables (e.g. one process per model)."""
    tables: dict[str, FlipTable] = {}
    summaries: dict[str, dict[str, Any]] = {}
    runs = [json.loads(path.read_text()) for path in paths]
    for run_ in runs:
        for key, t in run_["tables"].items():
            table = tables.setdefault(key, FlipTable())
            table.positions += t["positions"]
            table.argmax += t["argmax"]
            table.largest_gap = max(table.largest_gap, t["largest_gap"])
            if table.observed is None:
                table.observed, table.expected = list(t["observed"]), [list(r) for r in
                                                                       t["expected"]]
            else:
                assert table.expected is not None
                table.observed = [a + b for a, b in zip(table.observed, t["observed"],
                                                        strict=True)]
                table.expected = [[a + b for a, b in zip(r1, r2, strict=True)]
                                  for r1, r2 in zip(table.expected, t["expected"], strict=True)]
            worst = summaries.setdefault(key, {})
            for name, value in t["chunks"].items():
                worst[name] = max(worst.get(name, value), value)
    pairs = {k: {"positions": t.positions, "off_argmax": t.positions - t.argmax,
                 "largest_gap": round(t.largest_gap, 4), "smallest_beta": t.smallest_beta(),
                 **summaries[k]} for k, t in sorted(tables.items())}
    return {"benchmark": "calibrate_numerics", "merged": [str(p) for p in paths],
            "models": [m for r in runs for m in r["models"]],
            "error_models": error_models(pairs, tables), "pairs": pairs,
            "per_setup": {k: v for r in runs for k, v in r["per_setup"].items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny,trained",
                        help="comma-separated: tiny, trained (both)")
    parser.add_argument("--outputs", type=int, default=192,
                        help="greedy outputs per miner setup (192)")
    parser.add_argument("--edge-outputs", type=int, default=96,
                        help="sampled outputs under top_p < 1 per fp32, bf16 and fp16 miner "
                        "setup for the nucleus-edge margin (96; 0: none)")
    parser.add_argument("--max-tokens", type=int, default=64, help="max_tokens (64)")
    parser.add_argument("--seed", default="calibration", help="request seed")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (2)")
    parser.add_argument("--device", default="cpu", help="the verifiers' device (cpu)")
    parser.add_argument("--miner-device", default=None,
                        help="the honest miners' device (default --device; cuda on a GPU)")
    parser.add_argument("--smoke", action="store_true", help="seconds: tiny sizes, tiny model")
    parser.add_argument("--merge", type=Path, nargs="+", default=None,
                        help="derive the error models from earlier runs' JSON files instead")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.merge:
        result = merge(args.merge)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        for key, model in result["error_models"].items():
            say(f"model {key}: {model}")
        print(json.dumps({k: v for k, v in result.items() if k != "per_setup"}))
        return 0
    args.models = [m.strip() for m in str(args.models).split(",") if m.strip()]
    if args.smoke:
        args.models, args.outputs, args.max_tokens = ["tiny"], 6, 8
        args.edge_outputs = 4
    if not set(args.models) <= {"tiny", "trained"} or not args.models:
        parser.error("--models takes tiny and/or trained")
    with tempfile.TemporaryDirectory(prefix="quarry-calibrate-") as tmp:
        result = run(args, Path(tmp))
    if not args.smoke:  # a smoke run's figures are meaningless: never over real ones
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    for key, model in result["error_models"].items():
        say(f"model {key}: {model}")
    for key, margins in result.get("edge_models", {}).items():
        say(f"edge margins {key}: {margins}")
    for key, pair in result["pairs"].items():
        say(f"{key}: beta {pair['beta']} (smallest {pair['smallest_beta']}), largest gap "
            f"{pair['largest_gap']}, chunks: worst mismatches {pair.get('max_mismatches')}, "
            f"mean {pair.get('max_mant_err_mean')}, median {pair.get('max_mant_err_median')}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
