"""Where a test's boards live, on either database the board runs on (issue 34): the
`board_at` fixture (tests/conftest.py) hands a test one `BoardPlaces`, SQLite files in its
temporary directory or fresh databases on the session's private PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from market.local.postgres import PostgresServer


class BoardPlaces:
    """`places("name")`: the location of board "name" (the same one each time within a
    test); `places.drop("name")` deletes it, so the next call gives an empty one."""

    def __init__(self, tmp_path: Path, server: PostgresServer | None) -> None:
        self.tmp_path, self.server = tmp_path, server
        self._urls: dict[str, str] = {}

    @property
    def kind(self) -> str:
        return "sqlite" if self.server is None else "postgres"

    def __call__(self, name: str = "board") -> Path | str:
        if self.server is None:
            return self.tmp_path / f"{name}.sqlite"
        if name not in self._urls:
            self._urls[name] = self.server.create_database()
        return self._urls[name]

    def drop(self, name: str = "board") -> None:
        if self.server is None:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{self.tmp_path / name}.sqlite{suffix}").unlink(missing_ok=True)
        elif name in self._urls:
            self.server.drop_database(self._urls.pop(name))

    def close(self) -> None:
        """Drop every database made (the server lives on for the next test)."""
        for name in list(self._urls):
            self.drop(name)
