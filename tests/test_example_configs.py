"""The example configs of the README's by-hand path (`examples/config/`): each loads with its
role's settings, holds the devnet key `market devnet accounts` gives that role, and points at
the model directory the README creates and at one market; the example batch is valid."""

from __future__ import annotations

from pathlib import Path

import pytest

from client.config import ClientConfig
from market.chain.client import anvil_account
from market.chain.devnet import DEVNET_ROLES
from market.protocol.requests import parse_jsonl
from market.service.settings import MarketSettings
from miner.config import MinerConfig
from verifier.config import VerifierConfig

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "examples" / "config"
MARKET_URL = "http://127.0.0.1:8600"


@pytest.mark.parametrize(("name", "settings", "account"), [
    ("miner", MinerConfig, 3), ("verifier", VerifierConfig, 6), ("client", ClientConfig, 1)])
def test_role_configs_load_with_their_devnet_keys(name: str, settings: type,
                                                  account: int) -> None:
    cfg = settings.load(CONFIGS / f"{name}.toml")
    assert cfg.private_key().lower() == "0x" + bytes(anvil_account(account).key).hex()
    assert f"examples/config/{name}.toml" in DEVNET_ROLES[account]
    assert cfg.market_url == MARKET_URL


def test_model_paths_are_the_readmes_model_directory() -> None:
    models = ROOT / "models" / "tiny"
    [served] = MinerConfig.load(CONFIGS / "miner.toml").model_dirs
    reference = VerifierConfig.load(CONFIGS / "verifier.toml").model_dir
    assert served.resolve() == models and reference is not None
    assert reference.resolve() == models
    assert f"--out {models.relative_to(ROOT)}" in (ROOT / "README.md").read_text()


def test_the_market_config_names_a_settler() -> None:
    s = MarketSettings.load(CONFIGS / "market.toml")
    assert s.url == MARKET_URL
    assert s.settler_address == anvil_account(19).address
    assert "settler" in DEVNET_ROLES[19]


def test_the_example_batch_is_valid() -> None:
    parsed = parse_jsonl((CONFIGS / "batch.jsonl").read_bytes())
    assert {r.request["body"]["model"] for r in parsed} == {"quarry-tiny"}
