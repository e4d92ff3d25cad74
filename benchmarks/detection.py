"""How fast does the committee's scoring and reputation catch cheating miners, and does it ever
flag an honest one?

Creates the embedded tiny model, loads one engine per miner (honest ones, and one per
declared cheating mode of `miner.cheats`) and the verifier's own reference engine, then runs
`--epochs` epochs. Each epoch every miner gets its own challenge, drawn exactly as the
committee draws it (`verifier.challenges.draw_challenge_set`: distinct corpus prompts,
half greedy and half sampled), answers it with its engine, and the verifier scores the
answers with `verifier.scoring.score_outputs`. Challenges have the committee's default size
(`VerifierConfig`: 16 requests x 64 tokens, set from this benchmark: with 4 x 32 the
`perturb` cheat's epoch scores overlap honest ones, since the noise of honest sampled
answers dominates, so no threshold separates them).
The epoch score (mean, in bps) then drives `verifier.reputation.update` from the initial
reputation, for each of the three penalty levels, with the other constants at their
`ReputationParams` defaults.

Reported (JSON, last line; also written to benchmarks/out/detection.json with a PNG of the
reputation trajectories beside it): per level, `max_epochs_to_untrusted` over the cheating
modes (target <= 3) and `honest_false_positive_epochs` (epochs in which an honest miner's
epoch score was abnormal or its reputation untrusted; target 0); per-mode trajectories and
mean scores; and the margins that justify the thresholds: the lowest honest epoch score and
the highest cheating one against `abnormal_below_bps`.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
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
    fig.suptitle(f"Reputation of honest and cheating miners (alpha {params['alpha']}, "
                 f"abnormal below {params['abnormal_below_bps']} bps)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import torch

    from market.engine.torch_engine import TorchEngine
    from market.model.create import create_model
    from miner.cheats import CHEAT_MODES, cheating_engine
    from verifier.challenges import SAMPLED_TEMPERATURE, draw_challenge_set
    from verifier.reputation import PENALTY_LEVELS, MinerRecord, ReputationParams, update
    from verifier.scoring import mean_score, score_bps, score_outputs

    torch.set_num_threads(args.threads)
    started = time.monotonic()
    model_dir = work / "tiny"
    manifest = create_model(model_dir)
    verifier = TorchEngine(model_dir)
    honest_engine = TorchEngine(model_dir)
    labels = [f"honest-{i + 1}" for i in range(args.honest)] + list(CHEAT_MODES)
    engines: dict[str, Any] = {f"honest-{i + 1}": honest_engine for i in range(args.honest)}
    for mode in CHEAT_MODES:
        engines[mode] = cheating_engine(mode, TorchEngine(model_dir), model_dir, seed=0,
                                        cache_dir=work / "cheat-models")
    addresses = {miner_address(i): label for i, label in enumerate(labels)}
    say(f"loaded {len(labels)} miners and the verifier in {time.monotonic() - started:.1f}s")

    defaults = ReputationParams()
    params = {level: defaults.with_penalty(level) for level in PENALTY_LEVELS}
    records = {level: {label: MinerRecord.initial(p) for label in labels}
               for level, p in params.items()}
    trajectories: dict[str, dict[str, list[int]]] = {
        level: {label: [p.initial_bps] for label in labels} for level, p in params.items()}
    epoch_bps: dict[str, list[int]] = {label: [] for label in labels}
    request_scores: dict[str, dict[str, list[float]]] = {
        label: {"greedy": [], "sampled": []} for label in labels}
    rng = random.Random(args.seed)
    for epoch in range(1, args.epochs + 1):
        t0 = time.monotonic()
        cs = draw_challenge_set(epoch, manifest.model_id, manifest.name, list(addresses),
                                requests=args.requests, max_tokens=args.max_tokens, rng=rng)
        all_requests, all_outputs, owners = [], [], []
        for challenge in cs.challenges:
            label = addresses[challenge.miner]
            engine = engines[label]
            reqs = [engine.request_from_line(line) for line in challenge.lines]
            outputs = engine.generate(reqs)
            all_requests += [verifier.request_from_line(line) for line in challenge.lines]
            all_outputs += [o.token_ids for o in outputs]
            owners += [label] * len(reqs)
        scores = score_outputs(verifier, all_requests, all_outputs,
                               reference_samples=args.reference_samples)
        for label in labels:
            mine = [(r, s) for r, s, o in zip(all_requests, scores, owners, strict=True)
                    if o == label]
            for r, s in mine:
                request_scores[label]["greedy" if r.greedy else "sampled"].append(s.score)
            bps = score_bps(mean_score([s for _, s in mine]))
            epoch_bps[label].append(bps)
            for level, p in params.items():
                records[level][label] = update(records[level][label], bps, p)
                trajectories[level][label].append(records[level][label].reputation_bps)
        say(f"epoch {epoch}: " + ", ".join(f"{k} {v[-1]}" for k, v in epoch_bps.items())
            + f" ({time.monotonic() - t0:.1f}s)")

    honest = [label for label in labels if label.startswith("honest")]
    levels: dict[str, Any] = {}
    for level, p in params.items():
        traj = trajectories[level]
        to_untrusted = {m: epochs_to(traj[m][1:], p.untrusted_below_bps) for m in CHEAT_MODES}
        false_pos = sum(
            1 for m in honest for t in range(args.epochs)
            if epoch_bps[m][t] < p.abnormal_below_bps or traj[m][t + 1] < p.untrusted_below_bps)
        known = [v for v in to_untrusted.values() if v is not None]
        levels[level] = {
            "rate": p.rate,
            "max_epochs_to_untrusted": (max(known) if len(known) == len(to_untrusted)
                                        else None),
            "epochs_to_untrusted": to_untrusted,
            "epochs_to_below_2000": {m: epochs_to(traj[m][1:], 2000) for m in CHEAT_MODES},
            "epochs_to_below_1000": {m: epochs_to(traj[m][1:], 1000) for m in CHEAT_MODES},
            "honest_false_positive_epochs": false_pos,
            "honest_min_reputation_bps": min(min(traj[m][1:]) for m in honest),
            "trajectories": traj,
        }
    # How the choice of alpha and penalty rate would have fared on the same epoch scores.
    sweep = []
    for alpha in SWEEP_ALPHAS:
        for rate in SWEEP_RATES:
            p = replace(defaults, alpha=alpha, penalty_rates=(0.0, rate, 1.0))
            worst = []
            for m in CHEAT_MODES:
                record, traj = MinerRecord.initial(p), []
                for bps in epoch_bps[m]:
                    record = update(record, bps, p)
                    traj.append(record.reputation_bps)
                worst.append(epochs_to(traj, p.untrusted_below_bps))
            sweep.append({"alpha": alpha, "rate": rate, "max_epochs_to_untrusted":
                          None if None in worst else max(w for w in worst if w is not None)})
    default = levels[defaults.penalty]
    honest_epochs = [b for m in honest for b in epoch_bps[m]]
    cheat_max = {m: max(epoch_bps[m]) for m in CHEAT_MODES}

    def mean(xs: list[float]) -> float | None:
        return round(statistics.fmean(xs), 4) if xs else None

    return {
        "benchmark": "detection",
        "model_id": manifest.model_id_hex,
        "threads": torch.get_num_threads(),
        "epochs": args.epochs,
        "miners": labels,
        "requests_per_challenge": args.requests,
        "max_tokens": args.max_tokens,
        "sampled_temperature": SAMPLED_TEMPERATURE,
        "reference_samples": args.reference_samples,
        "seed": args.seed,
        "params": {k: (list(v) if isinstance(v, tuple) else v)
                   for k, v in asdict(defaults).items()},
        "default_level": defaults.penalty,
        "max_epochs_to_untrusted": default["max_epochs_to_untrusted"],
        "honest_false_positive_epochs": default["honest_false_positive_epochs"],
        "target_max_epochs_to_untrusted": TARGET_EPOCHS_TO_UNTRUSTED,
        "target_honest_false_positive_epochs": TARGET_HONEST_FALSE_POSITIVES,
        "targets_met": {
            level: (d["max_epochs_to_untrusted"] is not None
                    and d["max_epochs_to_untrusted"] <= TARGET_EPOCHS_TO_UNTRUSTED
                    and d["honest_false_positive_epochs"] <= TARGET_HONEST_FALSE_POSITIVES)
            for level, d in levels.items()},
        "honest_min_epoch_bps": min(honest_epochs),
        "cheat_max_epoch_bps": cheat_max,
        "honest_margin_bps": min(honest_epochs) - defaults.abnormal_below_bps,
        "cheat_margin_bps": defaults.abnormal_below_bps - max(cheat_max.values()),
        "mean_score": {m: mean(request_scores[m]["greedy"] + request_scores[m]["sampled"])
                       for m in labels},
        "mean_score_greedy": {m: mean(request_scores[m]["greedy"]) for m in labels},
        "mean_score_sampled": {m: mean(request_scores[m]["sampled"]) for m in labels},
        "epoch_scores_bps": epoch_bps,
        "levels": levels,
        "alpha_rate_sweep": sweep,
        "seconds": round(time.monotonic() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    from verifier.config import VerifierConfig

    committee = VerifierConfig()
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=12, help="epochs (12)")
    parser.add_argument("--honest", type=int, default=2, help="honest miners (2)")
    parser.add_argument("--requests", type=int, default=committee.challenge_requests,
                        help="requests per challenge (the committee's default, "
                        f"{committee.challenge_requests})")
    parser.add_argument("--max-tokens", type=int, default=committee.challenge_max_tokens,
                        help="max_tokens per request (the committee's default, "
                        f"{committee.challenge_max_tokens})")
    parser.add_argument("--reference-samples", type=int, default=3,
                        help="verifier samples per sampled request (3)")
    parser.add_argument("--seed", type=int, default=2024, help="challenge-drawing seed (2024)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="JSON result file; the PNG goes beside it")
    args = parser.parse_args(argv)
    for name in ("epochs", "honest", "requests", "max_tokens", "reference_samples", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")

    with tempfile.TemporaryDirectory(prefix="quarry-detection-") as tmp:
        result = run(args, Path(tmp))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    png = args.out.with_suffix(".png")
    plot(png, result)
    result["plot"] = str(png.relative_to(ROOT) if png.is_relative_to(ROOT) else png)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for level, d in result["levels"].items():
        say(f"{level}: epochs to untrusted {d['epochs_to_untrusted']}, honest false positives "
            f"{d['honest_false_positive_epochs']}")
    say(f"honest min epoch {result['honest_min_epoch_bps']} bps, cheat max epoch "
        f"{result['cheat_max_epoch_bps']} (abnormal below "
        f"{result['params']['abnormal_below_bps']})")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
