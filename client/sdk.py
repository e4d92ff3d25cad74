"""The client SDK: post a batch job, follow it on-chain, and take only verified outputs.

    from client import Client
    c = Client(rpc_url, private_key, market_url)
    job = c.submit(["Hello", "The sky is"], model="tiny", max_tokens=16)
    job.wait()
    for out in job.results():          # every receipt checked before anything is returned
        print(out.custom_id, out.text)

The market only stores bytes and indexes events; everything that matters is read from the
chain (task, shards, miners, prices) or checked against it (content addresses, the input
root, each receipt's signature, Merkle proof and output hash). Every check that can fail
before money moves runs before `createTask`, so a bad batch costs nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from eth_account.signers.local import LocalAccount
from eth_utils import encode_hex, to_checksum_address

from client.batch import (
    Batch,
    BatchError,
    Output,
    encode_jsonl,
    parse_batch,
    prompt_lines,
    read_batch,
    write_output_lines,
)
from client.config import format_eth as _eth
from market.chain.client import Chain, TxResult, as_account
from market.chain.contracts import ZERO_ADDRESS, Shard, ShardState, Task
from market.chain.deploy import Quarry
from market.chain.errors import ContractRevert, DeploymentMismatch
from market.chain.heads import HeadFeed
from market.errors import QuarryError
from market.jobs import (
    HAS_RESULTS,
    ChallengeInfo,
    DeadlineExpired,
    DisputeInfo,
    DisputeNotPossible,
    InsufficientFunds,
    JobError,
    JobTimeout,
    MinerNotEligible,
    MinerOnProbation,
    OfferFailed,
    PaymentTooLow,
    ResultsNotReady,
    challenge_availability,
    challenge_info,
    miner_ask,
    open_dispute,
    post_batch,
    prove_billing_fault,
    shard_changes,
    sum_fault,
    task_disputes,
    task_shard_range,
    verified_shard,
    wait_challenge,
    wait_dispute,
)
from market.marketapi import MarketAPI, MarketError
from market.model.context import (
    ContextCheck,
    PromptCounter,
    context_length,
    store_tokenizer,
)
from market.model.manifest import Manifest, ModelError
from market.protocol.merkle import input_tree
from market.protocol.precision import (
    ANY,
    Precision,
    PrecisionError,
    accepts,
    mask_labels,
    precision_mask,
)
from market.protocol.requests import stop_strings, validate_request
from market.protocol.results import ResultCheckFailed, ResultItem, check_finish_reason
from market.store import ContentNotFound

__all__ = [
    "Client",
    "Job",
    "JobStatus",
    "ShardStatus",
    "DisputeInfo",
    "ChallengeInfo",
    "BillingFault",
    "ModelOffer",
    "MinerOffer",
    "ClientError",
    "ChainMismatch",
    "UnknownModel",
    "PaymentTooLow",
    "MinerNotEligible",
    "OfferFailed",
    "DeadlineExpired",
    "InsufficientFunds",
    "JobFailed",
    "ShardUnservable",
    "JobTimeout",
    "ResultsNotReady",
    "InputsMismatch",
    "DisputeNotPossible",
    "ResultCheckFailed",
]

DEFAULT_MAX_TOKENS = 64
"""`max_tokens` of prompt-list requests when none is given."""
DEFAULT_DEADLINE_S = 3600
MAX_SHARD_SIZE = 256
UNMEASURED_SHARD_SIZE = 64
"""The default shard's cap while no live miner has said how fast it generates."""
SHARD_CLAIM_SHARE = 0.5
"""The share of a claim's window a default shard fills at the slowest live miner's speed."""
MAX_SHARDS_IN_FLIGHT = 4
"""What a miner claims together by default (`miner.worker.MAX_SHARDS_IN_FLIGHT`)."""
POLL_S = 0.05
"""`Job.wait`'s default poll interval, for a node that does not push new heads (`HeadFeed`):
a poll is one `eth_blockNumber` (0.7 ms of CPU against Anvil; plus one `eth_getLogs` when a
block came), so polling this often costs about 1.5% of a core while waiting, and a finished
job is seen within about this (25 ms on average)."""

# The shared post/read/dispute path (market.jobs) raises these; re-exported here so that
# `except ClientError` catches every client error, its own and the shared path's.
ClientError = JobError


class ChainMismatch(ClientError, DeploymentMismatch):
    """The RPC is not the chain the market's contracts live on."""


class UnknownModel(ClientError):
    """No registered miner serves the model asked for."""


class JobFailed(ClientError):
    """Shards were refunded or can no longer be done, so the job will not produce all results."""


class InputsMismatch(ClientError):
    """The stored request file does not match the task's on-chain input root."""


class ShardUnservable(JobFailed):
    """A registered miner reports that it cannot serve one of the job's open shards (a
    request over the model's context, say): nobody will, and the shard would wait until the
    deadline. `shard`, `reason` and `miner` say which, why and who."""

    def __init__(self, message: str, *, shard: int, reason: str, miner: str) -> None:
        super().__init__(message)
        self.shard = shard
        self.reason = reason
        self.miner = miner



# ---------------------------------------------------------------------------- models


@dataclass(frozen=True)
class MinerOffer:
    address: str
    price_per_token: int  # on-chain ask
    alive: bool  # the market saw a recent heartbeat
    on_probation: bool = False  # new identity: claims only tasks that allow probation
    precision: Precision | None = None  # declared on-chain for the model: shards judged at it
    commitments: bool | None = None  # its heartbeat says its engine commits (None: unknown)

    seconds_per_token: float | None = None  # its measured speed (heartbeat), if it said

    def describe(self) -> str:
        """One line: address, ask, declared precision, liveness, probation."""
        flags = [self.precision.label if self.precision else "no precision declared",
                 "alive" if self.alive else "not seen lately"]
        if self.on_probation:
            flags.append("on probation")
        if self.commitments is False:
            flags.append("no activation commitments")
        return f"{self.address} {self.price_per_token} wei/token, {', '.join(flags)}"


@dataclass(frozen=True)
class ModelOffer:
    """A model and the registered miners that may claim its shards, cheapest first."""

    model_id: bytes
    name: str | None
    miners: tuple[MinerOffer, ...]

    @property
    def min_price(self) -> int:
        return min(m.price_per_token for m in self.miners)

    @property
    def alive(self) -> int:
        return sum(m.alive for m in self.miners)

    @property
    def established(self) -> tuple[MinerOffer, ...]:
        """The miners that may claim an ordinary task (off probation)."""
        return tuple(m for m in self.miners if not m.on_probation)

    @property
    def on_probation(self) -> tuple[MinerOffer, ...]:
        """The miners that may claim only tasks allowing probation."""
        return tuple(m for m in self.miners if m.on_probation)

    def serving(self, precisions: int = ANY,
                require_commitments: bool = False) -> tuple[MinerOffer, ...]:
        """The miners a task with accepted mask `precisions` (and, when
        `require_commitments`, needing activation commitments) may go to: their declared
        precision is accepted, and their heartbeats do not say their engine makes none."""
        return tuple(m for m in self.miners
                     if m.precision is not None and accepts(precisions, m.precision)
                     and not (require_commitments and m.commitments is False))

    def label(self) -> str:
        model_id = encode_hex(self.model_id)
        return f"{self.name} ({model_id})" if self.name else model_id

    def describe(self) -> str:
        """One line: established miners and, apart, those on probation (count, asks)."""
        line = f"{self.label()}: {_miners(self.established)}"
        if self.on_probation:
            line += (f"; {_miners(self.on_probation, 'on probation')} "
                     f"(only with {PROBATION_OPTION})")
        return line


PROBATION_OPTION = "allow_probation=True / `client submit --allow-probation`"
"""How a client lets miners on probation claim its task (named in errors and listings)."""


def _miners(miners: Sequence[MinerOffer], what: str = "miner(s)") -> str:
    if not miners:
        return f"0 {what}"
    alive = sum(m.alive for m in miners)
    return (f"{len(miners)} {what} ({alive} alive), from "
            f"{min(m.price_per_token for m in miners)} wei/token")


def parse_mask(precisions: str | Sequence[str | int | Precision] | None) -> int:
    """A task's accepted-precision mask from "bf16,fp32", a list of names, `Precision`s or
    numbers, or None (any); `ClientError` naming an unknown precision."""
    if precisions is None:
        return ANY
    items = precisions.split(",") if isinstance(precisions, str) else list(precisions)
    try:
        return precision_mask(p.strip() if isinstance(p, str) else p for p in items
                              if not (isinstance(p, str) and not p.strip()))
    except PrecisionError as exc:
        raise ClientError(f"precisions: {exc}") from None


def _model_id_of(value: Any) -> bytes | None:
    """A 32-byte modelId from bytes or a 0x-hex string; None for anything else (a name)."""
    if isinstance(value, bytes | bytearray) and len(value) == 32:
        return bytes(value)
    if isinstance(value, str) and value.lower().startswith("0x") and len(value) == 66:
        try:
            return bytes.fromhex(value[2:])
        except ValueError:
            return None
    return None


# ---------------------------------------------------------------------------- status


@dataclass(frozen=True)
class ShardStatus:
    index: int
    state: ShardState
    miner: str | None
    start: int
    end: int
    tokens_used: int
    claim_expiry: int
    window_end: int
    result_uri: str

    def to_json(self) -> dict[str, Any]:
        return {"shard": self.index, "state": self.state.name, "miner": self.miner,
                "requests": [self.start, self.end], "tokensUsed": self.tokens_used,
                "claimExpiry": self.claim_expiry, "windowEnd": self.window_end,
                "resultUri": self.result_uri or None}


@dataclass(frozen=True)
class JobStatus:
    """A task as the chain sees it now: every shard, and the money moved so far."""

    task_id: int
    client: str
    model_id: bytes
    num_requests: int
    shard_size: int
    max_tokens_per_request: int
    price_per_token: int
    deadline: int
    cancelled: bool
    payment: int  # wei escrowed at creation
    escrowed: int  # wei still in escrow
    paid: int  # wei released to miners
    refunded: int  # wei released back to the client
    compensation: int  # wei slashed from miners' collateral for expired claims, to the client
    chain_time: int
    shards: tuple[ShardStatus, ...]
    disputes: tuple[DisputeInfo, ...] = ()
    challenges: tuple[ChallengeInfo, ...] = ()

    @property
    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.shards:
            out[s.state.name] = out.get(s.state.name, 0) + 1
        return out

    @property
    def tokens(self) -> int:
        return sum(s.tokens_used for s in self.shards if s.state in HAS_RESULTS)

    @property
    def results_ready(self) -> bool:
        return all(s.state in HAS_RESULTS for s in self.shards)

    @property
    def finished(self) -> bool:
        """Settled: every shard finalized (miner paid, rest refunded) or refunded."""
        return all(s.state in (ShardState.FINALIZED, ShardState.REFUNDED) for s in self.shards)

    def to_json(self) -> dict[str, Any]:
        return {
            "taskId": self.task_id, "client": self.client, "modelId": encode_hex(self.model_id),
            "numRequests": self.num_requests, "shardSize": self.shard_size,
            "numShards": len(self.shards), "maxTokensPerRequest": self.max_tokens_per_request,
            "pricePerToken": self.price_per_token, "deadline": self.deadline,
            "cancelled": self.cancelled, "payment": self.payment, "escrowed": self.escrowed,
            "paid": self.paid, "refunded": self.refunded, "compensation": self.compensation,
            "tokens": self.tokens, "counts": self.counts, "resultsReady": self.results_ready,
            "finished": self.finished, "chainTime": self.chain_time,
            "shards": [s.to_json() for s in self.shards],
            "disputes": [d.to_json() for d in self.disputes],
            "challenges": [c.to_json() for c in self.challenges],
        }

    def summary(self) -> str:
        counts = ", ".join(f"{n} {state.lower()}" for state, n in sorted(self.counts.items()))
        lines = [
            f"task {self.task_id}: {self.num_requests} requests in {len(self.shards)} shards "
            f"({counts}){' [cancelled]' if self.cancelled else ''}",
            f"  model {encode_hex(self.model_id)}, {self.price_per_token} wei/token, "
            f"deadline {self.deadline} (chain time {self.chain_time})",
            f"  payment {self.payment} wei ({_eth(self.payment)}); escrowed {self.escrowed}, "
            f"paid to miners {self.paid}, refunded {self.refunded}, "
            f"compensation {self.compensation} wei; {self.tokens} tokens so far",
            f"  results {'ready' if self.results_ready else 'pending'}, "
            f"{'finished' if self.finished else 'not settled'}",
        ]
        for s in self.shards:
            miner = f" by {s.miner}" if s.miner else ""
            tokens = f", {s.tokens_used} tokens" if s.state in HAS_RESULTS else ""
            lines.append(f"  shard {s.index} [{s.start}, {s.end}): {s.state.name}{miner}{tokens}")
        for d in self.disputes:
            lines.append(f"  dispute {d.dispute_id} on request {d.index} (shard {d.shard}): "
                         f"{d.outcome()}")
        for c in self.challenges:
            lines.append(f"  availability challenge {c.challenge_id} on request {c.index} "
                         f"(shard {c.shard}): {c.outcome()}")
        return "\n".join(lines)


# ---------------------------------------------------------------------------- client


class Client:
    """One account's view of the market and the chain it settles on.

    `rpc_url` may be None: then the RPC the market's deployment names is used. Either way
    the chain must have the deployment's chain id and the contracts' code, or the
    constructor raises `ChainMismatch`.
    """

    def __init__(
        self,
        rpc_url: str | None,
        private_key: LocalAccount | str | bytes,
        market_url: str,
        *,
        timeout: float = 30.0,
    ) -> None:
        self.account = as_account(private_key)
        self.market = MarketAPI(market_url, timeout=timeout)
        deployment = self.market.deployment()
        self.rpc_url = rpc_url or deployment.rpc_url
        self.q = Quarry(deployment, Chain(self.rpc_url, timeout=timeout))
        self._stop_ids: dict[bytes, frozenset[int] | None] = {}  # model id -> manifest's
        # model id -> (context length, tokenizer): content-addressed, so fetched once
        self._contexts: dict[bytes, tuple[int, PromptCounter]] = {}
        try:
            self.q.check()
        except DeploymentMismatch as exc:
            raise ChainMismatch(f"{exc} (the deployment of the market at {self.market.url})"
                                ) from None

    @property
    def address(self) -> str:
        return str(self.account.address)

    @property
    def chain(self) -> Chain:
        return self.q.chain

    def close(self) -> None:
        self.market.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ models and miners
    def offers(self, min_reputation_bps: int = 0,
               allow_probation: bool = False) -> list[ModelOffer]:
        """Every model some registered miner may claim a task for, with on-chain asks.

        Miners are found through the market, but each one's eligibility and price are read
        from GPURegistry: the market cannot make a miner look cheaper than it is. Miners on
        probation (new identities the committee has not vetted yet) are left out unless
        `allow_probation`; then they are listed too, marked `on_probation`.
        """
        offers = []
        for o in self._offers(min_reputation_bps):
            miners = o.miners if allow_probation else o.established
            if miners:
                offers.append(dataclasses.replace(o, miners=miners))
        return offers

    def _offers(self, min_reputation_bps: int) -> list[ModelOffer]:
        """Every model's miners that may claim a task allowing probation, each marked."""
        names: dict[bytes, str] = {}
        for m in self.market.models():
            model_id = _model_id_of(m.get("modelId"))
            if model_id is not None and m.get("name"):
                names[model_id] = str(m["name"])
        # (miner, models, alive, commits, speed): liveness, commitments and speed are the
        # market's word (its heartbeats)
        listed: list[tuple[str, list[bytes], bool, bool | None, float | None]] = []
        for row in self.market.miners():
            served = [mid for mid in (_model_id_of(x) for x in row.get("models") or [])
                      if mid is not None]
            commits = (row.get("status") or {}).get("commitments")
            if served:
                listed.append((to_checksum_address(row["address"]), served,
                               bool(row.get("alive")),
                               commits if isinstance(commits, bool) else None,
                               _speed(row.get("status"))))
        terms = self.q.gpu.offer_terms([(a, served) for a, served, *_ in listed],
                                       min_reputation_bps, allow_probation=True)
        by_model: dict[bytes, list[MinerOffer]] = {}
        for (address, served, alive, commits, speed), (info, eligible) in zip(listed, terms,
                                                                              strict=True):
            for model_id, precision in zip(served, eligible, strict=True):
                if precision is not None:  # eligible, in the precision it declared
                    by_model.setdefault(model_id, []).append(MinerOffer(
                        address, info.price_per_token, alive, info.on_probation, precision,
                        commits, speed))
        return [ModelOffer(mid, names.get(mid), tuple(sorted(ms, key=lambda m: m.price_per_token)))
                for mid, ms in by_model.items()]

    def resolve_model(self, model: str | bytes, min_reputation_bps: int = 0,
                      allow_probation: bool | None = False, *, precisions: int = ANY,
                      require_commitments: bool = False) -> ModelOffer:
        """The offer for `model` (a name or a 0x modelId), with the miners a task accepting
        the mask `precisions` (and requiring commitments) may go to; `UnknownModel` lists what
        exists, and says so when only miners on probation serve it (naming the option), or
        none in an accepted precision or with commitments. `allow_probation=None` (what
        `submit` does by default): the established miners when there are any, else the miners
        on probation: a market's first miners are all new."""
        everyone = self._offers(min_reputation_bps)
        wanted = _model_id_of(model)
        matches = [o for o in everyone
                   if (o.model_id == wanted if wanted is not None else o.name == model)]
        shown = model if isinstance(model, str) else encode_hex(bytes(model))
        if len(matches) > 1:
            ids = ", ".join(encode_hex(o.model_id) for o in matches)
            raise UnknownModel(f"model name {shown!r} is ambiguous ({ids}); pass the modelId")
        floor = f" with reputation >= {min_reputation_bps} bps" if min_reputation_bps else ""
        if len(matches) == 1:
            offer = self._serving(matches[0], shown, precisions, require_commitments)
            if allow_probation or (allow_probation is None and not offer.established):
                return offer
            if offer.established:
                return dataclasses.replace(offer, miners=offer.established)
            raise UnknownModel(
                f"only miners on probation{floor} serve model {shown!r} "
                f"({_miners(offer.on_probation)}): new identities that have not yet passed "
                f"the committee's challenges; to let them claim the task pass "
                f"{PROBATION_OPTION}")
        known = "; ".join(o.describe() for o in everyone) or "none"
        listed = [m for m in self.market.models()
                  if m.get("name") == model or _model_id_of(m.get("modelId")) == wanted]
        if listed:
            raise UnknownModel(
                f"no miner that may claim a task now{floor} serves model {shown!r}: the "
                "miners registered for it are untrusted, exiting or short of stake (`client "
                f"models`, GET /miners say which); start or register another; known: {known}")
        raise UnknownModel(f"no registered miner{floor} serves model {shown!r} (start one: "
                           f"`miner register`, `miner run`); known: {known}")

    @staticmethod
    def _serving(offer: ModelOffer, shown: str, precisions: int,
                 require_commitments: bool) -> ModelOffer:
        """`offer` with only the miners that may serve such a task; `UnknownModel` naming
        what the miners do serve when none may."""
        miners = offer.serving(precisions, require_commitments)
        if miners:
            return dataclasses.replace(offer, miners=miners)
        if not offer.serving(precisions):
            declared = sorted({m.precision.label for m in offer.miners if m.precision})
            raise UnknownModel(f"no miner serves model {shown!r} in "
                               f"{', '.join(mask_labels(precisions))}: its miners declared "
                               f"{', '.join(declared) or 'no precision'}")
        raise UnknownModel(f"no miner serving model {shown!r} makes activation commitments "
                           "(their heartbeats say so); submit without requiring them")

    # ------------------------------------------------------------------ submit
    def submit(
        self,
        requests: Sequence[str] | Sequence[Mapping[str, Any]] | str | Path,
        *,
        model: str | bytes | None = None,
        max_tokens: int | None = None,
        price: int | None = None,
        deadline: float | datetime | None = None,
        shard_size: int | None = None,
        temperature: float = 0.0,
        arbiter: str | None = None,
        min_reputation_bps: int = 0,
        prefer_miner: str | None = None,
        allow_probation: bool | None = None,
        precisions: str | Sequence[str | int | Precision] | None = None,
        require_commitments: bool = False,
        audit_rate_bps: int | None = None,
    ) -> Job:
        """Post a batch and pay for it; returns its `Job`.

        `requests`: prompt strings, request dicts (OpenAI Batch input lines), or a JSONL
        file's path. `max_tokens` sets the prompts' budget, or caps a file's lines.
        `price`: wei per output token (default: the lowest ask among miners serving the
        model, or `prefer_miner`'s ask). `deadline`: seconds from now (int/float) or an
        absolute `datetime`. `prefer_miner`: a directed job, offered to that miner only (the
        market shows it to no one else until the deadline). `allow_probation`: miners on
        probation (new identities the committee has not vetted yet) may claim it too
        (True), or not (False, and their asks do not set the price); by default (None) they
        may only when no established miner serves the model (a new market's first miners).
        `precisions`: the precisions miners may serve it in ("bf16,fp32", or names,
        `Precision`s or numbers; default any): only miners that declared one of them may
        claim it, and only their asks set the price. `require_commitments`: every output must
        carry an activation commitment (miners whose engines make none, vLLM's say, then
        cannot take it). `shard_size` (default): two shards per live miner, capped so that the
        slowest of them (its measured speed) ends a shard within half the claim window.
        `audit_rate_bps`: the share of the task's shards the committee re-scores (above the
        base 1000: one in ten), bought right after the task is posted for each sitting
        member's forward pass (VerifierCommittee.auditFee; `Job.audit_fee` is what it cost).
        Everything that can be wrong is checked before any transaction is sent.
        """
        mask, commit = parse_mask(precisions), bool(require_commitments)
        if audit_rate_bps is not None:
            base = self.q.committee.base_audit_rate_bps()
            if isinstance(audit_rate_bps, bool) or not isinstance(audit_rate_bps, int) \
                    or not base < audit_rate_bps <= 10_000:
                raise ClientError(f"audit rate must be above the base {base} bps and at most "
                                  f"10000 bps, got {audit_rate_bps!r}")
        if isinstance(requests, str | Path):  # one string is a path: prompts come as a list
            batch = read_batch(requests, max_bytes=self.market.limits()["maxFileBytes"])
            offer = self._offer_for(batch, model, min_reputation_bps, allow_probation,
                                    precisions=mask, require_commitments=commit)
        elif requests and all(isinstance(r, str) for r in requests):
            if model is None:
                raise BatchError("model is required when submitting a list of prompts")
            offer = self.resolve_model(model, min_reputation_bps, allow_probation,
                                       precisions=mask, require_commitments=commit)
            body_model = offer.name or encode_hex(offer.model_id)
            batch = parse_batch(encode_jsonl(prompt_lines(
                list(requests), model=body_model,  # type: ignore[arg-type]
                max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
                temperature=temperature)))
        else:
            if not requests:
                raise BatchError("the batch is empty")
            lines = []
            for i, r in enumerate(requests):
                if not isinstance(r, Mapping):
                    raise BatchError(f"request {i} is a string among request objects")
                lines.append(validate_request(dict(r), line=i + 1))
            batch = parse_batch(encode_jsonl(lines))
            offer = self._offer_for(batch, model, min_reputation_bps, allow_probation,
                                    precisions=mask, require_commitments=commit)
        if max_tokens is not None:
            for parsed in batch.requests:
                if int(parsed.request["body"]["max_tokens"]) > max_tokens:
                    raise BatchError(f"line {parsed.line}: body.max_tokens "
                                     f"{parsed.request['body']['max_tokens']} is over "
                                     f"max_tokens {max_tokens}")
        return self._submit_batch(batch, offer, price=price, deadline=deadline,
                                  shard_size=shard_size, arbiter=arbiter,
                                  min_reputation_bps=min_reputation_bps,
                                  prefer_miner=prefer_miner, allow_probation=allow_probation,
                                  precisions=mask, require_commitments=commit,
                                  audit_rate_bps=audit_rate_bps)

    def _offer_for(self, batch: Batch, model: str | bytes | None,
                   min_reputation_bps: int, allow_probation: bool | None, *,
                   precisions: int = ANY, require_commitments: bool = False) -> ModelOffer:
        """Resolve the task's model and check every line's `body.model` names it."""
        named = batch.models()
        if model is None:
            if len(named) > 1:
                (_, first), (other, line) = list(named.items())[:2]
                raise BatchError(f"line {line}: body.model {other!r} differs from line "
                                 f"{first}'s; a task serves one model")
            model = next(iter(named))
        offer = self.resolve_model(model, min_reputation_bps, allow_probation,
                                   precisions=precisions,
                                   require_commitments=require_commitments)
        accepted = {encode_hex(offer.model_id), offer.model_id.hex()}
        if offer.name:
            accepted.add(offer.name)
        if isinstance(model, str):
            accepted.add(model)
        for name, line in named.items():
            if name not in accepted and name.lower() not in accepted:
                raise BatchError(f"line {line}: body.model is {name!r}, but the task is for "
                                 f"model {offer.label()}")
        return offer

    def _submit_batch(
        self,
        batch: Batch,
        offer: ModelOffer,
        *,
        price: int | None,
        deadline: float | datetime | None,
        shard_size: int | None,
        arbiter: str | None,
        min_reputation_bps: int,
        prefer_miner: str | None,
        allow_probation: bool | None,
        precisions: int = ANY,
        require_commitments: bool = False,
        audit_rate_bps: int | None = None,
    ) -> Job:
        """Fill in the defaults (price, shard size, deadline, probation) and post with
        `post_batch`; then buy `audit_rate_bps` at once, before a miner claims a shard (after
        that the rate can no longer change: `ShardsCommitted`, nothing paid)."""
        n = len(batch)
        if allow_probation is None:  # the offer holds miners on probation only if need be
            allow_probation = any(m.on_probation for m in offer.miners)
        if prefer_miner is not None:  # post_batch checks the price against this miner's ask
            ask = self._directed_ask(prefer_miner, offer.model_id, min_reputation_bps,
                                     allow_probation, precisions)
            miners = 1
        else:
            ask, miners = offer.min_price, offer.alive
            if isinstance(price, int) and not isinstance(price, bool) and 0 < price < ask:
                raise PaymentTooLow(
                    f"payment too low: {price} wei/token is below every registered miner's ask "
                    f"for model {offer.label()} (lowest ask: {ask} wei/token)")
        if price is None:
            price = ask
        self.check_context(batch, offer)
        limit, claim_timeout, block = self.chain.read([
            self.q.tasks.fn("maxShardsPerTask"), self.q.tasks.fn("claimTimeout"),
            lambda eth: eth.get_block("latest")])
        deadline_ts = self._deadline(deadline, int(block["timestamp"]))
        if shard_size is None:  # two shards per miner that could take them, within the limit
            shard_size = max(1, min(MAX_SHARD_SIZE, math.ceil(n / (2 * max(1, miners))),
                                    shard_fit(offer, batch.max_tokens, int(claim_timeout))))
            shard_size = max(shard_size, math.ceil(n / int(limit)))
        task_id, tx = post_batch(
            self.q, self.account, self.market, batch.data, batch.request_hashes,
            model_id=offer.model_id, shard_size=shard_size, max_tokens=batch.max_tokens,
            price=price, deadline=deadline_ts, min_reputation_bps=min_reputation_bps,
            arbiter=arbiter or ZERO_ADDRESS, prefer_miner=prefer_miner,
            allow_probation=allow_probation, precisions=precisions,
            require_commitments=require_commitments)
        job = Job(self, task_id)
        job._batch = batch
        job.submission = tx
        if audit_rate_bps is not None:
            fee = self.q.committee.audit_fee(task_id, audit_rate_bps)
            try:
                self.q.committee.raise_audit_rate(self.account, task_id, audit_rate_bps, fee)
            except ContractRevert as exc:
                raise ClientError(f"task {task_id} is posted, but its audit rate was not "
                                  f"bought ({exc.error}): a miner claimed a shard first; "
                                  "nothing was paid for it") from None
            job.audit_fee = fee
        return job

    def manifest(self, model_id: bytes) -> Manifest | None:
        """The model's manifest from the market, checked to hash to `model_id` (None when the
        market has none, or one for another model)."""
        try:
            m = Manifest.from_dict(self.market.model("0x" + model_id.hex()))
        except (MarketError, ModelError):
            return None
        return m if m.model_id == model_id else None

    def check_context(self, batch: Batch, offer: ModelOffer) -> None:
        """Refuse (`RequestError` naming the line) a request whose prompt tokens plus
        `max_tokens` exceed the model's context: no miner could serve it, and the client
        would pay into escrow for a shard that waits until the deadline. Needs the model's
        manifest on the market; prompts are counted with its tokenizer when its files are
        in the store (see `market.model.context`)."""
        known = self._contexts.get(offer.model_id)
        tokenizer: PromptCounter | None
        if known is not None:
            positions, tokenizer = known
        else:
            manifest = self.manifest(offer.model_id)
            found = None if manifest is None else context_length(manifest)
            if manifest is None or found is None:
                return
            positions, counter = found, store_tokenizer(self.market, manifest)
            if counter is not None:  # the files are checked against the manifest's hashes
                self._contexts[offer.model_id] = (positions, counter)
            tokenizer = counter
        check = ContextCheck(offer.label(), positions, tokenizer)
        check.check((r.line, r.request) for r in batch.requests)

    def _directed_ask(self, miner: str, model_id: bytes, min_reputation_bps: int,
                      allow_probation: bool, precisions: int = ANY) -> int:
        """`miner_ask`, with the SDK's and CLI's option named when probation is the reason."""
        try:
            return miner_ask(self.q, miner, model_id, min_reputation_bps, allow_probation,
                             precisions)
        except MinerOnProbation as exc:
            raise MinerOnProbation(f"{exc} ({PROBATION_OPTION})") from None

    def _deadline(self, deadline: float | datetime | None, now: int) -> int:
        """Absolute chain time: seconds from now (by the chain's clock) or a datetime."""
        if deadline is None:
            return now + DEFAULT_DEADLINE_S
        if isinstance(deadline, datetime):
            ts = int(deadline.timestamp())
            if ts <= now:
                raise DeadlineExpired(
                    f"deadline {deadline.isoformat()} (unix {ts}) has already passed: the "
                    f"chain's time is {now}")
            return ts
        if isinstance(deadline, bool) or not isinstance(deadline, int | float) or not \
                math.isfinite(deadline):
            raise ClientError(f"deadline must be seconds from now or a datetime, "
                              f"got {deadline!r}")
        if deadline <= 0:
            raise DeadlineExpired(f"deadline {deadline} s from now has already passed; give a "
                                  "positive number of seconds")
        return now + math.ceil(deadline)

    # ------------------------------------------------------------------ jobs and money
    def job(self, task_id: int) -> Job:
        """Re-attach to any task by id: everything is read back from the chain and store."""
        job = Job(self, int(task_id))
        job.task()  # fails clearly on an unknown id
        return job

    def jobs(self) -> list[dict[str, Any]]:
        """This account's jobs as the market's board lists them (for browsing only)."""
        return self.market.jobs(self.address)

    def withdrawable(self) -> int:
        """Refunds and compensation waiting in PaymentEscrow for this account."""
        return self.q.escrow.withdrawable(self.address)

    def withdraw(self) -> int:
        """Move every withdrawable wei to this account; returns the amount (0: nothing)."""
        amount = self.withdrawable()
        if amount:
            self.q.escrow.withdraw(self.account)
        return amount


# ---------------------------------------------------------------------------- job


class Job:
    """One task, read from the chain each time (it holds no state the chain does not)."""

    def __init__(self, client: Client, task_id: int) -> None:
        self.client = client
        self.task_id = task_id
        self.submission: TxResult | None = None  # set when this Job posted the task
        self.audit_fee = 0  # wei this Job paid for a raised audit rate
        self._batch: Batch | None = None
        self._task: Task | None = None
        # Shard -> (the on-chain commitment it was checked under, its checked items).
        self._checked: dict[int, tuple[tuple[str, bytes, int, str], list[ResultItem]]] = {}

    def __repr__(self) -> str:
        return f"Job(task_id={self.task_id})"

    @property
    def _q(self) -> Quarry:
        return self.client.q

    def task(self) -> Task:
        """The task struct (`cancelled` and `committed` read fresh each call)."""
        try:
            self._task = self._q.tasks.get_task(self.task_id)
        except ContractRevert as exc:
            if exc.error == "UnknownTask":
                raise ClientError(f"no task {self.task_id} on the chain at "
                                  f"{self.client.rpc_url}") from None
            raise
        return self._task

    @property
    def payment(self) -> int:
        t = self._task or self.task()
        return t.num_requests * t.max_tokens_per_request * t.price_per_token

    def _range(self, t: Task, shard: int) -> tuple[int, int]:
        return task_shard_range(t, shard)

    def _shard_status(self, t: Task, k: int, s: Shard) -> ShardStatus:
        start, end = self._range(t, k)
        miner = None if s.miner == ZERO_ADDRESS else to_checksum_address(s.miner)
        return ShardStatus(k, s.state, miner, start, end, s.tokens_used, s.claim_expiry,
                           s.window_end, s.result_uri)

    # ------------------------------------------------------------------ status
    def status(self) -> JobStatus:
        """Every shard's state, the wei moved so far and the task's disputes and availability
        challenges, from the contracts and their events: one batch of reads (`Chain.read`),
        plus one read per dispute or challenge when there are any."""
        q, since, tid = self._q, self._q.deployment.deploy_block, self.task_id
        n = (self._task or self.task()).num_shards  # fixed at creation
        t, states, (escrowed, block, released, reclaimed, disputes, challenges) = \
            q.tasks.read_task(tid, n, also=[
                q.escrow.fn("escrowed", tid), lambda eth: eth.get_block("latest"),
                q.escrow.log_query("Released", since, taskId=tid),
                q.tasks.log_query("ClaimReclaimed", since, taskId=tid),
                q.arbitration.log_query("DisputeOpened", since, taskId=tid),
                q.arbitration.log_query("AvailabilityChallenged", since, taskId=tid)])
        self._task = t
        client = to_checksum_address(t.client)
        paid = refunded = 0
        for ev in q.escrow.decode_events("Released", released):
            if to_checksum_address(ev["to"]) == client:
                refunded += int(ev["amount"])
            else:
                paid += int(ev["amount"])
        compensation = sum(int(ev["penalty"]) for ev in
                           q.tasks.decode_events("ClaimReclaimed", reclaimed))
        return JobStatus(
            task_id=tid, client=client, model_id=t.model_id,
            num_requests=t.num_requests, shard_size=t.shard_size,
            max_tokens_per_request=t.max_tokens_per_request, price_per_token=t.price_per_token,
            deadline=t.deadline, cancelled=t.cancelled, payment=self.payment,
            escrowed=int(escrowed), paid=paid, refunded=refunded,
            compensation=compensation, chain_time=int(block["timestamp"]),
            shards=tuple(self._shard_status(t, k, s) for k, s in enumerate(states)),
            disputes=tuple(task_disputes(
                q, tid, q.arbitration.decode_events("DisputeOpened", disputes))),
            challenges=tuple(self._challenges(
                q.arbitration.decode_events("AvailabilityChallenged", challenges))))

    def wait(
        self,
        progress: bool = True,
        timeout: float | None = None,
        finalized: bool = False,
        poll_s: float = POLL_S,
        unservable_s: float = 1.0,
        prefetch: bool = True,
    ) -> JobStatus:
        """Block until every shard has a result (or, with `finalized`, is paid out).

        Raises `JobFailed` as soon as a shard is refunded (cancelled, past the deadline,
        dispute upheld) or the deadline passes with shards nobody claimed, its subclass
        `ShardUnservable` as soon as a registered miner reports an open shard unservable
        (its heartbeat's `unservable` list, read from the market every `unservable_s`
        seconds while shards are open), and `JobTimeout` after `timeout` seconds. The bar
        (on a terminal's stderr) counts shards done.

        Each shard is read once; after that, each new head (pushed by the node over
        WebSocket where it can, else polled every `poll_s`; see `HeadFeed`) brings
        TaskRegistry's events of this task since the last block seen (one `eth_getLogs`),
        so a poll costs the same for 5 shards or 5,000.

        With `prefetch`, a shard's result document is fetched and checked as soon as it
        lands, while the others are still generating: `results()` then only rereads each
        shard's commitment. A shard that fails its checks here is left to `results()`,
        which checks it again and says why.
        """
        target = {ShardState.FINALIZED} if finalized else HAS_RESULTS
        what = "finalized" if finalized else "with results"
        started = time.monotonic()
        n = (self._task or self.task()).num_shards
        seen = self._q.chain.block_number()  # events after this block are read as they come
        t, shards, _ = self._q.tasks.read_task(self.task_id, n)
        self._task = t
        states = dict(enumerate(s.state for s in shards))
        pending = {k for k, s in states.items() if s not in target}
        next_report = time.monotonic()
        desc = f"task {self.task_id}" + (" paid out" if finalized else "")
        with _bar(t.num_shards, "shard", desc, progress) as bar, \
                HeadFeed(self._q.chain) as heads:
            bar.update(t.num_shards - len(pending))
            while True:
                if not pending:
                    return self.status()
                refunded = sorted(k for k in pending if states[k] == ShardState.REFUNDED)
                if refunded:
                    raise JobFailed(f"task {self.task_id}: shard(s) {_ks(refunded)} were "
                                    f"refunded ({self._refund_reason()}); they will have no "
                                    "results")
                unclaimed = sorted(k for k in pending if states[k] == ShardState.OPEN)
                if unclaimed and self._q.chain.timestamp() >= t.deadline:
                    raise JobFailed(f"task {self.task_id}: the deadline ({t.deadline}) passed "
                                    f"with shard(s) {_ks(unclaimed)} never claimed; they will "
                                    "be refunded")
                if unclaimed and time.monotonic() >= next_report:
                    next_report = time.monotonic() + unservable_s
                    self._raise_unservable(set(unclaimed))
                if timeout is not None and time.monotonic() - started >= timeout:
                    left = ", ".join(f"{n} {s.name.lower()}" for s, n in
                                     _count(states[k] for k in pending))
                    raise JobTimeout(f"task {self.task_id}: timed out after {timeout:g} s with "
                                     f"{t.num_shards - len(pending)}/{t.num_shards} shards "
                                     f"{what} ({left})")
                bar.set_postfix_str(", ".join(
                    f"{n} {s.name.lower()}" for s, n in _count(states[k] for k in pending)))
                head = heads.next_head(seen, poll_s)
                if head <= seen:
                    continue
                changed, cancelled = shard_changes(self._q, self.task_id, seen + 1, head)
                seen = head
                if cancelled:  # Open shards now read Refunded: ask the contract for all
                    _, shards, _ = self._q.tasks.read_task(self.task_id, t.num_shards)
                    changed = {k: shards[k].state for k in pending}
                landed = []
                for k, state in changed.items():
                    if k in pending:
                        states[k] = state
                        if state in target:
                            pending.discard(k)
                            landed.append(k)
                            bar.update(1)
                if prefetch and pending:  # the last shard is checked by results() itself
                    for k in sorted(landed):
                        self._prefetch(t, k)

    def _prefetch(self, t: Task, k: int) -> None:
        """Check shard `k`'s results now (see `wait`); a failure is left to `results()`."""
        try:
            self._checked_items(t, k, self._q.tasks.get_shard(self.task_id, k))
        except QuarryError:
            pass  # results() checks it again and says what failed

    def _checked_items(self, t: Task, k: int, s: Shard) -> list[ResultItem]:
        """Shard `k`'s result items checked against `s` (the shard as just read from the
        chain) and the task's inputs; a shard already checked under the same commitment
        (result URI, root, token sum, miner) is not fetched and checked again."""
        key = (s.result_uri, bytes(s.result_root), int(s.tokens_used), str(s.miner))
        hit = self._checked.get(k)
        if hit is not None and hit[0] == key:
            return hit[1]
        _, items = verified_shard(self._q, self.client.market, self.task_id, k,
                                  self.inputs().request_hashes, task=t, state=s)
        self._checked[k] = (key, items)
        return items

    def _raise_unservable(self, shards: set[int]) -> None:
        """Raise `ShardUnservable` when a miner's last heartbeat (as the market lists it)
        reports one of `shards` of this task unservable and the chain says it is
        registered."""
        for row in self.client.market.miners():
            status = row.get("status")
            reports = status.get("unservable") if isinstance(status, dict) else None
            for r in reports if isinstance(reports, list) else []:
                if not isinstance(r, dict) or r.get("taskId") != self.task_id or \
                        r.get("shardId") not in shards:
                    continue
                miner = to_checksum_address(row["address"])
                if not self._q.gpu.is_registered(miner):
                    continue
                shard = int(r["shardId"])
                reason = str(r.get("reason") or "no reason given")[:300]
                raise ShardUnservable(
                    f"task {self.task_id}: shard {shard} cannot be served: miner {miner} "
                    f"reports {reason!r}; no miner will take it, so it would wait until the "
                    f"deadline ({self._task.deadline if self._task else '?'}): cancel the job "
                    "to get the open shards' budget back, and resubmit what fits",
                    shard=shard, reason=reason, miner=miner)

    def _refund_reason(self) -> str:
        t = self.task()
        if t.cancelled:
            return "the task was cancelled"
        if self._q.chain.timestamp() >= t.deadline:
            return "the deadline passed"
        return "the miner was found at fault (dispute, availability challenge or billing proof)"

    # ------------------------------------------------------------------ results
    def inputs(self) -> Batch:
        """The task's requests, fetched by its inputURI and checked against inputRoot."""
        if self._batch is not None:
            return self._batch
        t = self._task or self.task()
        data = self.client.market.get(t.input_uri)  # checked against the content address
        try:
            batch = parse_batch(data, f"task {self.task_id}'s input file")
        except QuarryError as exc:
            raise InputsMismatch(str(exc)) from exc
        if len(batch) != t.num_requests:
            raise InputsMismatch(f"task {self.task_id}'s input file has {len(batch)} requests, "
                                 f"the task says {t.num_requests}")
        if input_tree(batch.request_hashes).root != t.input_root:
            raise InputsMismatch(f"task {self.task_id}'s input file does not hash to its "
                                 "on-chain inputRoot")
        self._batch = batch
        return batch

    def shard_results(self, k: int, state: Shard | None = None) -> list[Output]:
        """Shard `k`'s outputs, each checked against the chain (`state`: the shard as just
        read from it); `ResultCheckFailed` names the first check that fails (a missing
        document fails the "document" check), the request when known, and the on-chain
        remedy with the chain time it is open until."""
        t = self._task or self.task()
        batch = self.inputs()
        try:
            s = state or self._q.tasks.get_shard(self.task_id, k)
            if s.state not in HAS_RESULTS:
                raise ResultsNotReady(f"task {self.task_id} shard {k} is {s.state.name}: no "
                                      "result yet")
            items = self._checked_items(t, k, s)
        except ContentNotFound as exc:
            missing = ResultCheckFailed("document", f"shard {k}'s result document is missing "
                                        f"({exc})")
            raise self._with_remedy(missing, k) from None
        except ResultCheckFailed as exc:
            raise self._with_remedy(exc, k) from None
        miner = to_checksum_address(s.miner)
        chain_id, registry = self._q.chain.chain_id, self._q.tasks.address
        stop_ids = self._stop_ids(t)
        outputs = []
        for item in items:
            request = batch.requests[item.index].request  # our own line, not the miner's copy
            cap = min(int(request["body"]["max_tokens"]), t.max_tokens_per_request)
            try:
                check_finish_reason(item, cap, stop_ids,
                                    stop_strings(request["body"].get("stop")))
            except ResultCheckFailed as exc:
                raise self._with_remedy(exc, k) from None
            outputs.append(Output(
                task_id=self.task_id, shard=k, index=item.index,
                custom_id=str(request["custom_id"]), url=str(request["url"]),
                model=str(request["body"]["model"]), text=item.text, token_ids=item.token_ids,
                finish_reason=item.finish_reason, prompt_tokens=item.prompt_tokens, miner=miner,
                receipt=item.receipt, signature=item.signature, proof=item.proof,
                created=s.submitted_at, result_uri=s.result_uri, chain_id=chain_id,
                task_registry=registry))
        return outputs

    def _stop_ids(self, t: Task) -> frozenset[int] | None:
        """The model's stop tokens from its manifest on the market, checked to hash to the
        task's modelId (None when the market has no manifest for it: finish reasons are then
        checked against lengths only)."""
        stops = self.client._stop_ids
        if t.model_id not in stops:
            m = self.client.manifest(t.model_id)
            stops[t.model_id] = None if m is None else m.stop_token_ids
        return stops[t.model_id]

    def _with_remedy(self, exc: ResultCheckFailed, k: int) -> ResultCheckFailed:
        """The same failed check, its message ending with what the client can do about it."""
        return ResultCheckFailed(
            exc.check, f"{exc.detail}; {self._remedy(exc.check, exc.index, k)}", index=exc.index)

    def _remedy(self, check: str, index: int | None, k: int) -> str:
        """The command that answers a failed check on shard `k`, while its window is open."""
        s = self._q.tasks.get_shard(self.task_id, k)
        if s.state == ShardState.DISPUTED:
            return (f"shard {k} is frozen by an open dispute or availability challenge; "
                    "wait for its outcome")
        if s.state != ShardState.SUBMITTED or self._q.chain.timestamp() >= s.window_end:
            return f"no remedy left: shard {k}'s challenge window closed at {s.window_end}"
        if index is None:  # the document as a whole: make the miner show a receipt on-chain
            command, index = "challenge", self._range(self._task or self.task(), k)[0]
        else:
            command = _REMEDIES.get(check, "dispute")
        if check == "merkle proof" and index is not None:
            # a receipt that does not prove may sit under a false sum in the tree: provable
            # at once, from the document, where a challenge would only make the miner fail
            start, end = self._range(self._task or self.task(), k)
            if sum_fault(self.client.market, s, k, start, end - start, index) is not None:
                command = "prove-billing"
        return (f"remedy: `client {command} {self.task_id} {index}` ({_REMEDY_WHY[command]}) "
                f"before chain time {s.window_end}")

    def results(self) -> list[Output]:
        """Every output in request order, only after every shard's document checks out."""
        t, shards, _ = self._q.tasks.read_task(self.task_id,
                                                (self._task or self.task()).num_shards)
        self._task = t
        missing = [f"{k} ({s.state.name.lower()})" for k, s in enumerate(shards)
                   if s.state not in HAS_RESULTS]
        if missing:
            raise ResultsNotReady(f"task {self.task_id}: shard(s) {', '.join(missing)} have "
                                  "no results yet; wait() first")
        out: list[Output] = []
        for k, s in enumerate(shards):
            out.extend(self.shard_results(k, s))
        return out

    def write_results(self, path: str | Path) -> Path:
        """Verify everything, then write OpenAI Batch output JSONL (nothing on failure)."""
        return write_output_lines(self.results(), path)

    # ------------------------------------------------------------------ disputes
    def dispute(self, index: int, bond: int | None = None,
                evidence_uri: str | None = None) -> int:
        """Dispute request `index`'s receipt in Arbitration; returns the dispute id.

        `bond` defaults to the minimum bond, `evidence_uri` to the shard's result document
        (which holds the disputed output). The shard must be Submitted and inside its
        challenge window, and this account the task's client or arbiter.
        """
        return open_dispute(self._q, self.client.account, self.client.market, self.task_id,
                            index, bond=bond, evidence_uri=evidence_uri)

    def disputes(self) -> list[DisputeInfo]:
        """Every dispute opened on this task, with its current on-chain status and outcome."""
        return task_disputes(self._q, self.task_id)

    def wait_dispute(self, dispute_id: int, timeout: float | None = None,
                     progress: bool = True, poll_s: float = 0.5,
                     expire: bool = True) -> DisputeInfo:
        """Block until dispute `dispute_id` (on this task) is settled; returns it.

        A verdict can only come before the dispute's deadline, so this waits that long at
        most (by the chain's clock). Then, with `expire`, this account expires the dispute
        (the bond goes back to its opener and the shard is paid as submitted); without it,
        the still-open dispute is returned. `JobTimeout` after `timeout` seconds. The bar
        (on a terminal's stderr) shows the chain time used of the dispute's deadline.
        """
        info = next((d for d in self.disputes() if d.dispute_id == dispute_id), None)
        if info is None:
            raise DisputeNotPossible(f"task {self.task_id} has no dispute {dispute_id}")
        with _window_bar(info.opened_at, info.deadline, f"dispute {dispute_id}",
                         progress) as show:
            return wait_dispute(self._q, dispute_id, timeout=timeout, poll_s=poll_s,
                                expire_as=self.client.account if expire else None,
                                on_poll=show)

    # ------------------------------------------------------------------ availability, billing
    def challenge(self, index: int, bond: int | None = None) -> int:
        """Challenge the miner to show request `index`'s receipt on-chain within Arbitration's
        response window; returns the challenge id. The remedy for a result document that is
        missing or does not prove the receipt: unanswered, the shard is refunded and the miner
        slashed; answered, the shown receipt can be disputed (`dispute`). `bond` (default: the
        minimum) goes to a miner that answers."""
        return challenge_availability(self._q, self.client.account, self.task_id, index,
                                      bond=bond)

    def challenges(self) -> list[ChallengeInfo]:
        """Every availability challenge opened on this task, oldest first, as it is now."""
        return self._challenges(self._q.arbitration.events(
            "AvailabilityChallenged", self._q.deployment.deploy_block, taskId=self.task_id))

    def _challenges(self, opened: Sequence[dict[str, Any]]) -> list[ChallengeInfo]:
        return [challenge_info(self._q, int(ev["challengeId"])) for ev in opened]

    def challenge_info(self, challenge_id: int) -> ChallengeInfo:
        """Availability challenge `challenge_id` on this task, as the chain has it now."""
        info = challenge_info(self._q, challenge_id)
        if info.task_id != self.task_id:
            raise DisputeNotPossible(f"task {self.task_id} has no availability challenge "
                                     f"{challenge_id}")
        return info

    def wait_challenge(self, challenge_id: int, timeout: float | None = None,
                       progress: bool = True, settle: bool = True,
                       poll_s: float = 0.5) -> ChallengeInfo:
        """Block until challenge `challenge_id` is answered or its deadline passes; returns it.

        With `settle`, this account then settles an unanswered challenge: the miner is at
        fault (shard budget back to the client, bond back, the slash burned); without it,
        the still-open challenge is returned. `JobTimeout` after `timeout` seconds. The bar (on a
        terminal's stderr) shows the chain time used of the miner's response window.
        """
        info = self.challenge_info(challenge_id)
        with _window_bar(info.opened_at, info.deadline, f"challenge {challenge_id}",
                         progress) as show:
            return wait_challenge(self._q, challenge_id, timeout=timeout, poll_s=poll_s,
                                  settle_as=self.client.account if settle else None,
                                  on_poll=show)

    def prove_billing_fault(self, index: int) -> BillingFault:
        """Prove on-chain that request `index`'s receipt bills more tokens than its output
        holds (or than a request may have), or that its shard's result tree records a false
        sum (proven from the lying request's path, which the result's `index` names): the
        shard is refunded and the miner slashed at once, without the committee.
        `DisputeNotPossible` when there is nothing to prove."""
        tx = prove_billing_fault(self._q, self.client.account, self.client.market,
                                 self.task_id, index)
        ev = tx.event("BillingFaultProven")
        shard = int(ev["shard"])
        return BillingFault(self.task_id, shard, int(ev["index"]), int(ev["slashed"]),
                            self._q.tasks.shard_budget(self.task_id, shard), tx)

    def cancel(self) -> int:
        """Cancel the task: every still-open shard's budget is refunded (returned, in wei)."""
        tx = self._q.tasks.cancel_task(self.client.account, self.task_id)
        return int(tx.event("TaskCancelled")["refund"])


@dataclass(frozen=True)
class BillingFault:
    """An over-billing receipt proven on-chain, and what it moved to the client's escrow."""

    task_id: int
    shard: int
    index: int
    slashed: int  # wei of the miner's stake, to the client
    refunded: int  # the shard's budget, back to the client
    tx: TxResult

    def outcome(self) -> str:
        return (f"billing fault proven on request {self.index} (shard {self.shard}): shard "
                f"budget of {self.refunded} wei refunded, miner slashed {self.slashed} wei, "
                "both to your escrow balance (`client withdraw`)")


_REMEDIES = {"merkle proof": "challenge", "token count": "prove-billing"}
"""The command for a failed per-request check (others: `dispute`). An unproven receipt cannot
be disputed until the miner shows a proven one on-chain, hence a challenge."""
_REMEDY_WHY = {
    "challenge": "the miner must show the receipt on-chain or be slashed",
    "prove-billing": "proves the over-billing on-chain at once",
    "dispute": "the committee judges the output",
}


def _bar(total: int, unit: str, desc: str, progress: bool, counts: bool = True) -> Any:
    """When asked for: a tqdm bar on a terminal's stderr, else (a pipe, a log file, CI) one
    line per milestone (`_Milestones`). `counts`: the bar's position is a count worth
    reporting (shards done), not a clock."""
    from tqdm import tqdm

    if progress and not sys.stderr.isatty():
        return _Milestones(total, unit, desc, counts)
    return tqdm(total=total, unit=unit, desc=desc, file=sys.stderr, leave=False,
                disable=not progress)


class _Milestones:
    """The part of tqdm's interface the waits use, writing a line to stderr only when what
    it would show changes (a shard done, a state reached): a redrawn bar in a file is
    thousands of carriage-return frames on one line."""

    def __init__(self, total: int, unit: str, desc: str, counts: bool) -> None:
        self.n, self.total, self.unit, self.desc, self.counts = 0, total, unit, desc, counts
        self._postfix = ""
        self._said = ""

    def __enter__(self) -> _Milestones:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.counts and self.n >= self.total:
            self._postfix = ""  # the states of the shards still pending: none are
            self._say()

    def update(self, k: int = 1) -> None:
        self.n += k  # said with the next postfix: shards landing together make one line

    def set_postfix_str(self, text: str = "", refresh: bool = True) -> None:
        self._postfix = text
        self._say()

    def _say(self) -> None:
        done = f"{self.n}/{self.total} {self.unit}s done" if self.counts else ""
        line = ", ".join(p for p in (done, self._postfix) if p)
        if line and line != self._said:
            self._said = line
            print(f"{self.desc}: {line}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _window_bar(opened_at: int, deadline: int, desc: str,
                progress: bool) -> Iterator[Callable[[Any, int], None]]:
    """A bar of the chain time used of a window from `opened_at` to `deadline`, and the
    `on_poll` callback that moves it and shows the polled record's status."""
    with _bar(max(1, deadline - opened_at), "s", desc, progress, counts=False) as bar:

        def show(record: Any, now: int) -> None:
            bar.n = min(bar.total, max(0, now - opened_at))
            bar.set_postfix_str(record.status.name.lower(), refresh=True)

        yield show


def _ks(ks: Sequence[int]) -> str:
    shown = ", ".join(str(k) for k in ks[:10])
    return shown + (f" and {len(ks) - 10} more" if len(ks) > 10 else "")


def _count(states: Any) -> list[tuple[ShardState, int]]:
    counts: dict[ShardState, int] = {}
    for s in states:
        counts[s] = counts.get(s, 0) + 1
    return sorted(counts.items())


def _speed(status: Any) -> float | None:
    """A heartbeat's `secondsPerToken`, when it is a positive finite number."""
    value = status.get("secondsPerToken") if isinstance(status, Mapping) else None
    if isinstance(value, int | float) and not isinstance(value, bool) and \
            math.isfinite(value) and value > 0:
        return float(value)
    return None


def shard_fit(offer: ModelOffer, max_tokens: int, claim_timeout: int) -> int:
    """The most requests a shard may hold so that the slowest live miner that said its speed
    ends it within `SHARD_CLAIM_SHARE` of the claim window (a miner claims up to
    `MAX_SHARDS_IN_FLIGHT` shards together: the window holds them all); without a measured
    speed, `UNMEASURED_SHARD_SIZE`."""
    speeds = [m.seconds_per_token for m in offer.miners
              if m.alive and m.seconds_per_token is not None]
    if not speeds:
        return UNMEASURED_SHARD_SIZE
    per_request = max(speeds) * max(1, max_tokens) * MAX_SHARDS_IN_FLIGHT
    return max(1, int(SHARD_CLAIM_SHARE * claim_timeout / per_request))
