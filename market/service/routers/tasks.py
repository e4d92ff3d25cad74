"""Offers: a task's client shows its task to one miner until the task's deadline."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Path

from market.chain.errors import revert_class
from market.protocol.messages import MalformedMessage, recover_offer
from market.protocol.precision import accepts, mask_labels
from market.service.board import I64_MAX, checksum, deployment_identity
from market.service.deps import MarketDep
from market.service.http import check_skew, errors
from market.service.schemas import OfferIn, OfferOut

router = APIRouter(tags=["jobs"])


@router.post("/tasks/{task_id}/offer", response_model=OfferOut,
             responses=errors(400, 401, 404, 413, 503))
def offer(body: OfferIn, market: MarketDep,
          task_id: int = Path(ge=0, le=I64_MAX)) -> dict[str, Any]:
    """The task's client offers it to one registered miner: until the task's deadline its
    shards are shown and recommended to that miner alone (the contract still lets any
    eligible miner claim). 401 when not signed by the task's client (TaskRegistry), 404
    for an unknown task or miner, 400 when the timestamp is over 120 s off or the miner
    could not claim the task (`isEligible` with the task's model, reputation floor and
    allowProbation, and its declared precision in the task's accepted mask: an offer to it
    would hide the task from every miner that could). A newer offer replaces an older one."""
    raw = body.model_dump()
    try:
        signer = recover_offer(task_id, raw)
    except MalformedMessage as exc:
        raise HTTPException(400, str(exc)) from exc
    miner = checksum(body.miner, "miner")
    check_skew(f"offer for task {task_id}", body.timestamp, 400)
    q, board = market.deployment.quarry(), market.board
    try:
        task = q.tasks.get_task(task_id)
    except revert_class("UnknownTask"):
        raise HTTPException(404, f"task {task_id} does not exist in TaskRegistry "
                            f"{q.tasks.address}") from None
    if signer != task.client:
        raise HTTPException(401, f"offer for task {task_id} is signed by {signer}, not "
                            f"its client {task.client}")
    if not q.gpu.is_registered(miner):
        raise HTTPException(404, f"miner {miner} is not registered in GPURegistry "
                            f"{q.gpu.address}")
    precision = q.gpu.eligible_precision(miner, task.model_id, task.min_reputation_bps,
                                         task.allow_probation)
    if precision is None:
        why = ("it is on probation and the task does not allow probation"
               if not task.allow_probation and q.gpu.on_probation(miner) else
               "GPURegistry.isEligible says no (model, reputation floor, stake or exit)")
        raise HTTPException(400, f"miner {miner} could not claim task {task_id}: {why}")
    if not accepts(task.precisions, precision):
        raise HTTPException(400, f"miner {miner} could not claim task {task_id}: it serves "
                            f"the model in {precision.label}, the task accepts "
                            f"{', '.join(mask_labels(task.precisions))}")
    identity = deployment_identity(q)
    board.put_offer(identity, task_id, task.client, miner, task.deadline, body.timestamp,
                    body.signature)
    stored = board.offer(identity, task_id)
    assert stored is not None
    return {"taskId": task_id, "miner": stored["miner"], "until": stored["until"]}
