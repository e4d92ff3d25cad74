"""A miner's standing in one word, the same for `miner status`, `GET /miners` and the
dashboard, from what GPURegistry says (`isEligible`'s rules, in order):

- "exiting": it asked to leave; it claims nothing new;
- "untrusted": reputation under `untrustedBelowBps`: it claims nothing, not even the
  committee's challenges, until it pays `miner rechallenge`;
- "re-challenged": untrusted, but it paid to be challenged again: until the next report it
  may claim tasks that allow probation and set no reputation floor (the challenges);
- "on probation": new, re-registered, or back on probation after missing too many
  challenges in a row: it claims only tasks that allow probation;
- "trusted": every task its reputation meets the floor of.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from market.chain.deploy import Quarry

STANDINGS = ("exiting", "untrusted", "re-challenged", "on probation", "trusted")


def miner_standing(*, reputation_bps: int, untrusted_below_bps: int, on_probation: bool,
                   rechallenge_pending: bool = False, exiting: bool = False) -> str:
    """One of `STANDINGS` (see the module docstring)."""
    if exiting:
        return "exiting"
    if reputation_bps < untrusted_below_bps:
        return "re-challenged" if rechallenge_pending else "untrusted"
    return "on probation" if on_probation else "trusted"


def why_not_eligible(q: Quarry, miner: str, model_id: bytes, min_reputation_bps: int = 0,
                     allow_probation: bool = False) -> str:
    """Why `GPURegistry.isEligible(miner, model_id, min_reputation_bps, allow_probation)` is
    false, in words that say what to do (checked in the contract's order); "" when it is
    eligible."""
    gpu = q.gpu
    if not gpu.is_registered(miner):
        return f"miner {miner} is not registered (run `miner register`)"
    if gpu.is_eligible(miner, model_id, min_reputation_bps, allow_probation):
        return ""
    info = gpu.miner_info(miner)
    if info.exit_requested_at:
        return f"miner {miner} has requested exit and may claim no new shards"
    if model_id not in gpu.models_of(miner):
        served = ", ".join("0x" + m.hex() for m in gpu.models_of(miner)) or "nothing"
        return (f"miner {miner} does not serve model 0x{model_id.hex()} (it serves {served}; "
                "add the model's directory to model_dirs and rerun `miner register`)")
    if info.stake < gpu.min_stake():
        return (f"miner {miner}'s stake {info.stake} wei is below the minimum "
                f"{gpu.min_stake()} wei (add stake)")
    untrusted = gpu.untrusted_below_bps()
    if info.reputation_bps < untrusted:
        if gpu.rechallenge_pending(miner):
            return (f"miner {miner} is untrusted (reputation {info.reputation_bps} bps, under "
                    f"{untrusted}) with a re-challenge pending: until the next report it may "
                    "claim only tasks that allow probation and set no reputation floor")
        return (f"miner {miner} is untrusted (reputation {info.reputation_bps} bps, under "
                f"{untrusted}): it claims nothing, not even the committee's challenges, until "
                "it pays to be challenged again (`miner rechallenge`)")
    if info.on_probation and not allow_probation:
        epochs, pass_bps = gpu.probation_params()
        return (f"miner {miner} is on probation ({info.passed_epochs} of {epochs} passing "
                f"reports; {epochs} in a row at or above {pass_bps} bps end it): the task does "
                "not allow miners on probation")
    return (f"miner {miner}'s reputation {info.reputation_bps} bps is below the task's floor "
            f"of {min_reputation_bps} bps")
