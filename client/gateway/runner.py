"""The gateway's background loop: submit each validated batch through the SDK, follow its
task on-chain, and write the output and error files once every shard is settled.

Everything it needs is in the store, so a restarted gateway picks every batch up where it
was: a batch with a task id is followed again; one cut off between its upload and the
`createTask` receipt is looked up among this account's `TaskCreated` events by its input
root before anything is submitted again (a batch is never paid for twice).

All chain writes (createTask, cancelTask, refundUnfinished) happen on this one thread, with
one `Client`, so they never race each other for the account's nonce.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from eth_utils import encode_hex, is_address, to_checksum_address

from client.batch import encode_jsonl, output_line, parse_batch
from client.gateway.store import GatewayStore
from client.gateway.translate import LineError, error_line, translate_file
from client.sdk import PROBATION_OPTION, Client, Job, JobStatus, parse_mask
from market.chain.contracts import ShardState
from market.chain.errors import ContractRevert
from market.errors import QuarryError
from market.jobs import HAS_RESULTS
from market.marketapi import MarketUnavailable
from market.protocol.merkle import input_tree
from market.protocol.precision import ANY, mask_labels
from market.protocol.results import ResultCheckFailed
from market.roleconfig import wei

log = logging.getLogger("quarry.gateway")

WINDOW_S = {"24h": 24 * 3600}
"""The completion windows a batch may ask for (OpenAI's one) and the task deadline each sets."""
OPTIONS = {
    "quarry_max_price_per_token": "wei per output token the task pays (\"2 gwei\" works; "
                                  "default: the lowest ask among eligible miners)",
    "quarry_miner": "a miner address: a directed task, offered to that miner only",
    "quarry_arbiter": "an address that may dispute on your behalf",
    "quarry_min_reputation_bps": "least miner reputation to claim, in basis points (0-10000)",
    "quarry_allow_probation": "\"true\": miners on probation (new identities) may claim it "
                              "too; \"false\": they may not (default: only while no "
                              "established miner serves the model)",
    "quarry_shard_size": "requests per shard (default: spread over twice the alive miners, "
                         "each within half a claim window at the slowest one's speed)",
    "quarry_precision": "precisions miners may serve it in, e.g. \"bf16,fp32\" (fp32, fp16, "
                        "bf16, fp8, int8; default any)",
    "quarry_require_commitments": "\"true\": every output must carry an activation "
                                  "commitment",
}
"""The `metadata` keys that set Quarry's own knobs; every other key is the user's own."""


class OptionError(QuarryError):
    """A `quarry_*` metadata key that is unknown or has a bad value."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(f"metadata.{key}: {message}")


@dataclass(frozen=True)
class Options:
    """The task parameters `metadata` asks for (None: the SDK's default)."""

    price: int | None = None
    miner: str | None = None
    arbiter: str | None = None
    min_reputation_bps: int = 0
    allow_probation: bool | None = None  # None: the SDK's default (market.sdk.Client.submit)
    shard_size: int | None = None
    precisions: int = ANY  # accepted-precision mask
    require_commitments: bool = False


def parse_options(metadata: Mapping[str, str] | None) -> Options:
    """`Options` from a batch's metadata; `OptionError` naming the key for a bad one."""
    values: dict[str, Any] = {}
    for key, value in (metadata or {}).items():
        if not key.startswith("quarry_"):
            continue
        if key not in OPTIONS:
            raise OptionError(key, f"unknown Quarry option (known: {', '.join(OPTIONS)})")
        try:
            values[key] = _option(key, value)
        except ValueError as exc:
            raise OptionError(key, str(exc)) from None
    return Options(
        price=values.get("quarry_max_price_per_token"),
        miner=values.get("quarry_miner"), arbiter=values.get("quarry_arbiter"),
        min_reputation_bps=values.get("quarry_min_reputation_bps", 0),
        allow_probation=values.get("quarry_allow_probation"),
        shard_size=values.get("quarry_shard_size"),
        precisions=values.get("quarry_precision", ANY),
        require_commitments=values.get("quarry_require_commitments", False))


def _option(key: str, value: str) -> Any:
    if key == "quarry_max_price_per_token":
        price = wei(value)
        if price < 1:
            raise ValueError("must be at least 1 wei")
        return price
    if key in ("quarry_miner", "quarry_arbiter"):
        if not is_address(value):
            raise ValueError(f"{value!r} is not an address")
        return to_checksum_address(value)
    if key == "quarry_precision":
        try:
            return parse_mask(value)
        except QuarryError as exc:
            raise ValueError(str(exc).removeprefix("precisions: ")) from None
    if key in ("quarry_allow_probation", "quarry_require_commitments"):
        if value.lower() not in ("true", "false"):
            raise ValueError(f"must be \"true\" or \"false\", got {value!r}")
        return value.lower() == "true"
    n = int(value) if value.strip().isdigit() else -1
    low, high = (0, 10_000) if key == "quarry_min_reputation_bps" else (1, 2**32 - 1)
    if not low <= n <= high:
        raise ValueError(f"must be an integer in [{low}, {high}], got {value!r}")
    return n


class Runner:
    """Moves every active batch one step per `poll_s`; `start`/`stop` run it on a thread."""

    def __init__(self, store: GatewayStore, connect: Callable[[], Client],
                 poll_s: float = 0.5) -> None:
        self.store = store
        self._connect = connect
        self._client: Client | None = None
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen: dict[str, int] = {}  # batch id -> the chain head its task was read at

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = self._connect()
        return self._client

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="gateway-runner", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._client is not None:
            self._client.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # a bad poll must not end the loop: log it, try again
                log.exception("gateway runner: poll failed; retrying")
            self._stop.wait(self.poll_s)

    def tick(self) -> None:
        """One step for every active batch (oldest first)."""
        for batch in self.store.active_batches():
            if self._stop.is_set():
                return
            try:
                if batch["task_id"] is None:
                    self._submit(batch)
                else:
                    self._follow(batch)
            except (MarketUnavailable, OSError) as exc:  # transient: the next tick retries
                log.warning("batch %s: %s; retrying", batch["id"], exc)

    # ------------------------------------------------------------------ validate, submit
    def _submit(self, b: dict[str, Any]) -> None:
        now = int(time.time())
        if b["status"] == "cancelling" and b["submit_block"] is None:
            self.store.update_batch(b["id"], status="cancelled", cancelled_at=now)
            return
        data = self.store.file_data(b["input_file_id"])
        if data is None:
            self._fail(b, [LineError("file_not_found", f"input file {b['input_file_id']} was "
                                     "deleted before the batch started")])
            return
        translated = translate_file(data, b["endpoint"])
        if isinstance(translated, list):
            self._fail(b, translated)
            return
        batch = parse_batch(encode_jsonl(list(translated.lines)))
        root = encode_hex(input_tree(batch.request_hashes).root)
        c = self.client
        if b["submit_block"] is not None and b["input_root"] == root:
            task_id = self._submitted(b["submit_block"], root)
            if task_id is not None:
                self._started(b, task_id)
                return
        if b["status"] == "cancelling":  # cut off mid-submission, and no task was created
            self.store.update_batch(b["id"], status="cancelled", cancelled_at=now)
            return
        opts = parse_options(b["metadata"])
        self.store.update_batch(b["id"], submit_block=c.chain.block_number(), input_root=root,
                                total=len(batch), model=translated.model)
        try:
            job = c.submit(list(translated.lines), price=opts.price,
                           deadline=WINDOW_S[b["completion_window"]],
                           shard_size=opts.shard_size, arbiter=opts.arbiter,
                           min_reputation_bps=opts.min_reputation_bps,
                           prefer_miner=opts.miner, allow_probation=opts.allow_probation,
                           precisions=mask_labels(opts.precisions) if opts.precisions else None,
                           require_commitments=opts.require_commitments)
        except MarketUnavailable:
            raise
        except QuarryError as exc:
            self.store.update_batch(b["id"], submit_block=None)
            line = getattr(exc, "line", None)
            if isinstance(line, int) and 0 < line <= len(translated.line_numbers):
                line = translated.line_numbers[line - 1]  # Quarry's line -> the user's line
            self._fail(b, [LineError(_code(exc), _gateway_words(str(exc)),
                                     line if isinstance(line, int) else None)])
            return
        self._started(b, job.task_id)

    def _submitted(self, from_block: int, root: str) -> int | None:
        """The task this account created since `from_block` with input root `root`."""
        c = self.client
        for ev in c.q.tasks.events("TaskCreated", from_block, client=c.address):
            if encode_hex(ev["inputRoot"]) == root:
                return int(ev["taskId"])
        return None

    def _started(self, b: dict[str, Any], task_id: int) -> None:
        t = self.client.job(task_id).task()
        fields: dict[str, Any] = {"task_id": task_id, "expires_at": t.deadline,
                  "quarry": {"task_id": task_id, "deadline": t.deadline}}
        if not self.store.update_batch(b["id"], only_if="validating", status="in_progress",
                                       in_progress_at=int(time.time()), **fields):
            self.store.update_batch(b["id"], **fields)  # cancelled meanwhile: cancel the task

    def _fail(self, b: dict[str, Any], errors: list[LineError]) -> None:
        self.store.update_batch(b["id"], status="failed", failed_at=int(time.time()),
                                errors={"object": "list",
                                        "data": [e.to_json() for e in errors]})

    # ------------------------------------------------------------------ follow, settle
    def _follow(self, b: dict[str, Any]) -> None:
        head = self.client.chain.block_number()
        if self._seen.get(b["id"]) == head and b["status"] == "in_progress":
            return  # no new block: nothing on-chain changed since the last read
        self._seen[b["id"]] = head
        job = self.client.job(b["task_id"])
        quarry = dict(b["quarry"] or {})
        if b["status"] == "cancelling" and "cancel_refund" not in quarry:
            quarry["cancel_refund"] = self._cancel(job)
            self.store.update_batch(b["id"], quarry=quarry)
        st = job.status()
        if b["status"] != "cancelling" and not st.cancelled and st.chain_time >= st.deadline:
            self._refund_open(job, st)  # the window passed: take the open shards' budget back
            st = job.status()
        done = sum(s.end - s.start for s in st.shards if s.state in HAS_RESULTS)
        refunded = sum(s.end - s.start for s in st.shards if s.state == ShardState.REFUNDED)
        quarry.update(_money(st))
        self.store.update_batch(b["id"], completed=done, failed=refunded, quarry=quarry)
        if all(s.state in HAS_RESULTS or s.state == ShardState.REFUNDED for s in st.shards):
            self._finish(b, job, st, quarry)

    def _cancel(self, job: Job) -> int:
        """Cancel the task: the open shards' budget goes back to escrow (returned, in wei)."""
        try:
            return job.cancel()
        except ContractRevert as exc:  # every shard already taken or settled: nothing to do
            log.info("task %s: cancel refused (%s); claimed shards run to their end",
                     job.task_id, exc)
            return 0

    def _refund_open(self, job: Job, st: JobStatus) -> None:
        c = self.client
        for s in st.shards:
            if s.state == ShardState.OPEN:
                try:
                    c.q.tasks.refund_unfinished(c.account, job.task_id, s.index)
                except ContractRevert as exc:  # the market's sweep was first
                    log.info("task %s shard %s: %s", job.task_id, s.index, exc)

    def _finish(self, b: dict[str, Any], job: Job, st: JobStatus,
                quarry: dict[str, Any]) -> None:
        """Verify every shard with results, then write the output and error files."""
        now = int(time.time())
        if b["status"] != "finalizing":
            self.store.update_batch(b["id"], status="finalizing", finalizing_at=now)
        final = ("cancelled" if b["status"] == "cancelling" or st.cancelled else
                 "expired" if st.chain_time >= st.deadline and
                 any(s.state == ShardState.REFUNDED for s in st.shards) else "completed")
        why = {"cancelled": ("batch_cancelled", "the batch was cancelled before a miner "
                             "took this request; its budget was refunded"),
               "expired": ("batch_expired", "this request could not be executed before the "
                           "completion window expired; its budget was refunded")}.get(
            final, ("refunded", "the shard holding this request was refunded (its miner was "
                    "found at fault); it has no verified output"))
        requests = job.inputs().requests
        outputs: list[dict[str, Any]] = []
        errors: list[dict[str, Any]] = []
        prompt = completion = 0
        for s in st.shards:
            if s.state in HAS_RESULTS:
                try:
                    for out in job.shard_results(s.index):
                        outputs.append(output_line(out))
                        prompt += out.usage["prompt_tokens"]
                        completion += out.usage["completion_tokens"]
                    continue
                except ResultCheckFailed as exc:
                    code, message = "verification_failed", str(exc)
            else:
                code, message = why
            for i in range(s.start, s.end):
                errors.append(error_line(requests[i].custom_id, f"batch_req_{job.task_id}_{i}",
                                         code, message))
        fields: dict[str, Any] = {"completed": len(outputs), "failed": len(errors),
                                  f"{final}_at": int(time.time())}
        if outputs:
            fields["output_file_id"] = self.store.add_file(
                f"{b['id']}_output.jsonl", "batch_output", encode_jsonl(outputs))["id"]
        if errors:
            fields["error_file_id"] = self.store.add_file(
                f"{b['id']}_error.jsonl", "batch_output", encode_jsonl(errors))["id"]
        quarry["usage"] = {"input_tokens": prompt, "output_tokens": completion}
        self.store.update_batch(b["id"], status=final, quarry=quarry, **fields)


def _money(st: JobStatus) -> dict[str, Any]:
    return {"payment_wei": st.payment, "paid_wei": st.paid, "refunded_wei": st.refunded,
            "compensation_wei": st.compensation, "price_per_token_wei": st.price_per_token,
            "deadline": st.deadline, "shards": len(st.shards)}


def _code(exc: Exception) -> str:
    """`PaymentTooLow` -> `payment_too_low`: an error code from the exception's class."""
    name = type(exc).__name__
    return "".join(f"_{ch.lower()}" if ch.isupper() else ch for ch in name).lstrip("_")


__all__ = ["OPTIONS", "OptionError", "Options", "Runner", "WINDOW_S",
           "parse_options"]


def _gateway_words(message: str) -> str:
    """An SDK message in the gateway's terms: its knobs are `metadata` keys, not the SDK's
    arguments or the CLI's flags."""
    return message.replace(PROBATION_OPTION, 'metadata={"quarry_allow_probation": "true"}')
