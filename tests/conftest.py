"""Shared fixtures: one Anvil per test session, deployed and wired, with miners and a verifier
committee registered; each test runs inside an `evm_snapshot`/`evm_revert` pair.

- `devnet_session` (session): the running chain and its `Devnet` bundle.
- `devnet` (function): the same bundle, isolated: state and clock are rolled back after the
  test. Use this one in tests.
- `one_torch_thread` (module): model tests run single-threaded (see its docstring).
- `rpc_front`, `no_batch_node` (function): a counting JSON-RPC front for the devnet; the
  second refuses batches, as nodes with batches turned off do.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import pytest

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from market.chain.client import Chain
    from market.chain.deploy import Deployment, Quarry
    from market.chain.devnet import AnvilProcess
    from market.protocol.merkle import SumNode as SumNodeT
    from market.protocol.merkle import SumStep as SumStepT

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """The tiny model is overhead-bound: one intra-op thread is faster on a shared CPU."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


TRAINED_MODEL = ROOT / "testmodels" / "quarry-pydoc"
TRAINED_PROMPTS = (
    "The built-in function", "A dictionary maps", "Exceptions are raised when",
    "The module defines the following", "This method returns", "If the argument is",
    "Changed in version 3.", "The default value of", "An iterator is an object",
    "Return a new list", "The file is opened", "Strings are immutable",
)
"""Prompts in the trained test model's own domain (the Python documentation)."""


@pytest.fixture(scope="module")
def trained_engine() -> Iterator[object]:
    """The trained test model in fp32 (the reference verifier), loaded once per module."""
    from market.engine.torch_engine import TorchEngine

    eng = TorchEngine(TRAINED_MODEL, max_batch_size=24)
    yield eng
    eng.close()


@pytest.fixture(autouse=True)
def sigint_handler_restored() -> Iterator[None]:
    """Tests that press Ctrl-C (a real SIGINT, or `_thread.interrupt_main`, which does
    nothing unless Python's own handler is installed) start from Python's default handler
    and leave it, whatever a test before them did with a late signal."""
    import signal

    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, signal.default_int_handler if before is None else before)


@pytest.fixture(autouse=True)
def root_logger_restored() -> Iterator[None]:
    """A CLI run in-process sets up logging (`market.logs.configure_logging` replaces the
    root handlers with one bound to that test's captured stderr): the next test gets the
    root logger back as it was, as a new process would. pytest's own capturing handlers,
    added and removed around each phase, are left to pytest."""
    import logging

    def ours(h: logging.Handler) -> bool:
        return not type(h).__module__.startswith("_pytest")

    root = logging.getLogger()
    before, level = [h for h in root.handlers if ours(h)], root.level
    yield
    for h in root.handlers[:]:
        if ours(h) and h not in before:
            root.removeHandler(h)
    for h in before:
        if h not in root.handlers:
            root.addHandler(h)
    root.setLevel(level)


@contextlib.contextmanager
def cpu_hogs(n: int = 2) -> Iterator[list[int]]:
    """`n` CPU-bound processes (a busy loop each) beside the block: on this 2-core machine
    they take both cores away, as other work on a shared machine does. Yields their pids;
    they are killed on exit."""
    import subprocess
    import sys

    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield [h.pid for h in hogs]
    finally:
        for h in hogs:
            h.kill()
            h.wait()


def write_miner_config(path: Path, key: bytes, market_url: str, model_dir: Path, *,
                       price: int, port: int, max_batch: int) -> Path:
    """A `[miner]` config as a test miner process reads it (fast polls and heartbeats)."""
    path.write_text(
        "[miner]\n"
        f'key = "0x{bytes(key).hex()}"\n'
        f'market_url = "{market_url}"\n'
        f'model_dirs = ["{model_dir}"]\n'
        f"price_per_token = {price}\n"
        'stake = "0.5ether"\n'
        f'endpoint = "http://127.0.0.1:{port}"\n'
        f"poll_interval_s = 0.3\nheartbeat_interval_s = 1.0\nmax_batch = {max_batch}\n")
    path.chmod(0o600)  # it holds a raw key
    return path


MODEL_ID = bytes.fromhex("11" * 32)  # the model the test miners serve
OTHER_MODEL_ID = bytes.fromhex("22" * 32)
MINER_STAKE = 10**18
VERIFIER_STAKE = 10**18
PRICE = 10**9  # wei per token


@dataclass
class Devnet:
    """Everything a chain test needs. Accounts are Anvil's default ones (10,000 ETH each)."""

    MODEL_ID: ClassVar[bytes] = MODEL_ID
    OTHER_MODEL_ID: ClassVar[bytes] = OTHER_MODEL_ID
    MINER_STAKE: ClassVar[int] = MINER_STAKE
    VERIFIER_STAKE: ClassVar[int] = VERIFIER_STAKE
    PRICE: ClassVar[int] = PRICE

    anvil: AnvilProcess
    chain: Chain
    deployment: Deployment
    q: Quarry
    deployer: LocalAccount
    client: LocalAccount
    client2: LocalAccount
    miner: LocalAccount  # registered for MODEL_ID with MINER_STAKE
    miner2: LocalAccount  # registered for MODEL_ID with MINER_STAKE
    outsider: LocalAccount  # funded, registered nowhere
    anyone: LocalAccount  # a third party for permissionless calls
    verifiers: list[LocalAccount]  # the committee (4 members: quorum 3)

    @property
    def verifier_keys(self) -> list[bytes]:
        return [bytes(v.key) for v in self.verifiers]


def until_seated(q: Quarry) -> int:
    """Move the devnet clock to the epoch boundary where every membership change scheduled so
    far has taken effect (joins activate, exits end); returns that epoch."""
    c = q.committee
    at = c.current_epoch()
    for v in c.seats():
        info = c.verifier_info(v)
        at = max(at, info.active_from if info.seated else info.active_until)
    start = c.epoch_start(at)
    now = q.chain.timestamp()
    if now < start:
        q.chain.advance_time(start - now)
    return at


def to_next_epoch(q: Quarry) -> None:
    """Move the devnet clock to the start of the next epoch (skipping idle epoch time)."""
    gap = q.committee.epoch_start(q.committee.current_epoch() + 1) - q.chain.timestamp()
    if gap > 0:
        q.chain.advance_time(gap)


@pytest.fixture(scope="session")
def devnet_session() -> Iterator[Devnet]:
    from market.chain.client import Chain, anvil_account
    from market.chain.contracts import GpuSpec
    from market.chain.deploy import Quarry, deploy
    from market.chain.devnet import start_anvil

    anvil = start_anvil(silent=True, die_with_parent=True)
    try:
        chain = Chain(anvil.rpc_url)
        accounts = [anvil_account(i) for i in range(12)]
        deployment, _ = deploy(chain, accounts[0])
        q = Quarry(deployment, chain)
        net = Devnet(
            anvil=anvil, chain=chain, deployment=deployment, q=q, deployer=accounts[0],
            client=accounts[1], client2=accounts[2], miner=accounts[3], miner2=accounts[4],
            outsider=accounts[5], anyone=accounts[10], verifiers=accounts[6:10],
        )
        gpu = GpuSpec("NVIDIA H100", 81920, 1)
        # The two fixture miners are established (off probation); a miner registered in a test
        # starts on probation, as on any deployment.
        probation = q.gpu.probation_params()
        q.gpu.set_probation(net.deployer, 0, probation[1])
        for i, m in enumerate((net.miner, net.miner2)):
            q.gpu.register(m, [MODEL_ID], gpu, f"http://127.0.0.1:{9100 + i}", PRICE,
                           MINER_STAKE)
        q.gpu.set_probation(net.deployer, *probation)
        for v in net.verifiers:
            q.committee.register(v, VERIFIER_STAKE)
        until_seated(q)
        yield net
    finally:
        anvil.stop()


@pytest.fixture
def devnet(devnet_session: Devnet) -> Iterator[Devnet]:
    # A module's own fixture may have reverted to a snapshot taken minutes ago (winding the
    # clock back with it): catch up first, so no test starts with the chain behind.
    keep_up_with_the_wall_clock(devnet_session)
    snapshot = devnet_session.chain.snapshot()
    try:
        yield devnet_session
    finally:
        devnet_session.chain.revert_to(snapshot)
        keep_up_with_the_wall_clock(devnet_session)


class RpcFront:
    """A JSON-RPC endpoint in front of the devnet that passes requests through and counts
    them; with `refuse_batches`, it answers a batch as nodes with batches turned off do (one
    error object)."""

    def __init__(self, upstream: str, *, refuse_batches: bool) -> None:
        import http.server
        import threading
        import urllib.request

        self.batches: list[int] = []  # each batch's size (refused or not)
        self.singles = 0
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        node = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                batch = body.lstrip().startswith(b"[")
                if batch:
                    node.batches.append(len(json.loads(body)))
                else:
                    node.singles += 1
                if batch and refuse_batches:
                    answer = json.dumps({"jsonrpc": "2.0", "id": None, "error": {
                        "code": -32600, "message": "batch requests are disabled"}}).encode()
                else:
                    request = urllib.request.Request(
                        upstream, body, {"Content-Type": "application/json"})
                    with opener.open(request, timeout=30) as response:
                        answer = response.read()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def rpc_front(devnet: Devnet) -> Iterator[RpcFront]:
    with contextlib.closing(RpcFront(devnet.chain.rpc_url, refuse_batches=False)) as node:
        yield node


@pytest.fixture
def no_batch_node(devnet: Devnet) -> Iterator[RpcFront]:
    with contextlib.closing(RpcFront(devnet.chain.rpc_url, refuse_batches=True)) as node:
        yield node


def keep_up_with_the_wall_clock(net: Devnet) -> None:
    """Anvil's evm_revert winds its clock back with the snapshot, so over a session of
    reverted tests the chain falls behind the wall clock by their total duration, while the
    market's sweeps take the later of the two clocks: on a slow machine deadlines then look
    due minutes early. Move the clock up to the wall clock whenever it lags (never back),
    and mine a block there: until one is mined the latest block keeps the old time, and a
    deadline reckoned from it could already be past for the next block."""
    now = int(time.time())
    if net.chain.timestamp() < now:
        net.chain.rpc("evm_setTime", [now])
        # And a block at that time: the next test reads `chain.timestamp()` (the latest
        # block's) to set deadlines; until the interval miner's next block the latest is the
        # reverted one, older by the tests run since, and a deadline computed from it can be
        # in the past by the time its transaction is mined (DeadlineInPast on a busy machine).
        net.chain.mine()


@pytest.fixture
def deployment_file(devnet: Devnet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The session chain's deployment written to a private QUARRY_HOME (set in the env), for
    code that reads `$QUARRY_HOME/deployment.json`. It carries no Anvil pid, so a
    `market devnet down` there removes the file but never stops the session's chain."""
    from market.chain.deployment import Deployment

    home = tmp_path / "quarry-home"
    monkeypatch.setenv("QUARRY_HOME", str(home))
    d = devnet.deployment
    return Deployment(d.chain_id, d.rpc_url, dict(d.addresses), d.deploy_block, d.deployer,
                      dict(d.params)).save(home / "deployment.json")


def subtree_spans(n: int) -> list[tuple[int, int]]:
    """Every subtree [lo, hi) of a result tree of n leaves (RFC 9162 shape)."""
    out, todo = [], [(0, n)]
    while todo:
        lo, hi = todo.pop()
        out.append((lo, hi))
        if hi - lo > 1:
            k = 1 << ((hi - lo - 1).bit_length() - 1)
            todo += [(lo, lo + k), (lo + k, hi)]
    return out


def lying_result_tree(
        leaves: list[SumNodeT], lies: dict[str, int],
) -> tuple[bytes, int, list[list[SumNodeT]], list[list[SumStepT]]]:
    """(root, tokensUsed, proofs, SumStep paths) of a result tree whose parents may record
    false sums: `lies` maps a subtree "lo:hi" (leaf positions [lo, hi)) to the sum its parent
    records, and "root" to the tokensUsed submitted (contracts/test/resultTree.js
    LyingSumTree). Hashes are honest over what the parents record, so every receipt outside a
    lying subtree still proves."""
    from market.protocol.merkle import SumNode, SumStep, sum_node_hash

    nodes: dict[tuple[int, int], SumNode] = {}

    def build(lo: int, hi: int) -> SumNode:
        if hi - lo == 1:
            node = leaves[lo]
        else:
            k = 1 << ((hi - lo - 1).bit_length() - 1)
            left, right = build(lo, lo + k), build(lo + k, hi)
            node = SumNode(sum_node_hash(left, right), left.sum + right.sum)
        if f"{lo}:{hi}" in lies:
            node = SumNode(node.hash, lies[f"{lo}:{hi}"])
        nodes[(lo, hi)] = node
        return node

    n = len(leaves)
    top = build(0, n)
    proofs, paths = [], []
    for m in range(n):
        proof, path, lo, hi = [], [], 0, n
        while hi - lo > 1:
            k = 1 << ((hi - lo - 1).bit_length() - 1)
            span, sib = ((lo, lo + k), (lo + k, hi)) if m < lo + k else ((lo + k, hi), (lo, lo + k))
            proof.append(nodes[sib])
            path.append(SumStep(nodes[span].sum, nodes[sib].hash, nodes[sib].sum))
            lo, hi = span
        proofs.append(proof[::-1])
        paths.append(path[::-1])
    return top.hash, lies.get("root", top.sum), proofs, paths


# -- PostgreSQL (the board's other database) ----------------------------------------------


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[object]:
    """A private PostgreSQL for the session (initdb in a temporary directory, a free port;
    stopped and removed at the end). `make setup` installs it; skipped only without it."""
    from market.local.postgres import missing_binaries, start_postgres
    from market.service.boardsql import close_pools

    missing = missing_binaries()
    if missing:
        pytest.skip(f"PostgreSQL is not installed ({', '.join(missing)} missing): "
                    "run `make setup`")
    server = start_postgres()
    try:
        yield server
    finally:
        close_pools()
        server.stop()


@pytest.fixture(params=["sqlite", "postgres"])
def board_at(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[object]:
    """Where this test's boards live: run once on SQLite files, once on PostgreSQL."""
    from boardplaces import BoardPlaces

    server = request.getfixturevalue("postgres_server") if request.param == "postgres" \
        else None
    places = BoardPlaces(tmp_path, server)
    try:
        yield places
    finally:
        places.close()
