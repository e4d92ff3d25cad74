"""Judging one submitted shard from public data: what a dispute vote and an audit both do.

The evidence is the miner's own result document at the shard's on-chain `resultURI`, never
an opener's `evidenceURI`: the opener chooses that URI, so trusting it would let a client
point at bytes that are missing or are not the miner's and have an honest miner slashed for
"withholding". The document at `resultURI` is the one the miner published and committed to
with `resultRoot`; it must verify like the client's own check (`verify_shard_result`: every
receipt signed by the miner, under the root, hashing to its text and token ids, answering
the task's own request hashes, each carrying an activation commitment when the task requires
them). Unavailable or inconsistent, the miner is at fault (data withheld). Otherwise every
output of the shard is scored against the requests of the task's input file, at the precision
the shard recorded at its claim and with the outputs' commitments, and judged as a set
(`verifier.scoring.judge`): an opener that picks the least likely of n honest outputs gains
nothing, since an honest shard is found at fault with probability at most FALSE_FAULT_RATE
whichever receipt is named.

Trouble on the verifier's side (market or scoring workers unreachable, a model this
verifier does not run) raises `DisputeDeferred`: nothing is decided, it is tried again.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from market.chain.contracts import Shard, ShardState, Task
from market.errors import QuarryError
from market.jobs import verified_shard
from market.marketapi import MarketAPI, MarketError
from market.protocol.eip712 import Receipt
from market.protocol.merkle import input_tree
from market.protocol.requests import ParsedRequest, parse_jsonl
from market.protocol.results import ResultCheckFailed, ResultItem
from market.store import ContentNotFound, StoreError, parse_uri
from verifier.scoring import ChallengeScore, judge

if TYPE_CHECKING:
    from market.chain.deploy import Quarry
    from verifier.scoring_worker import ScoringClient


class DisputeDeferred(QuarryError):
    """The shard cannot be judged now for a reason on the verifier's side (market or
    scoring workers unreachable, the market serving bytes that do not match their address,
    a model this verifier does not run); nothing is decided and it is tried again later."""


class _ClientSide(Exception):
    """Internal: the task's inputs are unusable (the client's side)."""


class _Withheld(Exception):
    """Internal: the miner's document is missing or does not verify (the miner's side)."""


@dataclass(frozen=True)
class ShardVerdict:
    """A shard judged: `fault` with its `reason`. `scores` (one per request of the shard,
    from `start`) are None when it was judged on its evidence alone; `withheld` when the
    miner's document is missing or inconsistent; `inputs_unusable` when the client's own
    input file cannot be used (nothing can then be shown against the miner)."""

    task_id: int
    shard: int
    start: int
    fault: bool
    reason: str
    scores: list[ChallengeScore] | None = None
    items: list[ResultItem] | None = None
    withheld: bool = False
    inputs_unusable: bool = False

    def most_suspicious(self) -> int:
        """The request index to name in a dispute: the output with the clearest evidence."""
        if not self.scores:
            return self.start
        k = max(range(len(self.scores)),
                key=lambda i: self.scores[i].suspicion())  # type: ignore[index]
        return self.start + k


def scoring_line(request: Mapping[str, Any], max_tokens: int) -> dict[str, Any]:
    """The request as the miner had to serve it: `max_tokens` capped by the task's
    `maxTokensPerRequest` (what the miner's engine also caps to), so the reference
    distribution is read over the same length budget as the miner's output."""
    line = copy.deepcopy(dict(request))
    body = line["body"]
    body["max_tokens"] = min(int(body["max_tokens"]), max_tokens)
    return line


JUDGED_KEPT = 4096
"""How many scored verdicts `ShardJudge` keeps: an audit's verdict is read again when its
shard's evidence joins the miner's epoch (`verifier.committee`), and scoring is the cost."""


class ShardJudge:
    """Judges submitted shards of tasks over this verifier's model (see the module doc)."""

    def __init__(self, q: Quarry, market: MarketAPI, scorer: ScoringClient, *,
                 model_id: bytes | None = None) -> None:
        self.q, self.market, self.scorer = q, market, scorer
        self._model_id = model_id
        self._judged: OrderedDict[tuple[int, int], ShardVerdict] = OrderedDict()

    @property
    def model_id(self) -> bytes:
        """The model the scorer scores with: given, or the scorer's model directory's
        manifest (the scoring worker checks the files against it before loading)."""
        if self._model_id is None:
            from market.model.manifest import load_manifest

            self._model_id = load_manifest(self.scorer.model_dir).model_id
        return self._model_id

    def judge(self, task_id: int, shard: int, *, receipt: Receipt | None = None
              ) -> ShardVerdict:
        """The verdict on a submitted shard; with `receipt` (a dispute's), the miner's
        document must also hold exactly that receipt. A scored verdict is kept and given
        again (a submitted shard's document and requests never change); one without scores
        is not (a withheld document may be published later)."""
        if receipt is None and (task_id, shard) in self._judged:
            self._judged.move_to_end((task_id, shard))
            return self._judged[task_id, shard]
        verdict = self._judge(task_id, shard, receipt)
        if receipt is None and verdict.scores is not None:
            self._judged[task_id, shard] = verdict
            if len(self._judged) > JUDGED_KEPT:
                self._judged.popitem(last=False)
        return verdict

    def _judge(self, task_id: int, shard: int, receipt: Receipt | None) -> ShardVerdict:
        task = self.q.tasks.get_task(task_id)
        state = self.q.tasks.get_shard(task_id, shard)
        start, end = self.q.tasks.shard_range(task_id, shard)
        verdict_of = functools.partial(ShardVerdict, task_id=task_id, shard=shard, start=start)
        try:
            requests = self.task_requests(task)
        except _ClientSide as exc:
            return verdict_of(fault=False, reason=f"task input unusable: {exc}",
                                inputs_unusable=True)
        try:
            items = self._items(task_id, shard, task, state, start, requests[start:end],
                                receipt)
        except _Withheld as exc:
            return verdict_of(fault=True, reason=f"data withheld: {exc}",
                                withheld=True)
        over = [it for it in items if len(it.token_ids) > task.max_tokens_per_request]
        if over:
            return verdict_of(fault=True, items=items, reason=(
                f"request {over[0].index}: {len(over[0].token_ids)} output tokens, over the "
                f"task's {task.max_tokens_per_request}"))
        if task.model_id != self.model_id:
            raise DisputeDeferred(
                f"task {task_id} is over model 0x{task.model_id.hex()}, this verifier "
                f"scores with 0x{self.model_id.hex()}")
        lines = [scoring_line(requests[it.index].request, task.max_tokens_per_request)
                 for it in items]
        try:
            scores = self.scorer.score(lines, [list(it.token_ids) for it in items],
                                       [it.finish_reason for it in items],
                                       [it.text for it in items], precision=state.precision,
                                       commitments=[it.commitment for it in items])
        except QuarryError as exc:  # ScoringError: workers down, timeout...
            raise DisputeDeferred(f"task {task_id} shard {shard}: scoring failed: {exc}"
                                  ) from exc
        if len(scores) != len(items):
            raise DisputeDeferred(f"task {task_id} shard {shard}: the scorer returned "
                                  f"{len(scores)} scores for {len(items)} outputs")
        verdict = judge(scores)
        reason = f"shard of {verdict.outputs} output(s): " + (
            verdict.reason if not verdict.passed else f"passes ({verdict.summary()})")
        return verdict_of(fault=not verdict.passed, reason=reason, scores=scores,
                            items=items)

    def task_requests(self, task: Task) -> list[ParsedRequest]:
        """The task's requests, checked against its on-chain count and inputRoot
        (`_ClientSide` naming the problem). An unreachable market, or one serving bytes
        that do not match their address (its fault, not the client's), defers."""
        uri = task.input_uri
        try:
            parse_uri(uri)
        except StoreError as exc:
            raise _ClientSide(f"inputURI: {exc}") from exc
        try:
            data = self.market.get(uri)
        except ContentNotFound as exc:
            raise _ClientSide(f"input file {uri} is not in the market's store") from exc
        except (MarketError, StoreError) as exc:
            raise DisputeDeferred(f"cannot fetch input file {uri}: {exc}") from exc
        try:
            requests = parse_jsonl(data)
        except QuarryError as exc:
            raise _ClientSide(f"input file is not a valid batch: {exc}") from exc
        if len(requests) != task.num_requests:
            raise _ClientSide(f"input file holds {len(requests)} requests, the task says "
                              f"{task.num_requests}")
        root = input_tree([p.request_hash for p in requests]).root
        if root != task.input_root:
            raise _ClientSide(f"input file's root 0x{root.hex()} is not the task's inputRoot")
        return requests

    def _items(self, task_id: int, shard: int, task: Task, state: Shard, start: int,
               requests: Sequence[ParsedRequest], receipt: Receipt | None
               ) -> list[ResultItem]:
        """The items of the miner's verified document for the shard (`state`: as read
        from the chain), holding `receipt` when one is given (`_Withheld` naming the first
        problem otherwise)."""
        uri = state.result_uri
        try:
            parse_uri(uri)
        except StoreError as exc:
            raise _Withheld(f"the shard's resultURI {exc}") from exc
        if state.state == ShardState.REFUNDED and state.result_uri:
            # Refunded after a fault: its committed root and document stay, and its
            # outputs still count in the miner's pooled epoch evidence (verifier.committee).
            state = dataclasses.replace(state, state=ShardState.SUBMITTED)
        try:
            _, items = verified_shard(self.q, self.market, task_id, shard,
                                      [p.request_hash for p in requests], task=task,
                                      state=state)
        except ContentNotFound as exc:
            raise _Withheld(f"the miner's result document {uri} is not in the market's "
                            "store") from exc
        except ResultCheckFailed as exc:
            if exc.check == "content address":  # the market served other bytes: its fault
                raise DisputeDeferred(f"cannot fetch result document {uri}: {exc}") from exc
            raise _Withheld(f"the miner's result document {uri} does not verify: "
                            f"{exc}") from exc
        except MarketError as exc:  # unreachable, or failing for reasons of its own
            raise DisputeDeferred(f"cannot fetch result document {uri}: {exc}") from exc
        if receipt is not None and items[receipt.index - start].receipt != receipt:
            # verify_shard_result recovered every item's signature to the shard's miner;
            # the contract recovered the opener's receipt to the same miner.
            raise _Withheld(f"the miner's document answers request {receipt.index} with "
                            "another receipt than the disputed one")
        return items
