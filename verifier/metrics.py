"""The verifier's Prometheus metrics (default registry; `verifier run --metrics-port` serves
them), updated by the committee member, the dispute desk and the audit desk from what they
already know (no chain reads of their own). The scoring queue's depth is read from Redis
at scrape time (`watch_scoring_queue`)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, Info

from market.metrics import metric, queue_depth

BPS = 10_000

INFO = metric(Info, "quarry_verifier", "This verifier: its address and model")
EPOCH = metric(Gauge, "quarry_verifier_epoch", "The committee epoch at the member's last step")
EPOCHS_REPORTED = metric(Counter, "quarry_verifier_epochs_reported_total",
                         "Epoch reports this member signed as leader (led), co-signed "
                         "(cosigned), refused to co-sign (refused), or submitted on-chain "
                         "(submitted)", ["action"])
CHALLENGE_SCORE = metric(Histogram, "quarry_verifier_challenge_score",
                         "This member's own epoch score of each miner's challenge answers, "
                         "in bps (10000 passes, 0 fails)",
                         buckets=(0, 1000, 2500, 5000, 7500, 9000, BPS))
AUDITS = metric(Counter, "quarry_verifier_audits_total",
                "Audits of client shards: judged passed or failed, then acted on "
                "(challenged for availability, disputed)", ["outcome"])
DISPUTES_VOTED = metric(Counter, "quarry_verifier_disputes_voted_total",
                        "Dispute votes this member signed, by vote", ["vote"])
QUEUE_DEPTH = metric(Gauge, "quarry_verifier_scoring_queue_depth",
                     "Scoring jobs waiting in this verifier's Celery queue (NaN: Redis did "
                     "not answer)")

for _action in ("led", "cosigned", "refused", "submitted"):  # every series present at 0
    EPOCHS_REPORTED.labels(_action)
for _outcome in ("passed", "failed", "challenged", "disputed"):
    AUDITS.labels(_outcome)
for _vote in ("fault", "no_fault"):
    DISPUTES_VOTED.labels(_vote)


def watch_scoring_queue(redis_url: str, queue: str) -> None:
    """Make `QUEUE_DEPTH` read `queue`'s length from Redis at every scrape (short timeouts:
    a scrape must not hang on a Redis that is down)."""
    import redis

    client = redis.Redis.from_url(redis_url, socket_connect_timeout=1, socket_timeout=1)
    QUEUE_DEPTH.set_function(lambda: queue_depth(client, queue))
