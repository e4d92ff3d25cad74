"""How fast does the committee's scoring and reputation catch cheating miners, and does it ever
flag an honest one?

Creates the embedded tiny model, loads one engine per miner (honest ones, and one per
declared cheating mode of `miner.cheats`) and the verifier's own reference engine, then runs
`--epochs` epochs. Each epoch every miner gets its own challenge, drawn exactly as the
committee draws it (`verifier.challenges.draw_challenge_set`: private prompts, shapes drawn
like client jobs,
half greedy and half sampled), answers it with its engine, and the verifier scores the
answers with `verifier.scoring.score_outputs` (at the miners' declared `--precision`, with
their activation commitments unless `--no-commitments`) and `judge` (greedy, sampled and
commitment evidence; the miner's evidence so far is carried in floored at 0, the
committee's CUSUM e-detector). Challenges have the committee's default
size (`VerifierConfig`: 16 requests x 64 tokens). Every mode of `miner.cheats` runs: the
crude ones (another model, noisy weights, random tokens, another prompt) and the rational
ones (greedy answers to sampled requests, a colder temperature, small logit noise,
truncation) and the selective one (honest on challenges, a cheaper model on client
traffic). Each epoch every miner also serves `--client-shards` client shards (default 32,
of 4 chat requests each, greedy or sampled at 0.7 or 1.0: the stated share of client
traffic); each is audited with probability `--audit-rate-bps` (the committee's default,
1000), and an audited shard that fails `judge` is a fault, which (as in the committee's
reports) puts the miner under the untrusted line in the next epoch's update. Only audited
shards are generated: the others are never looked at, so they cannot change anything.
The epoch score (10000 passed, 0 failed; a failed challenge is a fault at once, and its
dispute one more the next epoch, like an audit's) then drives
`verifier.reputation.update` from the initial reputation, for each of the three penalty
levels, with the other constants at their `ReputationParams` defaults.

Then the false-fault measurement: `--honest-outputs` honest outputs (default 20,000), a
quarter each greedy and sampled at temperatures 0.5, 0.8 and 1.0, of random corpus
prompts, are judged one at a time (the strictest use: a dispute over a one-output shard)
and `honest_outputs_at_fault` counts those found at fault (target 0; the stated model
bounds the rate by 1e-6).

Reported (JSON, last line; also written to benchmarks/out/detection.json with a PNG of the
reputation trajectories beside it): per level, `max_epochs_to_untrusted` over the cheating
modes (target <= 3) and `honest_false_positive_epochs` (epochs in which an honest miner's
epoch score was abnormal or its reputation untrusted; target 0); per-mode trajectories and
the evidence per mode (greedy mismatches, the largest and smallest log evidence of honest
and cheating epochs against the threshold log(1e6) = 13.8).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TRAINED_MODEL = ROOT / "testmodels" / "quarry-pydoc"
DEFAULT_OUT = ROOT / "benchmarks" / "out" / "detection.json"
TARGET_EPOCHS_TO_UNTRUSTED = 3
SWEEP_ALPHAS = (0.5, 0.6, 0.7, 0.8)
SWEEP_RATES = (0.3, 0.4, 0.5, 0.6, 0.7)
TARGET_HONEST_FALSE_POSITIVES = 0


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def miner_address(i: int) -> str:
    from eth_utils import to_checksum_address

    return to_checksum_address(f"0x{i + 1:040x}")


def commitment(args: argparse.Namespace, output: Any) -> bytes:
    """The output's activation commitment, or none when the run checks statistics only."""
    return output.commitment if args.commitments else b""


def epochs_to(trajectory: list[int], below: int) -> int | None:
    """The first epoch (1-based) whose reputation is under `below`, or None."""
    return next((t + 1 for t, r in enumerate(trajectory) if r < below), None)


def plot(path: Path, result: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = result["levels"]
    fig, axes = plt.subplots(1, len(levels), figsize=(5 * len(levels), 4), sharey=True)
    params = result["params"]
    for ax, (level, data) in zip(axes, levels.items(), strict=True):
        for label, traj in data["trajectories"].items():
            style = "-" if label.startswith("honest") else "--"
            ax.plot(range(len(traj)), traj, style, marker="o", markersize=3, label=label)
        ax.axhline(params["untrusted_below_bps"], color="red", linewidth=0.8,
                   label="untrusted below")
        ax.set_title(f"{level} (rate {data['rate']})"
                     + (" - default" if level == params["penalty"] else ""))
        ax.set_xlabel("epoch")
        ax.set_ylim(0, 10000)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("reputation (bps)")
    axes[-1].legend(fontsize=7, loc="center right")
    fig.suptitle(f"Reputation of honest and cheating miners (alpha {params['alpha']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import torch

    from market.engine.torch_engine import TorchEngine
    from market.model.create import create_model
    from market.model.manifest import load_manifest
    from miner.cheats import CHEAT_MODES, SELECTIVE_MODES, cheating_engine
    from verifier.challenges import SAMPLED_TEMPERATURE, draw_challenge_set
    from verifier.reputation import PENALTY_LEVELS, MinerRecord, ReputationParams, update
    from verifier.scoring import judge, score_outputs

    torch.set_num_threads(args.threads)
    started = time.monotonic()
    if args.model == "tiny":
        model_dir = work / "tiny"
        manifest = create_model(model_dir)
    else:
        model_dir = TRAINED_MODEL if args.model == "trained" else Path(args.model)
        manifest = load_manifest(model_dir)
    verifier = TorchEngine(model_dir, precision="fp32", device="cpu")
    miner_options = {"precision": args.precision, "device": "cpu"}
    honest_engine = TorchEngine(model_dir, **miner_options)
    modes = [m for m in CHEAT_MODES if m in args.modes]
    labels = [f"honest-{i + 1}" for i in range(args.honest)] + modes
    engines: dict[str, Any] = {f"honest-{i + 1}": honest_engine for i in range(args.honest)}
    for mode in modes:
        engines[mode] = cheating_engine(mode, TorchEngine(model_dir, **miner_options),
                                        model_dir, seed=0, cache_dir=work / "cheat-models")
    addresses = {miner_address(i): label for i, label in enumerate(labels)}
    say(f"loaded {len(labels)} miners and the verifier in {time.monotonic() - started:.1f}s")

    defaults = ReputationParams()
    params = {level: defaults.with_penalty(level) for level in PENALTY_LEVELS}
    records = {level: {label: MinerRecord.initial(p) for label in labels}
               for level, p in params.items()}
    trajectories: dict[str, dict[str, list[int]]] = {
        level: {label: [p.initial_bps] for label in labels} for level, p in params.items()}
    epoch_bps: dict[str, list[int]] = {label: [] for label in labels}
    evidence: dict[str, list[float]] = {label: [] for label in labels}
    mismatches: dict[str, list[int]] = {label: [] for label in labels}
    failed_chunks: dict[str, list[int]] = {label: [] for label in labels}
    audits = {label: {"audited": 0, "failed": 0} for label in labels}
    faulted: set[str] = set()  # found at fault by an audit in the previous epoch
    carry: dict[str, tuple[float, ...]] = {}  # each miner's evidence so far (floored at 0)
    rng = random.Random(args.seed)
    audit_rng = random.Random(args.seed + 2)
    for epoch in range(1, args.epochs + 1):
        t0 = time.monotonic()
        cs = draw_challenge_set(epoch, manifest.model_id, manifest.name, list(addresses),
                                requests=args.requests, max_tokens=args.max_tokens, rng=rng)
        all_requests, all_outputs, all_finish, owners, all_commits = [], [], [], [], []
        for challenge in cs.challenges:
            label = addresses[challenge.miner]
            # The selective cheater is given a perfect oracle: it answers every challenge
            # honestly, as if it read the tells that remain on-chain (a fresh, freshly
            # funded client, a directed task). Only audits can catch it.
            engine = honest_engine if label in SELECTIVE_MODES else engines[label]
            reqs = [engine.request_from_line(line) for line in challenge.lines]
            outputs = engine.generate(reqs)
            all_requests += [verifier.request_from_line(line) for line in challenge.lines]
            all_outputs += [o.token_ids for o in outputs]
            all_finish += [o.finish_reason for o in outputs]
            all_commits += [commitment(args, o) for o in outputs]
            owners += [label] * len(reqs)
        scores = score_outputs(verifier, all_requests, all_outputs, all_finish,
                               precision=args.precision, commitments=all_commits)
        faults_now = audit_client_traffic(args, engines, verifier, labels, audit_rng, audits)
        for label in labels:
            verdict = judge([s for s, o in zip(scores, owners, strict=True) if o == label],
                            prior=carry.pop(label, ()))  # as the committee carries it
            if verdict.passed:
                carry[label] = verdict.carry
            score = 0 if label in faulted else verdict.score_bps
            epoch_bps[label].append(score)
            # A failed challenge is a fault in this epoch's report, and its dispute, resolved
            # at fault, is one in the next; an audit's dispute counts in the next.
            fault = label in faulted or not verdict.passed
            if not verdict.passed:
                faults_now.add(label)
            evidence[label].append(round(verdict.log_evidence, 2))
            mismatches[label].append(verdict.mismatches + verdict.impossible)
            failed_chunks[label].append(verdict.failed_chunks)
            for level, p in params.items():
                records[level][label] = update(records[level][label], score, p,
                                               fault=fault)
                trajectories[level][label].append(records[level][label].reputation_bps)
        faulted = faults_now
        say(f"epoch {epoch}: " + ", ".join(f"{k} {v[-1]}" for k, v in epoch_bps.items())
            + f" ({time.monotonic() - t0:.1f}s)")

    honest = [label for label in labels if label.startswith("honest")]
    levels: dict[str, Any] = {}
    for level, p in params.items():
        traj = trajectories[level]
        to_untrusted = {m: epochs_to(traj[m][1:], p.untrusted_below_bps) for m in modes}
        false_pos = sum(
            1 for m in honest for t in range(args.epochs)
            if epoch_bps[m][t] < p.abnormal_below_bps or traj[m][t + 1] < p.untrusted_below_bps)
        known = [v for v in to_untrusted.values() if v is not None]
        levels[level] = {
            "rate": p.rate,
            "max_epochs_to_untrusted": (max(known) if len(known) == len(to_untrusted)
                                        else None),
            "epochs_to_untrusted": to_untrusted,
            "epochs_to_below_2000": {m: epochs_to(traj[m][1:], 2000) for m in modes},
            "honest_false_positive_epochs": false_pos,
            "honest_min_reputation_bps": min(min(traj[m][1:]) for m in honest),
            "trajectories": traj,
        }
    default = levels[defaults.penalty]
    t0 = time.monotonic()
    false_faults = honest_outputs_at_fault(args, verifier, honest_engine)
    say(f"{args.honest_outputs} honest outputs judged one by one in "
        f"{time.monotonic() - t0:.0f}s: {false_faults['at_fault']} at fault")
    return {
        "benchmark": "detection",
        "model": args.model,
        "model_id": manifest.model_id_hex,
        "precision": args.precision,
        "commitments": args.commitments,
        "threads": torch.get_num_threads(),
        "epochs": args.epochs,
        "miners": labels,
        "requests_per_challenge": args.requests,
        "max_tokens": args.max_tokens,
        "sampled_temperature": SAMPLED_TEMPERATURE,
        "seed": args.seed,
        "params": {k: (list(v) if isinstance(v, tuple) else v)
                   for k, v in asdict(defaults).items()},
        "default_level": defaults.penalty,
        "max_epochs_to_untrusted": default["max_epochs_to_untrusted"],
        "honest_false_positive_epochs": default["honest_false_positive_epochs"],
        "honest_epochs": args.epochs * args.honest,
        "honest_outputs_at_fault": false_faults["at_fault"],
        "honest_outputs": false_faults,
        "target_max_epochs_to_untrusted": TARGET_EPOCHS_TO_UNTRUSTED,
        "target_honest_false_positive_epochs": TARGET_HONEST_FALSE_POSITIVES,
        "targets_met": {
            level: (d["max_epochs_to_untrusted"] is not None
                    and d["max_epochs_to_untrusted"] <= TARGET_EPOCHS_TO_UNTRUSTED
                    and d["honest_false_positive_epochs"] <= TARGET_HONEST_FALSE_POSITIVES
                    and false_faults["at_fault"] == 0)
            for level, d in levels.items()},
        "log_evidence_threshold": round(math.log(1e6), 2),
        "honest_max_log_evidence": max(max(evidence[m]) for m in honest),
        "cheat_min_log_evidence": {m: min(evidence[m]) for m in modes},
        "epoch_log_evidence": evidence,
        "epoch_mismatches": mismatches,
        "epoch_failed_chunks": failed_chunks,
        "epoch_scores_bps": epoch_bps,
        "client_shards_per_epoch": args.client_shards,
        "audit_rate_bps": args.audit_rate_bps,
        "audits": audits,
        "selective_detection_probability_per_epoch": round(
            1 - (1 - args.audit_rate_bps / 10_000) ** args.client_shards, 4),
        "levels": levels,
        "seconds": round(time.monotonic() - started, 1),
    }


CLIENT_PROMPTS = (
    "Summarise the attached meeting notes in three bullet points",
    "Draft a polite reminder about the unpaid invoice",
    "Translate this product description into plain English",
    "Write a short cover letter for a junior analyst role",
    "Classify this support ticket as billing, bug or question",
    "Suggest five names for a neighbourhood bakery",
    "Explain the difference between a loan and a lease",
    "Rewrite this paragraph so a child can follow it",
)


def audit_client_traffic(args: argparse.Namespace, engines: dict[str, Any], verifier: Any,
                         labels: list[str], rng: random.Random,
                         audits: dict[str, dict[str, int]]) -> set[str]:
    """One epoch of client traffic per miner, each shard audited with the audit rate;
    returns the miners an audit found at fault."""
    from market.engine.base import GenerationRequest
    from verifier.scoring import judge, score_outputs

    faults = set()
    for label in labels:
        for _ in range(args.client_shards):
            if rng.randrange(10_000) >= args.audit_rate_bps:
                continue  # not audited: nobody ever looks at it
            asks = [f"{rng.choice(CLIENT_PROMPTS)} (ref {rng.randrange(10**6)})"
                    for _ in range(4)]
            reqs = [GenerationRequest(verifier.encode_chat([{"role": "user", "content": a}]),
                                      32, temperature=rng.choice((0.0, 0.7, 1.0)),
                                      seed=rng.randrange(1 << 63)) for a in asks]
            outs = engines[label].generate(reqs)
            verdict = judge(score_outputs(verifier, reqs, [o.token_ids for o in outs],
                                          [o.finish_reason for o in outs],
                                          precision=args.precision,
                                          commitments=[commitment(args, o) for o in outs]))
            audits[label]["audited"] += 1
            if not verdict.passed:
                audits[label]["failed"] += 1
                faults.add(label)
    return faults


def honest_outputs_at_fault(args: argparse.Namespace, verifier: Any, honest: Any
                            ) -> dict[str, Any]:
    """Judge `args.honest_outputs` honest outputs one at a time (each alone is a shard);
    a quarter greedy, a quarter each sampled at 0.5, 0.8 and 1.0."""
    from market.engine.base import GenerationRequest
    from market.model.corpus import CORPUS
    from verifier.scoring import judge, score_outputs

    text = CORPUS
    rng = random.Random(args.seed + 1)
    temperatures = (0.0, 0.5, 0.8, 1.0)
    counts = {str(t): 0 for t in temperatures}
    at_fault = {str(t): 0 for t in temperatures}
    worst = {str(t): -math.inf for t in temperatures}
    batch = 256
    for start in range(0, args.honest_outputs, batch):
        reqs = []
        for k in range(start, min(start + batch, args.honest_outputs)):
            at = rng.randrange(len(text) - 200)
            prompt = honest.encode_prompt(text[at: at + rng.randrange(20, 200)])
            reqs.append(GenerationRequest(prompt, args.fault_max_tokens,
                                          temperature=temperatures[k % 4],
                                          seed=rng.randrange(1 << 63)))
        outs = honest.generate(reqs)
        scores = score_outputs(verifier, reqs, [o.token_ids for o in outs],
                               [o.finish_reason for o in outs], precision=args.precision,
                               commitments=[commitment(args, o) for o in outs])
        for r, s in zip(reqs, scores, strict=True):
            key = str(r.temperature)
            verdict = judge([s])
            counts[key] += 1
            at_fault[key] += not verdict.passed
            worst[key] = max(worst[key], verdict.log_evidence)
    return {"outputs": args.honest_outputs, "max_tokens": args.fault_max_tokens,
            "at_fault": sum(at_fault.values()), "by_temperature": counts,
            "at_fault_by_temperature": at_fault,
            "max_log_evidence_by_temperature": {k: round(v, 2) for k, v in worst.items()}}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The benchmark's options (also how `numerics.py` runs it on the trained model)."""
    from miner.cheats import CHEAT_MODES
    from verifier.config import VerifierConfig

    committee = VerifierConfig()
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=12, help="epochs (12)")
    parser.add_argument("--honest", type=int, default=5,
                        help="honest miners (5: 60 honest epochs over 12)")
    parser.add_argument("--requests", type=int, default=committee.challenge_requests,
                        help="requests per challenge (the committee's default, "
                        f"{committee.challenge_requests})")
    parser.add_argument("--max-tokens", type=int, default=committee.challenge_max_tokens,
                        help="max_tokens per request (the committee's default, "
                        f"{committee.challenge_max_tokens})")
    parser.add_argument("--client-shards", type=int, default=32,
                        help="client shards per miner per epoch (32 of 4 requests)")
    parser.add_argument("--audit-rate-bps", type=int, default=1000,
                        help="share of client shards audited (the committee's default, 1000)")
    parser.add_argument("--honest-outputs", type=int, default=20_000,
                        help="honest outputs judged one by one for the false-fault rate "
                        "(20000)")
    parser.add_argument("--fault-max-tokens", type=int, default=32,
                        help="max_tokens of those outputs (32)")
    parser.add_argument("--seed", type=int, default=2024, help="challenge-drawing seed (2024)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1)")
    parser.add_argument("--model", default="tiny",
                        help="tiny (the embedded model, made afresh), trained "
                        "(testmodels/quarry-pydoc) or a model directory (tiny)")
    parser.add_argument("--precision", default="fp32",
                        help="every miner's declared precision, which the honest ones and "
                        "the cheats' honest parts compute in (fp32)")
    parser.add_argument("--no-commitments", dest="commitments", action="store_false",
                        help="drop the miners' activation commitments: statistics only")
    parser.add_argument("--modes", default=",".join(CHEAT_MODES),
                        help="comma-separated cheating modes (all)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="JSON result file; the PNG goes beside it")
    parser.add_argument("--smoke", action="store_true",
                        help="seconds, at tiny sizes, results in a temporary directory: that "
                        "the script runs (make test), not its figures")
    args = parser.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(args.modes) - set(CHEAT_MODES))
    if unknown:
        parser.error(f"unknown mode(s) {', '.join(unknown)}; modes: {', '.join(CHEAT_MODES)}")
    if args.smoke:
        args.epochs, args.honest, args.requests, args.max_tokens = 1, 1, 2, 4
        args.client_shards, args.honest_outputs, args.fault_max_tokens = 1, 4, 4
    for name in ("epochs", "honest", "requests", "max_tokens", "honest_outputs",
                 "fault_max_tokens", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="quarry-detection-") as tmp:
        result = run(args, Path(tmp))
        if args.smoke:
            args.out = Path(tmp) / "smoke" / "detection.json"
            return _report(args, result)
    return _report(args, result)


def _report(args: argparse.Namespace, result: dict[str, Any]) -> int:
    """Write the JSON and the plot, say the headline, print the JSON last."""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    png = args.out.with_suffix(".png")
    plot(png, result)
    result["plot"] = str(png.relative_to(ROOT) if png.is_relative_to(ROOT) else png)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for level, d in result["levels"].items():
        say(f"{level}: epochs to untrusted {d['epochs_to_untrusted']}, honest false positives "
            f"{d['honest_false_positive_epochs']}")
    say(f"honest max log evidence {result['honest_max_log_evidence']}, cheats' min "
        f"{result['cheat_min_log_evidence']} (threshold {result['log_evidence_threshold']}); "
        f"honest outputs at fault: {result['honest_outputs_at_fault']} of "
        f"{result['honest_outputs']['outputs']}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
