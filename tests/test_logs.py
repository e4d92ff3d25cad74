"""Structured logs (market/logs.py): text as it always was, or one JSON object per line tagged
with the task and shard, from `extra=` or from `log_context`; the CLIs' --log-format and
QUARRY_LOG_FORMAT."""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from market import logs
from market.errors import ConfigError
from market.logs import configure_logging, log_context


@pytest.fixture(autouse=True)
def _restore_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test configures the root logger: put it (and the module's state) back after."""
    monkeypatch.delenv(logs.ENV, raising=False)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    levels = {n: logging.getLogger(n).level for n in (*logs.NOISY, "quarry")}
    state = dict(logs._state)
    yield
    for h in root.handlers[:]:
        if h not in handlers:
            root.removeHandler(h)
    for h in handlers:
        if h not in root.handlers:
            root.addHandler(h)
    root.setLevel(level)
    for name, lvl in levels.items():
        logging.getLogger(name).setLevel(lvl)
    logging.captureWarnings(False)
    logs._state.clear()
    logs._state.update(state)


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def test_json_lines_have_the_keys_and_tags() -> None:
    out = io.StringIO()
    configure_logging("miner", fmt="json", stream=out)
    log = logging.getLogger("miner")
    log.info("task %d shard %d claimed", 3, 1, extra={"task": 3, "shard": 1, "miner": "0xab"})
    log.warning("no task here")
    first, second = json_lines(out.getvalue())
    assert list(first)[:5] == ["ts", "level", "role", "logger", "msg"]
    assert first["ts"].endswith("Z") and len(first["ts"]) == len("2024-01-01T00:00:00.000Z")
    assert first | {"ts": None} == {"ts": None, "level": "INFO", "role": "miner",
                                    "logger": "miner", "msg": "task 3 shard 1 claimed",
                                    "task": 3, "shard": 1, "miner": "0xab"}
    assert "task" not in second and "shard" not in second and second["level"] == "WARNING"


def test_configure_logging_writes_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("verifier", fmt="json")
    logging.getLogger("verifier").info("hello", extra={"epoch": 7})
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = json_lines(captured.err)
    assert (line["msg"], line["role"], line["epoch"]) == ("hello", "verifier", 7)


def test_text_format_is_unchanged() -> None:
    out = io.StringIO()
    configure_logging("miner", fmt="text", stream=out)
    logging.getLogger("miner").info("task %d shard %d submitted", 1, 0,
                                    extra={"task": 1, "shard": 0})
    with log_context(task=2):
        logging.getLogger("miner").info("plain")
    assert out.getvalue() == "miner: task 1 shard 0 submitted\nminer: plain\n"


def test_the_environment_chooses_the_format(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(logs.ENV, "json")
    out = io.StringIO()
    configure_logging("market", stream=out)
    logging.getLogger("quarry.sweep").warning("x")
    assert json_lines(out.getvalue())[0]["logger"] == "quarry.sweep"
    assert logs.json_logs()
    # the flag wins over the environment
    out = io.StringIO()
    configure_logging("market", fmt="text", stream=out)
    logging.getLogger("quarry.sweep").warning("x")
    assert out.getvalue() == "market: x\n" and not logs.json_logs()


def test_a_bad_format_is_a_config_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="'xml'"):
        configure_logging("miner", fmt="xml")
    monkeypatch.setenv(logs.ENV, "JSONL")
    with pytest.raises(ConfigError, match=r"QUARRY_LOG_FORMAT.*'JSONL'"):
        configure_logging("miner")


def test_context_nests_merges_and_restores() -> None:
    out = io.StringIO()
    configure_logging("verifier", fmt="json", stream=out)
    log = logging.getLogger("verifier.disputes")
    with log_context(task=5):
        log.info("a")
        with log_context(shard=2, dispute=9):
            log.info("b")
            with log_context(shard=None):
                log.info("c")
            assert logs.current_context() == {"task": 5, "shard": 2, "dispute": 9}
        log.info("d")
    log.info("e")
    a, b, c, d, e = json_lines(out.getvalue())
    assert (a["task"], "shard" in a) == (5, False)
    assert (b["task"], b["shard"], b["dispute"]) == (5, 2, 9)
    assert (c["task"], "shard" in c, c["dispute"]) == (5, False, 9)
    assert (d["task"], "shard" in d, "dispute" in d) == (5, False, False)
    assert not {"task", "shard", "dispute"} & set(e)
    assert logs.current_context() == {}


def test_extra_beats_the_context_and_values_are_cleaned() -> None:
    out = io.StringIO()
    configure_logging("miner", fmt="json", stream=out)
    log = logging.getLogger("miner")
    with log_context(task=1, shard=1, note="ctx"):
        log.info("x", extra={"shard": "4", "note": "extra", "blob": object(),
                             "level": "spoofed", "shards": [4, 5]})
    (line,) = json_lines(out.getvalue())
    assert (line["task"], line["shard"], line["note"], line["shards"]) == (1, 4, "extra", [4, 5])
    assert "blob" not in line  # not JSON-serialisable: left out
    assert line["level"] == "INFO"  # the core keys cannot be overridden


def test_the_context_stays_in_its_thread() -> None:
    out = io.StringIO()
    configure_logging("miner", fmt="json", stream=out)
    log = logging.getLogger("miner")
    with log_context(task=8):
        t = threading.Thread(target=lambda: log.info("other thread"))
        t.start()
        t.join()
        log.info("this thread")
    other, this = json_lines(out.getvalue())
    assert "task" not in other and this["task"] == 8


def test_exceptions_carry_their_traceback() -> None:
    out = io.StringIO()
    configure_logging("market", fmt="json", stream=out)
    try:
        1 / 0  # noqa: B018
    except ZeroDivisionError:
        logging.getLogger("quarry.worker").exception("sweep failed", extra={"task": 3})
    (line,) = json_lines(out.getvalue())
    assert line["msg"] == "sweep failed" and line["task"] == 3 and line["level"] == "ERROR"
    assert "Traceback" in line["exc"] and "ZeroDivisionError" in line["exc"]


def test_json_replaces_handlers_and_quiets_the_noisy_libraries() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("miner", fmt="text", stream=first)
    configure_logging("miner", fmt="json", stream=second, verbose=True)
    logging.getLogger("miner").debug("debug line")
    logging.getLogger("httpx").info("a request")
    logging.getLogger("web3").warning("a warning")
    assert first.getvalue() == ""
    assert [x["msg"] for x in json_lines(second.getvalue())] == ["debug line", "a warning"]
    assert logging.getLogger().level == logging.DEBUG


def test_quarry_level_sets_the_project_loggers_apart() -> None:
    out = io.StringIO()
    configure_logging("market-worker", fmt="json", stream=out, level=logging.WARNING,
                      quarry_level=logging.INFO)
    logging.getLogger("quarry.index").info("indexed", extra={"task": 1, "shard": 0})
    logging.getLogger("somelib").info("dropped")
    (line,) = json_lines(out.getvalue())
    assert (line["logger"], line["task"]) == ("quarry.index", 1)


def test_say_prints_in_text_and_logs_in_json(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("miner", fmt="text")
    logs.say("miner: stopped", logger="miner", task=1)
    assert capsys.readouterr().err == "miner: stopped\n"
    configure_logging("miner", fmt="json")
    logs.say("miner: stopped", logger="miner", task=1)
    logs.say("summary", logger="miner", file=None)
    first, second = json_lines(capsys.readouterr().err)
    assert (first["msg"], first["task"], second["msg"]) == ("stopped", 1, "summary")


def test_celery_workers_log_json_and_skip_the_banner(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    """The signal receivers a Celery worker process sends at start (no broker needed)."""
    from celery import signals
    from celery.apps import worker

    monkeypatch.setattr(worker, "safe_say", worker.safe_say)  # put back after the test
    logs.celery_worker_logging("test-worker")
    instance = SimpleNamespace(quiet=False)
    signals.celeryd_init.send(sender="w@h", instance=instance, conf=None, options={})
    assert not instance.quiet and not logs.json_logs()  # text: Celery's own setup
    monkeypatch.setenv(logs.ENV, "json")
    signals.celeryd_init.send(sender="w@h", instance=instance, conf=None, options={})
    assert instance.quiet and logs.json_logs()
    # What its signal handlers write straight to a file descriptor is a JSON line too.
    with open(tmp_path / "out", "w") as f:
        worker.safe_say("worker: Warm shutdown (MainProcess)", f)
    (line,) = json_lines((tmp_path / "out").read_text())
    assert (line["msg"], line["role"]) == ("worker: Warm shutdown (MainProcess)", "test-worker")
    signals.after_setup_logger.send(sender=None, logger=logging.getLogger(),
                                    loglevel=logging.WARNING, logfile=None, format="",
                                    colorize=False)
    assert logging.getLogger("quarry").level == logging.INFO
    signals.after_setup_logger.send(sender=None, logger=logging.getLogger(),
                                    loglevel=logging.DEBUG, logfile=None, format="",
                                    colorize=False)
    assert logging.getLogger("quarry").level == logging.DEBUG


@pytest.mark.parametrize("cli", ["miner", "verifier"])
def test_the_clis_refuse_a_bad_format_in_one_line(
        cli: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import importlib

    main = importlib.import_module(f"{cli}.cli").main
    monkeypatch.setenv(logs.ENV, "yaml")
    assert main(["run"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"{cli}: error: QUARRY_LOG_FORMAT: unknown log format 'yaml' "
                   "(expected text or json)")
    with pytest.raises(SystemExit) as exc:
        main(["run", "--log-format", "yaml"])
    assert exc.value.code == 2


def test_market_serve_and_worker_take_the_flag() -> None:
    from market.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["serve", "--log-format", "json"]).log_format == "json"
    assert parser.parse_args(["worker"]).log_format is None
