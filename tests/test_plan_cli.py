"""`market plan` as a subprocess: example files plan, bad files fail in one line."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SMALL = ROOT / "examples/clusters/small.toml"
GEO = ROOT / "examples/clusters/geo-70b.toml"

pytestmark = pytest.mark.timeout(120)


def plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "market.cli", "plan", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )


def check_document(doc: dict, L: int) -> None:
    assert doc["model"]["num_layers"] == L
    ranges = {k: tuple(v) for k, v in doc["ranges"].items()}
    held = set()
    for a, b in ranges.values():
        assert 0 <= a <= b <= L
        held.update(range(a, b))
    assert held == set(range(L))
    exp = doc["expected"]
    assert exp["per_token_s"] > 0
    cursor = 0
    for hop in exp["route"]:
        a, b = ranges[hop["server"]]
        assert hop["start"] == cursor and a <= hop["start"] < hop["end"] <= b
        cursor = hop["end"]
    assert cursor == L


@pytest.mark.parametrize("path, L", [(SMALL, 64), (GEO, 80)])
def test_parallax_plan_on_the_examples(tmp_path, path, L):
    out = tmp_path / "plan.json"
    res = plan(str(path), "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
    assert "pipeline 1:" in res.stdout and "expected per-token time" in res.stdout
    doc = json.loads(out.read_text())
    assert doc["algorithm"] == "parallax"
    check_document(doc, L)
    for pipe in doc["pipelines"]:  # every pipeline is a gap-free cover of [0, L)
        cursor = 0
        for name in pipe:
            a, b = doc["ranges"][name]
            assert a == cursor
            cursor = b
        assert cursor == L
    assert doc["params"] == {"algorithm": "parallax", "concurrency": 8, "l_in": 512,
                             "l_max": 256, "client": None}


def test_client_and_workload_flags(tmp_path):
    out = tmp_path / "plan.json"
    res = plan(str(SMALL), "--client", "client-sf", "--l-in", "128", "--l-max", "64",
               "--concurrency", "4", "--out", str(out))
    assert res.returncode == 0, res.stderr
    doc = json.loads(out.read_text())
    assert doc["params"]["client"] == "client-sf"
    assert plan(str(SMALL), "--out", str(out)).returncode == 0
    no_client = json.loads(out.read_text())
    # The client adds its one-way latency to the first and from the last server.
    assert doc["expected"]["per_token_s"] > no_client["expected"]["per_token_s"]


@pytest.mark.parametrize("algorithm", ["cgbp", "petals"])
def test_other_placers(tmp_path, algorithm):
    try:
        importlib.import_module(f"market.scheduler.{algorithm}")
        importlib.import_module("market.scheduler.routing")
    except ModuleNotFoundError:
        pytest.skip(f"market.scheduler.{algorithm} is not in this checkout")
    out = tmp_path / "plan.json"
    res = plan(str(SMALL), "--algorithm", algorithm, "--out", str(out))
    assert res.returncode == 0, res.stderr
    doc = json.loads(out.read_text())
    check_document(doc, 64)
    assert doc["expected"]["decode_step_s"] > 0


BAD_FILES = {
    "syntax.toml": ("[model\nname = 1\n", "not valid"),
    "no_model.toml": ('[[servers]]\nname = "a"\n', "invalid cluster description"),
    "negative.toml": (
        SMALL.read_text().replace("memory_bytes = 34_359_738_368", "memory_bytes = -1", 1),
        "memory_bytes",
    ),
    "string_number.toml": (
        SMALL.read_text().replace("decode_s_per_block = 0.000545", 'decode_s_per_block = "x"',
                                  1),
        "decode_s_per_block",
    ),
    "unknown_key.toml": (SMALL.read_text().replace('name = "us-5090-a"',
                                                   'name = "us-5090-a"\ncolour = "red"', 1),
                         "colour"),
    "too_small.toml": (SMALL.read_text().replace("num_layers = 64", "num_layers = 640"),
                       "cannot hold"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_cluster_file_fails_in_one_line(tmp_path, name):
    text, needle = BAD_FILES[name]
    path = tmp_path / name
    path.write_text(text)
    out = tmp_path / "plan.json"
    res = plan(str(path), "--out", str(out))
    assert res.returncode != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("market: error:") and needle in lines[0]
    assert not out.exists()


def test_missing_file_and_bad_flags(tmp_path):
    res = plan(str(tmp_path / "nope.toml"))
    assert res.returncode != 0 and res.stderr.strip().count("\n") == 0
    assert "not found" in res.stderr
    res = plan(str(SMALL), "--concurrency", "0")
    assert res.returncode != 0 and "--concurrency" in res.stderr
    res = plan(str(SMALL), "--client", "nobody")
    assert res.returncode != 0 and "nobody" in res.stderr.strip()
    assert len(res.stderr.strip().splitlines()) == 1


def test_module_is_cheap_to_import():
    code = ("import sys, market.scheduler.cli; "
            "print(any(m in sys.modules for m in ('numpy', 'torch', 'web3')))")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert res.stdout.strip() == "False", res.stderr


def test_registered_in_the_market_command():
    try:
        from market.cli import build_parser

        parser = build_parser()
    except ModuleNotFoundError as exc:
        pytest.skip(f"another area of the market CLI is not in this checkout: {exc}")
    args = parser.parse_args(["plan", str(SMALL), "--algorithm", "parallax"])
    assert args.func.__module__ == "market.scheduler.cli"
