"""What operators and clients see: the dashboard (`/ui`) in a real headless browser (Debian's
chromium driven by Selenium), `/metrics` in Prometheus' text format on the market and the
miners, and the JSON log lines of every process.

The live tests share one run of the demo (`examples/demo.py`: Redis, Anvil with the
contracts, `market serve` and its Celery worker, two `verifier run` and two `miner run`
processes, all real) left running once it is done: a finished job, a dispute the committee
voted on and a reported epoch. Every process logs JSON (`QUARRY_LOG_FORMAT=json`). The
screenshots are saved under each test's output directory (`tmp_path`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from market.chain.client import anvil_account
from market.chain.devnet import free_port
from market.service.app import serve_in_thread
from market.service.settings import MarketSettings

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")


def _load_demo() -> Any:
    spec = importlib.util.spec_from_file_location("quarry_demo", ROOT / "examples" / "demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus text page by (name, sorted labels); parsing fails on
    anything that is not the text format."""
    text = httpx.get(url, timeout=10).raise_for_status().text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def total(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
          **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    return sum(v for (n, ls), v in samples.items()
               if n == name and all(dict(ls).get(k) == w for k, w in labels.items()))


# ---------------------------------------------------------------- no chain at all
def test_the_dashboard_and_metrics_answer_before_any_deployment(tmp_path: Path) -> None:
    """A market started before its devnet: the page draws (empty, the committee unread) and
    `/metrics` still parses, counting the requests it has answered."""
    settings = MarketSettings(deployment=tmp_path / "missing.json", store_dir=tmp_path / "s",
                              db_path=tmp_path / "board.sqlite", port=free_port(),
                              redis_url=f"redis://127.0.0.1:{free_port()}/0")
    with serve_in_thread(settings) as url:
        page = httpx.get(f"{url}/ui", timeout=10)
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert "No task on the board yet." in page.text
        assert "the chain cannot be read" in page.text
        assert httpx.get(f"{url}/ui/tx/0x1234", timeout=10).status_code == 404
        for method in ("BREW", "SPAM"):  # a client's method does not become a new series
            httpx.request(method, f"{url}/ui", timeout=10)
        samples = metrics(f"{url}/metrics")
    assert total(samples, "quarry_market_requests_total", route="/ui", status="200") == 1
    assert total(samples, "quarry_market_requests_total", route="/ui/tx/{tx}",
                 status="404") == 1
    assert total(samples, "quarry_market_shards", state="open") == 0
    assert total(samples, "quarry_market_requests_total", method="other") == 2
    assert not {ls for n, ls in samples if ("method", "BREW") in ls}
    # Redis and the chain are down: their gauges are left out, the rest still answers.
    names = {n for n, _ in samples}
    assert "quarry_market_celery_queue_depth" not in names
    assert "quarry_market_indexer_lag_blocks" not in names
    assert "quarry_market_store_bytes" in names


# ---------------------------------------------------------------- the live demo
@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The demo's eight steps, run beside two CPU-bound processes (`cpu_hogs`) that take the
    machine's two cores, as other work on a shared machine does: a busy machine makes the
    demo slower, never failed (the hogs stop once it is done, before the checks)."""
    from conftest import cpu_hogs

    demo = _load_demo()
    home = tmp_path_factory.mktemp("demo")
    args = argparse.Namespace(prompts=30, max_tokens=16, shard_size=10, timeout=600.0,
                              keep=False, log_format="json")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QUARRY_LOG_FORMAT", "json")  # every process of the stack inherits it
        mp.setenv("QUARRY_HOME", str(home / "quarry-home"))
        mp.chdir(home)  # nothing may land in the working directory (checked below)
        with contextlib.ExitStack() as hogs:
            hogs.enter_context(cpu_hogs(2))
            with demo.demo(args, home) as run:
                hogs.close()  # the steps are done: the checks run on a quiet machine
                assert not (home / ".quarry").exists()
                yield run


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.fail("chromium and chromedriver are missing: `make browser` installs them")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1400,1800"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.mark.chain
@pytest.mark.slow
def test_the_dashboard_shows_the_job_the_dispute_the_committee_and_the_miners(
        demo_run: Any, browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    board_job = httpx.get(f"{demo_run.stack.market_url}/jobs/{demo_run.task_id}",
                          timeout=10).json()
    q = demo_run.stack.quarry
    # Every epoch reports new reputations: the page shows one of those the chain or the
    # board (which indexes it a moment later) had around its load.
    seen: dict[str, set[int]] = {m: set() for m in demo_run.miners}

    def read_reputations() -> None:
        on_board = {m["address"]: m["reputationBps"] for m in
                    httpx.get(f"{demo_run.stack.market_url}/miners", timeout=10).json()}
        for m in demo_run.miners:
            seen[m] |= {q.gpu.miner_info(m).reputation_bps, on_board[m]}

    read_reputations()
    browser.get(f"{demo_run.dashboard_url}?refresh=0")  # still while it is read
    read_reputations()
    assert browser.title == "Quarry market"

    def cells(css: str) -> list[str]:
        return [c.text for c in browser.find_element(By.CSS_SELECTOR, css)
                .find_elements(By.CSS_SELECTOR, ":scope > td")]

    # The job: done, every shard finalized, tokens and payments as the board has them.
    task = demo_run.task_id
    row = cells(f"tr.job[data-task='{task}']")
    assert row[0] == f"task {task}" and row[1] == "done"
    assert row[4] == str(board_job["numRequests"]) and row[6] == str(board_job["tokensUsed"])
    assert board_job["paid"] + board_job["refunded"] == board_job["payment"]
    for shard in board_job["shards"]:
        srow = cells(f"tr.shard[data-task='{task}'][data-shard='{shard['shard']}']")
        assert srow[0] == f"shard {shard['shard']}" and srow[2] == "Finalized"
        assert srow[4] == str(shard["tokensUsed"])
        assert srow[5] == f"{shard['payment'] / 10**9:,.3f} gwei".replace(".000 gwei",
                                                                          " gwei")

    # The dispute the arbiter opened, with the committee's verdict.
    drow = cells(f"tr.dispute[data-dispute='{demo_run.dispute_id}']")
    assert drow[0] == f"dispute {demo_run.dispute_id}" and drow[4] == "MinerNotAtFault"
    assert drow[1].startswith(f"task {task} / ")

    # The committee: this epoch's two members, one the leader, and the reported epoch.
    assert int(browser.find_element(By.ID, "epoch").text) >= demo_run.epoch
    members = browser.find_elements(By.CSS_SELECTOR, "tr.member:not(.waiting)")
    assert len(members) == 2
    assert sorted(m.find_elements(By.TAG_NAME, "td")[3].text for m in members) == [
        "leader", "member"]
    report = cells(f"tr.report[data-epoch='{demo_run.epoch}']")
    assert report[0] == f"epoch {demo_run.epoch}" and report[1] == str(len(demo_run.miners))

    # The miners: stake, price, reputation as the chain has it, a heartbeat, a plot.
    for miner in demo_run.miners:
        mrow = cells(f"tr.miner[data-miner='{miner}']")
        assert mrow[1] == "0.500000 ETH" and mrow[2] == "1 gwei"
        assert mrow[3] in {f"{bps / 100:g}%" for bps in seen[miner]}
        # new miners that answered their challenges: on probation or past it, never
        # "untrusted" (a missed challenge is no failure)
        assert mrow[4] in {"on probation", "trusted"} and mrow[5].isdigit()
        assert "s ago" in mrow[6]
        plot = browser.find_element(By.CSS_SELECTOR, f"tr.miner[data-miner='{miner}'] svg")
        label = plot.get_attribute("aria-label")
        # a point per report that rated it: none at the first report for a miner it reported
        # MISSED (too busy to answer beside the hogs)
        assert (f"epoch {demo_run.epoch}:" in label) == (miner not in demo_run.missed)
        assert label.endswith(f": {mrow[3]}")
    shots = tmp_path / "screenshots"
    shots.mkdir()
    assert browser.save_screenshot(str(shots / "dashboard.png"))

    # It refreshes itself: the chain clock moves on, new blocks are indexed.
    browser.get(f"{demo_run.dashboard_url}?refresh=1")
    first = int(browser.find_element(By.ID, "cursor").text)
    WebDriverWait(browser, 15).until(
        lambda b: b.find_element(By.ID, "live-status").text.startswith("updated")
        and int(b.find_element(By.ID, "cursor").text) > first)
    browser.get(f"{demo_run.dashboard_url}?refresh=0")

    # Each row links to the chain data behind it: the job's to its TaskCreated transaction.
    browser.find_element(By.CSS_SELECTOR, f"tr.job[data-task='{task}'] a.tx").click()
    WebDriverWait(browser, 10).until(lambda b: b.find_elements(By.CSS_SELECTOR, "tr.event"))
    event = browser.find_element(By.CSS_SELECTOR, "tr.event").text
    assert "TaskRegistry" in event and "TaskCreated" in event and f"taskId = {task}" in event
    assert "success" in browser.find_element(By.ID, "transaction").text
    assert browser.save_screenshot(str(shots / "transaction.png"))
    print(f"screenshots in {shots}")


@pytest.mark.chain
@pytest.mark.slow
def test_metrics_parse_and_their_counters_move_with_a_job(demo_run: Any) -> None:
    from client import Client

    stack = demo_run.stack
    market_url = f"{stack.market_url}/metrics"
    miner_urls = [f"http://127.0.0.1:{p}/metrics"
                  for p in demo_run.metrics_ports[:len(demo_run.miners)]]
    before = metrics(market_url)
    miners_before = [metrics(u) for u in miner_urls]
    assert total(before, "quarry_market_tasks", status="done") >= 1
    assert total(before, "quarry_market_disputes", status="miner_not_at_fault") == 1
    assert total(before, "quarry_market_miners", alive="true") == 2
    assert total(before, "quarry_market_indexer_lag_blocks") >= 0
    assert total(before, "quarry_market_store_bytes") > 0
    verifiers = [metrics(f"http://127.0.0.1:{p}/metrics")
                 for p in demo_run.metrics_ports[len(demo_run.miners):]]
    assert sum(total(v, "quarry_verifier_disputes_voted_total") for v in verifiers) == 2
    assert sum(total(v, "quarry_verifier_epochs_reported_total", action="submitted")
               for v in verifiers) >= 1

    with Client(stack.rpc_url, anvil_account(1).key, stack.market_url) as client:
        job = client.submit(["One more prompt.", "And another."], model="quarry-tiny",
                            max_tokens=8, price=10**9, shard_size=2, deadline=3600,
                            allow_probation=True)
        job.wait(progress=False, timeout=120)
        tokens = job.status().tokens
    # The market keeps a /metrics page for a second (market.service.kept): a job done
    # within it reads the page from before it, so read until the store's counter moves.
    stored = total(before, "quarry_market_requests_total", route="/store", status="201")
    deadline = time.monotonic() + 10
    after = metrics(market_url)
    while total(after, "quarry_market_requests_total", route="/store",
                status="201") <= stored and time.monotonic() < deadline:
        time.sleep(0.6)
        after = metrics(market_url)
    assert total(after, "quarry_market_requests_total", route="/store",
                 status="201") > total(before, "quarry_market_requests_total",
                                       route="/store", status="201")
    assert total(after, "quarry_market_request_seconds_count", route="/shards/open") > total(
        before, "quarry_market_request_seconds_count", route="/shards/open")
    # The committee may post its next epoch's challenge tasks meanwhile: at least this one.
    assert total(after, "quarry_market_shards") >= total(before, "quarry_market_shards") + 1
    generated = sum(total(metrics(u), "quarry_miner_tokens_generated_total")
                    - total(b, "quarry_miner_tokens_generated_total")
                    for u, b in zip(miner_urls, miners_before, strict=True))
    assert generated >= tokens > 0
    submitted = sum(total(metrics(u), "quarry_miner_shards_total", outcome="submitted")
                    - total(b, "quarry_miner_shards_total", outcome="submitted")
                    for u, b in zip(miner_urls, miners_before, strict=True))
    assert submitted >= 1


def _json_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of a log file as JSON; fails naming the first line that is not."""
    out = []
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pytest.fail(f"{path.name}:{n} is not JSON: {line[:200]!r}")
    return out


@pytest.mark.chain
@pytest.mark.slow
def test_json_logs_follow_one_task_through_the_market_the_miners_and_the_verifiers(
        demo_run: Any) -> None:
    logs = demo_run.stack.logs
    home = demo_run.stack.home
    # The long-running processes' logs (a one-shot command's file holds its printed result).
    files = {p.name: p for pattern in ("market.log", "worker*.log", "miner?.log",
                                       "verifier?.log", "verifier-state/logs/scorer-*.log")
             for p in [*logs.glob(pattern), *home.glob(pattern)]}
    assert len(files) == 8, sorted(files)
    parsed = {name: _json_lines(path) for name, path in files.items()}
    for name, records in parsed.items():
        for r in records:
            assert {"ts", "level", "logger", "msg"} <= r.keys(), (name, r)
    task = demo_run.task_id

    def about_task(prefix: str) -> list[dict[str, Any]]:
        return [r for name, records in parsed.items() if name.startswith(prefix)
                for r in records if r.get("task") == task]

    market = about_task("worker")
    assert {"TaskCreated", "ShardClaimed", "ResultSubmitted", "ShardFinalized",
            "DisputeOpened"} <= {r.get("event") for r in market}
    miner = about_task("miner")
    assert {r["shard"] for r in miner if "shard" in r} == set(range(3))
    verifier = about_task("verifier")
    assert verifier, "no verifier line names the disputed task"
    assert any(r.get("dispute") == demo_run.dispute_id for r in verifier)
    events = [r["event"] for r in market if "event" in r]
    assert events.index("TaskCreated") < events.index("ShardFinalized")
    print(f"{len(market) + len(miner) + len(verifier)} lines about task {task}: "
          f"{len(market)} market, {len(miner)} miner, {len(verifier)} verifier")
