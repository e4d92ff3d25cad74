"""Scoring on Celery workers (Redis as broker and result backend), so the verifier process
never loads torch or the model.

The verifier enqueues `SCORE_TASK` with OpenAI Batch request lines, the miner's token ids and
(optionally) their finish reasons and texts to its own queue (`quarry.score.<address>`:
verifiers never share scorers); any number of workers on that queue share the load. A worker
tokenizes the lines with its engine (`TextEngine.request_from_line`), runs
`verifier.scoring.score_outputs` and returns each `ChallengeScore.to_json()`. It keeps one
engine per model directory, loaded through `market.model.loading`, which checks the
directory against its manifest once at load: a tampered model directory is refused, naming
the file.

`ScoringClient.score` waits for the answer and raises ScoringError naming the problem: no
worker answered within the timeout (the job then expires unrun), the worker's own error
(bad request line, tampered model...), or Redis unreachable. Kept free of torch at import.
"""

from __future__ import annotations

import argparse
import base64
import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from celery import Celery

from verifier.scoring import ChallengeScore, ScoringError

if TYPE_CHECKING:
    from market.engine.text import TextEngine
    from market.local.processes import ManagedProcess

__all__ = [
    "SCORE_TASK",
    "ScoringClient",
    "ScoringError",
    "run_worker",
    "scoring_app",
    "start_scoring_worker",
]

SCORE_TASK = "quarry.verifier.score"
log = logging.getLogger("quarry.scoring")
_engines: dict[str, TextEngine] = {}
_threads = 1  # torch threads per worker process, set by run_worker
_precision = "fp32"  # the reference's precision, set by run_worker


def _load_engine(model_dir: str) -> TextEngine:
    """This process's engine for `model_dir`, loaded (and manifest-checked) on first use."""
    key = str(Path(model_dir).resolve())
    engine = _engines.get(key)
    if engine is None:
        from market.engine.torch_engine import TorchEngine

        started = time.monotonic()
        # market.model.loading verifies every file first; the precision is explicit, never
        # the GPU default (bf16), so that a verifier scores at the calibration it names.
        engine = TorchEngine(key, precision=_precision, threads=_threads)
        _engines[key] = engine
        log.info("loaded %s (%s) in %.1fs", key, engine.model_id.hex(),
                 time.monotonic() - started)
    return engine


def score_task(model_dir: str, request_lines: list[dict[str, Any]],
               output_ids: list[list[int]], finish_reasons: list[str] | None = None,
               texts: list[str] | None = None, precision: int | str = "fp32",
               commitments: list[str] | None = None) -> list[dict[str, Any]]:
    """The Celery task body: score a miner's outputs for request lines against `model_dir`,
    judged at the miner's declared `precision`, with its activation `commitments` (base64,
    "" for an output without one) when given.

    Any failure is raised as a ScoringError whose message names the problem, which the
    result backend carries back to the client."""
    from market.errors import QuarryError
    from market.protocol.precision import parse_precision
    from verifier.scoring import score_outputs

    started = time.monotonic()
    try:
        if not isinstance(model_dir, str) or not model_dir:
            raise ScoringError(f"model_dir must be a path string, got {model_dir!r}")
        if not isinstance(request_lines, list) or not isinstance(output_ids, list):
            raise ScoringError("request_lines and output_ids must be lists")
        if len(request_lines) != len(output_ids):
            raise ScoringError(f"{len(request_lines)} request lines but {len(output_ids)} "
                               "outputs; each line needs exactly one output")
        engine = _load_engine(model_dir)
        requests = []
        for i, line in enumerate(request_lines):
            try:
                requests.append(engine.request_from_line(line))
            except QuarryError as exc:
                raise ScoringError(f"request line {i}: {exc}") from exc
        scores = score_outputs(engine, requests, output_ids, finish_reasons, texts,
                               precision=parse_precision(precision),
                               commitments=None if commitments is None
                               else [_unbase64(c, i) for i, c in enumerate(commitments)])
    except ScoringError:
        raise
    except QuarryError as exc:
        raise ScoringError(f"{type(exc).__name__}: {exc}") from exc
    log.info("scored %d output(s) against %s in %.2fs", len(scores), model_dir,
             time.monotonic() - started)
    return [s.to_json() for s in scores]


def _unbase64(text: object, index: int) -> bytes:
    if not isinstance(text, str):
        raise ScoringError(f"commitment {index} must be a base64 string")
    try:
        return base64.b64decode(text, validate=True)
    except ValueError as exc:
        raise ScoringError(f"commitment {index} is not base64: {exc}") from exc


def scoring_app(redis_url: str) -> Celery:
    """A Celery app on `redis_url` (broker and results) with `SCORE_TASK` registered."""
    if not isinstance(redis_url, str) or not redis_url.startswith(("redis://", "rediss://",
                                                                   "unix://")):
        raise ScoringError(f"not a Redis URL: {redis_url!r} (expected redis://host:port/db)")
    app = Celery("quarry-scoring", broker=redis_url, backend=redis_url, set_as_current=False)
    app.conf.update(
        broker_connection_retry_on_startup=True,
        broker_connection_retry=True,
        broker_connection_max_retries=None,  # a Redis outage never ends a worker
        broker_connection_timeout=2.0,
        # Scoring jobs are short; an unacked one is redelivered only after this long.
        broker_transport_options={"visibility_timeout": 3600},
        result_backend_always_retry=False,
        result_backend_transport_options={"retry_policy": {
            "max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5}},
        result_expires=3600,
        redis_socket_connect_timeout=2.0,
        redis_socket_timeout=30.0,
        task_acks_late=True,  # a job whose worker dies goes to another worker
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,  # idle workers take the next job, not a busy one
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_publish_retry_policy={"max_retries": 2, "interval_start": 0,
                                   "interval_step": 0.2, "interval_max": 0.5},
        worker_hijack_root_logger=False,
        timezone="UTC",
    )
    app.task(name=SCORE_TASK)(score_task)
    return app


def _check_payload(request_lines: Sequence[Mapping[str, Any]],
                   output_ids: Sequence[Sequence[int]]) -> tuple[list[dict[str, Any]],
                                                                 list[list[int]]]:
    if isinstance(request_lines, str | bytes | Mapping) or isinstance(output_ids,
                                                                      str | bytes | Mapping):
        raise ScoringError("request_lines and output_ids must be lists")
    lines = list(request_lines)
    outputs = list(output_ids)
    if len(lines) != len(outputs):
        raise ScoringError(f"{len(lines)} request lines but {len(outputs)} outputs; each "
                           "line needs exactly one output")
    for i, line in enumerate(lines):
        if not isinstance(line, Mapping):
            raise ScoringError(f"request line {i} must be an object, got {type(line).__name__}")
    ids = []
    for i, out in enumerate(outputs):
        if isinstance(out, str | bytes | Mapping) or not isinstance(out, Sequence):
            raise ScoringError(f"output {i}: token ids must be a list of integers")
        if any(isinstance(t, bool) or not isinstance(t, int) for t in out):
            raise ScoringError(f"output {i}: every token id must be an integer")
        ids.append([int(t) for t in out])
    return [dict(line) for line in lines], ids


class ScoringClient:
    """Sends scoring jobs to the workers on `queue` and waits for their answers."""

    def __init__(self, redis_url: str, queue: str, model_dir: Path, timeout_s: float = 300
                 ) -> None:
        if not isinstance(queue, str) or not queue:
            raise ScoringError(f"queue must be a non-empty name, got {queue!r}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) \
                or not timeout_s > 0:
            raise ScoringError(f"timeout_s must be a positive number, got {timeout_s!r}")
        self.redis_url = redis_url
        self.queue = queue
        self.model_dir = Path(model_dir).resolve()
        self.timeout_s = float(timeout_s)
        self.app = scoring_app(redis_url)

    def score(self, request_lines: Sequence[Mapping[str, Any]],
              output_ids: Sequence[Sequence[int]],
              finish_reasons: Sequence[str] | None = None,
              texts: Sequence[str] | None = None, *,
              precision: object = "fp32",
              commitments: Sequence[bytes] | None = None) -> list[ChallengeScore]:
        """Evidence per output, in request order (`finish_reasons` and, for requests with
        stop strings, `texts`, when given, are checked against the tokens), judged at the
        miner's declared `precision` (`market.protocol.precision`; the shard records it),
        with each output's activation commitment (b"" for none) when given; raises
        ScoringError naming what went wrong."""
        from celery.exceptions import TimeoutError as CeleryTimeout

        from market.protocol.precision import PrecisionError, parse_precision

        lines, ids = _check_payload(request_lines, output_ids)
        if not lines:
            return []
        reasons = None
        if finish_reasons is not None:
            reasons = [str(f) for f in finish_reasons]
            if len(reasons) != len(lines):
                raise ScoringError(f"{len(lines)} outputs but {len(reasons)} finish reasons")
        if texts is not None:
            if isinstance(texts, str | bytes) or any(not isinstance(t, str) for t in texts):
                raise ScoringError("texts must be a list of strings")
            if len(texts) != len(lines):
                raise ScoringError(f"{len(lines)} outputs but {len(texts)} texts")
        try:
            declared = parse_precision(precision)
        except PrecisionError as exc:
            raise ScoringError(str(exc)) from exc
        encoded = None
        if commitments is not None:
            if isinstance(commitments, bytes) or any(not isinstance(c, bytes)
                                                     for c in commitments):
                raise ScoringError("commitments must be a list of bytes")
            if len(commitments) != len(lines):
                raise ScoringError(f"{len(lines)} outputs but {len(commitments)} commitments")
            encoded = [base64.b64encode(c).decode("ascii") for c in commitments]
        args: list[Any] = [str(self.model_dir), lines, ids, reasons,
                           None if texts is None else list(texts), declared.label, encoded]
        self._ping_redis()
        try:
            result = self.app.send_task(SCORE_TASK, args=args,
                                        queue=self.queue, expires=self.timeout_s)
        except Exception as exc:  # kombu/redis raise their own types for a broker outage
            raise ScoringError(f"cannot reach Redis at {self.redis_url} to enqueue scoring "
                               f"on {self.queue}: {exc}") from exc
        try:
            answer = result.get(timeout=self.timeout_s, propagate=True)
        except CeleryTimeout as exc:
            raise ScoringError(f"no scoring worker on queue {self.queue} answered within "
                               f"{self.timeout_s:g}s (is one running on {self.redis_url}?)"
                               ) from exc
        except ScoringError as exc:
            raise ScoringError(f"the scoring worker on {self.queue} refused the job: {exc}"
                               ) from exc
        except (OSError, ConnectionError) as exc:
            raise ScoringError(f"lost Redis at {self.redis_url} while waiting for scores: "
                               f"{exc}") from exc
        except Exception as exc:  # the worker's own failure, rebuilt by Celery
            raise ScoringError(f"the scoring worker on {self.queue} failed: "
                               f"{type(exc).__name__}: {exc}") from exc
        finally:
            try:
                result.forget()
            except Exception:  # Redis gone: the result expires by itself
                pass
        if not isinstance(answer, list) or len(answer) != len(lines):
            raise ScoringError(f"the scoring worker on {self.queue} returned "
                               f"{type(answer).__name__} instead of {len(lines)} scores")
        return [ChallengeScore.from_json(d) for d in answer]

    def _ping_redis(self) -> None:
        """Fail fast, with Redis's own reason, when the broker is down (Celery would retry
        for a while and then report its result store instead)."""
        import redis

        client = redis.Redis.from_url(self.redis_url, socket_connect_timeout=2,
                                      socket_timeout=5)
        try:
            client.ping()
        except redis.RedisError as exc:
            raise ScoringError(f"cannot reach Redis at {self.redis_url} to enqueue scoring "
                               f"on {self.queue}: {exc}") from exc
        finally:
            client.close()

    def close(self) -> None:
        self.app.close()


def _node_name(queue: str) -> str:
    from market.local.processes import worker_nodename

    return worker_nodename(f"scorer-{queue}-{os.getpid()}-{time.monotonic_ns()}")


def start_scoring_worker(redis_url: str, queue: str, log_path: Path, *, concurrency: int = 1,
                         wait: bool = True, timeout: float = 60.0, threads: int = 1,
                         precision: str = "fp32") -> ManagedProcess:
    """`python -m verifier.scoring_worker` on `queue` in its own process group, dying with
    this process; with `wait`, returns once it answers a ping (it consumes jobs)."""
    from market.config import PROJECT_ROOT
    from market.local.processes import ProcessError, spawn, wait_worker

    scoring_app(redis_url)  # checks the URL
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ProcessError(f"scoring worker concurrency must be at least 1, got {concurrency!r}")
    node = _node_name(queue)
    cmd = [sys.executable, "-m", "verifier.scoring_worker", "--redis-url", redis_url,
           "--queue", queue, "--concurrency", str(concurrency), "--name", node,
           "--threads", str(threads), "--precision", precision]
    env = dict(os.environ)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(PROJECT_ROOT) + (os.pathsep + path if path else "")
    env["PYTHONUNBUFFERED"] = "1"
    proc = spawn(cmd, name=f"scoring worker {node}", log_path=Path(log_path), env=env,
                 cwd=PROJECT_ROOT)
    proc.extra["node"] = node
    proc.extra["queue"] = queue
    if wait:
        try:
            wait_worker(proc, redis_url, timeout)
        except BaseException:
            proc.stop()
            raise
    return proc


def run_worker(redis_url: str, queue: str, concurrency: int = 1, *, name: str | None = None,
               threads: int = 1, precision: str = "fp32") -> None:
    """Run a scoring worker on `queue` until stopped (solo pool for one job at a time,
    prefork above; each process loads its own engine on its first job)."""
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ScoringError(f"concurrency must be at least 1, got {concurrency!r}")
    if not isinstance(queue, str) or not queue:
        raise ScoringError(f"queue must be a non-empty name, got {queue!r}")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ScoringError(f"threads must be at least 1, got {threads!r}")
    from market.logs import NOISY, celery_worker_logging, configure_logging
    from market.protocol.precision import PrecisionError, parse_precision
    from verifier.scoring import VERIFIER_PRECISIONS

    try:
        reference = parse_precision(precision)
    except PrecisionError as exc:
        raise ScoringError(str(exc)) from exc
    if reference not in VERIFIER_PRECISIONS:
        raise ScoringError(f"a scoring worker computes in fp32 or bf16, not {reference.label}")
    global _threads, _precision
    _threads, _precision = threads, reference.label
    # Text as ever, or JSON lines when $QUARRY_LOG_FORMAT says so (`verifier run` puts its
    # own format there, and this process inherits it); the app does not hijack the root
    # logger, so Celery keeps this handler.
    configure_logging("verifier-scorer", level=logging.INFO,
                      text_format="%(asctime)s %(name)s: %(message)s",
                      quiet=[n for n in NOISY if n not in ("celery", "kombu")])
    celery_worker_logging("verifier-scorer")
    app = scoring_app(redis_url)
    pool = (["--pool=solo", "--concurrency=1"] if concurrency == 1
            else ["--pool=prefork", f"--concurrency={concurrency}"])
    app.worker_main(["worker", "-Q", queue, *pool, "-n", name or _node_name(queue),
                     "--loglevel=INFO", "--without-mingle", "--without-gossip"])


def main(argv: Sequence[str] | None = None) -> int:
    from market.cliutil import run_cli

    parser = argparse.ArgumentParser(prog="python -m verifier.scoring_worker",
                                     description="Run a Quarry scoring worker.")
    parser.add_argument("--redis-url", required=True, help="Redis broker and result backend")
    parser.add_argument("--queue", required=True, help="the verifier's scoring queue")
    parser.add_argument("--concurrency", type=int, default=1, help="jobs at once (1)")
    parser.add_argument("--name", default=None, help="Celery node name")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per job (1)")
    parser.add_argument("--precision", default="fp32",
                        help="the reference's precision: fp32 (default) or bf16")
    parser.set_defaults(func=lambda a: run_worker(a.redis_url, a.queue, a.concurrency,
                                                  name=a.name, threads=a.threads,
                                                  precision=a.precision))
    return run_cli(parser, argv)


if __name__ == "__main__":
    raise SystemExit(main())
