"""The market API against its own OpenAPI document, with schemathesis: every operation of
`/openapi.json` gets generated requests (valid and invalid ones, a bounded and fixed set:
25 examples of each per operation, derandomized) against the app in-process (ASGI) over a
real devnet whose board holds a task and the fixture miners. No answer may be a 5xx, have a
status the document does not declare, or a body outside its declared schema. Part of
`make test` (it is a pytest test); it runs in about half a minute."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from market.chain.devnet import free_port
from market.service.app import create_app
from market.service.board import Board
from market.service.settings import MarketSettings
from market.store import content_uri

if TYPE_CHECKING:
    from conftest import Devnet

pytestmark = [pytest.mark.chain]


@pytest.fixture
def api_schema(devnet: Devnet, deployment_file: Path, tmp_path: Path) -> Any:
    s = MarketSettings(redis_url=f"redis://127.0.0.1:{free_port()}/0",  # no Redis: degraded
                       deployment=deployment_file, store_dir=tmp_path / "store",
                       db_path=tmp_path / "board.sqlite", max_file_bytes=4096)
    devnet.q.tasks.create_task(
        devnet.client, model_id=devnet.MODEL_ID, input_root=b"\x01" * 32,
        input_uri=content_uri(b"requests"), num_requests=4, shard_size=2,
        max_tokens_per_request=4, price_per_token=devnet.PRICE,
        deadline=devnet.chain.timestamp() + 3600)
    Board(s.db_path).index(devnet.q)
    return schemathesis.openapi.from_asgi("/openapi.json", create_app(s))


CHECKS = [not_a_server_error, response_schema_conformance, status_code_conformance]


def test_the_api_keeps_its_documented_contract(api_schema: Any) -> None:
    """Each operation in turn (schemathesis's pytest plugin does not load under this pytest,
    so hypothesis drives each operation's strategy here)."""
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 14, [op.label for op in operations]
    failures: list[str] = []
    for operation, mode in itertools.product(operations, GenerationMode):

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=25, derandomize=True, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def run(case: Any) -> None:
            case.call_and_validate(checks=CHECKS)

        try:
            run()
        except Unsatisfiable:  # nothing to make invalid (no parameters, or a raw body)
            assert mode is GenerationMode.NEGATIVE, operation.label
        except Exception as exc:  # one operation's failure; report them all together
            failures.append(f"{operation.label} ({mode.value}): {exc}")
    assert not failures, "\n\n".join(failures)
