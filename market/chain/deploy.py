"""Deploy and wire the five contracts, the deployment file, and `Quarry`: every wrapper on one
connection.

Order and wiring follow TaskRegistry's NatSpec: PaymentEscrow, GPURegistry, TaskRegistry,
VerifierCommittee, Arbitration, then each contract's one-time setters.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from eth_account.signers.local import LocalAccount
from eth_utils import is_address, to_checksum_address

from market.chain.artifacts import load_artifact
from market.chain.client import Chain, TxResult
from market.chain.contracts import (
    Arbitration,
    GPURegistry,
    PaymentEscrow,
    TaskRegistry,
    VerifierCommittee,
)
from market.chain.deployment import CONTRACT_NAMES, Deployment
from market.errors import ConfigError

ETHER = 10**18


@dataclass(frozen=True)
class DeployParams:
    """Every amount (wei) and duration (seconds) the constructors and the deploy-time setters
    take. The defaults are the devnet's: small stakes and windows short enough that a whole
    life cycle runs in minutes, yet long enough for a busy 2-core machine (a miner that is
    generating, a market that indexes late). `PUBLIC_CHAIN_PARAMS` holds the windows for a
    public chain (README "Trust", "Windows"). The README's "cost of attacking the committee"
    works through them."""

    # GPURegistry
    min_stake: int = ETHER // 10
    miner_unbonding_period: int = 60
    initial_reputation_bps: int = 5000
    probation_epochs: int = 2  # passing committee reports before a new miner leaves probation
    probation_pass_bps: int = 6000
    # Missed challenge reports in a row before the next one puts a miner back on probation.
    missed_reports_allowed: int = 2
    # TaskRegistry
    collateral_bps: int = 2000
    claim_timeout: int = 600
    challenge_window: int = 30
    reclaim_penalty_bps: int = 5000
    # VerifierCommittee
    min_verifier_stake: int = ETHER // 10
    # Above dispute_timeout: a member leaving stays slashable for its absences.
    verifier_unbonding_period: int = 900
    epoch_duration: int = 120
    # Seconds a challenged miner has, from its challenge's posting, before the committee may
    # report it missed; 0: half the epoch.
    challenge_answer_window: int = 0
    genesis_time: int = 0  # 0: the deploy block's timestamp
    activation_delay: int = 1  # epochs from a join or exit to the boundary it takes effect at
    churn_limit: int = 4  # verifiers activated per epoch
    idle_strikes_allowed: int = 0  # absences before each further one also costs stake
    idle_slash_bps: int = 1000
    # Arbitration
    min_bond: int = ETHER // 100
    dispute_timeout: int = 600
    fault_slash_bps: int = 10_000
    verifier_reward_bps: int = 2000
    miner_bond_share_bps: int = 5000
    min_availability_bond: int = ETHER // 100  # pays the miner's answer (gas included)
    response_window: int = 120  # seconds a miner has to answer an availability challenge

    @property
    def answer_window(self) -> int:
        """The challenge answer window in force: as set, or half the epoch."""
        return self.challenge_answer_window or max(1, self.epoch_duration // 2)

    def constructor_args(self, name: str) -> tuple[Any, ...]:
        return {
            "PaymentEscrow": (),
            "GPURegistry": (self.min_stake, self.miner_unbonding_period,
                            self.initial_reputation_bps),
            "TaskRegistry": (self.collateral_bps, self.claim_timeout, self.challenge_window,
                             self.reclaim_penalty_bps),
            "VerifierCommittee": (self.min_verifier_stake, self.verifier_unbonding_period,
                                  self.epoch_duration, self.genesis_time),
            "Arbitration": (self.min_bond, self.dispute_timeout, self.fault_slash_bps,
                            self.verifier_reward_bps, self.miner_bond_share_bps,
                            self.min_availability_bond, self.response_window),
        }[name]

    def setter_calls(self) -> list[tuple[str, str, tuple[Any, ...]]]:
        """The owner's parameter calls after wiring: (contract, function, args)."""
        return [
            ("GPURegistry", "setProbation", (self.probation_epochs, self.probation_pass_bps)),
            ("VerifierCommittee", "setMembershipParams",
             (self.activation_delay, self.churn_limit)),
            ("VerifierCommittee", "setIdlePenalty",
             (self.idle_strikes_allowed, self.idle_slash_bps)),
            ("VerifierCommittee", "setChallengeAnswerWindow", (self.answer_window,)),
            ("GPURegistry", "setMissedReportsAllowed", (self.missed_reports_allowed,)),
        ]


DEVNET_PARAMS = DeployParams()

PUBLIC_CHAIN_PARAMS = DeployParams(
    # Windows a public chain needs (README "Windows that fit the network"): blocks of 2 to
    # 12 s, RPC nodes minutes behind at worst, and a miner or verifier that restarts (a
    # reboot, a driver update, a model reload) should not lose money or standing for it.
    min_stake=10 * ETHER,
    miner_unbonding_period=7 * 86400,
    probation_epochs=3,
    missed_reports_allowed=2,
    claim_timeout=6 * 3600,
    challenge_window=24 * 3600,
    min_verifier_stake=32 * ETHER,
    verifier_unbonding_period=14 * 86400,
    epoch_duration=3600,
    challenge_answer_window=1800,
    dispute_timeout=3 * 86400,
    response_window=4 * 3600,
    min_bond=ETHER // 10,
    min_availability_bond=ETHER // 100,
)
"""Stated defaults for a public chain (what the README reasons about); the devnet keeps the
short `DEVNET_PARAMS`. The owner can change every one later."""


def deploy(
    chain: Chain, deployer: LocalAccount, params: DeployParams = DEVNET_PARAMS
) -> tuple[Deployment, list[TxResult]]:
    """Deploy the five contracts from `deployer` and wire them; returns the deployment (not
    yet saved) and every transaction's result."""
    txs: list[TxResult] = []
    contracts = {}
    for name in CONTRACT_NAMES:
        contract, result = chain.deploy(load_artifact(name), deployer,
                                        *params.constructor_args(name))
        contracts[name] = contract
        txs.append(result)
    a: dict[str, str] = {name: c.address for name, c in contracts.items()}
    wiring = [
        ("PaymentEscrow", "setTaskRegistry", "TaskRegistry"),
        ("PaymentEscrow", "setArbitration", "Arbitration"),
        ("PaymentEscrow", "setGPURegistry", "GPURegistry"),
        ("PaymentEscrow", "setCommittee", "VerifierCommittee"),
        ("GPURegistry", "setTaskRegistry", "TaskRegistry"),
        ("GPURegistry", "setArbitration", "Arbitration"),
        ("GPURegistry", "setCommittee", "VerifierCommittee"),
        ("GPURegistry", "setEscrow", "PaymentEscrow"),
        ("TaskRegistry", "setGPURegistry", "GPURegistry"),
        ("TaskRegistry", "setEscrow", "PaymentEscrow"),
        ("TaskRegistry", "setArbitration", "Arbitration"),
        ("VerifierCommittee", "setGPURegistry", "GPURegistry"),
        ("VerifierCommittee", "setEscrow", "PaymentEscrow"),
        ("VerifierCommittee", "setArbitration", "Arbitration"),
        ("Arbitration", "setTaskRegistry", "TaskRegistry"),
        ("Arbitration", "setGPURegistry", "GPURegistry"),
        ("Arbitration", "setCommittee", "VerifierCommittee"),
        ("Arbitration", "setEscrow", "PaymentEscrow"),
    ]
    for target, setter, wired in wiring:
        fn = contracts[target].functions[setter](a[wired])
        txs.append(chain.send(fn, deployer, where=f"{target}.{setter}"))
    for target, setter, args in params.setter_calls():
        fn = contracts[target].functions[setter](*args)
        txs.append(chain.send(fn, deployer, where=f"{target}.{setter}"))
    deployment = Deployment(
        chain_id=chain.chain_id,
        rpc_url=chain.rpc_url,
        addresses=a,
        deploy_block=txs[0].block_number,
        deployer=deployer.address,
        params=asdict(params),
    )
    return deployment, txs


class Quarry:
    """The five contracts on one connection: `q.tasks`, `q.gpu`, `q.escrow`, `q.arbitration`,
    `q.committee`, plus `q.chain` and `q.deployment`."""

    def __init__(self, deployment: Deployment, chain: Chain | None = None) -> None:
        self.deployment = deployment
        self.chain = chain or Chain(deployment.rpc_url)
        a = deployment.addresses
        self.escrow = PaymentEscrow(self.chain, a["PaymentEscrow"])
        self.gpu = GPURegistry(self.chain, a["GPURegistry"])
        self.tasks = TaskRegistry(self.chain, a["TaskRegistry"])
        self.committee = VerifierCommittee(self.chain, a["VerifierCommittee"])
        self.arbitration = Arbitration(self.chain, a["Arbitration"])
        self._identity: str | None = None

    @classmethod
    def connect(cls, path: Path | None = None, *, check: bool = True) -> Quarry:
        """From the deployment file; with `check`, fail clearly if the chain is gone or
        another chain answers at its URL."""
        q = cls(Deployment.load(path))
        if check:
            q.check()
        return q

    def check(self) -> None:
        """Fail clearly unless the chain answers, has the deployment's id, and holds code at
        every one of its addresses (`DeploymentMismatch` for the last two)."""
        from market.chain.errors import ChainError, DeploymentMismatch

        url = self.chain.rpc_url
        if not self.chain.is_up():
            raise ChainError(
                f"no chain answers at {url}; is the devnet running? (`market devnet status`)"
            )
        if self.chain.chain_id != self.deployment.chain_id:
            raise DeploymentMismatch(
                f"the chain at {url} has id {self.chain.chain_id}, but the deployment settles "
                f"on chain {self.deployment.chain_id}"
            )
        for name in CONTRACT_NAMES:
            address = self.address(name)
            if not self.chain.w3.eth.get_code(to_checksum_address(address)):
                raise DeploymentMismatch(
                    f"no {name} code at {address} on the chain at {url}: the deployment is not "
                    "on this chain (was the devnet restarted without redeploying? run `market "
                    "devnet down` and `market devnet up`)"
                )

    @property
    def chain_id(self) -> int:
        return self.deployment.chain_id

    def identity(self) -> str:
        """A name for this deployment that a fresh devnet never repeats: the chain id, the
        TaskRegistry address and the deploy block's hash (a redeployed devnet reuses the same
        addresses and block numbers, but not the same blocks)."""
        if self._identity is None:
            block = self.chain.w3.eth.get_block(self.deployment.deploy_block)
            self._identity = (f"{self.chain_id}-{self.tasks.address}-"
                              f"{bytes(block['hash']).hex()[:16]}")
        return self._identity

    def address(self, name: str) -> str:
        if name not in self.deployment.addresses or not is_address(self.deployment.addresses[name]):
            raise ConfigError(f"deployment has no contract {name!r}")
        return self.deployment.addresses[name]


class WatchedDeployment:
    """A deployment file that long-running services (the market app, its workers) follow:
    `quarry()` connects on first use and again whenever the file changes on disk, e.g. when
    a devnet is restarted and redeployed. A missing or unusable file raises ConfigError."""

    def __init__(self, path: Path, *, timeout: float = 30.0) -> None:
        self.path = Path(path)
        self.timeout = timeout
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._quarry: Quarry | None = None

    def quarry(self) -> Quarry:
        try:
            stat = self.path.stat()
            stamp: tuple[int, int] | None = (stat.st_mtime_ns, stat.st_size)
        except OSError:
            stamp = None  # Deployment.load names the missing file
        with self._lock:
            if self._quarry is None or stamp != self._stamp:
                deployment = Deployment.load(self.path)
                self._quarry = Quarry(deployment, Chain(deployment.rpc_url,
                                                        timeout=self.timeout))
                self._stamp = stamp
            return self._quarry
