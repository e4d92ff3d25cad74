"""Prometheus metrics of `miner run` and `verifier run`: the shared server (`market.metrics`)
scraped over HTTP, the `metrics_port` / `metrics_host` settings, the scoring queue's depth
read from a real Redis, and the miner's metrics moving as a real worker serves a task on
Anvil (with the helpers of tests/test_miner.py)."""

from __future__ import annotations

import math
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY, CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families
from test_miner import PRICE, batch, post_task, register  # the miner tests' helpers

from market.chain.client import anvil_account
from market.chain.devnet import free_port
from market.errors import ConfigError
from market.metrics import metric, metrics_url, queue_depth, serve_metrics
from market.store import LocalStore
from miner import cli as miner_cli
from miner import metrics as miner_metrics
from miner.config import MinerConfig
from miner.worker import Worker
from verifier import metrics as verifier_metrics
from verifier.config import VerifierConfig


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith(("QUARRY_MINER_", "QUARRY_VERIFIER_")):
            monkeypatch.delenv(name)


def scrape(port: int) -> dict[str, Any]:
    """GET /metrics, parsed: family name -> family."""
    r = httpx.get(metrics_url("127.0.0.1", port), timeout=10)
    r.raise_for_status()
    return {f.name: f for f in text_string_to_metric_families(r.text)}


def value(name: str, **labels: str) -> float:
    v = REGISTRY.get_sample_value(name, labels)
    return 0.0 if v is None else v


# ----------------------------------------------------------------------------- the server
def test_serve_metrics_on_any_port_is_scraped_and_parsed() -> None:
    port = serve_metrics(0)
    assert port > 0
    miner_metrics.SHARDS.labels("skipped").inc(0)  # the modules' metrics are registered
    families = scrape(port)
    assert families["quarry_miner_shards"].type == "counter"
    outcomes = {s.labels["outcome"] for s in families["quarry_miner_shards"].samples
                if s.name == "quarry_miner_shards_total"}
    assert outcomes == set(miner_metrics.SHARD_OUTCOMES)
    assert families["quarry_miner_engine_batch_size"].type == "histogram"
    assert families["quarry_verifier_disputes_voted"].type == "counter"
    assert "process_cpu_seconds" in families or "python_info" in families  # the defaults

    before = value("quarry_miner_wei_earned_total")
    miner_metrics.WEI_EARNED.inc(7)
    [sample] = [s for s in scrape(port)["quarry_miner_wei_earned"].samples
                if s.name == "quarry_miner_wei_earned_total"]
    assert sample.value == before + 7


def test_serve_metrics_serves_a_given_registry() -> None:
    registry = CollectorRegistry()
    counter = Counter("quarry_test_things", "things", registry=registry)
    counter.inc(3)
    families = scrape(serve_metrics(0, registry=registry))
    assert not any(name.startswith("quarry_miner") for name in families)  # not the default
    assert families["quarry_test_things"].samples[0].value == 3


def test_a_busy_port_is_a_config_error_naming_it() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        with pytest.raises(ConfigError, match=f"port {busy} \\(metrics_port\\)"):
            serve_metrics(busy)


def test_metric_is_the_same_object_when_declared_again() -> None:
    """A module imported a second time (tests do) gets its metrics back, not a duplicate
    time series error."""
    registry = CollectorRegistry()
    first = metric(Counter, "quarry_test_again_total", "again", ["x"], registry=registry)
    assert metric(Counter, "quarry_test_again_total", "again", ["x"],
                  registry=registry) is first


def test_metrics_url_brackets_ipv6() -> None:
    assert metrics_url("127.0.0.1", 9101) == "http://127.0.0.1:9101/metrics"
    assert metrics_url("::1", 9101) == "http://[::1]:9101/metrics"


# ----------------------------------------------------------------------------- settings
@pytest.mark.parametrize("settings", [MinerConfig, VerifierConfig])
def test_metrics_port_from_toml_env_and_flag(settings: Any, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    role = settings.role
    assert settings.load().metrics_port is None  # no server unless asked
    assert settings.load().metrics_host == "127.0.0.1"
    toml = tmp_path / "role.toml"
    toml.write_text(f'[{role}]\nmetrics_port = 9101\nmetrics_host = " 0.0.0.0 "\n')
    cfg = settings.load(toml)
    assert (cfg.metrics_port, cfg.metrics_host) == (9101, "0.0.0.0")
    monkeypatch.setenv(f"QUARRY_{role.upper()}_METRICS_PORT", "9102")
    assert settings.load(toml).metrics_port == 9102
    assert settings.load(toml, metrics_port=0).metrics_port == 0  # 0: any free port
    monkeypatch.setenv(f"QUARRY_{role.upper()}_METRICS_PORT", "")  # empty: unset
    assert settings.load().metrics_port is None


@pytest.mark.parametrize("settings", [MinerConfig, VerifierConfig])
@pytest.mark.parametrize("bad", ["70000", "-1", "http", "9101.5"])
def test_a_bad_metrics_port_is_named(settings: Any, bad: str,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    var = f"QUARRY_{settings.role.upper()}_METRICS_PORT"
    monkeypatch.setenv(var, bad)
    with pytest.raises(ConfigError) as info:
        settings.load()
    assert str(info.value) == (f"{settings.role} setting metrics_port (from {var}): "
                               f"{bad!r} is not a port number (0 to 65535)")


@pytest.mark.parametrize("bad", ["true", "9101.5", '"a"'])
def test_a_bad_metrics_port_in_toml_is_named(bad: str, tmp_path: Path) -> None:
    toml = tmp_path / "miner.toml"
    toml.write_text(f"[miner]\nmetrics_port = {bad}\n")
    with pytest.raises(ConfigError, match=f"miner setting metrics_port \\(from {toml} "
                                          "\\[miner\\]\\): .* is not a port number"):
        MinerConfig.load(toml)


def test_miner_run_starts_the_server_before_anything_else(
        capsys: pytest.CaptureFixture[str]) -> None:
    """`miner run --metrics-port` binds first: a busy port fails at once, naming it; a free
    one is logged (here the run then stops: no key)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        assert miner_cli.main(["run", "--metrics-port", str(busy)]) == 1
    assert f"cannot serve metrics on 127.0.0.1 port {busy}" in capsys.readouterr().err
    assert miner_cli.main(["run", "--metrics-port", "70000"]) == 1
    assert "metrics_port (from --metrics-port): 70000 is not a port" in capsys.readouterr().err


# ----------------------------------------------------------------------------- verifier
def test_queue_depth_is_nan_when_redis_does_not_answer() -> None:
    import redis

    client = redis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0",
                                  socket_connect_timeout=1, socket_timeout=1)
    assert math.isnan(queue_depth(client, "quarry.score.nobody"))


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from market.local.processes import start_redis

    redis = start_redis(tmp_path_factory.mktemp("redis"))
    try:
        yield redis.extra["url"]
    finally:
        redis.stop()


def test_scoring_queue_depth_counts_jobs_no_worker_took(redis_url: str) -> None:
    """Celery jobs sent to a queue nobody consumes are what the gauge shows at a scrape."""
    from verifier.scoring_worker import SCORE_TASK, scoring_app

    queue = "quarry.score.0xmetrics"
    verifier_metrics.watch_scoring_queue(redis_url, queue)
    try:
        assert value("quarry_verifier_scoring_queue_depth") == 0
        app = scoring_app(redis_url)
        for priority in (None, 9):  # kombu keeps prioritized jobs in lists of their own
            app.send_task(SCORE_TASK, args=["m", [], []], queue=queue, priority=priority)
        assert value("quarry_verifier_scoring_queue_depth") == 2
        app.close()
    finally:
        verifier_metrics.QUEUE_DEPTH.set_function(lambda: 0.0)


# ----------------------------------------------------------------------------- miner
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from market.model.create import create_model

    d = tmp_path_factory.mktemp("models") / "quarry-miner-test"
    create_model(d, name="quarry-miner-test", layers=2, hidden=64, max_positions=256)
    return d


@pytest.fixture(scope="module")
def engine(model_dir: Path, one_torch_thread: None) -> Iterator[Any]:
    from market.engine.factory import load_engine

    eng = load_engine("torch", model_dir, max_batch_size=4)
    yield eng
    eng.close()


@pytest.mark.chain
@pytest.mark.timeout(120)
def test_worker_moves_the_miner_metrics(devnet: Any, model_dir: Path, engine: Any,
                                        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUARRY_HOME", str(tmp_path / "home"))  # the worker's result copies
    q, miner, store = devnet.q, anvil_account(12), LocalStore(tmp_path / "store")
    dead_market = f"http://127.0.0.1:{free_port()}"
    register(devnet, miner, model_dir, dead_market)
    model = "0x" + engine.model_id.hex()
    shards = {o: value("quarry_miner_shards_total", outcome=o)
              for o in miner_metrics.SHARD_OUTCOMES}
    tokens = value("quarry_miner_tokens_generated_total", model=model)
    batches = value("quarry_miner_engine_batch_size_count")
    batch_requests = value("quarry_miner_engine_batch_size_sum")
    claims = value("quarry_miner_claim_to_submit_seconds_count")
    earned = value("quarry_miner_wei_earned_total")

    task_id = post_task(devnet, store, engine.model_id, batch(5))  # shards [0,3) and [3,5)
    worker = Worker(account=miner, quarry=q, engines={engine.model_id: engine}, store=store,
                    max_batch=2, poll_interval_s=0.1, progress=False)
    summary = worker.run(stop_when_idle=True)
    assert [(o.task_id, o.shard) for o in summary.submitted] == [(task_id, 0), (task_id, 1)]
    assert value("quarry_miner_shards_total", outcome="submitted") == shards["submitted"] + 2
    assert value("quarry_miner_tokens_generated_total", model=model) == tokens + summary.tokens
    assert value("quarry_miner_tokens_per_second", model=model) > 0
    assert value("quarry_miner_engine_batch_size_count") == batches + 3  # 2 + 2 + 1
    assert value("quarry_miner_engine_batch_size_sum") == batch_requests + 5
    assert value("quarry_miner_claim_to_submit_seconds_count") == claims + 2
    assert REGISTRY.get_sample_value("quarry_miner_info",
                                     {"address": miner.address, "engine": "torch"}) == 1

    # Shard 0 finalized by another account (as the market's sweep does), shard 1 by the
    # worker: both paid, both counted, with no chain read for the other's payment.
    devnet.chain.advance_time(q.tasks.params()["challenge_window"] + 1)
    q.tasks.finalize_shard(devnet.client, task_id, 0)
    assert worker.collect() == summary.submitted[1].tokens_used * PRICE
    assert value("quarry_miner_shards_total", outcome="finalized") == shards["finalized"] + 2
    assert value("quarry_miner_wei_earned_total") == earned + summary.tokens * PRICE
    assert value("quarry_miner_shards_total", outcome="failed") == shards["failed"]
    worker.close()
