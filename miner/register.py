"""`miner register`: verify the models on disk, then stake and list them on-chain.

Every model directory's manifest is checked file by file before anything is sent (a miner
serving modified weights would be serving another modelId). Every model is declared in the
miner's precision (`MinerConfig.served_precision`: the `precision` setting, else its engine's
dtype); its shards are judged at it, and a client may accept only some. The manifests are
posted to the market so clients can name the models; the registration itself goes to
GPURegistry. Run again, it updates the profile (models, precision, GPU, endpoint, price) and
tops the stake up to the
configured `stake`: the command is idempotent, never staking twice.

A new (or re-registered) miner starts on probation: it may claim only tasks that allow it
(the committee's challenge tasks, clients that opt in) until enough consecutive committee
reports pass it (`GPURegistry.probation_params()`); the report says so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from market.errors import ConfigError, QuarryError
from market.protocol.precision import Precision

if TYPE_CHECKING:
    from market.chain.deploy import Quarry
    from market.marketapi import MarketAPI
    from market.model.manifest import Manifest
    from miner.config import MinerConfig
    from miner.hardware import HardwareSpec

log = logging.getLogger("miner")


class RegistrationError(QuarryError):
    """The miner cannot (re)register in its current on-chain state."""


@dataclass(frozen=True)
class ServedModel:
    """A verified model directory and its manifest."""

    path: Path
    manifest: Manifest

    @property
    def model_id(self) -> bytes:
        return self.manifest.model_id


def load_models(model_dirs: tuple[Path, ...] | list[Path]) -> list[ServedModel]:
    """Each directory's manifest, checked against the files (ModelFileMismatch names the
    first file that differs); two directories of the same model, or a model whose
    architecture no engine here serves (`market.model.archs`), are refused."""
    from market.model.archs import arch_of
    from market.model.manifest import load_manifest

    if not model_dirs:
        raise ConfigError("no model directories given (miner setting model_dirs)")
    out: list[ServedModel] = []
    seen: dict[bytes, Path] = {}
    for d in model_dirs:
        d = Path(d)
        manifest = load_manifest(d)
        manifest.verify(d)
        arch_of(manifest.architecture.get("model_type"), f"model directory {d}")
        if manifest.model_id in seen:
            raise ConfigError(f"model directories {seen[manifest.model_id]} and {d} hold the "
                              f"same model ({manifest.model_id_hex}); list it once")
        seen[manifest.model_id] = d
        out.append(ServedModel(d, manifest))
    return out


@dataclass
class RegisterReport:
    address: str
    action: str  # "registered" or "updated"
    models: list[ServedModel]
    precision: Precision
    hardware: HardwareSpec
    price_per_token: int
    endpoint: str
    stake: int  # on-chain stake afterwards
    stake_added: int
    market_posted: bool
    market_note: str = ""
    tx_hashes: list[str] = field(default_factory=list)
    on_probation: bool = False
    passed_epochs: int = 0
    probation: tuple[int, int] = (0, 0)  # (epochs, pass bps): what ends probation

    def format(self) -> str:
        lines = [f"miner {self.address} {self.action} on GPURegistry"]
        for m in self.models:
            lines.append(f"  model  {m.manifest.name} {m.manifest.model_id_hex} ({m.path}) in "
                         f"{self.precision.label}")
        lines += [
            f"  gpu    {self.hardware.describe()}",
            f"  price  {self.price_per_token} wei/token",
            f"  stake  {self.stake} wei" + (f" (+{self.stake_added} wei now)"
                                            if self.stake_added else " (nothing added)"),
            f"  endpoint {self.endpoint}",
            "  market " + ("manifests posted" if self.market_posted
                           else f"manifests NOT posted: {self.market_note}"),
            "  probation " + self._probation(),
        ]
        lines += [f"  tx     {h}" for h in self.tx_hashes]
        return "\n".join(lines)

    def _probation(self) -> str:
        if not self.on_probation:
            return "none: the miner may claim every task its reputation allows"
        from miner.status import probation_note

        start = "the miner starts on probation" if self.action == "registered" else \
            "the miner is on probation"
        note = probation_note(self.passed_epochs, *self.probation)
        return f"{start} {note.removeprefix('this miner is on probation ')}"


def hardware_for(cfg: MinerConfig) -> HardwareSpec:
    from miner.hardware import HardwareSpec, detect

    if cfg.gpu is not None:
        return HardwareSpec(cfg.gpu.name, cfg.gpu.memory_mib, cfg.gpu.count, "config")
    return detect()


def post_manifests(market: MarketAPI, models: list[ServedModel]) -> tuple[bool, str]:
    """POST each manifest, and the tokenizer files it lists (clients count prompt tokens
    against the context with them before paying), to the market; (posted, why not). The
    chain is the source of truth, so an unreachable market is reported, not fatal: rerun
    register to post later."""
    from market.marketapi import MarketError, MarketUnavailable
    from market.model.context import publish_tokenizer

    try:
        for m in models:
            got = market.register_model(m.manifest.to_dict())
            if got.lower() != m.manifest.model_id_hex:
                raise RegistrationError(f"market computed modelId {got} for {m.path}, expected "
                                        f"{m.manifest.model_id_hex}: different manifest rules?")
            publish_tokenizer(market, m.path, m.manifest)
    except MarketUnavailable as exc:
        log.warning("%s", exc)
        return False, str(exc)
    except MarketError as exc:
        raise RegistrationError(f"market refused a model manifest: {exc}") from exc
    return True, ""


def register_miner(
    cfg: MinerConfig,
    *,
    q: Quarry | None = None,
    market: MarketAPI | None = None,
    hardware: HardwareSpec | None = None,
) -> RegisterReport:
    """Register (or update) the configured miner; returns what was done."""
    from market.chain.contracts import GpuSpec

    cfg.require("key", "model_dirs", "price_per_token", "stake", "endpoint")
    account = cfg.account()
    models = load_models(cfg.model_dirs)
    precision = cfg.served_precision()
    hw = hardware or hardware_for(cfg)
    opened: MarketAPI | None = None
    if q is None or market is None:
        from market.connect import connect

        q2, opened = connect(cfg)
        q, market = q or q2, market or opened
    try:
        posted, note = post_manifests(market, models)
        gpu = GpuSpec(hw.name, hw.memory_mib, hw.count)
        ids = [m.model_id for m in models]
        precisions = [precision] * len(ids)
        price, stake = int(cfg.price_per_token or 0), int(cfg.stake or 0)
        txs = []
        if q.gpu.is_registered(account.address):
            info = q.gpu.miner_info(account.address)
            if info.exit_requested_at:
                raise RegistrationError(
                    f"miner {account.address} has requested exit; withdraw the stake with "
                    "`miner withdraw --stake` once unbonding ends, then register again")
            txs.append(q.gpu.update(account, ids, gpu, cfg.endpoint, price, precisions))
            added = max(0, stake - info.stake)
            if added:
                txs.append(q.gpu.add_stake(account, added))
            elif stake < info.stake:
                log.info("stake stays %d wei (above the configured %d; stake leaves only by "
                         "`miner exit`)", info.stake, stake)
            action = "updated"
        else:
            minimum = q.gpu.min_stake()
            if stake < max(minimum, 1):
                raise ConfigError(f"miner setting stake: {stake} wei is below GPURegistry's "
                                  f"minimum stake of {minimum} wei")
            txs.append(q.gpu.register(account, ids, gpu, cfg.endpoint, price, stake, precisions))
            added, action = stake, "registered"
        info = q.gpu.miner_info(account.address)
        probation = q.gpu.probation_params()
    finally:
        if opened is not None:
            opened.close()
    return RegisterReport(account.address, action, models, precision, hw, price, cfg.endpoint,
                          info.stake, added, posted, note, [t.tx_hash for t in txs],
                          info.on_probation, info.passed_epochs, probation)
