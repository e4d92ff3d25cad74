"""The job board (tasks indexed from the chain) and the open shards miners claim."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, HTTPException, Path, Query
from starlette.concurrency import run_in_threadpool

from market.service.board import I64_MAX, checksum, model_id_bytes
from market.service.deps import BoardDep, Market, MarketDep
from market.service.http import errors
from market.service.matching import eligible, rank_open_shards
from market.service.schemas import JobOut, JobSummaryOut, OpenShardOut

router = APIRouter(tags=["jobs"])

MAX_WAIT_S = 30


@router.get("/jobs", response_model=list[JobSummaryOut], responses=errors(400))
def jobs(board: BoardDep, client: str | None = None) -> list[dict[str, Any]]:
    """Every task on the board (of `client` when given), without the shard list."""
    return board.jobs(client)


@router.get("/jobs/{task_id}", response_model=JobOut, responses=errors(404))
def job(board: BoardDep, task_id: int = Path(ge=0, le=I64_MAX)) -> dict[str, Any]:
    """The task with every shard (state, miner, claimExpiry, windowEnd, tokensUsed,
    resultUri, payment, refund...), its disputes (status, deadline, committee epoch and
    votes by weight, absences reported), availability challenges (status, deadline) and
    proven billing faults."""
    found = board.job(task_id)
    if found is None:
        raise HTTPException(404, f"task {task_id} is not on the board: unknown, or not "
                            f"indexed yet (indexed up to block {board.cursor()})")
    return found


def _open_shards(market: Market, model_bytes: bytes | None, miner: str | None,
                 limit: int) -> tuple[int, list[dict[str, Any]]]:
    """The board's cursor, then the open shards (see `open_shards`) as of at least it."""
    board, at = market.board, market.now()
    return board.cursor(), _matching(market, model_bytes, miner, limit, at)


def _matching(market: Market, model_bytes: bytes | None, miner: str | None,
              limit: int, at: int) -> list[dict[str, Any]]:
    board = market.board
    candidates = board.open_shards(model_bytes, at)
    if miner is None:
        candidates = [s for s in candidates if s["offeredTo"] is None]
        candidates.sort(key=lambda s: (-s["pricePerToken"], s["deadline"]))
        return list(candidates[:limit])
    row = board.miner(miner)
    if row is None:
        raise HTTPException(404, f"miner {checksum(miner, 'miner')} is not registered in "
                            f"GPURegistry (board indexed up to block {board.cursor()})")
    stored = board.fresh_recommendations(row["address"], 3 * market.settings.index_interval_s)
    if stored is not None:
        by_key = {(s["taskId"], s["shard"]): s for s in candidates}
        picked = [by_key[k] for r in stored
                  if (k := (r.get("taskId"), r.get("shard"))) in by_key]
        return [s for s in picked if eligible(s, row, at)][:limit]
    return rank_open_shards(candidates, row, at, limit)


@router.get("/shards/open", response_model=list[OpenShardOut], responses=errors(400, 404))
async def open_shards(market: MarketDep, modelId: str | None = None,
                      miner: str | None = None,
                      limit: int = Query(20, ge=1, le=1000),
                      waitSeconds: float = Query(0, ge=0, le=MAX_WAIT_S)
                      ) -> list[dict[str, Any]]:
    """Open shards, best first. With `miner`: only those it may claim, in its own order
    (the workers' fresh recommendations when there are, else ranked now); a miner on
    probation sees only tasks that allow probation. A task offered to one miner shows only
    with that `miner`. With `waitSeconds` (a long poll, at most 30): when nothing matches,
    the answer waits until the board indexes new blocks with a matching shard, or the time
    is up (then `[]`)."""
    model_bytes = model_id_bytes(modelId) if modelId else None
    deadline = time.monotonic() + waitSeconds
    while True:
        since, found = await run_in_threadpool(_open_shards, market, model_bytes, miner,
                                               limit)
        left = deadline - time.monotonic()
        if found or left <= 0:
            return found
        await market.watch.wait(since, left)
