"""What the dashboard (`/ui`) shows, gathered from the board and a few chain reads.

Jobs, shards, miners, disputes and challenges come from the board (indexed from the
chain's events); each row carries the transaction behind it (the event that created or last
changed it) so the page can link to `/ui/tx/{hash}`. The committee's epoch, leader and
seated weights are read from VerifierCommittee as the page is drawn; reported epochs and the
reputation each report gave each miner come from the indexed events (GPURegistry's
ReputationSet in the same transaction as VerifierCommittee's ReputationSubmitted).

The page is open to anyone, so what it costs must not be theirs to choose (`Pages`): a draw
is kept until the board's cursor moves (`HOLD_S` at most), and redrawn at most once per
`REDRAW_S` whatever the number of readers; `/ui/tx/{hash}` asks the node only for a
transaction the board indexed, and keeps the answers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from eth_typing import HexStr

from market.service.matching import miner_alive

if TYPE_CHECKING:
    from market.service.deps import Market

log = logging.getLogger("quarry.dashboard")

JOBS_SHOWN = 25
ROWS_SHOWN = 50
PLOT_W, PLOT_H = 160, 36
REDRAW_S = 1.0
"""The most often the dashboard is drawn anew (the board's cursor moving or not)."""
HOLD_S = 10.0
"""The longest a draw is kept while the cursor stands (heartbeats do not move it)."""
PAGES_KEPT = 8
"""Renderings of one draw kept (one per `refresh` value asked for)."""
RECEIPTS_KEPT = 256
"""Transactions whose receipts `/ui/tx` keeps (mined receipts do not change)."""

SHARD_EVENTS = ("ShardClaimed", "ResultSubmitted", "ClaimReclaimed", "ShardFinalized",
                "ShardRefunded", "ShardDisputed", "ShardDisputeResolved")
LINKED_EVENTS = (
    "TaskCreated", "TaskCancelled", *SHARD_EVENTS, "MinerRegistered", "ReputationSet",
    "DisputeOpened", "DisputeResolved", "DisputeExpired", "AvailabilityChallenged",
    "AvailabilityAnswered", "AvailabilityUnanswered", "VerifierRegistered",
    "VerifierExitRequested", "ChallengeSetCommitted", "ReputationSubmitted",
)


class Pages:
    """What `/ui` and `/ui/tx` answer, at a cost readers cannot raise (see the module doc).
    One per app; safe from the threads that answer requests."""

    def __init__(self, market: Market) -> None:
        self.market = market
        self._lock = threading.Lock()
        self._drawn: tuple[int, float, dict[str, Any]] | None = None  # cursor, when, values
        self._pages: dict[float, bytes] = {}  # the latest draw rendered, by refresh_s
        self._receipts: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.draws = 0  # how many times the dashboard was drawn anew

    def dashboard(self, render: Callable[[dict[str, Any], float], bytes],
                  refresh_s: float) -> bytes:
        """The page as `render(values, refresh_s)` made it from the latest draw: drawn anew
        after `REDRAW_S` once the cursor moved, or after `HOLD_S`; each page is rendered
        once per draw (per `refresh_s`, a few kept). Concurrent readers wait for one draw
        instead of each making their own."""
        with self._lock:
            now = time.monotonic()
            drawn = self._drawn
            if drawn is not None and now - drawn[1] >= REDRAW_S and (
                    now - drawn[1] >= HOLD_S or self.market.board.cursor() != drawn[0]):
                drawn = None
            if drawn is None:
                values = dashboard(self.market)
                drawn = self._drawn = (values["cursor"], now, values)
                self._pages.clear()
                self.draws += 1
            page = self._pages.get(refresh_s)
            if page is None:
                if len(self._pages) >= PAGES_KEPT:
                    self._pages.clear()
                page = self._pages[refresh_s] = render(drawn[2], refresh_s)
            return page

    def transaction(self, tx: str) -> dict[str, Any] | None:
        """`transaction(market, tx)` for a transaction the board indexed an event of, None
        for any other (the node is not asked); receipts are kept for `RECEIPTS_KEPT`."""
        events = self.market.board.events((), tx=tx)
        if not events:
            return None
        key = tx.lower()
        with self._lock:
            kept = self._receipts.get(key)
            if kept is not None:
                self._receipts.move_to_end(key)
        if kept is None:
            kept = receipt(self.market, tx)
            if kept["receipt"] is not None:
                with self._lock:
                    self._receipts[key] = kept
                    while len(self._receipts) > RECEIPTS_KEPT:
                        self._receipts.popitem(last=False)
        return {"hash": key, "events": events, **kept}


def dashboard(market: Market) -> dict[str, Any]:
    """Everything `/ui` draws, as plain values, from one state of the board."""
    with market.board.snapshot():
        return _dashboard(market)


def _dashboard(market: Market) -> dict[str, Any]:
    board = market.board
    events = board.events(LINKED_EVENTS)
    txs = _transactions(events)
    models = {m["modelId"]: m.get("name") for m in board.models()}
    jobs = board.recent_jobs(JOBS_SHOWN)
    for job in jobs:
        job["modelName"] = models.get(job["modelId"])
        job["tx"] = txs["task"].get(job["taskId"])
        job["state"] = _job_state(job)
        for shard in job["shards"]:
            shard["tx"] = txs["shard"].get((job["taskId"], shard["shard"]))
    reports = _reports(events)
    history = _reputation_history(events, reports)
    wall, ttl = time.time(), market.settings.heartbeat_ttl_s
    miners = board.miners()
    for m in miners:
        m["alive"] = miner_alive(m, wall, ttl)
        m["seenAgo"] = None if m["lastSeen"] is None else max(0, int(wall - m["lastSeen"]))
        m["tx"] = txs["miner"].get(m["address"])
        m["history"] = history.get(m["address"], [])
        m["plot"] = _plot(m["history"])
        m["behind"] = _behind((m["status"] or {}).get("behind")) if m["alive"] else ""
    disputes = board.recent_disputes(ROWS_SHOWN)
    for d in disputes:
        d["tx"] = txs["dispute"].get(d["disputeId"])
        d["outcomeTx"] = txs["dispute_end"].get(d["disputeId"])
    challenges = board.recent_challenges(ROWS_SHOWN)
    for c in challenges:
        c["tx"] = txs["challenge"].get(c["challengeId"])
        c["outcomeTx"] = txs["challenge_end"].get(c["challengeId"])
    return {
        "cursor": board.cursor(), "chainTime": board.cursor_time(), "jobs": jobs,
        "miners": miners, "disputes": disputes, "challenges": challenges,
        "committee": _committee(market, events, reports),
        "reports": sorted(reports.values(), key=lambda r: -r["epoch"])[:ROWS_SHOWN],
    }


def receipt(market: Market, tx: str) -> dict[str, Any]:
    """One transaction as the chain reports it: {receipt, contract, error}, the error
    saying why the receipt is None when the chain cannot give it."""
    out: dict[str, Any] = {"receipt": None, "error": None, "contract": None}
    try:
        q = market.deployment.quarry()
        chain = q.chain
        (receipt,) = chain.read([lambda eth: eth.get_transaction_receipt(HexStr(tx))])
        (block,) = chain.read([lambda eth: eth.get_block(receipt["blockNumber"])])
        out["receipt"] = {
            "block": int(receipt["blockNumber"]), "from": receipt["from"],
            "to": receipt["to"], "status": "success" if receipt["status"] == 1 else "reverted",
            "gasUsed": int(receipt["gasUsed"]), "timestamp": int(block["timestamp"]),
            "logs": len(receipt["logs"]),
        }
        out["contract"] = next((name for name, address in q.deployment.addresses.items()
                                if address.lower() == str(receipt["to"]).lower()), None)
    except Exception as exc:  # noqa: BLE001 - the page still shows the board's events
        out["error"] = f"the chain did not give this transaction: {exc}"
    return out


def _transactions(events: list[dict[str, Any]]) -> dict[str, dict[Any, str]]:
    """The transaction behind each row: the event that created it (tasks, miners, disputes,
    challenges) or last changed it (shards), and the one that ended a dispute or challenge."""
    out: dict[str, dict[Any, str]] = defaultdict(dict)
    for e in events:  # oldest first: a later event overwrites an earlier one
        a, name, tx = e["args"], e["name"], e["tx"]
        if name == "TaskCreated":
            out["task"][int(a["taskId"])] = tx
        elif name in SHARD_EVENTS:
            out["shard"][(int(a["taskId"]), int(a["shard"]))] = tx
        elif name == "MinerRegistered":
            out["miner"][_checksum(a["miner"])] = tx
        elif name == "DisputeOpened":
            out["dispute"][int(a["disputeId"])] = tx
        elif name in ("DisputeResolved", "DisputeExpired"):
            out["dispute_end"][int(a["disputeId"])] = tx
        elif name == "AvailabilityChallenged":
            out["challenge"][int(a["challengeId"])] = tx
        elif name in ("AvailabilityAnswered", "AvailabilityUnanswered"):
            out["challenge_end"][int(a["challengeId"])] = tx
    return out


def _reports(events: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Reported epochs by number: how many miners each report rated, its signers and
    transaction."""
    return {int(e["args"]["epoch"]): {
        "epoch": int(e["args"]["epoch"]), "count": int(e["args"]["count"]),
        "signers": [_checksum(s) for s in e["args"]["signers"]], "tx": e["tx"],
        "block": e["block"]} for e in events if e["name"] == "ReputationSubmitted"}


def _reputation_history(events: list[dict[str, Any]],
                        reports: dict[int, dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each miner's reputation after each reported epoch: the ReputationSet events sent in a
    report's transaction."""
    epoch_of_tx = {r["tx"]: r["epoch"] for r in reports.values()}
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e["name"] == "ReputationSet" and e["tx"] in epoch_of_tx:
            out[_checksum(e["args"]["miner"])].append(
                {"epoch": epoch_of_tx[e["tx"]], "bps": int(e["args"]["bps"]), "tx": e["tx"]})
    return out


def _plot(points: list[dict[str, Any]]) -> dict[str, Any] | None:
    """SVG coordinates of a reputation-over-epochs line (0 to 100% bottom to top)."""
    if not points:
        return None
    first, last = points[0]["epoch"], points[-1]["epoch"]
    span = max(1, last - first)
    xy = [(round(4 + (p["epoch"] - first) * (PLOT_W - 8) / span, 1),
           round(PLOT_H - 3 - p["bps"] * (PLOT_H - 6) / 10_000, 1)) for p in points]
    return {"width": PLOT_W, "height": PLOT_H, "points": xy,
            "line": " ".join(f"{x},{y}" for x, y in xy),
            "label": ", ".join(f"epoch {p['epoch']}: {p['bps'] / 100:g}%" for p in points)}


def _committee(market: Market, events: list[dict[str, Any]],
               reports: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The current epoch, its leader and seated members by weight (read from the chain now),
    the verifiers waiting for a seat or leaving (from the indexed events), and the epochs
    reported."""
    joined = {_checksum(e["args"]["verifier"]): {"activeFrom": int(e["args"]["activeFrom"]),
                                                 "tx": e["tx"]}
              for e in events if e["name"] == "VerifierRegistered"}
    leaving = {_checksum(e["args"]["verifier"]): int(e["args"]["activeUntil"])
               for e in events if e["name"] == "VerifierExitRequested"}
    out: dict[str, Any] = {"epoch": None, "leader": None, "members": [], "error": None,
                           "reported": sorted(reports), "waiting": []}
    try:
        committee = market.deployment.quarry().committee
        epoch = committee.current_epoch()
        weights = committee.weights_at(epoch)
        out["epoch"] = epoch
        out["nextReport"] = committee.next_report_epoch()
        if weights:
            out["leader"] = _checksum(committee.leader_of(epoch))
    except Exception as exc:  # noqa: BLE001 - the rest of the page still draws
        log.warning("dashboard: cannot read the committee: %s", exc)
        out["error"] = f"the chain cannot be read: {exc}"
        return out
    total = sum(weights.values()) or 1
    for address, weight in sorted(weights.items(), key=lambda kv: -kv[1]):
        who = _checksum(address)
        out["members"].append({
            "address": who, "weight": weight, "share": weight / total,
            "leader": who == out["leader"], "tx": joined.get(who, {}).get("tx"),
            "leavingAt": leaving.get(who),
        })
    seated = {m["address"] for m in out["members"]}
    out["waiting"] = [{"address": a, "activeFrom": j["activeFrom"], "tx": j["tx"]}
                      for a, j in joined.items() if a not in seated and j["activeFrom"] > epoch]
    return out


def _job_state(job: dict[str, Any]) -> str:
    """One word for a task: cancelled, done (every shard finalized or refunded), disputed,
    open while a shard waits for a claim, running while one is claimed, else settling (every
    result in, the challenge windows still open)."""
    states = job["shardStates"]
    if job["cancelled"]:
        return "cancelled"
    if job["done"]:
        return "done"
    for state, word in (("Disputed", "disputed"), ("Open", "open"), ("Claimed", "running")):
        if states.get(state):
            return word
    return "settling"


def _checksum(address: str) -> str:
    from eth_utils import to_checksum_address

    return str(to_checksum_address(address))


def _behind(behind: Any) -> str:
    """A heartbeat's `behind` (miner.backlog) in a few words, "" when the miner keeps up."""
    if not isinstance(behind, dict):
        return ""
    try:
        late = len(behind.get("late") or [])
        return (f"behind: {float(behind['backlogSeconds']):g} s of work, "
                f"{int(behind['waiting'])} waiting" + (f", {late} late" if late else ""))
    except (KeyError, TypeError, ValueError):  # a miner's own words: shown only if well formed
        return ""
