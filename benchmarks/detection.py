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
traffic), plus the selective families `selective-F%` (`--selective-fractions`, default 1%, 5%
and 20%): honest on every challenge and on all but a fraction F of their client shards,
where they serve the substitute model (a saving of about half a shard's budget). Every
selective miner is given a perfect challenge recogniser, the worst case for us: a
recogniser that uses everything public on-chain (the challenge client's funding trail, its
task's shape) is assumed to recognise every challenge and answer it honestly, so only audits
catch it. Each epoch every miner also serves `--client-shards` client shards (default 32,
of 4 chat requests each, greedy or sampled at 0.7 or 1.0, top_p drawn as challenges draw
it: the stated share of client traffic); each is audited at the rate of
`verifier.audits.audit_rate` (base `--audit-rate-bps`, the committee's default 1000,
each shard counting `YOUNG_WEIGHT` = 4 times while the miner is young: it registered
`--registered-epochs` before the run, its probation), and an audited shard that fails
`judge` is a fault, which (as in the committee's reports) puts the miner under the
untrusted line in the next epoch's update.
Every audited shard, passed or failed, also joins its miner's evidence in the next epoch's
`judge` call, as the committee pools the audited shards submitted during the epoch before
each report (`--no-pool-audits`: judged alone only, the comparison). Only audited shards
are generated: the others are never looked at, so they cannot change anything. For each
selective family the result also
gives the detection arithmetic (per epoch 1 - (1 - a F)^N; a year of public epochs) and, per
cheated shard, the expected loss a (B + C + lost probation income) against the gain
`--cheat-saving` B, with the untrusted burn that is escapable by leaving before a second
untrusted report shown apart.
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
TARGET_FRACTION = 0.05
"""The selective families at or above this fraction are held to `TARGET_EPOCHS_TO_UNTRUSTED`;
below it, to an expected loss per cheated shard above its gain."""
PUBLIC_EPOCHS_PER_YEAR = 365 * 24  # public epochs last an hour (PUBLIC_CHAIN_PARAMS)


def family_label(fraction: float) -> str:
    return f"selective-{fraction * 100:g}%"


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

    from market.engine.threads import set_threads  # engines loaded later keep it
    from market.engine.torch_engine import TorchEngine
    from market.model.create import create_model
    from market.model.manifest import load_manifest
    from miner.cheats import CHEAT_MODES, SELECTIVE_MODES, cheating_engine
    from verifier.challenges import SAMPLED_TEMPERATURE, draw_challenge_set
    from verifier.reputation import PENALTY_LEVELS, MinerRecord, ReputationParams, update
    from verifier.scoring import judge, score_outputs

    set_threads(args.threads)
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
    engines: dict[str, Any] = {f"honest-{i + 1}": honest_engine for i in range(args.honest)}
    for mode in modes:
        engines[mode] = cheating_engine(mode, TorchEngine(model_dir, **miner_options),
                                        model_dir, seed=0, cache_dir=work / "cheat-models")
    # The selective families cheat with the selective engine (the substitute, on client
    # prompts) on a fraction of their client shards, and are honest on the rest.
    fractions = {family_label(f): f for f in args.selective_fractions} \
        if "selective" in modes else {}
    for label in fractions:
        engines[label] = engines["selective"]
    modes += list(fractions)
    labels = [f"honest-{i + 1}" for i in range(args.honest)] + modes
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
    beyond_edge: dict[str, list[int]] = {label: [] for label in labels}
    edge_tokens: dict[str, list[int]] = {label: [] for label in labels}
    audits = {label: {"audited": 0, "failed": 0} for label in labels}
    faulted: set[str] = set()  # found at fault by an audit in the previous epoch
    # The audited shards of the previous epoch's client traffic, which join each miner's
    # evidence in this epoch's judgement (the committee's `pooled_shards`: a report pools
    # the audited shards submitted during the epoch before it).
    pooled: dict[str, list[list[Any]]] = {}
    pooled_shards: dict[str, list[int]] = {label: [] for label in labels}
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
            engine = honest_engine if label in SELECTIVE_MODES or label in fractions \
                else engines[label]
            reqs = [engine.request_from_line(line) for line in challenge.lines]
            outputs = engine.generate(reqs)
            all_requests += [verifier.request_from_line(line) for line in challenge.lines]
            all_outputs += [o.token_ids for o in outputs]
            all_finish += [o.finish_reason for o in outputs]
            all_commits += [commitment(args, o) for o in outputs]
            owners += [label] * len(reqs)
        scores = score_outputs(verifier, all_requests, all_outputs, all_finish,
                               precision=args.precision, commitments=all_commits)
        rate = epoch_audit_rate(args, epoch)
        faults_now, audited = audit_client_traffic(args, engines, honest_engine, verifier,
                                                   labels, audit_rng, audits, fractions, rate)
        for label in labels:
            joined = pooled.get(label, [])
            pooled_shards[label].append(len(joined))
            verdict = judge([s for s, o in zip(scores, owners, strict=True) if o == label],
                            prior=carry.pop(label, ()),  # as the committee carries it
                            joined=joined)
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
            beyond_edge[label].append(verdict.beyond_edge)
            edge_tokens[label].append(verdict.edge_tokens)
            for level, p in params.items():
                records[level][label] = update(records[level][label], score, p,
                                               fault=fault)
                trajectories[level][label].append(records[level][label].reputation_bps)
        faulted = faults_now
        pooled = audited if args.pool_audits else {}
        say(f"epoch {epoch}: " + ", ".join(f"{k} {v[-1]}" for k, v in epoch_bps.items())
            + f" ({time.monotonic() - t0:.1f}s)")

    honest = [label for label in labels if label.startswith("honest")]
    levels: dict[str, Any] = {}
    for level, p in params.items():
        traj = trajectories[level]
        to_untrusted = {m: epochs_to(traj[m][1:], p.untrusted_below_bps) for m in modes}
        held = {m: v for m, v in to_untrusted.items()  # the 1% family: judged by its loss
                if fractions.get(m, 1.0) >= TARGET_FRACTION}
        false_pos = sum(
            1 for m in honest for t in range(args.epochs)
            if epoch_bps[m][t] < p.abnormal_below_bps or traj[m][t + 1] < p.untrusted_below_bps)
        known = [v for v in held.values() if v is not None]
        levels[level] = {
            "rate": p.rate,
            "max_epochs_to_untrusted": (max(known) if len(known) == len(held) else None),
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
        "pool_audits": args.pool_audits,
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
        "epoch_pooled_shards": pooled_shards,
        "epoch_beyond_edge": beyond_edge,
        "epoch_edge_tokens": edge_tokens,
        "epoch_scores_bps": epoch_bps,
        "client_shards_per_epoch": args.client_shards,
        "audit_rate_bps": args.audit_rate_bps,
        "audits": audits,
        "selective_detection_probability_per_epoch": round(
            1 - (1 - args.audit_rate_bps / 10_000) ** args.client_shards, 4),
        "audit_rate_bps_by_epoch": [epoch_audit_rate(args, e)
                                    for e in range(1, args.epochs + 1)],
        "selective_families": selective_families(
            args, fractions, default["epochs_to_untrusted"]),
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


def epoch_audit_rate(args: argparse.Namespace, epoch: int) -> int:
    """The rate (bps) `verifier.audits.audit_rate` gives a typical client shard of a miner
    that registered `args.registered_epochs` before epoch 1, no rate bought."""
    from verifier.audits import audit_rate

    return audit_rate(args.audit_rate_bps, 0,
                      epochs_registered=args.registered_epochs + epoch - 1, budget=1,
                      typical_budget=1)


def selective_families(args: argparse.Namespace, fractions: dict[str, float],
                       to_untrusted: dict[str, int | None]) -> dict[str, Any]:
    """Each selective family's detection arithmetic, at the rule's rates: per epoch
    1 - (1 - a F)^N while young and after; a year of public epochs; and, per cheated shard,
    expected loss against gain (in shard budgets B)."""
    from verifier.audits import YOUNG_EPOCHS

    n = args.client_shards
    young = epoch_audit_rate(args, 1) / 10_000
    base = args.audit_rate_bps / 10_000
    collateral = args.collateral_bps / 10_000
    lost_income = args.probation_epochs * n * args.margin  # no ordinary work on probation
    out: dict[str, Any] = {
        "recogniser": "perfect: every challenge recognised (as everything public on-chain "
                      "allows: the challenge client's funding, the task's shape) and answered "
                      "honestly, so only audits catch these families",
        "client_shards_per_epoch": n, "base_audit_rate": base, "young_audit_rate": young,
        "young_epochs": YOUNG_EPOCHS, "gain_per_cheated_shard_B": args.cheat_saving,
        "collateral_B": collateral, "probation_epochs": args.probation_epochs,
        "margin": args.margin, "lost_probation_income_B": round(lost_income, 3),
        "burn_share_of_stake_if_not_escaped": 0.1, "families": {}}
    for label, f in fractions.items():
        per_epoch = {name: 1 - (1 - a * f) ** n for name, a in (("young", young),
                                                                ("base", base))}
        year = 1 - (1 - base * f) ** (n * PUBLIC_EPOCHS_PER_YEAR)
        losses = {name: a * (1 + collateral + lost_income) for name, a in (("young", young),
                                                                           ("base", base))}
        out["families"][label] = {
            "fraction": f, "cheated_shards_per_epoch": f * n,
            "epochs_to_untrusted_simulated": to_untrusted.get(label),
            "detection_per_epoch": {k: round(v, 4) for k, v in per_epoch.items()},
            "expected_epochs_to_capture_base": round(1 / per_epoch["base"], 1),
            "caught_within_3_epochs_base": round(1 - (1 - per_epoch["base"]) ** 3, 4),
            "caught_within_3_epochs_young": round(1 - (1 - per_epoch["young"]) ** 3, 4),
            "survives_a_public_year_base": round(1 - year, 6),
            "target": ("epochs_to_untrusted <= 3" if f >= TARGET_FRACTION
                       else "expected loss per cheated shard > gain"),
            "expected_loss_per_cheated_shard_B": {k: round(v, 3) for k, v in losses.items()},
            "loss_exceeds_gain": {k: v > args.cheat_saving for k, v in losses.items()},
        }
    return out


def audit_client_traffic(args: argparse.Namespace, engines: dict[str, Any], honest: Any,
                         verifier: Any, labels: list[str], rng: random.Random,
                         audits: dict[str, dict[str, int]], fractions: dict[str, float],
                         rate_bps: int) -> tuple[set[str], dict[str, list[list[Any]]]]:
    """One epoch of client traffic per miner, each shard audited at `rate_bps`; a selective
    family cheats on each shard with its probability (unknowing of the draw, as on-chain).
    Returns the miners an audit found at fault, and each miner's audited shards' scores
    (passed or failed: all join its next epoch's evidence when pooled)."""
    from market.engine.base import GenerationRequest
    from verifier.challenges import TOP_PS
    from verifier.scoring import judge, score_outputs

    faults = set()
    audited: dict[str, list[list[Any]]] = {label: [] for label in labels}
    for label in labels:
        for _ in range(args.client_shards):
            cheated = rng.random() < fractions[label] if label in fractions else True
            if rng.randrange(10_000) >= rate_bps:
                continue  # not audited: nobody ever looks at it
            asks = [f"{rng.choice(CLIENT_PROMPTS)} (ref {rng.randrange(10**6)})"
                    for _ in range(4)]
            reqs = []
            for a in asks:
                t, seed = rng.choice((0.0, 0.7, 1.0)), rng.randrange(1 << 63)
                # top_p from the request's own seed: the audit draws stay as they were
                reqs.append(GenerationRequest(
                    verifier.encode_chat([{"role": "user", "content": a}]), 32,
                    temperature=t, top_p=TOP_PS[seed % len(TOP_PS)], seed=seed))
            outs = (engines[label] if cheated else honest).generate(reqs)
            shard = score_outputs(verifier, reqs, [o.token_ids for o in outs],
                                  [o.finish_reason for o in outs], precision=args.precision,
                                  commitments=[commitment(args, o) for o in outs])
            audited[label].append(shard)
            audits[label]["audited"] += 1
            if not judge(shard).passed:  # alone, as its dispute judges it
                audits[label]["failed"] += 1
                faults.add(label)
    return faults, audited


def honest_outputs_at_fault(args: argparse.Namespace, verifier: Any, honest: Any
                            ) -> dict[str, Any]:
    """Judge `args.honest_outputs` honest outputs one at a time (each alone is a shard);
    a quarter greedy, a quarter each sampled at 0.5, 0.8 and 1.0, the sampled ones at a
    top_p drawn as challenges draw it (`verifier.challenges.TOP_PS`)."""
    from market.engine.base import GenerationRequest
    from market.model.corpus import CORPUS
    from verifier.challenges import TOP_PS
    from verifier.scoring import judge, score_outputs

    text = CORPUS
    rng = random.Random(args.seed + 1)
    temperatures = (0.0, 0.5, 0.8, 1.0)
    counts = {str(t): 0 for t in temperatures}
    at_fault = {str(t): 0 for t in temperatures}
    worst = {str(t): -math.inf for t in temperatures}
    edge = {"edge_tokens": 0, "beyond_edge": 0}
    batch = 256
    for start in range(0, args.honest_outputs, batch):
        reqs = []
        for k in range(start, min(start + batch, args.honest_outputs)):
            at = rng.randrange(len(text) - 200)
            prompt = honest.encode_prompt(text[at: at + rng.randrange(20, 200)])
            seed = rng.randrange(1 << 63)
            reqs.append(GenerationRequest(prompt, args.fault_max_tokens,
                                          temperature=temperatures[k % 4],
                                          top_p=TOP_PS[seed % len(TOP_PS)], seed=seed))
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
            edge["edge_tokens"] += s.edge_tokens
            edge["beyond_edge"] += s.beyond_edge
    return {"outputs": args.honest_outputs, "max_tokens": args.fault_max_tokens,
            "at_fault": sum(at_fault.values()), "by_temperature": counts,
            "at_fault_by_temperature": at_fault, **edge,
            "max_log_evidence_by_temperature": {k: round(v, 2) for k, v in worst.items()}}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The benchmark's options (also how `numerics.py` runs it on the trained model)."""
    from market.chain.deploy import PUBLIC_CHAIN_PARAMS
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
                        help="base share of client shards audited (the committee's default, "
                        "1000; verifier.audits.audit_rate raises it for a young miner)")
    parser.add_argument("--registered-epochs", type=int,
                        default=PUBLIC_CHAIN_PARAMS.probation_epochs,
                        help="epochs each miner registered before the run: its probation "
                        "(public: 3)")
    parser.add_argument("--selective-fractions", default="0.01,0.05,0.2",
                        help="the selective families' shares of cheated client shards "
                        "(with the selective mode)")
    parser.add_argument("--cheat-saving", type=float, default=0.5,
                        help="what a substitute-served shard saves, in shard budgets (0.5)")
    parser.add_argument("--collateral-bps", type=int,
                        default=PUBLIC_CHAIN_PARAMS.collateral_bps,
                        help="collateral per shard (the deployment's, 2000)")
    parser.add_argument("--probation-epochs", type=int,
                        default=PUBLIC_CHAIN_PARAMS.probation_epochs,
                        help="a fresh identity's probation (public: 3)")
    parser.add_argument("--margin", type=float, default=0.1,
                        help="the miner's margin on a shard, in budgets: the income a fresh "
                        "identity forgoes per shard while on probation (0.1)")
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
    parser.add_argument("--no-pool-audits", dest="pool_audits", action="store_false",
                        help="judge audited shards alone only, as before they joined their "
                        "miner's epoch evidence (the comparison)")
    parser.add_argument("--modes", default=",".join(CHEAT_MODES),
                        help="comma-separated cheating modes (all)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="JSON result file; the PNG goes beside it")
    parser.add_argument("--smoke", action="store_true",
                        help="seconds, at tiny sizes, results in a temporary directory: that "
                        "the script runs (make test), not its figures")
    args = parser.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    try:
        args.selective_fractions = [float(f) for f in args.selective_fractions.split(",")
                                    if f.strip()]
    except ValueError:
        parser.error(f"--selective-fractions: not numbers: {args.selective_fractions!r}")
    if any(not 0 < f <= 1 for f in args.selective_fractions):
        parser.error("--selective-fractions must each be in (0, 1]")
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
    for label, fam in result["selective_families"]["families"].items():
        say(f"{label} (challenges recognised and answered honestly; only audits catch it): "
            f"epochs to untrusted {fam['epochs_to_untrusted_simulated']}, detection per "
            f"epoch {fam['detection_per_epoch']}, expected loss per cheated shard "
            f"{fam['expected_loss_per_cheated_shard_B']} B against a gain of "
            f"{result['selective_families']['gain_per_cheated_shard_B']} B")
    say(f"honest max log evidence {result['honest_max_log_evidence']}, cheats' min "
        f"{result['cheat_min_log_evidence']} (threshold {result['log_evidence_threshold']}); "
        f"honest outputs at fault: {result['honest_outputs_at_fault']} of "
        f"{result['honest_outputs']['outputs']} ({result['honest_outputs']['beyond_edge']} of "
        f"{result['honest_outputs']['edge_tokens']} tokens beyond the nucleus' edge)")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
