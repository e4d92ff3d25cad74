"""The miner's own copies of the result documents it submitted.

A task's client may challenge a submitted shard's availability: the miner must then show one
request's receipt and result-tree proof on-chain within Arbitration's response window, or it
is at fault and slashed. The market's store may lose the document or be unreachable, so the
miner keeps every document it submits on its own disk, written (and synced) before
`submitResult` and removed once the shard is Finalized or Refunded.

Layout, one directory per miner and deployment (task ids restart with every deployment):

    <state_dir>/<miner address>/results/<chain id>-<TaskRegistry address>/<task>-<shard>.json

`state_dir` is the miner setting of that name, by default `$QUARRY_HOME/miner`.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from pathlib import Path

from market.protocol.results import ResultFormatError, ShardResult

log = logging.getLogger("miner")

_NAME = re.compile(r"(\d+)-(\d+)\.json")


def default_state_dir() -> Path:
    """`$QUARRY_HOME/miner` (see `market.config.quarry_home`)."""
    from market.config import quarry_home

    return quarry_home() / "miner"


class ResultArchive:
    """Result documents by (task, shard), one file each, written atomically."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @classmethod
    def for_miner(cls, state_dir: Path, miner: str, deployment: str) -> ResultArchive:
        """The archive of `miner` on one deployment (`Quarry.identity()`): task ids restart
        with every deployment, so each keeps its own."""
        return cls(Path(state_dir).expanduser() / miner / "results" / deployment)

    def path(self, task_id: int, shard: int) -> Path:
        return self.root / f"{task_id}-{shard}.json"

    def save(self, result: ShardResult, data: bytes | None = None) -> Path:
        """Write the document durably (temp file, fsync, rename): it must survive a crash
        between here and the end of the shard's challenge window. `data`: its bytes
        (`result.to_bytes()`) when the caller has them already."""
        path = self.path(result.task_id, result.shard)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(result.to_bytes() if data is None else data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _fsync_dir(path.parent)
        return path

    def load(self, task_id: int, shard: int) -> ShardResult | None:
        """The document, or None when there is none (or it cannot be read, logged)."""
        path = self.path(task_id, shard)
        try:
            return ShardResult.from_bytes(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ResultFormatError) as exc:
            log.warning("local result copy %s is unreadable: %s", path, exc,
                        extra={"task": task_id, "shard": shard})
            return None

    def remove(self, task_id: int, shard: int) -> None:
        self.path(task_id, shard).unlink(missing_ok=True)

    def keys(self) -> list[tuple[int, int]]:
        """(task, shard) of every document kept, sorted."""
        if not self.root.is_dir():
            return []
        found = (_NAME.fullmatch(p.name) for p in self.root.iterdir())
        return sorted((int(m[1]), int(m[2])) for m in found if m)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
