"""Can a miner tell the committee's challenges from client jobs by what is public on-chain?

A simulated market (no chain: the terms a miner sees are generated, the challenges' terms come
from the committee's own code, `verifier.challenges.draw_shapes`). Each epoch every miner gets
`--clients` client tasks and one challenge. Client tasks follow a stated mix (CLIENT_MIX
below): requests log-uniform from 1 to 2,000 split into shards of 16 to 256, max_tokens from
16 to 1,024, a price 0 to 60% over the claimant's ask, 30% directed at a miner, 15% open to
miners on probation, 10% from a client address new that epoch, funded from a shared exchange
wallet. A tenth of the miners are on probation (they claim only tasks that admit them); the
rates are over the tasks of the miners off probation, those a selective cheater cheats on.

Challenges, "before" (the committee's shapes until issue 32): 16 to 24 requests, max_tokens 32
to 64, 0 to 25% over the ask, always open to probation; "after": `draw_shapes` over the last
SAMPLE_JOBS claimed single-shard client tasks. Both: directed, one shard, from a fresh address
a committee member funded that epoch (the funding is unchanged: see README "Trust").

The recognisers see, per task: requests, shards, max_tokens, price over the miner's own ask,
the probation flag, whether the market offered it to this miner only, whether the client
address is new, and who funded it (committee members' addresses are public). They are:
`rule` (issue 32's: new address, directed, open to probation, one shard of 16 to 24 requests,
max_tokens 32 to 64, at most 25% over the ask); `shape` (the likelihood ratio of the task's
terms under the committee's draw, which the miner can run, against the client tasks it has
seen, flagging a posterior above one half); `funding` (a member funded the client); and
`fresh_directed`. For each: true- and false-positive rates, and for `shape` the share of
client tasks a selective cheater must serve honestly to answer every challenge (or 90% of
them) honestly: the client tasks whose terms are at least as challenge-like as that
challenge's.

Prints one JSON object as the last line of stdout; `--smoke` runs a few epochs in a second.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from verifier.challenges import (  # noqa: E402
    SAMPLE_JOBS,
    Terms,
    draw_shapes,
)

REQUESTS, MAX_TOKENS = 16, 64  # the committee's defaults (verifier config)
BPS = 10_000
CLIENT_MIX = {
    "directed": 0.30, "allow_probation": 0.15, "new_client": 0.10,
    "max_tokens": (16, 32, 64, 128, 256, 512, 1024),
    "shard_sizes": (16, 32, 64, 128, 256), "max_premium": 0.60,
}


@dataclass(frozen=True)
class Seen:
    """One task as the miner it is offered to sees it."""

    requests: int
    shards: int
    max_tokens: int
    premium_bps: int
    allow_probation: bool
    directed: bool
    new_client: bool
    member_funded: bool
    challenge: bool

    @property
    def terms(self) -> tuple[int, ...]:
        """What `shape` compares, each term on its own (naive Bayes), in coarse bins:
        requests and max_tokens by powers of two, the premium in 5% steps."""
        return (self.requests.bit_length(), min(self.shards, 2), self.max_tokens.bit_length(),
                self.premium_bps // 500, self.allow_probation, self.directed)


def client_task(rng: random.Random, on_probation: bool) -> Seen:
    """A client task a miner claims (one on probation claims only tasks that admit it)."""
    n = max(1, int(math.exp(rng.uniform(0, math.log(2000)))))
    shard = rng.choice(CLIENT_MIX["shard_sizes"])
    premium = int(BPS * CLIENT_MIX["max_premium"] * rng.random() ** 2)  # most pay near the ask
    return Seen(n, math.ceil(n / shard), rng.choice(CLIENT_MIX["max_tokens"]), premium,
                on_probation or rng.random() < CLIENT_MIX["allow_probation"],
                rng.random() < CLIENT_MIX["directed"],
                rng.random() < CLIENT_MIX["new_client"], False, False)


def challenges(rng: random.Random, miners: list[str], probation: set[str],
               board: list[Terms], after: bool) -> list[Seen]:
    """The epoch's challenges of the miners off probation (the ones a selective cheater
    cares about: it stays honest while on probation)."""
    seed = rng.randbytes(32)
    shapes = draw_shapes(seed, miners, board if after else [], probation, requests=REQUESTS,
                         max_tokens=MAX_TOKENS)
    return [Seen(s.requests, 1, s.max_tokens, s.premium_bps,
                 s.allow_probation if after else True, True, True, True, True)
            for m, s in shapes.items() if m not in probation]


def rule(t: Seen) -> bool:
    return (t.new_client and t.directed and t.allow_probation and t.shards == 1
            and 16 <= t.requests <= 24 and 32 <= t.max_tokens <= 64 and t.premium_bps <= 2500)


def rates(flags: list[tuple[bool, bool]]) -> dict[str, float]:
    """(flagged, is challenge) pairs -> true- and false-positive rates."""
    pos = [f for f, c in flags if c]
    neg = [f for f, c in flags if not c]
    return {"tpr": round(sum(pos) / max(1, len(pos)), 4),
            "fpr": round(sum(neg) / max(1, len(neg)), 4)}


def run(args: argparse.Namespace, after: bool) -> dict[str, Any]:
    rng = random.Random(args.seed)
    miners = [f"0x{i:040x}" for i in range(1, args.miners + 1)]
    probation = {m for i, m in enumerate(miners) if i % 10 == 0}
    board: list[Terms] = []  # claimed single-shard client tasks on-chain, oldest first
    seen: list[Seen] = []
    for epoch in range(args.epochs + 1):
        chal = challenges(rng, miners, probation, board[-SAMPLE_JOBS:], after)
        clients = {m: [client_task(rng, m in probation) for _ in range(args.clients)]
                   for m in miners}
        board += [Terms(t.requests, t.max_tokens, t.premium_bps, t.allow_probation)
                  for tasks in clients.values() for t in tasks if t.shards == 1]
        if epoch:  # epoch 0 fills the board (the miner has seen a window of client tasks)
            seen += chal + [t for m, tasks in clients.items() if m not in probation
                            for t in tasks]
    # The miner's model: each term's frequency among the client tasks it saw, and among the
    # challenges of many runs of the committee's draw over the same board (it can run it).
    clients_seen = [t for t in seen if not t.challenge]
    sims = [t for _ in range(args.model_draws)
            for t in challenges(rng, miners, probation, board[-SAMPLE_JOBS:], after)]
    k = len(clients_seen[0].terms)
    client_counts = [Counter(t.terms[i] for t in clients_seen) for i in range(k)]
    sim_counts = [Counter(t.terms[i] for t in sims) for i in range(k)]
    prior = 1 / (args.clients + 1)  # one challenge per miner per epoch

    def ratio(t: Seen) -> float:
        """The likelihood ratio challenge : client of the task's terms."""
        r = 1.0
        for i, v in enumerate(t.terms):
            r *= ((sim_counts[i][v] + 0.5) / (len(sims) + 1)) / \
                ((client_counts[i][v] + 0.5) / (len(clients_seen) + 1))
        return r

    def shape(t: Seen) -> bool:
        return prior / (1 - prior) * ratio(t) > 1

    ranked = sorted((ratio(t) for t in seen if t.challenge), reverse=True)
    client_ratios = [ratio(t) for t in clients_seen]

    def honest_share(caught: float) -> float:
        """Share of client tasks at least as challenge-like as the challenge that catches
        `caught` of them: what a selective cheater must serve honestly to pass them."""
        bar = ranked[max(0, math.ceil(caught * len(ranked)) - 1)]
        return round(sum(r >= bar for r in client_ratios) / len(client_ratios), 4)

    out: dict[str, Any] = {}
    for name, test in (("rule", rule), ("shape", shape),
                       ("funding", lambda t: t.member_funded),
                       ("fresh_directed", lambda t: t.new_client and t.directed)):
        out[name] = rates([(test(t), t.challenge) for t in seen])
    out["shape"] |= {"honest_share_all": honest_share(1.0),
                     "honest_share_90": honest_share(0.9)}
    out["challenges"] = len(ranked)
    out["client_tasks"] = len(clients_seen)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--miners", type=int, default=19)
    parser.add_argument("--clients", type=int, default=32, help="client tasks per miner/epoch")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--model-draws", type=int, default=200,
                        help="runs of the committee's draw the recogniser learns from")
    parser.add_argument("--seed", type=int, default=32)
    parser.add_argument("--smoke", action="store_true", help="a few epochs, a second")
    args = parser.parse_args()
    if args.smoke:
        args.miners, args.clients, args.epochs, args.model_draws = 5, 8, 3, 20
    out = {"before": run(args, after=False), "after": run(args, after=True),
           "miners": args.miners, "clients_per_miner_epoch": args.clients,
           "epochs": args.epochs, "smoke": args.smoke}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
