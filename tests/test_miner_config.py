"""Miner config (TOML, then QUARRY_MINER_* env, then flags), amounts, hardware detection,
and the CLI's cheap import and one-line errors that name the setting and its source."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from market.errors import ConfigError
from miner.config import GpuOverride, MinerConfig, parse_wei
from miner.hardware import cpu_model_name, cpu_spec, detect, meminfo_total_mib

KEY = "0x" + "ab" * 32
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("QUARRY_MINER_"):
            monkeypatch.delenv(name)


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "miner.toml"
    p.write_text(text)
    return p


def test_parse_wei() -> None:
    assert parse_wei(1500, "stake") == 1500
    assert parse_wei("1500", "stake") == 1500
    assert parse_wei("0.5ether", "stake") == 5 * 10**17
    assert parse_wei("0.5 ETH", "stake") == 5 * 10**17
    assert parse_wei("2gwei", "price_per_token") == 2 * 10**9
    assert parse_wei("7 wei", "stake") == 7
    for bad, why in (("1.5wei", "whole number"), ("abc", "not an amount"),
                     ("1 dollar", "not an amount"), (-1, "negative"), (True, "not an amount"),
                     (1.5, "not an amount")):
        with pytest.raises(ConfigError, match=why) as info:
            parse_wei(bad, "stake")
        assert "stake" in str(info.value)


def test_file_then_env_then_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg_file = write(tmp_path, f"""
[miner]
key = "{KEY}"
market_url = "http://market.example:8600/"
model_dirs = ["models/a", "/abs/b"]
engine = "pipeline"
price_per_token = "1gwei"
stake = "0.5ether"
endpoint = "http://203.0.113.7:9100"
max_batch = 4
max_shards_in_flight = 2
poll_interval_s = 0.5
state_dir = "state"

[miner.engine_options]
stages = 2

[miner.gpu]
name = "NVIDIA H100"
memory_mib = 81920
count = 2
""")
    cfg = MinerConfig.load(cfg_file)
    assert cfg.private_key() == KEY
    assert cfg.market_url == "http://market.example:8600"
    assert cfg.model_dirs == (tmp_path / "models/a", Path("/abs/b"))  # file-relative paths
    assert (cfg.engine, cfg.engine_options) == ("pipeline", {"stages": 2})
    assert (cfg.price_per_token, cfg.stake) == (10**9, 5 * 10**17)
    assert cfg.gpu == GpuOverride(name="NVIDIA H100", memory_mib=81920, count=2)
    assert (cfg.max_batch, cfg.poll_interval_s, cfg.auto_withdraw) == (4, 0.5, False)
    assert cfg.max_shards_in_flight == 2 and MinerConfig.load().max_shards_in_flight == 4
    assert cfg.rpc_url is None
    assert cfg.state_dir == tmp_path / "state"  # file-relative, like every path

    monkeypatch.setenv("QUARRY_MINER_MAX_BATCH", "16")
    monkeypatch.setenv("QUARRY_MINER_MODEL_DIRS", "x, y")
    monkeypatch.setenv("QUARRY_MINER_AUTO_WITHDRAW", "yes")
    monkeypatch.setenv("QUARRY_MINER_RPC_URL", "http://127.0.0.1:8545")
    monkeypatch.setenv("QUARRY_MINER_GPU", '{"name": "A100", "memory_mib": 40960, "count": 1}')
    monkeypatch.setenv("QUARRY_MINER_STATE_DIR", "/var/lib/quarry-miner")
    cfg = MinerConfig.load(cfg_file)
    assert cfg.max_batch == 16 and cfg.auto_withdraw is True
    assert cfg.model_dirs == (Path("x"), Path("y"))  # env paths: relative to cwd
    assert cfg.rpc_url == "http://127.0.0.1:8545"
    assert cfg.gpu == GpuOverride(name="A100", memory_mib=40960, count=1)
    assert cfg.state_dir == Path("/var/lib/quarry-miner")

    cfg = MinerConfig.load(cfg_file, max_batch=2, stake="1ether", engine=None)
    assert (cfg.max_batch, cfg.stake, cfg.engine) == (2, 10**18, "pipeline")

    monkeypatch.setenv("QUARRY_MINER_KEY_FILE", "/run/secrets/miner.key")  # env beats the
    cfg = MinerConfig.load(cfg_file)                                      # file's key
    assert (cfg.key, cfg.key_file) == ("", Path("/run/secrets/miner.key"))
    assert KEY[4:] not in repr(MinerConfig.load(key=KEY))  # a key never shows in a repr


def test_key_file_and_require(tmp_path: Path) -> None:
    key_file = tmp_path / "miner.key"
    key_file.write_text(KEY[2:] + "\n")
    cfg = MinerConfig.load(write(tmp_path, '[miner]\nkey_file = "miner.key"\n'))
    assert cfg.private_key() == KEY
    assert cfg.account().address.startswith("0x")
    with pytest.raises(ConfigError, match="missing miner setting model_dirs.*"
                                          "QUARRY_MINER_MODEL_DIRS"):
        cfg.require("key", "model_dirs")
    with pytest.raises(ConfigError, match="missing miner setting key"):
        MinerConfig.load().require("key")
    key_file.write_text("not a key")
    with pytest.raises(ConfigError, match="key_file.*not a hex private key"):
        cfg.private_key()
    with pytest.raises(ConfigError, match="key_file: cannot read"):
        MinerConfig.load(key_file=tmp_path / "absent").private_key()


@pytest.mark.parametrize(("text", "field"), [
    ('key = "0x12"', "key"),
    ('market_url = "market:8600"', "market_url"),
    ('engine = "tensorrt"', "engine"),
    ('precision = "fp4"', "precision"),
    ('precision = 9', "precision"),
    ('price_per_token = 0', "price_per_token"),
    ('stake = "lots"', "stake"),
    ('max_batch = 0', "max_batch"),
    ('max_batch = 2.5', "max_batch"),
    ('max_shards_in_flight = 0', "max_shards_in_flight"),
    ('poll_interval_s = 0', "poll_interval_s"),
    ('auto_withdraw = "maybe"', "auto_withdraw"),
    ('endpoint = ""', "endpoint"),
    ('model_dirs = 3', "model_dirs"),
    ('state_dir = 3', "state_dir"),
    ('engine_options = 3', "engine_options"),
    ('gpu = {name = "X", memory_mib = 1}', "gpu.count"),
    ('gpu = {name = "X", memory_mib = 0, count = 1}', "gpu.memory_mib"),
    ('gpu = {name = "X", memory_mib = 1, count = 1, cores = 5}', "gpu"),
    ('colour = "blue"', "colour"),
])
def test_invalid_fields_are_named(tmp_path: Path, text: str, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        MinerConfig.load(write(tmp_path, "[miner]\n" + text + "\n"))
    assert field in str(info.value)


def test_the_declared_precision_is_the_engine_s_dtype() -> None:
    """The miner declares `precision` and its engine computes in it; unset, the engine's
    dtype option says it, else the torch engine's default (fp32 here, on a CPU); a dtype
    that disagrees with an explicit precision, or names none, is a ConfigError."""
    from market.protocol.precision import Precision

    assert MinerConfig.load().served_precision() is Precision.FP32  # no GPU on this machine
    assert MinerConfig.load().engine_kwargs() == {"dtype": "float32"}
    bf16 = MinerConfig.load(precision="BF16", engine_options={"device": "cpu"})
    assert bf16.precision is Precision.BF16
    assert bf16.engine_kwargs() == {"device": "cpu", "dtype": "bfloat16"}
    int8 = MinerConfig.load(precision="int8")  # a weight quantisation computing in bf16
    assert int8.engine_kwargs()["dtype"] == "bfloat16"
    assert MinerConfig.load(engine_options={"dtype": "float16"}).served_precision() \
        is Precision.FP16
    agree = MinerConfig.load(precision="fp16", engine_options={"dtype": "half"})
    assert agree.engine_kwargs()["dtype"] == "float16"
    with pytest.raises(ConfigError, match="precision bf16 and engine_options.dtype 'float32' "
                       "disagree"):
        MinerConfig.load(precision="bf16", engine_options={"dtype": "float32"}).engine_kwargs()
    with pytest.raises(ConfigError, match="engine_options.dtype 'auto' names no precision"):
        MinerConfig.load(engine_options={"dtype": "auto"}).served_precision()


def test_bad_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="cannot read miner config"):
        MinerConfig.load(tmp_path / "absent.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        MinerConfig.load(write(tmp_path, "[miner\n"))
    with pytest.raises(ConfigError, match=r"no \[miner\] table"):
        MinerConfig.load(write(tmp_path, "[market]\nport = 1\n"))
    monkeypatch.setenv("QUARRY_MINER_GPU", "{bad json")
    with pytest.raises(ConfigError, match="QUARRY_MINER_GPU must be a JSON object"):
        MinerConfig.load()


@pytest.mark.parametrize(("source", "message"), [
    ("file", "miner setting max_batch (from {file} [miner]): Input should be greater than or "
             "equal to 1, got 0"),
    ("env", "miner setting max_batch (from QUARRY_MINER_MAX_BATCH): Input should be greater "
            "than or equal to 1, got '0'"),
    ("flag", "miner setting max_batch (from --max-batch): Input should be greater than or "
             "equal to 1, got 0"),
])
def test_an_error_names_the_source_that_gave_the_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, message: str,
) -> None:
    """The same bad value from each source: the message says which one to fix."""
    cfg = write(tmp_path, "[miner]\nmax_batch = 0\n" if source == "file" else "[miner]\n")
    if source == "env":
        monkeypatch.setenv("QUARRY_MINER_MAX_BATCH", "0")
    with pytest.raises(ConfigError) as info:
        MinerConfig.load(cfg, max_batch=0 if source == "flag" else None)
    assert str(info.value) == message.format(file=cfg)


def test_hardware_parsing() -> None:
    cpuinfo = ("processor\t: 0\nvendor_id\t: GenuineIntel\n"
               "model name\t: Intel(R) Xeon(R)  CPU @ 2.20GHz\n")
    assert cpu_model_name(cpuinfo) == "Intel(R) Xeon(R) CPU @ 2.20GHz"
    assert cpu_model_name("processor : 0\n") is None
    assert meminfo_total_mib("MemTotal:       16384000 kB\nMemFree: 1 kB\n") == 16000
    assert meminfo_total_mib("") is None


def test_detect_on_this_machine() -> None:
    import torch

    spec = detect()
    if torch.cuda.is_available() and torch.cuda.device_count():
        assert spec.kind == "cuda" and spec.count == torch.cuda.device_count()
        assert spec.memory_mib > 0
    else:
        assert spec == cpu_spec()
        assert spec.kind == "cpu" and spec.count == 1 and spec.name.startswith("CPU ")
        assert spec.memory_mib > 100
        assert "no CUDA device" in spec.describe()


def test_cli_is_cheap_to_import_and_errors_in_one_line(tmp_path: Path) -> None:
    code = ("import sys, miner.cli; heavy = [m for m in ('torch', 'web3', 'eth_account') "
            "if m in sys.modules]; assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)
    bad = write(tmp_path, '[miner]\nengine = "tensorrt"\n')
    r = subprocess.run([sys.executable, "-m", "miner.cli", "status", "--config", str(bad)],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        f"miner: error: miner setting engine (from {bad} [miner]): 'tensorrt' is not one of "
        "torch, pipeline, vllm"]


@pytest.mark.parametrize("key", ["0" * 64, "f" * 64,
                                 "FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141"])
def test_a_key_off_the_curve_is_one_line_not_a_traceback(tmp_path: Path, key: str) -> None:
    """64 hex digits that are no secp256k1 private key (zero, or the curve order and up)
    used to end `miner register` in a 44-line traceback."""
    cfg = write(tmp_path, f'[miner]\nkey = "0x{key}"\nmodel_dirs = ["m"]\n')
    r = subprocess.run([sys.executable, "-m", "miner.cli", "register", "--config", str(cfg)],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        f"miner: error: miner setting key (from {cfg} [miner]): 64 hex digits, but not a "
        "valid secp256k1 private key (it must be between 1 and the curve order - 1)"]


def test_result_copies_live_under_quarry_home(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the miner keeps copies of submitted results (to answer availability challenges)
    when no state_dir is set: per miner and deployment, under $QUARRY_HOME/miner; written
    whole (no temp file left), read back equal, listed, removed; a damaged one reads as
    missing."""
    from market.protocol.results import Completion, build_shard_result
    from miner.archive import ResultArchive, default_state_dir

    monkeypatch.setenv("QUARRY_HOME", str(tmp_path / "home"))
    assert MinerConfig.load().state_dir is None
    assert default_state_dir() == tmp_path / "home" / "miner"
    archive = ResultArchive.for_miner(default_state_dir(), "0xMiner", "31337-0xRegistry-ab12")
    assert archive.path(7, 2) == (tmp_path / "home" / "miner" / "0xMiner" / "results"
                                  / "31337-0xRegistry-ab12" / "7-2.json")
    assert archive.keys() == [] and archive.load(7, 2) is None

    done = [Completion(index=4 + i, custom_id=f"r{i}", request_hash=bytes([i]) * 32,
                       text=f"out {i}", token_ids=(1, 2, i), finish_reason="length",
                       prompt_tokens=3) for i in range(2)]
    doc = build_shard_result(task_id=7, shard=2, model_id=b"\x11" * 32, completions=done,
                             private_key=KEY, miner="0x" + "12" * 20, chain_id=31337,
                             task_registry="0x" + "00" * 19 + "01")
    assert archive.save(doc) == archive.path(7, 2)
    (archive.root / "notes.txt").write_text("not a result")
    assert archive.load(7, 2) == doc and archive.keys() == [(7, 2)]
    assert sorted(p.name for p in archive.root.iterdir()) == ["7-2.json", "notes.txt"]
    archive.path(7, 2).write_bytes(b"{truncated")
    assert archive.load(7, 2) is None
    archive.remove(7, 2)
    archive.remove(7, 2)  # already gone: fine
    assert archive.keys() == []
