"""What could a *seeded replay* of sampled tokens catch that the distributional test cannot?

A measurement of a check the protocol does not have (issue 32's study). The protocol's
sampler is deterministic given the request's seed (`market.engine.sampling`: one float64
uniform u_t per sampled step from `make_generator(seed)`, mapped through the cumulative
distribution of the nucleus, sorted by probability, stable). A verifier that knows the seed
can replay u_t and ask whether a miner whose logits differ from its own only by rounding
could have mapped u_t to the token returned (`replay_distances`). That is not bounded by
the cheat's KL divergence, which bounds `verifier.scoring`'s distributional test
(`benchmarks/evidence_limits.py`). It is not a protocol rule because every engine would
have to draw from that one seeded stream, and vLLM's own stream differs
(`market.engine.vllm_engine`).

On the same per-epoch requests as `evidence_limits.py` (one challenge and the audited
client shards; sampled requests only), with an fp32 verifier teacher-forcing every output:

- honest miners declared fp32, bf16 (whole batch and batch 1: bf16 kernels round with the
  batch shape) and fp16: every sampled token's replay distance (max, quantiles, shares
  above a grid of margins);
- the cheats of `miner.cheats` (`--modes`) declared fp32 and bf16, using the same
  generators as the honest sampler (the cheater's best case against a replay): per epoch,
  the share of tokens beyond each margin, and the test the check would be, shaped like
  the nucleus-edge test (`verifier.scoring`): margin m = twice the farthest honest distance
  of the precision pair (at least 0.005), honest rate bound eps = `EDGE_FALSE_RATE`,
  alternatives `ALTERNATIVES`, factor q / eps per token beyond, (1 - q) / (1 - eps)
  inside; the best alternative's log evidence per epoch and the epochs its mean needs to
  reach log(1e6) plus the mixture's log(len(ALTERNATIVES));
- beside them, on the same outputs: the exact likelihood ratio of fp32 cheats and its
  expectation (`evidence_limits.exact_log_ratio`) and the sampled test's best alternative
  (`test_best`), as `evidence_limits.py` reports them;
- what the replay cannot see: the steps where the cheat's token is the one the honest rule
  maps u_t to under the verifier's logits (`agree`), and those where it is not but lies
  within the margin (`differ_within_margin`).

The margins come from this run's honest tokens, so the honest share beyond them is 0 here
by construction; the calibration of a real rule would need a separate honest sample.
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

import evidence_limits  # noqa: E402

THRESHOLD = math.log(1e6)
MARGINS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2)
"""The grid of margins (raw-logit nats) whose exceedance shares are reported."""
ALTERNATIVES = (0.002, 0.01, 0.05, 0.2)
"""The replay test's alternative shares of tokens beyond the margin."""
MIN_MARGIN = 0.005
"""The least margin, as `verifier.error_models.EDGE`'s."""
HONEST = ("fp32", "bf16", "bf16-b1", "fp16")
"""Honest miners: declared precision, `-b1` generating one request at a time."""


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def replay_distances(logits: Any, targets: Any, uniforms: Any, temperature: float,
                     top_p: float) -> Any:
    """How far each target y of `targets` [N] is from being what the protocol's sampler
    maps the replayed uniform `uniforms[i]` to under logits [N, V], in raw-logit nats
    (float64 [N]; 0 where y is what these logits give, up to the nucleus' size).

    With s the tempered log-probabilities, w = e^s, and a slack g >= 0 (tempered nats):
    A(g) = {s_i > s_y + g} holding a, B(g) = {s_i >= s_y - g} (y included) holding b,
    lo(g) = a e^-g / (a e^-g + 1 - a), hi(g) = b e^g / (b e^g + 1 - b). y is g-consistent
    when lo(g) <= u and u p <= hi(g); the distance is T times the least such g.

    Why an honest miner whose raw logits differ from these by at most delta around a
    common shift stays within 2 delta: with g = 2 delta / T its tempered log-probs differ
    pairwise from s by at most g, so it sorts every token of A(g) before y and every token
    outside B(g) after y, and its probabilities are w_i e^(e_i) / N with |e_i| <= g / 2, so
    it holds at least lo(g) before y and at most hi(g) before and at y. Its sampler picks y
    only if the mass before y is at most x = u Z and the mass through y above it, Z its
    nucleus' mass, in [p, 1] (the nucleus holds at least p, or everything): so lo(g) <= u
    and u p <= hi(g).

    lo falls and hi rises with g, and on each interval between the gaps |s_i - s_y| the
    sets are fixed, so the least g is exact: the largest of
    min over the positions j up to y's in the stable sort of max(s_j - s_y,
    log(C_j (1 - u) / (u (1 - C_j)))), C_j the mass sorted before j, and min over the
    positions j from y's of max(s_y - s_j, log(u p (1 - D_j) / (D_j (1 - u p)))), D_j the
    mass through j (each candidate is consistent; the least is among them). Float64, CPU.
    """
    import torch

    if logits.dim() != 2 or targets.dim() != 1 or uniforms.dim() != 1 \
            or not targets.shape[0] == uniforms.shape[0] == logits.shape[0]:
        raise ValueError(f"logits must be [N, V], targets and uniforms [N], got "
                         f"{tuple(logits.shape)}, {tuple(targets.shape)} and "
                         f"{tuple(uniforms.shape)}")
    if not temperature > 0 or not 0 < top_p <= 1:
        raise ValueError(f"replay distances need a sampled request (temperature > 0, "
                         f"top_p in (0, 1]), got {temperature!r}, {top_p!r}")
    s = torch.log_softmax(logits.to("cpu", torch.float64) / temperature, dim=-1)
    s_sorted, order = torch.sort(s, dim=-1, descending=True, stable=True)
    w = s_sorted.exp()
    rank = (order == targets.to("cpu")[:, None]).to(torch.int64).argmax(-1, keepdim=True)
    gap = s_sorted - s_sorted.gather(1, rank)  # >= 0 up to y, <= 0 after it
    through = torch.cumsum(w, -1)
    before = through - w
    from_here = torch.flip(torch.cumsum(torch.flip(w, [-1]), -1), [-1])  # 1 - before
    after = torch.cat([from_here[:, 1:], torch.zeros_like(w[:, :1])], -1)  # 1 - through
    u = uniforms.to("cpu", torch.float64)[:, None]
    up = u * top_p
    lo_need = torch.log(before * (1 - u)) - torch.log(u * from_here)
    lo_need[:, 0] = -math.inf  # nothing before the first: lo = 0 <= u, even at u = 0
    hi_need = torch.log(up * after) - torch.log(through * (1 - up))
    hi_need[:, -1] = -math.inf  # everything through the last: hi = 1 >= u p
    positions = torch.arange(w.shape[1]).expand_as(w)
    inf = torch.full_like(w, math.inf)
    lo = torch.where(positions <= rank, torch.maximum(gap, lo_need), inf).min(-1).values
    hi = torch.where(positions >= rank, torch.maximum(-gap, hi_need), inf).min(-1).values
    need = torch.maximum(lo, hi)
    return torch.where(need > 0, need * temperature, torch.zeros_like(need))


def replay_uniforms(seed: int, steps: int) -> Any:
    """The uniforms the protocol's sampler draws for a request's first `steps` sampled steps:
    one float64 `torch.rand` per step from `make_generator(seed)`, as `_sample_row` draws."""
    import torch

    from market.engine.sampling import make_generator

    gen = make_generator(seed)
    return torch.stack([torch.rand((), generator=gen, dtype=torch.float64)
                        for _ in range(steps)]) if steps else torch.zeros(0, dtype=torch.float64)


def replayed_tokens(logits: Any, seed: int, temperature: float, top_p: float) -> list[int]:
    """The tokens the honest rule maps the request's replayed uniforms to under each row of
    `logits` [N, V] (row t the logits of step t, given the output's own prefix)."""
    from market.engine.sampling import _sample_row, make_generator

    gen = make_generator(seed)
    return [_sample_row(row, temperature, top_p, gen) for row in logits]


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else 0.0


def distance_summary(distances: list[float]) -> dict[str, Any]:
    """Count, max, 99.9% and 99% quantiles, and the share above each of `MARGINS`."""
    ordered = sorted(distances)
    n = len(ordered)
    return {"tokens": n, "max": round(ordered[-1], 5) if n else 0.0,
            "q999": round(_quantile(ordered, 0.999), 5),
            "q99": round(_quantile(ordered, 0.99), 5),
            "share_above": {str(m): round(sum(d > m for d in ordered) / n, 5) if n else 0.0
                            for m in MARGINS}}


def replay_log_ratios(checked: int, beyond: int) -> tuple[float, ...]:
    """The replay test's log e-value factors per `ALTERNATIVES` over `checked` tokens of
    which `beyond` lie beyond the margin (the nucleus-edge test's form and honest rate)."""
    from verifier.scoring import EDGE_FALSE_RATE, _binomial_log_ratios

    return _binomial_log_ratios(checked, beyond, EDGE_FALSE_RATE, ALTERNATIVES)


def _engines(args: argparse.Namespace, model_dir: Path, work: Path) -> dict[str, Any]:
    """name -> (engine, declared precision, mode or "", one request at a time)."""
    from market.engine.torch_engine import TorchEngine
    from miner.cheats import cheating_engine

    out: dict[str, Any] = {}
    for name in args.honest:
        precision = name.split("-")[0]
        out[f"honest-{name}"] = (TorchEngine(model_dir, precision=precision, device="cpu"),
                                 precision, "", name.endswith("-b1"))
    for mode in args.modes:
        for precision in args.precisions:
            honest = TorchEngine(model_dir, precision=precision, device="cpu")
            out[f"{mode}@{precision}"] = (cheating_engine(mode, honest, model_dir, seed=0,
                                                          cache_dir=work / "cheat-models"),
                                          precision, mode, False)
    return out


def _generate(engine: Any, requests: list[Any], one_by_one: bool) -> list[Any]:
    if not requests:
        return []
    if one_by_one:
        return [engine.generate([r])[0] for r in requests]
    return list(engine.generate(requests))


def observe(args: argparse.Namespace, verifier: Any, engine: Any, precision: str, mode: str,
            requests: list[Any], outputs: list[Any], gen: Any) -> dict[str, Any]:
    """One part of one epoch for one engine: per token its replay distance and whether it is
    the honest rule's token; the exact ratio (fp32 cheats) and the sampled test's scores."""
    import torch

    from verifier.scoring import score_outputs

    part: dict[str, Any] = {"distances": [], "agree": [], "exact": 0.0, "expected": 0.0,
                            "outside_nucleus": 0, "scores": []}
    for req, o in zip(requests, outputs, strict=True):
        if not o.token_ids:
            continue
        seq = list(req.prompt_ids) + list(o.token_ids)
        with torch.inference_mode():
            logits = verifier.model(torch.tensor([seq])).logits[
                0, len(req.prompt_ids) - 1: len(seq) - 1].float()
        targets = torch.tensor(o.token_ids)
        t, p = float(req.temperature), float(req.top_p)
        u = replay_uniforms(req.seed, len(o.token_ids))
        part["distances"] += replay_distances(logits, targets, u, t, p).tolist()
        part["agree"] += [h == y for h, y in zip(replayed_tokens(logits, req.seed, t, p),
                                                 o.token_ids, strict=True)]
        if mode and precision == "fp32":
            value, mean, outside, _ = evidence_limits.exact_log_ratio(
                mode, logits, o.token_ids, t, p, verifier.stop_token_ids, args.draws, gen)
            part["exact"] += value
            part["expected"] += mean
            part["outside_nucleus"] += outside
    if requests:
        part["scores"] = score_outputs(verifier, requests, [o.token_ids for o in outputs],
                                       [o.finish_reason for o in outputs],
                                       precision=precision)
    return part


def collect(args: argparse.Namespace, engines: dict[str, Any], verifier: Any,
            manifest: Any) -> dict[str, list[dict[str, Any]]]:
    """Every engine's parts per epoch: {name: [{"challenge": part, "audits": part}, ...]}."""
    import torch

    started = time.monotonic()
    rng, audit_rng = random.Random(args.seed), random.Random(args.seed + 2)
    gen = torch.Generator().manual_seed(args.seed)
    seen: dict[str, list[dict[str, Any]]] = {name: [] for name in engines}
    for epoch in range(1, args.epochs + 1):
        challenge, audits = evidence_limits.epoch_requests(args, verifier, manifest, epoch,
                                                           rng, audit_rng)
        for name, (engine, precision, mode, one_by_one) in engines.items():
            seen[name].append({
                part: observe(args, verifier, engine, precision, mode, reqs,
                              _generate(engine, reqs, one_by_one), gen)
                for part, reqs in (("challenge", challenge), ("audits", audits))})
        say(f"epoch {epoch}: {len(challenge)} sampled challenge requests, {len(audits)} "
            f"sampled audited ones, {len(engines)} engines, "
            f"{time.monotonic() - started:.0f} s so far")
    return seen


def _pool(epoch: dict[str, Any], scope: str, key: str) -> list[Any]:
    parts = ("challenge",) if scope == "challenge" else ("challenge", "audits")
    return [x for p in parts for x in epoch[p][key]]


def held_out(seen: dict[str, list[dict[str, Any]]], engines: dict[str, Any]
             ) -> dict[str, Any]:
    """The in-sample margins make the honest share beyond them 0 by construction; this is
    the honest share beyond a margin set (the same way) from the first half of the epochs,
    counted on the second half, per precision."""
    out: dict[str, Any] = {}
    half = len(next(iter(seen.values()))) // 2
    if half < 1:
        return out
    for precision in sorted({engines[n][1] for n in seen if not engines[n][2]}):
        names = [n for n in seen if not engines[n][2] and engines[n][1] == precision]
        first = [d for n in names for e in seen[n][:half] for d in _pool(e, "pooled",
                                                                           "distances")]
        rest = [d for n in names for e in seen[n][half:] for d in _pool(e, "pooled",
                                                                          "distances")]
        m = max(MIN_MARGIN, 2 * max(first, default=0.0))
        out[precision] = {"margin": round(m, 5), "epochs": [1, half],
                          "tokens_after": len(rest), "beyond_after": sum(d > m for d in rest),
                          "farthest_after": round(max(rest, default=0.0), 5)}
    return out


def summarise(args: argparse.Namespace, seen: dict[str, list[dict[str, Any]]],
              engines: dict[str, Any]) -> dict[str, Any]:
    """The honest distances, each pair's margin, and per cheat and epoch the replay test's
    evidence beside the distributional figures."""
    from verifier.scoring import GREEDY_EXPONENTS, SAMPLED_WIDTH, judge

    start = len(GREEDY_EXPONENTS)
    honest = {name: distance_summary([d for e in epochs for d in _pool(e, "pooled",
                                                                        "distances")])
              for name, epochs in seen.items() if name.startswith("honest-")}
    margins = {}
    for precision in sorted({engines[n][1] for n in seen}):
        farthest = [honest[n]["max"] for n in honest if engines[n][1] == precision]
        margins[precision] = (round(max(MIN_MARGIN, 2 * max(farthest)), 5) if farthest
                              else None)
    cost = math.log(len(ALTERNATIVES))
    results: dict[str, Any] = {}
    for name, epochs in seen.items():
        precision, mode = engines[name][1], engines[name][2]
        m = margins[precision]
        row: dict[str, Any] = {"declared": precision, "margin": m}
        row.update(honest[name] if not mode else distance_summary(
            [d for e in epochs for d in _pool(e, "pooled", "distances")]))
        for scope in ("challenge", "pooled"):
            per_epoch: dict[str, Any] = {"tokens": [], "beyond": [], "replay_best": [],
                                         "test_best": [], "agree": [],
                                         "differ_within_margin": [],
                                         "share_above": {str(g): [] for g in MARGINS}}
            sums = [0.0] * len(ALTERNATIVES)
            if mode and precision == "fp32":
                per_epoch["exact"], per_epoch["expected"] = [], []
            for e in epochs:
                dist, agree = _pool(e, scope, "distances"), _pool(e, scope, "agree")
                beyond = sum(d > m for d in dist) if m is not None else 0
                logs = replay_log_ratios(len(dist), beyond)
                sums = [a + b for a, b in zip(sums, logs, strict=True)]
                scores = _pool(e, scope, "scores")
                own = judge(scores).own[start: start + SAMPLED_WIDTH] if scores else (0.0,)
                for g in MARGINS:
                    per_epoch["share_above"][str(g)].append(
                        round(sum(d > g for d in dist) / len(dist), 4) if dist else None)
                per_epoch["tokens"].append(len(dist))
                per_epoch["beyond"].append(beyond)
                per_epoch["replay_best"].append(round(max(logs), 2))
                per_epoch["test_best"].append(round(max(own), 2))
                per_epoch["agree"].append(round(sum(agree) / len(agree), 4) if agree else None)
                per_epoch["differ_within_margin"].append(round(sum(
                    (not a) and d <= m for a, d in zip(agree, dist, strict=True))
                    / len(dist), 4) if dist and m is not None else None)
                if "exact" in per_epoch:
                    parts = ("challenge",) if scope == "challenge" else ("challenge", "audits")
                    exact = math.fsum(e[p]["exact"] for p in parts)
                    per_epoch["exact"].append(round(exact, 2) if math.isfinite(exact)
                                              else None)
                    per_epoch["expected"].append(round(math.fsum(e[p]["expected"]
                                                                 for p in parts), 2))
            rate = max(sums) / len(epochs) if epochs else 0.0
            per_epoch["replay_mean_per_epoch_best_alternative"] = round(rate, 2)
            per_epoch["replay_epochs_needed"] = (math.ceil((THRESHOLD + cost) / rate)
                                                 if rate > 0 else None)
            if per_epoch.get("expected"):
                mean = sum(per_epoch["expected"]) / len(per_epoch["expected"])
                per_epoch["exact_epochs_needed"] = (math.ceil(THRESHOLD / mean) if mean > 0
                                                    else None)
            row[scope] = per_epoch
        if mode and precision == "fp32":
            row["outside_nucleus"] = sum(e[p]["outside_nucleus"] for e in epochs
                                         for p in ("challenge", "audits"))
        results[name] = row
    return {"margins": margins, "held_out": held_out(seen, engines), "engines": results}


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    started = time.monotonic()
    model_dir, manifest, verifier = evidence_limits.reference(args, work)
    engines = _engines(args, model_dir, work)
    seen = collect(args, engines, verifier, manifest)
    summary = summarise(args, seen, engines)
    for name, row in summary["engines"].items():
        say(f"{name}: margin {row['margin']}, beyond per epoch {row['pooled']['beyond']} of "
            f"{row['pooled']['tokens']}, replay best {row['pooled']['replay_best']}, "
            f"test best {row['pooled']['test_best']}")
    return {"benchmark": "replay_limits", "model": args.model,
            "model_id": manifest.model_id_hex, "verifier": "fp32", "epochs": args.epochs,
            "requests_per_challenge": args.requests, "max_tokens": args.max_tokens,
            "client_shards": args.client_shards, "audit_rate_bps": args.audit_rate_bps,
            "registered_epochs": args.registered_epochs, "draws": args.draws,
            "seed": args.seed, "threshold": round(THRESHOLD, 2),
            "alternatives": list(ALTERNATIVES), "margin_grid": list(MARGINS), **summary,
            "seconds": round(time.monotonic() - started, 1)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from miner.cheats import SAMPLING_MODES
    from verifier.config import VerifierConfig

    committee = VerifierConfig()
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--modes", default="sampled-noise-0.25,sampled-noise-0.5,"
                        "likely-end-0.03,likely-end-0.1,top-k-5,top-k-20",
                        help="comma-separated likely-end-*, sampled-noise-* and top-k-* "
                        "modes of miner.cheats")
    parser.add_argument("--precisions", default="fp32,bf16",
                        help="the precisions the cheats declare (and run in)")
    parser.add_argument("--honest", default=",".join(HONEST),
                        help=f"honest miners among {', '.join(HONEST)}")
    parser.add_argument("--requests", type=int, default=committee.challenge_requests)
    parser.add_argument("--max-tokens", type=int, default=committee.challenge_max_tokens)
    parser.add_argument("--client-shards", type=int, default=32)
    parser.add_argument("--audit-rate-bps", type=int, default=1000)
    parser.add_argument("--registered-epochs", type=int, default=3)
    parser.add_argument("--draws", type=int, default=256,
                        help="noise draws per position for the noise cheats' exact ratio")
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", default="trained",
                        help="trained (testmodels/quarry-pydoc), tiny, or a model directory")
    parser.add_argument("--smoke", action="store_true",
                        help="seconds, tiny sizes: that the script runs, not its figures")
    args = parser.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    args.precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    args.honest = [h.strip() for h in args.honest.split(",") if h.strip()]
    bad = [m for m in args.modes if m not in SAMPLING_MODES
           or not m.startswith(evidence_limits.EXACT_FAMILIES)]
    if bad:
        parser.error(f"not a likely-end, sampled-noise or top-k mode: {', '.join(bad)}")
    if any(p not in ("fp32", "bf16", "fp16") for p in args.precisions):
        parser.error(f"--precisions takes fp32, bf16 and fp16, got {args.precisions}")
    if any(h not in HONEST for h in args.honest):
        parser.error(f"--honest takes {', '.join(HONEST)}, got {args.honest}")
    if args.epochs < 1:
        parser.error(f"--epochs must be at least 1, got {args.epochs}")
    if args.smoke:
        args.model, args.epochs, args.requests, args.max_tokens = "tiny", 1, 2, 8
        args.client_shards, args.draws, args.audit_rate_bps = 1, 8, 10_000
        args.modes, args.precisions = ["likely-end-0.1", "sampled-noise-0.5", "top-k-5"], ["fp32"]
        args.honest = ["fp32", "bf16", "bf16-b1"]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="quarry-replay-limits-") as tmp:
        result = run(args, Path(tmp))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
