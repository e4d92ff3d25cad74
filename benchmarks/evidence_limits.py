"""How much evidence can any test gather against the subtle sampled cheats, and how much does
ours gather?

A cheat that changes sampled tokens only a little (ending where an end was likely, small
logit noise) is caught only once the evidence against it passes log(1e6) = 13.8 nats. No
test can do better on average than the exact likelihood ratio of the cheat's own
distribution against the honest one (its expectation under the cheat is their KL divergence,
the most evidence per token any e-value can expect), so this script measures that ceiling
per epoch beside what `verifier.scoring` gathers, on the trained test model:

- `likely-end-C` (`miner.cheats`): where the nucleus' stop mass s reaches C it ends with the
  likeliest stop token, so its exact ratio is 1 / q(that token) at the cut and 1 elsewhere.
- `sampled-noise-S`: every sampled step draws from the nucleus of (logits + S eps) / T, eps
  standard normal and fresh per step; its distribution is the mean over eps, estimated here
  with `--draws` draws per position. Under top_p < 1 the noisy nucleus is not the honest
  one: a token outside the honest nucleus has honest chance 0 (an infinite ratio), so such
  tokens are counted apart (`outside_nucleus`, and their expected number under the cheat),
  and the ratio and its expectation cover the tokens inside (the test itself judges an
  outside token against the untruncated distribution: rounding at the edge is no cheat).
- `top-k-K`: every sampled step draws from the nucleus of the K most likely tokens' own
  softmax (a subset of the honest nucleus), so its ratio is exact without draws.

Each epoch is what the committee looks at in `benchmarks/detection.py`: one challenge
(`draw_challenge_set`, the committee's 16 requests x 64 tokens) and the miner's audited
client shards (`--client-shards` shards of 4 chat requests of 32 tokens, greedy or sampled
at 0.7 or 1.0, each audited at `verifier.audits.audit_rate` while young). Only sampled
outputs count (the cheats serve greedy ones exactly). Reported per mode and epoch
(challenge alone, and challenge plus audits pooled): the exact ratio's log evidence
(`exact`), its expectation under the cheat given the outputs' prefixes (`expected`: the sum
of the steps' KL divergences, the same number with the sampling luck taken out), the test's
best sampled alternative on the same outputs (`test_best`: `judge`'s own log ratios, before
its mixture over alternatives and kinds costs log 21 + log 3 = 4.1 nats more), and the
epochs the exact ratio needs to reach 13.8 at its expected rate. The honest miner's figures
on its own outputs are beside them.
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

import detection  # noqa: E402

THRESHOLD = math.log(1e6)
EXACT_FAMILIES = ("likely-end-", "sampled-noise-", "top-k-")
"""The cheats whose exact likelihood ratio `exact_log_ratio` computes."""
AUDIT_REQUESTS = 4
AUDIT_MAX_TOKENS = 32


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _nucleus_rows(logits: Any, temperature: float, top_p: float) -> Any:
    """`market.engine.sampling.nucleus_probs` for every row of `logits` [K, V] at once."""
    import torch

    from market.engine.sampling import _nucleus

    probs = torch.softmax(logits.to(torch.float64) / temperature, dim=-1)
    if top_p >= 1.0:
        return probs
    sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    keep = torch.zeros_like(probs, dtype=torch.bool).scatter_(1, order,
                                                             _nucleus(sorted_p, top_p))
    kept = probs * keep
    return kept / kept.sum(-1, keepdim=True)


def exact_log_ratio(mode: str, logits: Any, tokens: tuple[int, ...], temperature: float,
                    top_p: float, stop_ids: frozenset[int], draws: int, gen: Any
                    ) -> tuple[float, float, int, float]:
    """Over one output: (log of the cheat's exact likelihood ratio over the tokens inside
    the honest nucleus, its expectation under the cheat given the prefixes and that they stay
    inside (the steps' KL divergences), tokens outside the honest nucleus, their expected
    number under the cheat). The first is -inf where the cheat could not have returned the
    output; an outside token has an infinite exact ratio, so it is counted, not summed."""
    import torch

    from market.engine.sampling import nucleus_probs

    family, _, value = mode.rpartition("-")
    level = float(value)
    total, expected, outside, outside_mass = 0.0, 0.0, 0, 0.0
    stops = torch.tensor(sorted(stop_ids))
    for row, y in zip(logits, tokens, strict=True):
        q = nucleus_probs(row, temperature, top_p)
        if family == "likely-end":
            if float(q[stops].sum()) >= level:
                best = int(stops[int(torch.argmax(q[stops]))])
                total += -math.log(float(q[best])) if y == best else -math.inf
                expected += -math.log(float(q[best]))
            continue
        if family == "top-k":
            raw = row.float()
            kth = torch.topk(raw, int(level)).values[-1]
            r = _nucleus_rows(raw.masked_fill(raw < kth, float("-inf"))[None], temperature,
                              top_p)[0]
        else:
            noise = torch.randn(draws, row.shape[0], generator=gen, dtype=torch.float64)
            r = _nucleus_rows(row.to(torch.float64)[None] + level * noise, temperature,
                              top_p).mean(0)
        inside = q > 0
        outside_mass += float(r[~inside].sum())
        r_in = r * inside / r[inside].sum()
        if not bool(inside[y]):
            outside += 1
            continue
        total += math.log(float(r_in[y])) - math.log(float(q[y]))
        keep = inside & (r_in > 0)
        expected += float((r_in[keep] * (r_in[keep].log() - q[keep].log())).sum())
    return total, expected, outside, outside_mass


def epoch_requests(args: argparse.Namespace, verifier: Any, manifest: Any, epoch: int,
                   rng: random.Random, audit_rng: random.Random) -> tuple[list[Any], list[Any]]:
    """The sampled requests of one epoch: the challenge's, and the audited client shards'."""
    from market.engine.base import GenerationRequest
    from verifier.challenges import draw_challenge_set

    cs = draw_challenge_set(epoch, manifest.model_id, manifest.name,
                            [detection.miner_address(0)], requests=args.requests,
                            max_tokens=args.max_tokens, rng=rng)
    challenge = [verifier.request_from_line(line) for line in cs.challenges[0].lines]
    rate = detection.epoch_audit_rate(args, epoch)
    audits = []
    for _ in range(args.client_shards):
        if audit_rng.randrange(10_000) >= rate:
            continue
        for _ in range(AUDIT_REQUESTS):
            ask = (f"{audit_rng.choice(detection.CLIENT_PROMPTS)} "
                   f"(ref {audit_rng.randrange(10**6)})")
            audits.append(GenerationRequest(
                verifier.encode_chat([{"role": "user", "content": ask}]), AUDIT_MAX_TOKENS,
                temperature=audit_rng.choice((0.0, 0.7, 1.0)),
                seed=audit_rng.randrange(1 << 63)))
    return ([r for r in challenge if not r.greedy], [r for r in audits if not r.greedy])


def measure(args: argparse.Namespace, mode: str, engines: dict[str, Any], verifier: Any,
            manifest: Any) -> dict[str, Any]:
    """One mode's per-epoch evidence, exact and the test's, for the cheat and the honest."""
    import torch

    from verifier.scoring import GREEDY_EXPONENTS, SAMPLED_WIDTH, judge, score_outputs

    rng, audit_rng = random.Random(args.seed), random.Random(args.seed + 2)
    gen = torch.Generator().manual_seed(args.seed)
    start = len(GREEDY_EXPONENTS)
    out: dict[str, Any] = {who: {"exact": {"challenge": [], "pooled": []},
                                 "expected": {"challenge": [], "pooled": []},
                                 "test_best": {"challenge": [], "pooled": []},
                                 "outputs": 0, "tokens": 0, "nucleus_outputs": 0,
                                 "outside_nucleus": 0, "outside_nucleus_expected": 0.0}
                           for who in ("cheat", "honest")}
    for epoch in range(1, args.epochs + 1):
        challenge, audits = epoch_requests(args, verifier, manifest, epoch, rng, audit_rng)
        for who, engine in (("cheat", engines[mode]), ("honest", engines["honest"])):
            parts: dict[str, tuple[float, float, list[Any]]] = {}
            for part, reqs in (("challenge", challenge), ("audits", audits)):
                outs = engine.generate(reqs) if reqs else []
                exact = expected = 0.0
                for req, o in zip(reqs, outs, strict=True):
                    if not o.token_ids:
                        continue
                    seq = list(req.prompt_ids) + list(o.token_ids)
                    with torch.inference_mode():
                        logits = verifier.model(torch.tensor([seq])).logits[
                            0, len(req.prompt_ids) - 1: len(seq) - 1]
                    value, mean, outside, mass = exact_log_ratio(
                        mode, logits, o.token_ids, req.temperature, req.top_p,
                        verifier.stop_token_ids, args.draws, gen)
                    exact += value
                    expected += mean
                    out[who]["outside_nucleus"] += outside
                    out[who]["outside_nucleus_expected"] += mass
                    out[who]["nucleus_outputs"] += req.top_p < 1.0
                    out[who]["outputs"] += 1
                    out[who]["tokens"] += len(o.token_ids)
                scores = score_outputs(verifier, reqs, [o.token_ids for o in outs],
                                       [o.finish_reason for o in outs]) if reqs else []
                parts[part] = (exact, expected, scores)
            for name, keys in (("challenge", ("challenge",)), ("pooled", ("challenge",
                                                                          "audits"))):
                exact = math.fsum(parts[k][0] for k in keys)
                out[who]["expected"][name].append(round(math.fsum(parts[k][1] for k in keys),
                                                        2))
                scores = [s for k in keys for s in parts[k][2]]
                own = judge(scores).own[start: start + SAMPLED_WIDTH] if scores else (0.0,)
                out[who]["exact"][name].append(round(exact, 2))
                out[who]["test_best"][name].append(round(max(own), 2))
    for who in out.values():
        who["outside_nucleus_expected"] = round(who["outside_nucleus_expected"], 2)
        for kind in ("exact", "expected", "test_best"):
            for name, series in list(who[kind].items()):
                finite = [v for v in series if math.isfinite(v)]
                who[kind][f"{name}_mean_per_epoch"] = (round(sum(finite) / len(finite), 2)
                                                       if finite else None)
        who["exact"]["excluded_epochs"] = sum(not math.isfinite(v)
                                              for v in who["exact"]["pooled"])
    cheat = out["cheat"]["expected"]
    out["epochs_needed_by_the_exact_ratio"] = {  # at its expected rate
        name: (math.ceil(THRESHOLD / cheat[f"{name}_mean_per_epoch"])
               if cheat[f"{name}_mean_per_epoch"] and cheat[f"{name}_mean_per_epoch"] > 0
               else None) for name in ("challenge", "pooled")}
    for who in out.values():  # -inf is not JSON
        if isinstance(who, dict) and "exact" in who:
            for name in ("challenge", "pooled"):
                who["exact"][name] = [v if math.isfinite(v) else None
                                      for v in who["exact"][name]]
    return out


def reference(args: argparse.Namespace, work: Path) -> tuple[Path, Any, Any]:
    """`args.model`'s directory (the tiny one made in `work`), its manifest and the fp32
    verifier's engine, with torch at `args.threads` threads."""
    import torch

    from market.engine.torch_engine import TorchEngine
    from market.model.create import create_model
    from market.model.manifest import load_manifest

    torch.set_num_threads(args.threads)
    if args.model == "tiny":
        model_dir = work / "tiny"
        manifest = create_model(model_dir)
    else:
        model_dir = detection.TRAINED_MODEL if args.model == "trained" else Path(args.model)
        manifest = load_manifest(model_dir)
    return model_dir, manifest, TorchEngine(model_dir, precision="fp32", device="cpu")


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from market.engine.torch_engine import TorchEngine
    from miner.cheats import cheating_engine

    started = time.monotonic()
    model_dir, manifest, verifier = reference(args, work)
    engines: dict[str, Any] = {"honest": TorchEngine(model_dir, precision="fp32",
                                                     device="cpu")}
    modes: dict[str, Any] = {}
    for mode in args.modes:
        engines[mode] = cheating_engine(mode, TorchEngine(model_dir, precision="fp32",
                                                          device="cpu"),
                                        model_dir, seed=0, cache_dir=work / "cheat-models")
        modes[mode] = measure(args, mode, engines, verifier, manifest)
        say(f"{mode}: exact ratio per epoch {modes[mode]['cheat']['exact']}, the test's "
            f"best alternative {modes[mode]['cheat']['test_best']}, exact ratio needs "
            f"{modes[mode]['epochs_needed_by_the_exact_ratio']} epochs")
    return {"benchmark": "evidence_limits", "model": args.model,
            "model_id": manifest.model_id_hex, "epochs": args.epochs,
            "requests_per_challenge": args.requests, "max_tokens": args.max_tokens,
            "client_shards": args.client_shards, "audit_rate_bps": args.audit_rate_bps,
            "registered_epochs": args.registered_epochs, "draws": args.draws,
            "seed": args.seed, "threshold": round(THRESHOLD, 2), "modes": modes,
            "seconds": round(time.monotonic() - started, 1)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from miner.cheats import SAMPLING_MODES
    from verifier.config import VerifierConfig

    committee = VerifierConfig()
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3, help="epochs (3: the target)")
    parser.add_argument("--modes", default="likely-end-0.1,sampled-noise-0.25,"
                        "sampled-noise-0.5", help="comma-separated likely-end-*, "
                        "sampled-noise-* and top-k-* modes of miner.cheats")
    parser.add_argument("--requests", type=int, default=committee.challenge_requests)
    parser.add_argument("--max-tokens", type=int, default=committee.challenge_max_tokens)
    parser.add_argument("--client-shards", type=int, default=32,
                        help="client shards per epoch, as in detection.py (32)")
    parser.add_argument("--audit-rate-bps", type=int, default=1000)
    parser.add_argument("--registered-epochs", type=int, default=3,
                        help="epochs registered before the run (3: young, audited at 34%%)")
    parser.add_argument("--draws", type=int, default=256,
                        help="noise draws per position for the noise cheats' distribution")
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", default="trained",
                        help="trained (testmodels/quarry-pydoc), tiny, or a model directory")
    parser.add_argument("--smoke", action="store_true",
                        help="seconds, tiny sizes: that the script runs, not its figures")
    args = parser.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in args.modes if m not in SAMPLING_MODES
           or not m.startswith(EXACT_FAMILIES)]
    if bad:
        parser.error(f"not a likely-end, sampled-noise or top-k mode: {', '.join(bad)}")
    if args.smoke:
        args.epochs, args.requests, args.max_tokens, args.client_shards = 1, 2, 8, 1
        args.draws, args.audit_rate_bps = 8, 10_000
        args.modes = ["likely-end-0.1", "sampled-noise-0.5"]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="quarry-evidence-limits-") as tmp:
        result = run(args, Path(tmp))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
