"""Every benchmark still runs: each `benchmarks/*.py` with `--smoke` (seconds, tiny sizes,
figures meaningless and not written) must exit 0 and print one JSON object as its last line,
as `make bench` expects. A script added to benchmarks/ is picked up here; one without a
`--smoke` flag fails (argparse exits 2), so none can rot unseen.

The runs start together, three at a time, when the module's first test asks for them (most
of a smoke run is process start-up and waiting on a local chain or stack); each test then
waits for its own script's run. Each runs from an empty directory with its own QUARRY_HOME,
so a script that writes into the working directory or the repository's state shows up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p for p in (ROOT / "benchmarks").glob("*.py") if not p.name.startswith("_"))
PARALLEL = 3
TIMEOUT_S = 900  # per script: a loaded 2-core machine is slow, not broken


def _smoke(script: Path, home: Path) -> subprocess.CompletedProcess[str]:
    home.mkdir(parents=True)
    env = {**os.environ, "QUARRY_HOME": str(home / "quarry-home"), "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, str(script), "--smoke"], cwd=home, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)


def _status() -> str:
    """The working tree's changes and untracked files (ignored ones aside)."""
    return subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout


@pytest.fixture(scope="module")
def status_before() -> str:
    return _status()


@pytest.fixture(scope="module")
def runs(status_before: str) -> Iterator[dict[str, Future[subprocess.CompletedProcess[str]]]]:
    with tempfile.TemporaryDirectory(prefix="quarry-bench-smoke-") as tmp, \
            ThreadPoolExecutor(PARALLEL) as pool:
        yield {s.name: pool.submit(_smoke, s, Path(tmp) / s.stem) for s in SCRIPTS}


def test_every_benchmark_is_found() -> None:
    assert len(SCRIPTS) >= 10 and (ROOT / "benchmarks" / "market_overhead.py") in SCRIPTS


@pytest.mark.timeout(2 * TIMEOUT_S)
@pytest.mark.parametrize("script", [s.name for s in SCRIPTS])
def test_benchmark_smoke(script: str,
                         runs: dict[str, Future[subprocess.CompletedProcess[str]]]) -> None:
    done = runs[script].result()
    tail = (done.stdout[-2000:] + done.stderr[-3000:]).strip()
    assert done.returncode == 0, f"{script} --smoke exited {done.returncode}:\n{tail}"
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert lines, f"{script} --smoke printed nothing:\n{tail}"
    assert isinstance(json.loads(lines[-1]), dict), f"{script}: the last line is not a JSON object"


def test_the_smoke_runs_leave_the_repository_as_it_was(
        runs: dict[str, Future[subprocess.CompletedProcess[str]]], status_before: str) -> None:
    for future in runs.values():
        future.exception()  # wait; each script's own test reports how it ended
    assert _status() == status_before, "a smoke run wrote into the repository"
