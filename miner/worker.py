"""The miner's work loop: find open shards, check them, claim, generate, sign, submit, get paid.

One `Worker` holds the account, the contracts, one loaded engine per served model and a
content store (the market's, or any object with `get(uri)` and `put(bytes)`, such as
`market.store.LocalStore`). Everything it is told is rechecked against the chain:

1. candidates come from the market (`GET /shards/open`, ranked for this miner; an idle
   miner long-polls it) or, when the market does not answer, from `TaskCreated` events for
   the served models and `getShard`;
2. before claiming (which locks collateral), the input file is fetched by the task's
   `inputURI`, parsed, and its Merkle root must equal `inputRoot`; every request of the shard
   must fit the model (prompt + max_tokens within its positions). A task whose input fails
   is remembered and never claimed; a shard with a request the model cannot serve is
   remembered and reported in the heartbeat's `unservable` (what `Job.wait` shows the client),
   while the task's other shards are still served;
3. claim; a revert (`NotEligible`, `ShardNotOpen`, `DeadlinePassed`...) skips the shard:
   a reverted claim fails at gas estimation, so it costs nothing;
4. generate in batches of `max_batch` (progress bar on stderr), sign one EIP-712 Receipt per
   output (`build_shard_result`), keep the document on local disk (`miner.archive`), upload
   it, `submitResult` before the claim expires. In `run` these last steps go to a background
   thread while the next shard is checked, claimed and generated (a pipeline one shard
   deep: a shard's submission waits for the previous one's);
5. `answer_challenges()`: a task's client may challenge a submitted shard's availability;
   the miner shows the named request's receipt and proof on-chain within Arbitration's
   response window (devnet 60 s) from its local copy (or the store), or it is slashed. It
   runs every poll and between generation batches, in the loop's own thread (one account,
   one sender);
6. `collect()`: finalize its own submitted shards once their challenge window has closed
   (anyone may; someone else having done it is fine), drop their local copies, and with
   `auto_withdraw` pull the escrowed earnings.

A miner on probation (new or re-registered) may claim only tasks that allow it: other tasks
are skipped before any transaction, until a committee report ends the probation. So are tasks
whose accepted precisions leave out the one this miner declared for the model (a swarm head:
its swarm's), and tasks that require activation commitments when its engine makes none.

`listener(event, info)`, when given, hears what the worker does, from whichever of its
threads did it: "claimed", "submitted", "skipped", "failed", "challenged", "answered",
"challenge_missed", "challenge_unanswerable" (each with its task, shard and the like), and
"found" (a poll that found candidates: `tasks`). With `timing=True` it also hears each
step's wall-clock span (`start`, `end` from `time.time()`, and `task_id` where it has one):
"claim_tx", "generate", "sign", "upload", "submit_tx" and "collect". That is how a
benchmark times the miner's steps (benchmarks/market_overhead.py) without touching its
internals.

A request's `max_tokens` above the task's `maxTokensPerRequest` is generated only up to the
task's limit: the contract never pays beyond it (`TooManyTokens`).

Ctrl-C in `run()`: the first finishes (submits) the current shard, and the one being
submitted in the background, and returns; the second
aborts at once and says when the claim expires and how much collateral is at stake. An
engine failure mid-shard is logged and the loop carries on; the claim then expires.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import signal
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from eth_account.signers.local import LocalAccount
from eth_utils import to_checksum_address

from market.chain.contracts import (
    MAX_CLAIM_BATCH,
    AvailabilityChallenge,
    ChallengeStatus,
    MinerInfo,
    Shard,
    ShardState,
    as_struct,
)
from market.chain.deploy import Quarry
from market.chain.errors import ContractRevert
from market.engine.base import GenerationOutput, GenerationRequest
from market.engine.text import TextEngine
from market.errors import QuarryError
from market.jobs import task_shard_range
from market.logs import json_logs, log_context, say
from market.marketapi import MarketAPI, MarketError, MarketUnavailable
from market.protocol.merkle import input_tree
from market.protocol.precision import Precision, accepts, mask_labels
from market.protocol.requests import ParsedRequest, parse_jsonl
from market.protocol.results import Completion, ResultItem, ShardResult, build_shard_result
from market.standing import why_not_eligible
from market.store import StoreError, parse_uri
from miner import metrics
from miner.archive import ResultArchive, default_state_dir
from miner.backlog import Backlog

if TYPE_CHECKING:
    from pathlib import Path

    from market.chain.client import Read, TxResult
    from miner.config import MinerConfig

log = logging.getLogger("miner")
_T = TypeVar("_T")

CLAIM_MARGIN_S = 5
"""Stop generating when the claim has less than this left: a late submit only reverts."""
LONG_POLL_S = 5.0
"""How long an idle miner lets the market hold an empty `GET /shards/open` (a new shard
answers it at once). Short enough that challenges and payments are still looked at often,
and that a first Ctrl-C while idle exits within it."""
CHALLENGE_CHECK_S = 2.0
"""Between batches and candidates, look for availability challenges at most this often
(every poll of `run` looks regardless): far inside any response window."""
CLOCK_READ_S = 1.0
"""Between batches the claim deadlines are checked against the chain's time read at most
this often and carried forward by the local clock in between (a read is an RPC round trip;
one per batch cost the tiny model's miner 2% of its generation time)."""
MAX_SHARDS_IN_FLIGHT = 4
"""Shards of one task `run` claims together and generates as one stream (the
`max_shards_in_flight` setting): enough to keep the engine's batches full across shard
boundaries, few enough that one miner does not lock up a task others could share."""
CLAIM_FILL = 0.5
"""The share of a claim's window the shards claimed together may fill at this miner's
measured pace: the rest is room for a busier machine, signing and submitting. The stream
also ends within the same share of the committee's answer window, so a challenge offered
meanwhile is served in time (shards offered to the miner go first between streams)."""
INPUT_CACHE_SIZE = 8
"""Verified task inputs kept in memory (a task's shards are usually claimed together)."""
UNSERVABLE_KEPT = 5
"""Unservable shards the heartbeat reports (the latest): the market caps a heartbeat's
status at 4096 bytes."""
UNSERVABLE_REASON_CHARS = 200
UNSERVABLE_REMEMBERED = 1000
"""Unservable shards remembered (not checked again); the oldest are forgotten."""
# Claim reverts that mean "not this task for this miner" (remembered), not "try later".
_TASK_REVERTS = {"NotEligible", "DeadlinePassed", "UnknownTask", "PrecisionNotAccepted"}


class ClaimUnavailable(QuarryError):
    """A pluggable claim (`Worker(claim=...)`) cannot claim now: the shard is skipped,
    nothing locked (e.g. a swarm head whose new swarm is not registered yet)."""


class ContentStore(Protocol):
    """Where input files are read and result documents written (MarketAPI, LocalStore)."""

    def get(self, uri: str) -> bytes: ...

    def put(self, data: bytes) -> str: ...


class _Skip(Exception):
    """Internal: this shard is not taken; `task_wide` means no shard of the task will be,
    `unservable` that this shard never will be (a request the model cannot serve)."""

    def __init__(self, reason: str, *, task_wide: bool = False,
                 unservable: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.task_wide = task_wide
        self.unservable = unservable


@dataclass(frozen=True)
class ShardOutcome:
    """What `process_shard` did: "submitted", "skipped" (nothing locked) or "failed"
    (claimed, then could not submit: the claim will expire)."""

    task_id: int
    shard: int
    status: str
    reason: str = ""
    requests: int = 0
    tokens_used: int = 0
    result_uri: str = ""
    result_root: bytes = b""

    @property
    def submitted(self) -> bool:
        return self.status == "submitted"


@dataclass(frozen=True)
class ActiveClaim:
    task_id: int
    shard: int
    claim_expiry: int
    collateral: int
    # monotonic time of the claim (for the claim-to-submit metric); None: an earlier run's
    claimed_at: float | None = field(default_factory=time.monotonic, compare=False,
                                     repr=False)


@dataclass(eq=False)
class _Ready:
    """A shard checked and tokenized, not yet claimed (`state`: as read for the check)."""

    task: Any
    task_id: int
    shard: int
    engine: TextEngine
    requests: Sequence[ParsedRequest]
    gen: list[GenerationRequest]
    state: Any
    resume: bool
    reclaim: bool


@dataclass(eq=False)
class _Claimed:
    """A shard claimed (or resumed) by this miner, ready to generate; `outputs` fills up as
    its requests come out of the engine."""

    task: Any
    claim: ActiveClaim
    engine: TextEngine
    requests: Sequence[ParsedRequest]
    gen: list[GenerationRequest]
    outputs: list[GenerationOutput] = field(default_factory=list)


@dataclass
class RunSummary:
    submitted: list[ShardOutcome] = field(default_factory=list)
    skipped: int = 0
    failed: int = 0
    finalized: int = 0
    paid_wei: int = 0  # ShardFinalized payments of the shards this worker finalized
    withdrawn_wei: int = 0
    challenges_answered: int = 0
    challenge_bonds_wei: int = 0  # the bonds of the challenges this worker answered
    challenges_missed: int = 0  # not answered in time: collateral slashed

    @property
    def tokens(self) -> int:
        return sum(o.tokens_used for o in self.submitted)


def task_groups(candidates: Sequence[tuple[int, int]],
                size: int) -> Iterator[tuple[int, list[int]]]:
    """(task id, up to `size` of its shards) in the order of the candidates' first
    appearance: the shards one stream serves."""
    left = list(candidates)
    while left:
        task_id = left[0][0]
        shards = [k for t, k in left if t == task_id][:size]
        taken = set(shards)
        left = [(t, k) for t, k in left if t != task_id or k not in taken]
        yield task_id, shards


def _batch_metrics(model_id: bytes, outputs: Sequence[GenerationOutput],
                   seconds: float) -> None:
    """One engine batch in the metrics: its size, its output tokens and their rate."""
    model = "0x" + bytes(model_id).hex()
    tokens = sum(len(o.token_ids) for o in outputs)
    metrics.BATCH_SIZE.observe(len(outputs))
    metrics.TOKENS.labels(model).inc(tokens)
    if seconds > 0:
        metrics.TOKENS_PER_SECOND.labels(model).set(tokens / seconds)


def _utc(ts: int) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


class Worker:
    """The miner loop, usable in-process (`process_shard`, `collect`, `run`)."""

    def __init__(
        self,
        *,
        account: LocalAccount,
        quarry: Quarry,
        engines: Mapping[bytes, TextEngine],
        store: ContentStore,
        market: MarketAPI | None = None,
        max_batch: int = 8,
        max_shards_in_flight: int = MAX_SHARDS_IN_FLIGHT,
        poll_interval_s: float = 2.0,
        heartbeat_interval_s: float = 5.0,
        auto_withdraw: bool = False,
        progress: bool = True,
        listener: Callable[[str, dict[str, Any]], None] | None = None,
        timing: bool = False,
        engine_kind: str = "torch",
        state_dir: Path | None = None,
        challenge_check_s: float = CHALLENGE_CHECK_S,
        claim: Callable[[int, int], TxResult] | None = None,
        precision_of: Callable[[bytes], Precision | None] | None = None,
    ) -> None:
        if max_batch < 1:
            raise QuarryError("max_batch must be at least 1")
        if max_shards_in_flight < 1:
            raise QuarryError("max_shards_in_flight must be at least 1")
        if not engines:
            raise QuarryError("a worker needs at least one engine (model)")
        self.account = account
        self.address = account.address
        self.q = quarry
        self.engines = dict(engines)
        self.store = store
        self.market = market
        self.max_batch = max_batch
        self.max_shards_in_flight = max_shards_in_flight
        self.poll_interval_s = poll_interval_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.auto_withdraw = auto_withdraw
        self.progress = progress
        self.listener = listener
        self.timing = timing and listener is not None
        self.engine_kind = engine_kind
        metrics.INFO.info({"address": self.address, "engine": engine_kind})
        # How a checked shard is claimed: `claimShard` by default; a swarm's head passes
        # `claimShardForSwarm` for its swarm (miner.swarm). Its reverts are handled alike.
        self.claim = claim or functools.partial(self.q.tasks.claim_shard, account)
        # Shards streamed together are claimed in one `claimShards` transaction when the claim
        # is the plain one (a swarm's goes shard by shard).
        self.claim_many: Callable[[int, Sequence[int]], TxResult] | None = (
            None if claim else functools.partial(self.q.tasks.claim_shards, account))
        # The precision a claim is made in, per model: by default this miner's on-chain
        # declaration (read with each group's checks); a swarm's head passes its swarm's.
        self.precision_of = precision_of
        self.skipped_tasks: dict[int, str] = {}  # task id -> why none of its shards is taken
        # (task id, shard) -> why this model cannot serve it (e.g. a request over its
        # context); never tried again, and the latest are in the heartbeat for the client.
        self.unservable: OrderedDict[tuple[int, int], str] = OrderedDict()
        self.pending: set[tuple[int, int]] = set()  # submitted, not yet finalized
        # Shards signed here -> their task's wei per token: what a finalization by someone
        # else (the market's sweep) paid, for the metrics, without reading the chain.
        self._prices: dict[tuple[int, int], int] = {}
        # Window ends already read from the chain: no call for a shard until its end passes.
        self._window_ends: dict[tuple[int, int], int] = {}
        self.failed: set[tuple[int, int]] = set()
        self.current: ActiveClaim | None = None  # the first claim held, not yet generated
        self._held: list[ActiveClaim] = []  # claimed, not yet generated (in stream order)
        # Shards being signed, uploaded and submitted in the background (`run` only).
        self._inflight: list[tuple[ActiveClaim, Future[ShardOutcome]]] = []
        self._executor: ThreadPoolExecutor | None = None
        self._claim_executor: ThreadPoolExecutor | None = None  # claims made ahead
        self._emit_lock = threading.Lock()
        self.summary = RunSummary()
        # Verified inputs: (inputURI, inputRoot, numRequests) -> parsed requests.
        self._inputs: OrderedDict[tuple[str, bytes, int], list[ParsedRequest]] = OrderedDict()
        self._known_tasks: dict[int, tuple[int, int]] = {}  # task id -> (deadline, num shards)
        self._task_scan_from = quarry.deployment.deploy_block
        self._submitted_scan_from = quarry.deployment.deploy_block
        self._market_down = False
        self._stop = threading.Event()
        self._interrupts = 0
        self._params: dict[str, int] | None = None
        self._probation_skips: set[int] = set()  # skipped only while this miner is on probation
        # Availability challenges: local copies of submitted results, open challenges
        # naming this miner (id -> challenge), those this worker answered, those closed
        # (answered, missed or settled: never looked at again), those logged unanswerable.
        self.archive = ResultArchive.for_miner(state_dir or default_state_dir(), self.address,
                                               quarry.identity())
        self.challenge_check_s = challenge_check_s
        self.open_challenges: dict[int, AvailabilityChallenge] = {}
        self.answered: set[int] = set()
        self._closed: set[int] = set()
        self._unanswerable: set[int] = set()
        self._challenge_scan_from = quarry.deployment.deploy_block
        self._last_challenge_check = float("-inf")
        # What the latest poll offered (task, shard) -> (offered to this miner, deadline), its
        # size (requests, max tokens each), and what waits behind the stream being generated
        # (the heartbeat's `behind`).
        self._seen: dict[tuple[int, int], tuple[bool, int]] = {}
        self._sizes: dict[tuple[int, int], tuple[int, int]] = {}
        self.backlog = Backlog(quarry.committee.challenge_answer_window())

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, cfg: MinerConfig, **kwargs: Any) -> Worker:
        """Connect, verify and load every configured model, and check the registration."""
        from market.connect import connect
        from market.engine.factory import load_engine
        from miner.register import load_models

        cfg.require("key", "model_dirs")
        account = cfg.account()
        models = load_models(cfg.model_dirs)
        q, market = connect(cfg)
        engines: dict[bytes, TextEngine] = {}
        try:
            if not q.gpu.is_registered(account.address):
                raise QuarryError(f"miner {account.address} is not registered; run "
                                  "`miner register` first")
            served = set(q.gpu.models_of(account.address))
            precision = cfg.served_precision()
            for m in models:
                if m.model_id not in served:
                    log.warning("model %s (%s) is not in this miner's on-chain registration: "
                                "its tasks cannot be claimed; rerun `miner register`",
                                m.manifest.name, m.manifest.model_id_hex)
                elif (declared := q.gpu.precision_of(account.address, m.model_id)) is not None \
                        and precision > declared:
                    raise QuarryError(
                        f"the engine would run {m.manifest.name} in {precision.label}, less "
                        f"exact than the {declared.label} this miner declared on-chain (its "
                        f"shards are judged at {declared.label}); set precision = "
                        f"\"{declared.label}\" or rerun `miner register`")
                log.info("loading %s engine for %s from %s", cfg.engine, m.manifest.name,
                         m.path)
                engine = load_engine(cfg.engine, m.path, **cfg.engine_kwargs())
                if not isinstance(engine, TextEngine):
                    raise QuarryError(f"the {cfg.engine} engine has no tokenizer interface")
                engines[m.model_id] = engine
                if cfg.test_mode:  # declared cheating (miner run --test-mode): tests only
                    from miner.cheats import cheating_engine

                    engines[m.model_id] = cheating_engine(cfg.test_mode, engine, m.path)
        except BaseException:
            for e in engines.values():
                e.close()
            market.close()
            raise
        kwargs.setdefault("state_dir", cfg.state_dir)
        return cls(account=account, quarry=q, engines=engines, store=market, market=market,
                   max_batch=cfg.max_batch, max_shards_in_flight=cfg.max_shards_in_flight,
                   poll_interval_s=cfg.poll_interval_s,
                   heartbeat_interval_s=cfg.heartbeat_interval_s,
                   auto_withdraw=cfg.auto_withdraw, engine_kind=cfg.engine, **kwargs)

    def close(self) -> None:
        for executor in (self._executor, self._claim_executor):
            if executor is not None:
                executor.shutdown(wait=True)
        for e in self.engines.values():
            e.close()
        if self.market is not None:
            self.market.close()

    # ------------------------------------------------------------------ helpers
    @contextmanager
    def _timed(self, step: str, task_id: int | None) -> Iterator[None]:
        """Tell the listener the span of `step` (with `timing`; see the module docstring)."""
        if not self.timing:
            yield
            return
        start = time.time()
        try:
            yield
        finally:
            self._emit(step, start=start, end=time.time(), task_id=task_id)

    def _emit(self, event: str, **info: Any) -> None:
        if self.listener is not None:
            with self._emit_lock:  # the submitting thread emits too
                self.listener(event, info)

    def chain_now(self) -> int:
        return self.q.chain.timestamp()

    def params(self) -> dict[str, int]:
        if self._params is None:
            self._params = self.q.tasks.params()
        return self._params

    def status(self) -> dict[str, Any]:
        """The heartbeat's status: what the market's miner directory shows."""
        cur = self.current
        return {
            "models": ["0x" + m.hex() for m in self.engines],
            "engine": self.engine_kind,
            "commitments": all(e.commit for e in self.engines.values()),
            "busy": cur is not None,
            "current": None if cur is None else {"taskId": cur.task_id, "shard": cur.shard},
            "shardsSubmitted": len(self.summary.submitted),
            "shardsFailed": len(self.failed),
            "openChallenges": sorted(self.open_challenges),
            "challengesAnswered": self.summary.challenges_answered,
            "unservable": [{"taskId": t, "shardId": k, "reason": r[:UNSERVABLE_REASON_CHARS]}
                           for (t, k), r in list(self.unservable.items())[-UNSERVABLE_KEPT:]],
            "behind": self.backlog.report(),
            # Measured generation speed: clients size shards to end within a claim window.
            "secondsPerToken": round(self.backlog.token_s, 6) or None,
        }

    # ------------------------------------------------------------------ discovery
    def find_open_shards(self, limit: int = 20, wait_s: float = 0.0) -> list[tuple[int, int]]:
        """(taskId, shard) candidates, best first: the market's recommendation, or the
        chain's own events when the market is unreachable. `wait_s`: a miner of one model
        lets the market hold an empty answer that long, until a shard opens (a long poll;
        with several models it would delay the others', so they are asked at once)."""
        if self.market is not None:
            try:
                rows: list[dict[str, Any]] = []
                wait = wait_s if len(self.engines) == 1 else 0.0
                for model_id in self.engines:
                    rows += self.market.open_shards("0x" + model_id.hex(), self.address, limit,
                                                    wait_seconds=wait)
                if self._market_down:
                    log.info("market at %s answers again", self.market.url)
                    self._market_down = False
                found = [(int(r["taskId"]), int(r["shard"])) for r in rows]
                self._seen = {
                    (int(r["taskId"]), int(r["shard"])): (
                        str(r.get("offeredTo") or "").lower() == self.address.lower(),
                        int(r["deadline"])) for r in rows}
                self._sizes = {(int(r["taskId"]), int(r["shard"])): (
                    int(r["end"]) - int(r["start"]), int(r["maxTokensPerRequest"]))
                    for r in rows}
                return [c for c in found
                        if c[0] not in self.skipped_tasks and c not in self.unservable]
            except MarketError as exc:
                if not self._market_down:
                    log.warning("market gave no open shards (%s); reading them from chain "
                                "events", exc)
                    self._market_down = True
        return self.open_shards_from_chain()

    def open_shards_from_chain(self) -> list[tuple[int, int]]:
        """Open shards of live tasks for the served models, from `TaskCreated` and `getShard`
        (plus Claimed shards whose claim expired: reclaiming reopens them)."""
        tasks = self.q.tasks
        head = self.q.chain.block_number()
        if head >= self._task_scan_from:
            for model_id in self.engines:
                for ev in tasks.events("TaskCreated", self._task_scan_from, modelId=model_id):
                    self._known_tasks[int(ev["taskId"])] = (int(ev["deadline"]),
                                                            int(ev["numShards"]))
            self._task_scan_from = head + 1
        now = self.chain_now()
        out: list[tuple[int, int]] = []
        self._seen = {}
        for task_id, (deadline, num_shards) in sorted(self._known_tasks.items()):
            if deadline <= now:
                del self._known_tasks[task_id]
                continue
            if task_id in self.skipped_tasks:
                continue
            for k in range(num_shards):
                if (task_id, k) in self.unservable:
                    continue
                sh = tasks.get_shard(task_id, k)
                if sh.state == ShardState.OPEN or (
                        sh.state == ShardState.CLAIMED and sh.claim_expiry <= now
                        and sh.miner != self.address):
                    out.append((task_id, k))
                    self._seen[(task_id, k)] = (False, deadline)
        return out

    def own_open_claims(self) -> list[tuple[int, int]]:
        """Shards this miner claimed (e.g. before a restart) that are still Claimed by it with
        time left: `run` finishes them first rather than let the collateral be slashed."""
        now = self.chain_now()
        out = []
        since = self.q.deployment.deploy_block
        for ev in self.q.tasks.events("ShardClaimed", since, miner=self.address):
            key = (int(ev["taskId"]), int(ev["shard"]))
            if key in out or key in self.failed:
                continue
            sh = self.q.tasks.get_shard(*key)
            if (sh.state == ShardState.CLAIMED and sh.miner == self.address
                    and sh.claim_expiry > now + CLAIM_MARGIN_S):
                out.append(key)
        return out

    # ------------------------------------------------------------------ inputs
    def _fetch_requests(self, uri: str) -> list[ParsedRequest]:
        try:
            data = self.store.get(uri)
        except (MarketUnavailable, OSError) as exc:
            raise _Skip(f"cannot fetch the input file {uri}: {exc}") from exc
        except StoreError as exc:
            raise _Skip(f"cannot fetch the input file {uri}: {exc}") from exc
        try:
            return parse_jsonl(data)
        except QuarryError as exc:
            raise _Skip(f"input file {uri} is not a valid batch: {exc}", task_wide=True) from exc

    def task_requests(self, task_id: int, task: Any) -> list[ParsedRequest]:
        """The task's requests, checked against its on-chain `numRequests` and `inputRoot`.

        Fetched, parsed and verified once per input (the last `INPUT_CACHE_SIZE` are kept,
        keyed by URI, root and count): rebuilding the Merkle tree over the whole task for
        every shard made a task's total work grow with the square of its size."""
        key = (task.input_uri, bytes(task.input_root), int(task.num_requests))
        cached = self._inputs.get(key)
        if cached is not None:
            self._inputs.move_to_end(key)
            return cached
        try:
            parse_uri(task.input_uri)
        except StoreError as exc:
            raise _Skip(f"inputURI: {exc}", task_wide=True) from exc
        requests = self._fetch_requests(task.input_uri)
        if len(requests) != task.num_requests:
            raise _Skip(f"input file holds {len(requests)} requests, the task says "
                        f"{task.num_requests}", task_wide=True)
        root = input_tree([r.request_hash for r in requests]).root
        if root != task.input_root:
            raise _Skip(f"input file's Merkle root 0x{root.hex()} does not match the task's "
                        f"inputRoot 0x{task.input_root.hex()}", task_wide=True)
        self._inputs[key] = requests
        while len(self._inputs) > INPUT_CACHE_SIZE:
            self._inputs.popitem(last=False)
        return requests

    def prepare(self, engine: TextEngine, task: Any,
                requests: Sequence[ParsedRequest]) -> list[GenerationRequest]:
        """Generation requests for the shard; _Skip naming the first one the model cannot
        serve (checked before claiming, so nothing is locked for work that cannot be done).
        Only this shard is given up: the task's other shards may well fit."""
        out = []
        for r in requests:
            try:
                g = engine.request_from_line(r.request)
                if g.max_tokens > task.max_tokens_per_request:
                    g = dataclasses.replace(g, max_tokens=task.max_tokens_per_request)
                engine.validate_request(r.index, g)
            except QuarryError as exc:
                raise _Skip(f"request {r.index} ({r.custom_id!r}) cannot be served: {exc}",
                            unservable=True) from exc
            out.append(g)
        return out

    # ------------------------------------------------------------------ shards
    def process_shard(self, task_id: int, shard: int, *,
                      pipelined: bool = False) -> ShardOutcome:
        """Check, claim, generate, sign, upload and submit one shard; never raises for a
        shard it cannot or should not take (see the outcome's status and reason).

        `pipelined` (what `run` does): once generated, the shard is signed, uploaded and
        submitted in the background while the caller goes on to the next shard, and the
        outcome says "submitting"; `drain()` waits for it (submissions run one at a time,
        in the order the shards finished generating)."""
        return self.process_shards(task_id, [shard], pipelined=pipelined)[0]

    def process_shards(self, task_id: int, shards: Sequence[int], *,
                       pipelined: bool = False) -> list[ShardOutcome]:
        """`process_shard` for several shards of one task, run through the engine as one
        stream: each is checked (chain state, inputs, tokenized), and all are claimed in one
        `claimShards` transaction when they can be (`_lock_together`); otherwise the first is
        claimed and starts generating while the others are claimed one after another in a
        background thread. Their requests are generated in batches of `max_batch` that run
        across shard boundaries (the engine never drains its batch between shards), and each
        shard is signed, uploaded and submitted as soon as its last output is out. One outcome
        per shard, in order; a shard not reached (a first Ctrl-C stops claiming more) gets
        none.

        `run` passes at most `max_shards_in_flight` shards at a time, so one miner does not
        lock up a task other miners could share."""
        outcomes: dict[int, ShardOutcome] = {}
        seen: dict[str, Any] = {}  # this miner's registry entry, read once per group
        ready = [r for k in shards if (r := self._attempt(
            task_id, k, outcomes, functools.partial(self._check, task_id, k, seen)))]
        group = self._lock_together(ready)
        while ready and not group:  # the first claim, here: generation starts right after
            r = ready.pop(0)
            if (c := self._attempt(task_id, r.shard, outcomes, functools.partial(self._lock, r))):
                group.append(c)
        if group:
            # The others are claimed one after another in the background while the first
            # generates; the stream takes each as its turn comes (`_generate`).
            ahead = [self._claimer().submit(self._lock_ahead, r, outcomes) for r in ready]
            try:
                for o in self._run_group(group[0].engine, group, pipelined, ahead):
                    outcomes[o.shard] = o
            except KeyboardInterrupt:  # an abort: claim no more, and name every claim held
                for f in ahead:
                    f.cancel()
                futures_wait(ahead)
                raise
        self._held = []
        self.current = None
        self.backlog.idle()
        return [outcomes[k] for k in shards if k in outcomes]

    def _attempt(self, task_id: int, shard: int, outcomes: dict[int, ShardOutcome],
                 step: Callable[[], _T]) -> _T | None:
        """`step()` for one shard; None, with its outcome in `outcomes`, when the shard is
        skipped (nothing locked) or failed after claiming (the claim will expire). A
        KeyboardInterrupt passes: the claims stay held and the abort message names them."""
        try:
            with log_context(task=task_id, shard=shard):  # what the step logs names the shard
                return step()
        except _Skip as skip:
            outcomes[shard] = self._skipped(task_id, shard, skip)
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # a chain or store failure must not stop the miner
            reason = f"{type(exc).__name__}: {exc}"
            held = [c for c in self._held if (c.task_id, c.shard) == (task_id, shard)]
            if held:  # claimed, then failed: said loudly, the claim will expire
                self._release(held[0])
                outcomes[shard] = self._failed(held[0], reason)
            else:
                self.summary.skipped += 1
                metrics.SHARDS.labels("skipped").inc()
                log.error("task %d shard %d not taken: %s", task_id, shard, reason,
                          extra={"task": task_id, "shard": shard})
                outcomes[shard] = ShardOutcome(task_id, shard, "skipped", reason)
                self._emit("skipped", task_id=task_id, shard=shard, reason=reason)
        return None

    def _lock_together(self, ready: list[_Ready]) -> list[_Claimed]:
        """Claim the leading shards of `ready` that need a plain claim (not resumed, not
        reclaimed) in one `claimShards` transaction, and take them off `ready`. One
        transaction instead of one per shard while the first generates: on this machine the
        claims made beside generation cost it 2 to 3 times their own CPU (GIL), and on a
        chain with block times each would wait for its own inclusion. [] when there are
        fewer than two, or the chain refuses the batch (a shard was taken meanwhile, too
        little free stake, ...): each is then claimed on its own and its outcome says why."""
        run: list[_Ready] = []
        for r in ready[:MAX_CLAIM_BATCH]:
            if r.resume or r.reclaim:
                break
            run.append(r)
        if self.claim_many is None or len(run) < 2 or self._stop.is_set():
            return []  # after a first Ctrl-C only the first is claimed (`_lock_ahead`)
        task_id = run[0].task_id
        shards = [r.shard for r in run]
        try:
            with self._timed("claim_tx", task_id):
                tx = self.claim_many(task_id, shards)
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # nothing locked on a revert; one by one says why
            log.info("task %d: shards %s not claimed together (%s); claiming one by one",
                     task_id, shards, exc, extra={"task": task_id, "shards": shards})
            return []
        events = {int(e["shard"]): e for e in tx.all("ShardClaimed")}
        del ready[:len(run)]
        return [self._held_claim(r, ActiveClaim(task_id, r.shard,
                                                int(events[r.shard]["claimExpiry"]),
                                                int(events[r.shard]["collateral"])))
                for r in run]

    def _lock_ahead(self, r: _Ready, outcomes: dict[int, ShardOutcome]) -> _Claimed | None:
        """`_lock` in the claiming thread; None once a first Ctrl-C came (claim no more)."""
        if self._stop.is_set():
            return None
        return self._attempt(r.task_id, r.shard, outcomes, functools.partial(self._lock, r))

    def _claimer(self) -> ThreadPoolExecutor:
        if self._claim_executor is None:
            self._claim_executor = ThreadPoolExecutor(1, thread_name_prefix="miner-claim")
        return self._claim_executor

    def _release(self, claim: ActiveClaim) -> None:
        """`claim` is no longer held for generation (handed over, or failed)."""
        self._held.remove(claim)
        self.current = self._held[0] if self._held else None

    def _skipped(self, task_id: int, shard: int, skip: _Skip) -> ShardOutcome:
        if skip.task_wide:
            self.skipped_tasks[task_id] = skip.reason
        if skip.unservable:
            self.unservable[(task_id, shard)] = skip.reason
            while len(self.unservable) > UNSERVABLE_REMEMBERED:
                self.unservable.popitem(last=False)
        log.info("task %d shard %d skipped: %s", task_id, shard, skip.reason,
                 extra={"task": task_id, "shard": shard})
        self.summary.skipped += 1
        metrics.SHARDS.labels("skipped").inc()
        self._emit("skipped", task_id=task_id, shard=shard, reason=skip.reason)
        return ShardOutcome(task_id, shard, "skipped", skip.reason)

    def _failed(self, claim: ActiveClaim, reason: str) -> ShardOutcome:
        """A claimed shard that cannot be submitted: said loudly (the claim will expire)."""
        key = (claim.task_id, claim.shard)
        self.failed.add(key)
        self._prices.pop(key, None)
        self.summary.failed += 1
        metrics.SHARDS.labels("failed").inc()
        log.error("task %d shard %d failed after claiming (%s); the claim expires at %s",
                  *key, reason, _utc(claim.claim_expiry),
                  extra={"task": claim.task_id, "shard": claim.shard, "gave_up": True})
        self._emit("failed", task_id=claim.task_id, shard=claim.shard, reason=reason)
        return ShardOutcome(claim.task_id, claim.shard, "failed", reason)

    def drain(self) -> ShardOutcome | None:
        """Wait for the shards being submitted in the background, if any; the last one's
        outcome. While waiting each is `current` again, so a Ctrl-C names it and an abort
        says what it leaves behind."""
        inflight, self._inflight = self._inflight, []
        outcome = None
        generating = self.current
        try:
            for claim, future in inflight:
                self.current = claim
                outcome = future.result()
        finally:
            self.current = generating
        return outcome

    def _finish_safely(self, claim: ActiveClaim, finish: Callable[[], ShardOutcome],
                       ) -> ShardOutcome:
        """`finish` in the background thread: a failure is an outcome, never raised."""
        try:
            return finish()
        except Exception as exc:
            return self._failed(claim, f"{type(exc).__name__}: {exc}")

    def _check(self, task_id: int, shard: int, seen: dict[str, Any]) -> _Ready:
        """Check one shard against the chain and its inputs, and tokenize its requests;
        `_Skip` when it is not to be taken. `seen` keeps this miner's registry entry for the
        next shards of the same group (the claim rechecks it on-chain)."""
        q, me = self.q, self.address
        if task_id in self.skipped_tasks:
            raise _Skip(self.skipped_tasks[task_id])
        if (task_id, shard) in self.unservable:
            raise _Skip(self.unservable[(task_id, shard)], unservable=True)
        # The task, the shard, the chain's time and (once per group) this miner's entry: one
        # batch of reads.
        also: list[Read] = [lambda eth: eth.get_block("latest")]
        declared = self.precision_of is None and "precisions" not in seen
        if "info" not in seen:
            also.append(q.gpu.fn("minerInfo", me))
        if declared:
            also += [q.gpu.fn("precisionOf", me, m) for m in self.engines]
        try:
            task, (sh,), (head, *answers) = q.tasks.read_shards(task_id, [shard], also)
        except ContractRevert as exc:
            raise _Skip(str(exc)) from exc
        info = seen.get("info") or as_struct(MinerInfo, answers.pop(0))
        if declared:
            seen["precisions"] = {m: int(p) for m, p in zip(self.engines, answers, strict=True)}
        engine = self.engines.get(task.model_id)
        if engine is None:
            raise _Skip(f"this miner runs no engine for model 0x{task.model_id.hex()}",
                        task_wide=True)
        now = int(head["timestamp"])
        resume = (sh.state == ShardState.CLAIMED and sh.miner == me
                  and sh.claim_expiry > now + CLAIM_MARGIN_S)
        reclaim = (sh.state == ShardState.CLAIMED and sh.miner != me
                   and sh.claim_expiry <= now)
        if not (resume or reclaim or sh.state == ShardState.OPEN):
            raise _Skip(f"shard is {sh.state.name}")
        if not resume and now >= task.deadline:
            raise _Skip(f"task deadline passed at {_utc(task.deadline)}", task_wide=True)
        seen["info"] = info
        if not resume and task.price_per_token < info.price_per_token:
            raise _Skip(f"task pays {task.price_per_token} wei/token, below this miner's price "
                        f"of {info.price_per_token} wei/token", task_wide=True)
        if not resume and info.on_probation and not task.allow_probation:
            self._probation_skips.add(task_id)
            raise _Skip("the task does not allow miners on probation, and "
                        + self._probation_note(info), task_wide=True)
        if not resume:
            self._check_terms(task, engine, self._precision(task.model_id, seen))

        requests = self.task_requests(task_id, task)
        start, end = task_shard_range(task, shard)
        shard_requests = requests[start:end]
        gen = self.prepare(engine, task, shard_requests)
        return _Ready(task, task_id, shard, engine, shard_requests, gen, sh, resume, reclaim)

    def _precision(self, model_id: bytes, seen: dict[str, Any]) -> Precision | None:
        """The precision this miner's claim of a `model_id` task is made in (None: none
        declared), read once per group."""
        if self.precision_of is not None:
            if model_id not in seen.setdefault("swarm", {}):
                try:
                    seen["swarm"][model_id] = self.precision_of(model_id)
                except ClaimUnavailable as exc:  # e.g. no swarm registered yet: try later
                    raise _Skip(str(exc)) from exc
            return seen["swarm"][model_id]
        p = seen["precisions"].get(model_id, 0)
        return Precision(p) if p else None

    @staticmethod
    def _check_terms(task: Any, engine: TextEngine, precision: Precision | None) -> None:
        """`_Skip` (the whole task, before any transaction) when the task does not accept
        `precision`, or requires activation commitments that `engine` does not make. With no
        precision declared (the model is not registered) the claim says why (NotEligible)."""
        if precision is not None and not accepts(task.precisions, precision):
            raise _Skip(f"the task accepts {', '.join(mask_labels(task.precisions))}; this "
                        f"miner serves the model in {precision.label}", task_wide=True)
        if task.require_commitments and not engine.commit:
            raise _Skip("the task requires activation commitments and this miner's engine "
                        "makes none", task_wide=True)

    def _lock(self, r: _Ready) -> _Claimed:
        """Claim a checked shard (reclaiming an expired claim first, or resuming this
        miner's own); `_Skip` when the chain refuses (nothing locked)."""
        task, task_id, shard, sh, resume = r.task, r.task_id, r.shard, r.state, r.resume
        q = self.q
        if r.reclaim:
            try:
                q.tasks.reclaim_expired(self.account, task_id, shard)
                log.info("task %d shard %d: reclaimed %s's expired claim", task_id, shard,
                         sh.miner)
            except ContractRevert as exc:
                raise _Skip(f"could not reclaim the expired claim: {exc}") from exc
        if resume:
            claim = ActiveClaim(task_id, shard, sh.claim_expiry, sh.collateral, claimed_at=None)
            log.info("task %d shard %d: resuming this miner's own claim", task_id, shard)
        else:
            claim = self._claim(task, task_id, shard)
        return self._held_claim(r, claim)

    def _held_claim(self, r: _Ready, claim: ActiveClaim) -> _Claimed:
        """`claim` (of `r`) held for generation, and announced."""
        # Held before it is announced: a Ctrl-C from now on finishes it.
        self._held.append(claim)
        if self.current is None:
            self.current = claim
        if not r.resume:
            log.info("task %d shard %d claimed: %d wei collateral locked until %s", r.task_id,
                     r.shard, claim.collateral, _utc(claim.claim_expiry),
                     extra={"task": r.task_id, "shard": r.shard, "collateral": claim.collateral,
                            "claim_expiry": claim.claim_expiry})
        self._emit("claimed", task_id=r.task_id, shard=r.shard,
                   claim_expiry=claim.claim_expiry, collateral=claim.collateral)
        return _Claimed(r.task, claim, r.engine, r.requests, r.gen)

    def _run_group(self, engine: TextEngine, group: list[_Claimed], pipelined: bool,
                   ahead: list[Future[_Claimed | None]]) -> list[ShardOutcome]:
        """Generate the claimed shards as one stream (`ahead`: the claims still being
        made, joining it in order); each shard goes to `_finish` (in the background when
        `pipelined`) as soon as its outputs are complete. A shard whose claim is about to
        expire is given up (failed) before its next batch; an engine failure fails every
        shard not yet complete (their claims expire)."""
        outcomes: list[ShardOutcome] = []
        try:
            for done in self._generate(engine, group, outcomes, ahead):
                self._release(done.claim)
                outcomes.append(self._hand_over(done, pipelined))
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # an engine failure must not stop the miner
            reason = f"{type(exc).__name__}: {exc}"
            futures_wait(ahead)  # claims still being made are held too
            for claim in list(self._held):
                self._release(claim)
                outcomes.append(self._failed(claim, reason))
        return outcomes

    def _hand_over(self, c: _Claimed, pipelined: bool) -> ShardOutcome:
        """Sign the complete shard here, then keep, upload and submit it (in the background
        when `pipelined`). Signing and serializing are pure CPU: in a background thread they
        hold the GIL against the generating loop, whose small steps then wait for it in
        turn (on the tiny model, 0.1 s of signing beside generation slowed it by 0.3-0.5 s),
        so they run between batches; what goes to the background mostly waits on I/O."""
        try:
            result, data = self._sign(c)
        except Exception as exc:  # e.g. a malformed output: this shard only
            return self._failed(c.claim, f"{type(exc).__name__}: {exc}")
        self._prices[(c.claim.task_id, c.claim.shard)] = int(c.task.price_per_token)

        def finish() -> ShardOutcome:
            return self._finish(c.claim, result, data)

        if not pipelined:
            return finish()
        future = self._submitter().submit(self._finish_safely, c.claim, finish)
        self._inflight.append((c.claim, future))
        return ShardOutcome(c.claim.task_id, c.claim.shard, "submitting", "", len(c.gen))

    def _submitter(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="miner-submit")
        return self._executor

    def _sign(self, c: _Claimed) -> tuple[ShardResult, bytes]:
        """One signed receipt per output, the result tree, and the document's bytes."""
        q = self.q
        completions = [
            Completion(index=r.index, custom_id=r.custom_id, request_hash=r.request_hash,
                       text=o.text, token_ids=tuple(o.token_ids), finish_reason=o.finish_reason,
                       prompt_tokens=len(g.prompt_ids), commitment=o.commitment)
            for r, g, o in zip(c.requests, c.gen, c.outputs, strict=True)
        ]
        with self._timed("sign", c.claim.task_id):
            result = build_shard_result(
                task_id=c.claim.task_id, shard=c.claim.shard, model_id=c.task.model_id,
                completions=completions, private_key=self.account.key, miner=self.address,
                chain_id=q.chain_id, task_registry=q.tasks.address)
        return result, result.to_bytes()

    def _finish(self, claim: ActiveClaim, result: ShardResult, data: bytes) -> ShardOutcome:
        """Keep, upload and submit a signed shard result."""
        task_id, shard = claim.task_id, claim.shard
        uri, tx_hash = self._submit(result, data)
        outcome = ShardOutcome(task_id, shard, "submitted", "", len(result.items),
                               result.tokens_used, uri, result.result_root)
        self.summary.submitted.append(outcome)
        metrics.SHARDS.labels("submitted").inc()
        if claim.claimed_at is not None:
            metrics.CLAIM_TO_SUBMIT.observe(time.monotonic() - claim.claimed_at)
        log.info("task %d shard %d submitted: %d requests, %d tokens, %s", task_id, shard,
                 len(result.items), result.tokens_used, uri,
                 extra={"task": task_id, "shard": shard, "tx": tx_hash, "uri": uri,
                        "tokens": result.tokens_used})
        self._emit("submitted", task_id=task_id, shard=shard, tokens_used=result.tokens_used,
                   result_uri=uri)
        return outcome

    def _submit(self, result: ShardResult, data: bytes) -> tuple[str, str]:
        """Keep the document (`data`: its bytes) locally, so challenges can be answered
        whatever the store does, upload it, and submit its root; returns its URI and the
        submitting transaction's hash."""
        key = (result.task_id, result.shard)
        self.archive.save(result, data)
        try:
            with self._timed("upload", result.task_id):
                uri = self.store.put(data)
            with self._timed("submit_tx", result.task_id):
                tx = self.q.tasks.submit_result(self.account, *key, result.result_root, uri,
                                                result.tokens_used)
        except (ContractRevert, StoreError, MarketError):  # surely not submitted
            self.archive.remove(*key)
            raise
        self.pending.add(key)
        return uri, tx.tx_hash

    def _claim(self, task: Any, task_id: int, shard: int) -> ActiveClaim:
        try:
            with self._timed("claim_tx", task_id):
                tx = self.claim(task_id, shard)
        except ClaimUnavailable as exc:
            raise _Skip(str(exc)) from exc
        except ContractRevert as exc:
            reason = str(exc)
            if exc.error == "NotEligible":
                reason += ": " + self.ineligibility(task.model_id, task.min_reputation_bps,
                                                    task.allow_probation)
            elif exc.error == "InsufficientFreeStake":
                reason += ": add stake (miner register with a higher stake) or wait for " \
                          "submitted shards to finalize"
            raise _Skip(reason, task_wide=exc.error in _TASK_REVERTS) from exc
        ev = tx.event("ShardClaimed")
        return ActiveClaim(task_id, shard, int(ev["claimExpiry"]), int(ev["collateral"]))

    def ineligibility(self, model_id: bytes, min_reputation_bps: int,
                      allow_probation: bool = False) -> str:
        """Why GPURegistry.isEligible is false for this miner and model, in words."""
        return why_not_eligible(self.q, self.address, model_id, min_reputation_bps,
                                allow_probation)

    def _probation_note(self, info: MinerInfo) -> str:
        from miner.status import probation_note

        return probation_note(info.passed_epochs, *self.q.gpu.probation_params())

    def _check_probation(self) -> None:
        """Tasks skipped only for probation become candidates again once it has ended."""
        if not self._probation_skips or self.q.gpu.on_probation(self.address):
            return
        log.info("this miner is off probation: %d task(s) skipped for it are candidates again",
                 len(self._probation_skips))
        for task_id in self._probation_skips:
            self.skipped_tasks.pop(task_id, None)
        self._probation_skips.clear()

    def _generate(self, engine: TextEngine, group: list[_Claimed],
                  outcomes: list[ShardOutcome],
                  ahead: list[Future[_Claimed | None]]) -> Iterator[_Claimed]:
        """Run the group's requests through `engine` in batches of `max_batch`, in order
        and across shard boundaries; yield each shard as soon as its outputs are complete.
        The claims made `ahead` join the stream in order: as soon as they are done, and
        waited for when the stream has less than a batch left (batches stay full).
        Before every batch: a shard whose claim has less than `CLAIM_MARGIN_S` left is given
        up (its outcome "failed" goes to `outcomes`: a late submit only reverts), and open
        availability challenges are answered (a long stream must not miss a window)."""
        from tqdm import tqdm

        stream = [(c, i) for c in group for i in range(len(c.gen))]
        dropped: set[int] = set()  # shards given up, by position in the group
        pos = 0
        first = group[0].claim
        desc = (f"task {first.task_id} shard {first.shard}" if len(group) == 1 and not ahead
                else f"task {first.task_id} shards from {first.shard}")
        clock_at = -math.inf  # monotonic time of the last chain-time read
        chain_t = 0
        with tqdm(total=len(stream), desc=desc, unit="req", file=sys.stderr,
                  disable=not (self.progress and sys.stderr.isatty()), leave=False) as bar:
            while True:
                while ahead and (len(stream) - pos < self.max_batch or ahead[0].done()):
                    joined = ahead.pop(0).result()
                    if joined is not None:
                        group.append(joined)
                        stream += [(joined, i) for i in range(len(joined.gen))]
                        bar.total = len(stream)
                if pos >= len(stream):
                    break
                if time.monotonic() - clock_at >= CLOCK_READ_S:
                    chain_t, clock_at = self.chain_now(), time.monotonic()
                now = chain_t + int(time.monotonic() - clock_at)
                for j, c in enumerate(group):
                    if (j not in dropped and len(c.outputs) < len(c.gen)
                            and now >= c.claim.claim_expiry - CLAIM_MARGIN_S):
                        dropped.add(j)
                        self._release(c.claim)
                        outcomes.append(self._failed(c.claim, (
                            f"claim expires at {_utc(c.claim.claim_expiry)} before the shard "
                            "is done; giving it up")))
                self._maybe_answer_challenges()
                batch: list[tuple[_Claimed, int]] = []
                while pos < len(stream) and len(batch) < self.max_batch:
                    c, i = stream[pos]
                    pos += 1
                    if group.index(c) not in dropped:
                        batch.append((c, i))
                if not batch:
                    continue
                started = time.monotonic()
                with self._timed("generate", batch[0][0].claim.task_id):
                    outputs = engine.generate([c.gen[i] for c, i in batch])
                took = time.monotonic() - started
                _batch_metrics(batch[0][0].task.model_id, outputs, took)
                self.backlog.batch(len(outputs), took, len(stream) - pos, now + int(took),
                                   tokens=sum(len(o.token_ids) for o in outputs))
                self._say_late()
                for (c, _), out in zip(batch, outputs, strict=True):
                    c.outputs.append(out)
                bar.update(len(batch))
                # Shards complete in order: every one before the batch's last is done.
                for c in dict.fromkeys(c for c, _ in batch):
                    if len(c.outputs) == len(c.gen):
                        yield c

    # ------------------------------------------------------------------ payment
    def _discover_submitted(self) -> None:
        """Add this miner's submitted shards from chain events (e.g. from an earlier run)."""
        head = self.q.chain.block_number()
        if head < self._submitted_scan_from:
            return
        for ev in self.q.tasks.events("ResultSubmitted", self._submitted_scan_from,
                                      miner=self.address):
            self.pending.add((int(ev["taskId"]), int(ev["shard"])))
        self._submitted_scan_from = head + 1

    def _done(self, task_id: int, shard: int) -> None:
        """The shard is settled (or no longer this miner's): nothing left to answer for."""
        self.pending.discard((task_id, shard))
        self._prices.pop((task_id, shard), None)
        self.archive.remove(task_id, shard)

    def _finalized_elsewhere(self, sh: Shard, key: tuple[int, int]) -> None:
        """Metrics of this miner's shard finalized by another account (usually the market's
        settlement sweep): it paid the shard's tokens at the task's price."""
        price = self._prices.get(key)
        if price is not None and sh.miner == self.address:
            metrics.SHARDS.labels("finalized").inc()
            metrics.WEI_EARNED.inc(sh.tokens_used * price)

    def _prune_archive(self) -> None:
        """Local copies of shards not pending (e.g. from an earlier run): kept while the
        shard is this miner's and unsettled, else removed."""
        for key in self.archive.keys():
            if key in self.pending:
                continue
            sh = self.q.tasks.get_shard(*key)
            if sh.miner == self.address and sh.state in (ShardState.SUBMITTED,
                                                         ShardState.DISPUTED):
                self.pending.add(key)
            elif sh.miner != self.address or sh.state != ShardState.CLAIMED:
                self.archive.remove(*key)

    def collect(self) -> int:
        """Finalize this miner's submitted shards whose window closed; with `auto_withdraw`
        withdraw the escrowed earnings. Returns the wei the finalizations paid it."""
        tasks = self.q.tasks
        self._discover_submitted()
        self._prune_archive()
        now = max(self.chain_now(), int(time.time()))
        paid = 0
        for task_id, shard in sorted(self.pending):
            if self._window_ends.get((task_id, shard), 0) > now:
                continue  # known to be still inside its window
            sh = tasks.get_shard(task_id, shard)
            if sh.state in (ShardState.FINALIZED, ShardState.REFUNDED) or sh.miner != self.address:
                if sh.state == ShardState.FINALIZED:
                    self._finalized_elsewhere(sh, (task_id, shard))
                if sh.miner == self.address:  # settled by another account (the market's sweep)
                    log.info("task %d shard %d %s", task_id, shard, sh.state.name.lower(),
                             extra={"task": task_id, "shard": shard})
                self._done(task_id, shard)
                continue
            if sh.state == ShardState.SUBMITTED:
                self._window_ends[(task_id, shard)] = sh.window_end
            if sh.state != ShardState.SUBMITTED or sh.window_end > now:
                continue  # disputed, or window still open
            try:
                tx = tasks.finalize_shard(self.account, task_id, shard)
            except ContractRevert as exc:
                if exc.error == "AlreadyFinalized":
                    self._finalized_elsewhere(sh, (task_id, shard))
                    self._done(task_id, shard)
                elif exc.error not in ("WindowNotClosed", "DisputeOpen"):
                    log.warning("finalizing task %d shard %d: %s", task_id, shard, exc,
                                extra={"task": task_id, "shard": shard})
                continue
            payment = int(tx.event("ShardFinalized")["payment"])
            paid += payment
            self.summary.finalized += 1
            self.summary.paid_wei += payment
            metrics.SHARDS.labels("finalized").inc()
            metrics.WEI_EARNED.inc(payment)
            self._done(task_id, shard)
            log.info("task %d shard %d finalized: %d wei to escrow", task_id, shard, payment,
                     extra={"task": task_id, "shard": shard, "payment": payment,
                            "tx": tx.tx_hash})
            self._emit("finalized", task_id=task_id, shard=shard, payment=payment)
        self._window_ends = {k: v for k, v in self._window_ends.items() if k in self.pending}
        if self.auto_withdraw:
            self.withdraw()
        return paid

    def withdraw(self) -> int:
        """Pull everything escrowed for this miner; returns the wei sent (0 when none)."""
        amount = self.q.escrow.withdrawable(self.address)
        if amount == 0:
            return 0
        self.q.escrow.withdraw(self.account)
        self.summary.withdrawn_wei += amount
        log.info("withdrew %d wei of earnings", amount)
        self._emit("withdrawn", amount=amount)
        return amount

    # ------------------------------------------------------------------ availability
    def answer_challenges(self) -> int:
        """Answer every open availability challenge naming this miner before its deadline,
        with the receipt and proof from the local copy of the result (else the store);
        returns how many were answered now. One that cannot be answered is logged as an
        error: unanswered at its deadline, it costs the shard's collateral."""
        self._last_challenge_check = time.monotonic()
        self._scan_challenges()
        answered = 0
        for challenge_id in sorted(self.open_challenges):
            try:
                answered += self._answer(challenge_id)
            except QuarryError as exc:  # e.g. the chain did not answer: retried next poll
                c = self.open_challenges.get(challenge_id)
                where = {} if c is None else {"task": c.task_id, "shard": c.shard}
                log.error("answering availability challenge %d failed (retrying): %s",
                          challenge_id, exc, extra={"challenge": challenge_id, **where})
        return answered

    def _maybe_answer_challenges(self) -> None:
        """`answer_challenges` when `challenge_check_s` has passed since the last look; a
        failure is logged, never raised (the shard being generated goes on)."""
        if time.monotonic() - self._last_challenge_check >= self.challenge_check_s:
            self._safely("answering availability challenges", self.answer_challenges, 0)

    def _scan_challenges(self) -> None:
        """Add `AvailabilityChallenged` events naming this miner since the last scan."""
        head = self.q.chain.block_number()
        if head < self._challenge_scan_from:
            return
        for ev in self.q.arbitration.events("AvailabilityChallenged", self._challenge_scan_from):
            challenge_id = int(ev["challengeId"])
            if (to_checksum_address(ev["miner"]) != self.address or challenge_id in self._closed
                    or challenge_id in self.open_challenges):
                continue
            c = self.q.arbitration.get_challenge(challenge_id)
            if c.status != ChallengeStatus.OPEN:
                self._forget(challenge_id, c)  # settled before this miner looked (restart)
                continue
            self.open_challenges[challenge_id] = c
            log.warning("task %d shard %d: availability challenge %d on request %d by %s "
                        "(bond %d wei): answering, deadline %s", c.task_id, c.shard,
                        challenge_id, c.index, c.challenger, c.bond, _utc(c.deadline),
                        extra={"task": c.task_id, "shard": c.shard, "challenge": challenge_id})
            self._emit("challenged", challenge_id=challenge_id, task_id=c.task_id,
                       shard=c.shard, index=c.index, bond=c.bond, deadline=c.deadline)
        self._challenge_scan_from = head + 1

    def _forget(self, challenge_id: int, c: AvailabilityChallenge) -> None:
        """A challenge no longer open: remembered, and said how it ended if it cost."""
        self.open_challenges.pop(challenge_id, None)
        self._closed.add(challenge_id)
        if c.status == ChallengeStatus.UNANSWERED:
            self._window_ends.pop((c.task_id, c.shard), None)  # refunded: `collect` rereads
            log.error("task %d shard %d: availability challenge %d was settled UNANSWERED: "
                      "the shard's collateral was slashed", c.task_id, c.shard, challenge_id,
                      extra={"task": c.task_id, "shard": c.shard, "challenge": challenge_id})

    def _answer(self, challenge_id: int) -> bool:
        """Answer one open challenge; True when this call answered it."""
        arb = self.q.arbitration
        c = arb.get_challenge(challenge_id)
        if c.status != ChallengeStatus.OPEN:
            self._forget(challenge_id, c)
            return False
        if self.chain_now() >= c.deadline:
            return self._missed(challenge_id, c, "its response window closed")
        item, source = self._challenged_item(c)
        if item is None:
            if challenge_id not in self._unanswerable:  # loud once; retried every poll
                self._unanswerable.add(challenge_id)
                log.error("CANNOT ANSWER availability challenge %d (task %d shard %d request "
                          "%d): %s. Unless the document is found before %s, the miner is at "
                          "fault and loses the shard's collateral", challenge_id, c.task_id,
                          c.shard, c.index, source, _utc(c.deadline),
                          extra={"task": c.task_id, "shard": c.shard,
                                 "challenge": challenge_id})
                self._emit("challenge_unanswerable", challenge_id=challenge_id,
                           task_id=c.task_id, shard=c.shard, index=c.index, reason=source)
            return False
        try:
            tx = self.q.arbitration.answer_availability(self.account, challenge_id,
                                                        item.receipt, item.proof)
        except ContractRevert as exc:
            if exc.error == "ChallengeNotOpen":  # answered by someone else, or settled
                self._forget(challenge_id, arb.get_challenge(challenge_id))
                return False
            if exc.error == "ResponseWindowClosed":
                return self._missed(challenge_id, c, str(exc))
            raise
        window_end = int(tx.event("AvailabilityAnswered")["windowEnd"])
        self.open_challenges.pop(challenge_id, None)
        self._closed.add(challenge_id)
        self.answered.add(challenge_id)
        self._window_ends[(c.task_id, c.shard)] = window_end
        self.summary.challenges_answered += 1
        self.summary.challenge_bonds_wei += c.bond
        metrics.CHALLENGES.labels("answered").inc()
        log.info("task %d shard %d: answered availability challenge %d (request %d) from the "
                 "%s; bond of %d wei credited, window now ends %s", c.task_id, c.shard,
                 challenge_id, c.index, source, c.bond, _utc(window_end),
                 extra={"task": c.task_id, "shard": c.shard, "challenge": challenge_id,
                        "tx": tx.tx_hash})
        self._emit("answered", challenge_id=challenge_id, task_id=c.task_id, shard=c.shard,
                   index=c.index, bond=c.bond, window_end=window_end, source=source)
        return True

    def _missed(self, challenge_id: int, c: AvailabilityChallenge, why: str) -> bool:
        self.open_challenges.pop(challenge_id, None)
        self._closed.add(challenge_id)
        self._window_ends.pop((c.task_id, c.shard), None)  # to be refunded: `collect` rereads
        self.summary.challenges_missed += 1
        metrics.CHALLENGES.labels("missed").inc()
        log.error("MISSED availability challenge %d (task %d shard %d request %d): %s; the "
                  "miner is at fault and the shard's collateral will be slashed", challenge_id,
                  c.task_id, c.shard, c.index, why,
                  extra={"task": c.task_id, "shard": c.shard, "challenge": challenge_id})
        self._emit("challenge_missed", challenge_id=challenge_id, task_id=c.task_id,
                   shard=c.shard, index=c.index)
        return False

    def _challenged_item(self, c: AvailabilityChallenge) -> tuple[ResultItem | None, str]:
        """(the challenged request's item, where it came from), proven on-chain
        (`Arbitration.proves`), from the local copy or else the store; (None, why not) when
        neither has it."""
        sh = self.q.tasks.get_shard(c.task_id, c.shard)
        loaders: list[tuple[str, Callable[[], ShardResult | None]]] = [
            ("local copy", lambda: self.archive.load(c.task_id, c.shard)),
            ("store", lambda: ShardResult.from_bytes(self.store.get(sh.result_uri))),
        ]
        reasons = []
        for source, load in loaders:
            try:
                doc = load()
            except (QuarryError, OSError) as exc:
                reasons.append(f"{source}: {exc}")
                continue
            item = None if doc is None else next(
                (it for it in doc.items if it.index == c.index), None)
            if doc is None:
                reasons.append(f"{source}: missing")
            elif item is None or doc.result_root != sh.result_root:
                reasons.append(f"{source}: not the submitted document")
            elif not self.q.arbitration.proves(c.task_id, c.shard, item.receipt, item.proof):
                reasons.append(f"{source}: its proof does not hold on-chain")
            else:
                return item, source
        return None, "; ".join(reasons)

    # ------------------------------------------------------------------ the loop
    def request_stop(self) -> None:
        """Finish the current shard, then leave `run` (what the first Ctrl-C does)."""
        self._stop.set()

    def _on_sigint(self, signum: int, frame: Any) -> None:
        self._interrupts += 1
        if self._interrupts > 1:
            raise KeyboardInterrupt
        claims = self._claims_held()
        if claims:
            cur, more = claims[0], ", ".join(str(c.shard) for c in claims[1:])
            also = f" (and shard(s) {more} claimed with it)" if more else ""
            say(f"miner: Ctrl-C: finishing task {cur.task_id} shard {cur.shard}{also}, then "
                "exiting (Ctrl-C again to abort it)", logger="miner", task=cur.task_id,
                shard=cur.shard)
        else:
            say("miner: Ctrl-C: exiting", logger="miner")
        self.request_stop()

    def abort_message(self) -> str:
        """What a hard abort leaves behind: each claim, its expiry and the collateral."""
        claims = self._claims_held()
        if not claims:
            return "aborted; no shard was claimed"
        bps = self.params()["reclaim_penalty_bps"]
        return "aborted " + "; ".join(
            f"task {c.task_id} shard {c.shard}: its claim expires at {_utc(c.claim_expiry)} "
            f"(in about {max(0, c.claim_expiry - int(time.time()))} s); {c.collateral} wei of "
            f"stake stays locked until then, and {c.collateral * bps // 10_000} wei of it is "
            "slashed when the claim is reclaimed" for c in claims)

    def _claims_held(self) -> list[ActiveClaim]:
        """The claim being worked on (`current`) first, then the others held with it."""
        cur = self.current
        return ([] if cur is None else [cur]) + [c for c in self._held if c is not cur]

    def _heartbeat_loop(self, stop: threading.Event) -> None:
        assert self.market is not None
        api = MarketAPI(self.market.url, timeout=10.0)
        warned = False
        try:
            while True:
                try:
                    if self.current is not None:  # busy: look at what waits meanwhile
                        self._look_while_busy(api)
                    api.heartbeat(self.account, self.status())
                    warned = False
                except MarketError as exc:
                    if not warned:
                        log.warning("heartbeat failed: %s", exc)
                        warned = True
                if stop.wait(self.heartbeat_interval_s):
                    return
        finally:
            api.close()

    def _look_while_busy(self, api: MarketAPI) -> None:
        """From the heartbeat thread while a stream is generated: the shards now offered to
        this miner (a directed job, a committee challenge) join what waits behind it, so the
        heartbeat says so and the generating loop logs the ones it will not reach in time."""
        offered: dict[tuple[int, int], tuple[bool, int]] = {}
        for model_id in self.engines:
            for r in api.open_shards("0x" + model_id.hex(), self.address, 20, wait_seconds=0):
                if str(r.get("offeredTo") or "").lower() == self.address.lower():
                    offered[(int(r["taskId"]), int(r["shard"]))] = (True, int(r["deadline"]))
        self.backlog.also_seen(offered)

    def _safely(self, what: str, fn: Callable[[], Any], default: Any) -> Any:
        try:
            return fn()
        except KeyboardInterrupt:
            raise
        except QuarryError as exc:
            log.warning("%s failed: %s", what, exc)
            return default

    def run(self, stop_when_idle: bool = False) -> RunSummary:
        """Poll, work and collect until Ctrl-C (or, with `stop_when_idle`, until a poll finds
        no shard it can take), starting with this miner's own unfinished claims. Heartbeats
        go to the market from a background thread."""
        self._stop.clear()
        self._interrupts = 0
        previous = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGINT, self._on_sigint)
        hb_stop = threading.Event()
        hb = None
        if self.market is not None:
            hb = threading.Thread(target=self._heartbeat_loop, args=(hb_stop,),
                                  name="miner-heartbeat", daemon=True)
            hb.start()
        try:
            resume = self._safely("finding this miner's open claims", self.own_open_claims, [])
            idle = False
            while not self._stop.is_set():
                self.drain()
                self._safely("answering availability challenges", self.answer_challenges, 0)
                self._safely("checking probation", self._check_probation, None)
                with self._timed("collect", None):
                    self._safely("collecting payments", self.collect, 0)
                # Idle, ask the market to hold the answer until a shard opens (a long poll);
                # one that answers sooner with nothing (an older market) gets the usual
                # poll interval of sleep instead.
                asked = time.monotonic()
                wait_s = LONG_POLL_S if idle and not stop_when_idle else 0.0
                repoll = not resume  # this miner's own claims first, all of them
                candidates = resume or self._found(wait_s) or []
                resume = []
                worked = False
                for task_id, shards in self._groups(candidates, repoll):
                    if self._stop.is_set():
                        break
                    self._maybe_answer_challenges()
                    # Each candidate is re-checked on-chain before it is claimed, so a
                    # ranking a shard old is still safe to walk to its end. Up to
                    # `max_shards_in_flight` shards of a task run as one stream; each is
                    # submitted in the background while the next ones are generated.
                    outcomes = self.process_shards(task_id, shards, pipelined=True)
                    worked |= any(o.status in ("submitted", "submitting") for o in outcomes)
                if self._stop.is_set() or (not worked and stop_when_idle):
                    break
                # Just back from work, the next turn long-polls at once (a task posted now
                # is heard of as it is indexed); a long poll answered early with nothing
                # (an older market, or chain events) sleeps out the poll interval.
                was_idle, idle = idle, not worked
                if idle and not candidates and was_idle:
                    self._stop.wait(max(0.0, self.poll_interval_s
                                        - (time.monotonic() - asked)))
                elif idle and candidates:
                    self._stop.wait(self.poll_interval_s)
            self.drain()
        except KeyboardInterrupt:
            msg = self.abort_message()
            log.error("%s", msg)
            if not json_logs():  # said once more where it is seen even without logging set up
                print(f"miner: {msg}", file=sys.stderr, flush=True)
            raise
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
            hb_stop.set()
            if hb is not None:
                hb.join(timeout=15)
            self._warn_unwatched()
        return self.summary

    def _groups(self, candidates: list[tuple[int, int]],
                repoll: bool) -> Iterator[tuple[int, list[int]]]:
        """`task_groups` of the candidates; with `repoll`, the market is asked again between
        groups (one cheap read), so a shard offered to this miner since (a directed job, a
        committee challenge: the market ranks them first) is served before the rest of an
        older list. Each group is tried once per turn; the chain fallback is not re-read."""
        pending, tried = list(candidates), set[tuple[int, int]]()
        first = True
        while pending:
            if not first and repoll and self.market is not None and not self._market_down:
                fresh = self._found(0.0)
                if fresh is not None:
                    pending = [c for c in fresh if c not in tried]
                if not pending:
                    return
            first = False
            self.backlog.seen({c: self._seen.get(c, (False, 2**62)) for c in pending})
            task_id, shards = next(task_groups(pending, self.max_shards_in_flight))
            shards = self._that_fit(task_id, shards)
            tried.update((task_id, k) for k in shards)
            pending = [c for c in pending if c not in tried]
            self.backlog.started(task_id, shards)
            yield task_id, shards

    def _found(self, wait_s: float) -> list[tuple[int, int]] | None:
        """`find_open_shards` (None when it fails), told to the listener when it found
        candidates."""
        found: list[tuple[int, int]] | None = self._safely(
            "finding open shards", functools.partial(self.find_open_shards, wait_s=wait_s),
            None)
        if found:
            self._emit("found", tasks=sorted({t for t, _ in found}))
        return found

    def _that_fit(self, task_id: int, shards: list[int]) -> list[int]:
        """The leading shards (at least one) that, claimed together, end within `CLAIM_FILL`
        of the claim window and of the committee's answer window at this miner's measured
        pace: each claim's window runs from the claim, the last shard of a stream waits for
        all before it, and a challenge offered meanwhile waits for the stream."""
        window = CLAIM_FILL * min(self.params()["claim_timeout"],
                                  self.backlog.answer_window_s)
        total, tokens = 0, 0
        for n, k in enumerate(shards):
            requests, max_tokens = self._sizes.get((task_id, k), (0, 0))
            total, tokens = total + requests, max(tokens, max_tokens)
            if n > 0 and not self.backlog.fits(total, tokens, window):
                log.info("task %d: claiming %d of shards %s together: at %.4f s/token more "
                         "would outlast %.0f s (half the claim or answer window)", task_id, n,
                         shards, self.backlog.token_s, window, extra={"task": task_id})
                return shards[:n]
        return shards

    def _say_late(self) -> None:
        """Log once each shard the miner sees but will not reach in time (`Backlog.late`)."""
        for (task_id, shard), why in self.backlog.newly_late(self.backlog.chain_now()):
            log.warning("behind: task %d shard %d waits: %s", task_id, shard, why,
                        extra={"task": task_id, "shard": shard, "behind": True})

    def _warn_unwatched(self) -> None:
        """Leaving with shards in their window: nobody answers their challenges now."""
        if self.pending:
            log.warning("%d submitted shard(s) are still inside their challenge window; run "
                        "the miner again soon: an availability challenge must be answered "
                        "within minutes or the collateral is slashed", len(self.pending))
