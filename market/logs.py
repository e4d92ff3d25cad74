"""The one way every Quarry process sets up logging: today's plain text, or one JSON object per
line (`--log-format json`, or `QUARRY_LOG_FORMAT=json` in the environment, which the processes
a role starts inherit), each tagged with the task and shard it concerns, so one job can be
followed across the market, its workers, the miners and the verifiers.

A line gets its task and shard from `extra={"task": t, "shard": s}` on the call, or from an
enclosing `log_context(task=t, shard=s)`, which tags a whole block of work (the explicit
`extra` wins). Kept free of third-party imports: every CLI imports it.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, TextIO

from market.errors import ConfigError

__all__ = [
    "ENV",
    "FORMATS",
    "JsonFormatter",
    "NOISY",
    "celery_worker_logging",
    "configure_logging",
    "current_context",
    "export_format",
    "json_logs",
    "log_context",
    "log_format",
    "say",
]

ENV = "QUARRY_LOG_FORMAT"
FORMATS = ("text", "json")
NOISY = ("httpx", "httpcore", "urllib3", "web3", "celery", "kombu")
"""Libraries kept at WARNING: at INFO they log every request they make."""

_CORE = ("ts", "level", "role", "logger", "msg")
# Attributes every LogRecord has: anything else on a record came from `extra=` (but uvicorn's
# `color_message`, the message again with terminal colours, is no field).
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message", "asctime", "taskName", "color_message"}
_context: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "quarry_log_context", default=None)
_state: dict[str, str] = {"format": "text", "role": ""}


def log_format(fmt: str | None = None) -> str:
    """`fmt`, else `$QUARRY_LOG_FORMAT`, else "text"; ConfigError naming a value that is
    neither "text" nor "json"."""
    source = "--log-format"
    if fmt is None:
        fmt, source = os.environ.get(ENV, "").strip() or "text", ENV
    if fmt not in FORMATS:
        raise ConfigError(f"{source}: unknown log format {fmt!r} (expected text or json)")
    return fmt


def json_logs() -> bool:
    """Whether this process's last `configure_logging` chose JSON."""
    return _state["format"] == "json"


def export_format() -> None:
    """Put this process's log format in the environment, so the processes it starts (scoring
    workers, pool processes, swarm stages) log the same way."""
    os.environ[ENV] = _state["format"]


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts (ISO-8601 UTC, milliseconds), level, role, logger,
    msg, then task and shard (ints) when known, the other JSON-serialisable fields of
    `log_context` and `extra=`, and exc (the traceback) when there is one."""

    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname, "role": self.role, "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = dict(_context.get() or {})
        fields.update((k, v) for k, v in vars(record).items() if k not in _STANDARD)
        for key in ("task", "shard"):
            value = fields.pop(key, None)
            with contextlib.suppress(TypeError, ValueError):
                if value is not None and not isinstance(value, bool):
                    out[key] = int(value)
        for key, value in fields.items():
            if key in _CORE or key == "exc" or value is None:
                continue
            try:
                json.dumps(value)
            except (TypeError, ValueError):  # not JSON: left out rather than stringified
                continue
            out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False)


def configure_logging(
    role: str,
    *,
    fmt: str | None = None,
    verbose: bool = False,
    level: int | None = None,
    text_format: str | None = None,
    quarry_level: int | None = None,
    quiet: Iterable[str] = NOISY,
    stream: TextIO | None = None,
) -> None:
    """Log this process's records to stderr (`stream`) as `fmt` (see `log_format`), replacing
    any root handlers. Text is `"<role>: message"` (or `text_format`); JSON is one
    `JsonFormatter` object per line. The root level is `level`, else DEBUG with `verbose`,
    else INFO; `quarry_level` sets the `quarry.*` loggers apart from it (the market keeps
    libraries at its --log-level and its own lines at INFO); `quiet` libraries stay at
    WARNING. In JSON, Python warnings are logged too, so a JSON log stays all JSON."""
    chosen = log_format(fmt)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter(role) if chosen == "json" else logging.Formatter(
        text_format or role.replace("%", "%%") + ": %(message)s"))
    root_level = level if level is not None else logging.DEBUG if verbose else logging.INFO
    logging.basicConfig(level=root_level, handlers=[handler], force=True)
    for name in quiet:
        logging.getLogger(name).setLevel(logging.WARNING)
    if quarry_level is not None:
        logging.getLogger("quarry").setLevel(quarry_level)
    if chosen == "json":
        logging.captureWarnings(True)
    _state.update(format=chosen, role=role)


@contextlib.contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Tag every line logged in this block (in this thread) with `fields`, e.g. task and
    shard; nested blocks add to the enclosing one's fields (None unsets one) and the
    enclosing fields come back on exit. A thread started inside does not inherit them."""
    token = _context.set({**(_context.get() or {}), **fields})
    try:
        yield
    finally:
        _context.reset(token)


def current_context() -> Mapping[str, Any]:
    """The fields `log_context` blocks add to lines logged here now."""
    return dict(_context.get() or {})


def say(line: str, *, logger: str, level: int = logging.INFO, file: TextIO | None = None,
        **fields: Any) -> None:
    """A status line for the person running the command: printed as ever in text logs (to
    `file`, default stderr); in JSON logs, logged through `logger` with `fields` instead
    (without a leading "<role>: "), so every line of a JSON log parses."""
    if not json_logs():
        print(line, file=file if file is not None else sys.stderr, flush=True)
        return
    role = _state["role"]
    if role and line.startswith(f"{role}: "):
        line = line[len(role) + 2:]
    logging.getLogger(logger).log(level, "%s", line, extra=fields)


def celery_worker_logging(role: str, *, quarry_level: int = logging.INFO) -> None:
    """Log a Celery worker started in this process (by `worker_main` or `celery -A ...
    worker`) through `configure_logging`: in JSON (`$QUARRY_LOG_FORMAT`, read when the worker
    starts), the root handler is set up before Celery's own setup, which keeps it (the app
    must not hijack the root logger: `worker_hijack_root_logger=False`) and sends what it
    redirects from stdout and stderr through it; the banner, printed past both, is left out,
    and what its signal handlers write past both (shutdown notices) is JSON too. In text,
    Celery's own setup stays as it is. Either way the `quarry.*` loggers log at
    `quarry_level` (or the worker's --loglevel, if lower), whatever the worker's level."""
    from celery import signals

    def before(instance: Any = None, **_: Any) -> None:
        if log_format() == "json":
            configure_logging(role, fmt="json", level=logging.WARNING,
                              quiet=[n for n in NOISY if n not in ("celery", "kombu")])
            if instance is not None:
                instance.quiet = True  # no banner on stdout
            _celery_says_json(role)

    def after(loglevel: int | str | None = None, **_: Any) -> None:
        level = loglevel if isinstance(loglevel, int) and loglevel else logging.WARNING
        logging.getLogger("quarry").setLevel(min(quarry_level, level))

    signals.celeryd_init.connect(before, weak=False, dispatch_uid=f"quarry.logs.{role}.init")
    signals.after_setup_logger.connect(after, weak=False,
                                       dispatch_uid=f"quarry.logs.{role}.after")


def _celery_says_json(role: str) -> None:
    """Celery's worker writes a few lines straight to the file descriptors, from its signal
    handlers ("worker: Warm shutdown (MainProcess)"), through `celery.apps.worker.safe_say`:
    in JSON, that writes one JSON object instead. It still writes with `os.write`, taking no
    lock, so a signal arriving while the interrupted code logs cannot deadlock it."""
    from celery.apps import worker

    formatter = JsonFormatter(role)

    def safe_say(msg: str, f: Any = sys.__stderr__) -> None:
        record = logging.LogRecord("celery.worker", logging.INFO, __file__, 0, "%s",
                                   (str(msg).strip(),), None)
        with contextlib.suppress(AttributeError, OSError, ValueError):
            os.write(f.fileno(), (formatter.format(record) + "\n").encode())

    worker.safe_say = safe_say
