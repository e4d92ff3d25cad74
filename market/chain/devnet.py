"""The local devnet: Anvil from node_modules, deployed and wired, described by
`$QUARRY_HOME/deployment.json`.

`up` starts Anvil detached (its own session, so it outlives the command and a terminal's
Ctrl-C), waits for its RPC, deploys, and writes the deployment file with Anvil's pid and log.
`down` stops that process group and removes the file. A second `up` while one answers is
refused with an error naming it; a stale file (its chain gone) is replaced.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from market.chain.deployment import Deployment
from market.config import deployment_path, node_modules_dir, quarry_home
from market.errors import ConfigError, QuarryError

DEVNET_CHAIN_ID = 31337
DEVNET_ACCOUNTS = 20  # funded dev accounts (Anvil's default mnemonic), 10,000 ETH each
DEVNET_ROLES = {
    0: "deployer: owns the contracts",
    1: "client (examples/config/client.toml)",
    2: "arbiter: a client's third party for disputes",
    3: "miner (examples/config/miner.toml)",
    4: "a second miner",
    6: "verifier (examples/config/verifier.toml)",
    7: "a second verifier",
    19: "market settler: sends due settlements (examples/config/market.toml)",
}
"""Who uses which funded account in the README's by-hand path and the example configs;
`market devnet accounts` prints them with their keys (public: Anvil's default mnemonic)."""


class DevnetError(QuarryError):
    """The devnet cannot be started, found, or stopped."""


def anvil_binary() -> Path:
    """Anvil from npm (`@foundry-rs/anvil-linux-amd64`), else a Foundry install on PATH.

    Only the linux-x64 build is pinned in package.json (the registry mirror here carries no
    other platform), so other platforms fall back to `anvil` from foundryup.
    """
    nm = node_modules_dir()
    for candidate in (nm / "@foundry-rs" / "anvil-linux-amd64" / "bin" / "anvil",
                      nm / ".bin" / "anvil"):
        if candidate.exists() and os.access(candidate, os.X_OK):
            return candidate
    on_path = shutil.which("anvil")
    if on_path:
        return Path(on_path)
    raise ConfigError(
        f"Anvil is not installed under {nm}: run `npm ci` (or `make setup`) in the project root"
    )


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def pid_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _is_anvil(pid: int) -> bool:
    """Guard against a recycled pid: only a process whose command line mentions anvil."""
    try:
        return b"anvil" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@dataclass
class AnvilProcess:
    """A running Anvil. `popen` is set when this process started it (and must reap it)."""

    pid: int
    port: int
    log_path: Path | None
    popen: subprocess.Popen[bytes] | None = None

    @property
    def rpc_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self, timeout: float = 10.0) -> None:
        stop_anvil(self.pid, timeout=timeout, popen=self.popen)


DEVNET_BLOCK_TIME = 1
"""Seconds between the devnet's empty blocks (its clock's resolution when idle)."""


def start_anvil(
    port: int | None = None,
    *,
    log_path: Path | None = None,
    chain_id: int = DEVNET_CHAIN_ID,
    accounts: int = DEVNET_ACCOUNTS,
    silent: bool = False,
    timeout: float = 30.0,
    die_with_parent: bool = False,
    block_time: int | None = None,
) -> AnvilProcess:
    """Start Anvil in its own session on `port` (a free one when None) and wait for its RPC.

    Anvil mines a block per transaction. `block_time` also mines an empty block every that
    many seconds (mixed mining), so the chain's clock moves while nobody transacts, as on a
    real chain: without it, a call simulated at "latest" (gas estimation) sees the time of
    the last transaction, and a shard whose window has closed by the wall clock still looks
    open to `finalizeShard` until someone else sends a transaction.

    With a chosen port already taken, fail at once; with a free port picked here, retry on
    the rare race where another process grabs it first. `die_with_parent` (tests,
    benchmarks) has the kernel stop Anvil if this process dies without cleaning up.
    """
    binary = anvil_binary()
    if port is not None and _port_in_use(port):
        raise DevnetError(f"port {port} is already in use on 127.0.0.1")
    attempts = 1 if port is not None else 3
    last_error = ""
    for _ in range(attempts):
        chosen = port if port is not None else free_port()
        cmd = [str(binary), "--host", "127.0.0.1", "--port", str(chosen),
               "--chain-id", str(chain_id), "--accounts", str(accounts)]
        if block_time is not None:
            cmd += ["--block-time", str(block_time), "--mixed-mining"]
        if silent:
            cmd.append("--silent")
        log = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            popen = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, close_fds=True,
                preexec_fn=_die_with_parent if die_with_parent else None,
            )
        except OSError as exc:
            raise DevnetError(f"cannot start Anvil ({binary}): {exc}") from exc
        finally:
            if log is not subprocess.DEVNULL:
                log.close()  # type: ignore[union-attr]
        proc = AnvilProcess(popen.pid, chosen, log_path, popen)
        try:
            _wait_for_rpc(proc, chain_id, timeout)
            return proc
        except DevnetError as exc:
            last_error = str(exc)
            proc.stop()
    raise DevnetError(last_error)


def rpc_call(url: str, method: str, params: list[Any] | None = None,
             timeout: float = 2.0) -> Any:
    """One JSON-RPC call with the standard library (status and startup need no web3)."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or []})
    request = urllib.request.Request(url, data=body.encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        answer = json.loads(response.read())
    if "error" in answer:
        raise ValueError(f"{method}: {answer['error']}")
    return answer["result"]


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent dies (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the caller's own cleanup still stops it


def _wait_for_rpc(proc: AnvilProcess, chain_id: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.popen is not None and proc.popen.poll() is not None:
            raise DevnetError(
                f"Anvil exited with code {proc.popen.returncode} on port {proc.port}"
                + _log_tail(proc.log_path)
            )
        try:
            if int(rpc_call(proc.rpc_url, "eth_chainId", timeout=1), 16) == chain_id:
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.05)
    raise DevnetError(f"Anvil did not answer on {proc.rpc_url} within {timeout:.0f}s"
                      + _log_tail(proc.log_path))


def _log_tail(log_path: Path | None, lines: int = 5) -> str:
    if not log_path or not log_path.exists():
        return ""
    tail = log_path.read_text(errors="replace").strip().splitlines()[-lines:]
    return ("; log " + str(log_path) + ": " + " | ".join(tail)) if tail else ""


def stop_anvil(pid: int, *, timeout: float = 10.0,
               popen: subprocess.Popen[bytes] | None = None) -> None:
    """SIGTERM Anvil's process group (it leads its own session), then SIGKILL if it lingers."""
    if popen is None and pid_alive(pid) and not _is_anvil(pid):
        raise DevnetError(f"process {pid} is not Anvil; not stopping it")
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if popen is not None:
                if popen.poll() is not None:
                    return
            elif not pid_alive(pid):
                return
            time.sleep(0.05)
    if popen is not None:
        popen.wait(timeout=timeout)
    elif pid_alive(pid):
        raise DevnetError(f"Anvil (pid {pid}) did not stop")


# -- the devnet the CLI manages -----------------------------------------------------------


def up(port: int | None = None) -> Deployment:
    """Start Anvil, deploy and wire, write the deployment file; returns the Deployment."""
    path = deployment_path()
    if path.exists():
        try:
            state = status()
        except ConfigError:
            state = {"answers": False}
        if state["answers"]:
            raise DevnetError(
                f"a devnet is already running at {state['rpcUrl']} (pid {state['anvilPid']}, "
                f"file {path}); stop it with `market devnet down` first"
            )
        down(quiet=True)  # stale: its chain is gone; clear what is left and start afresh
    home = quarry_home()
    home.mkdir(parents=True, exist_ok=True)
    log_path = home / "anvil.log"
    log_path.write_bytes(b"")
    proc = start_anvil(port, log_path=log_path, block_time=DEVNET_BLOCK_TIME)
    try:
        from market.chain.client import Chain, anvil_account  # web3: import only when needed
        from market.chain.deploy import deploy

        deployment, _ = deploy(Chain(proc.rpc_url), anvil_account(0))
        deployment.anvil_pid = proc.pid
        deployment.anvil_log = str(log_path)
        deployment.save(path)
    except BaseException:
        proc.stop()
        raise
    return deployment


def status() -> dict[str, Any]:
    """What the deployment file says, and whether its chain answers with its contracts."""
    path = deployment_path()
    deployment = Deployment.load(path)
    block: int | None = None
    try:
        same_chain = int(rpc_call(deployment.rpc_url, "eth_chainId"), 16) == deployment.chain_id
        code = rpc_call(deployment.rpc_url, "eth_getCode",
                        [deployment.addresses["TaskRegistry"], "latest"])
        answers = same_chain and code not in ("0x", "", None)
        block = int(rpc_call(deployment.rpc_url, "eth_blockNumber"), 16)
    except (OSError, ValueError, KeyError):
        answers = False
    pid = deployment.anvil_pid
    return {
        "file": str(path),
        "chainId": deployment.chain_id,
        "rpcUrl": deployment.rpc_url,
        "addresses": deployment.addresses,
        "deployBlock": deployment.deploy_block,
        "anvilPid": pid,
        "anvilRunning": bool(pid and pid_alive(pid) and _is_anvil(pid)),
        "answers": answers,
        "blockNumber": block if answers else None,
    }


def down(quiet: bool = False) -> str:
    """Stop the devnet's Anvil and remove the deployment file; returns what was done."""
    path = deployment_path()
    if not path.exists():
        return f"no devnet deployment at {path}; nothing to stop"
    try:
        pid = Deployment.load(path).anvil_pid
    except ConfigError:
        pid = None
    message = f"removed {path}"
    if pid and pid_alive(pid) and _is_anvil(pid):
        stop_anvil(pid)
        message = f"stopped Anvil (pid {pid}) and removed {path}"
    elif pid and not quiet:
        message = f"Anvil (pid {pid}) was not running; removed {path}"
    path.unlink(missing_ok=True)
    return message


def accounts() -> list[dict[str, Any]]:
    """Every funded devnet account: index, address, private key (public knowledge: Anvil's
    default mnemonic) and the role the example configs give it."""
    from market.chain.client import anvil_account  # web3: import only when needed

    out = []
    for i in range(DEVNET_ACCOUNTS):
        account = anvil_account(i)
        out.append({"index": i, "address": account.address,
                    "privateKey": "0x" + bytes(account.key).hex(),
                    "role": DEVNET_ROLES.get(i, "")})
    return out
