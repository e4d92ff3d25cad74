"""Swarms: miners that together serve a model none of them holds alone.

A registered miner that lists the model joins its swarm with a signed declaration (memory,
speed, stage endpoint and CURVE key, measured RTTs, ask) and repeats it as a heartbeat; one
silent past `swarm_member_ttl_s` has left. The market plans the layers over the live members
(`market.scheduler.live`: Parallax by default, `swarm_algorithm`), lazily: a join that
finds the live members changed stores the next version, re-placed under the churn rules
(planned outside the board's write transaction, for at most `MAX_LAYERS` layers); reading
the plan never writes. The latest `PLAN_VERSIONS_KEPT` versions are kept. Each version
carries the SwarmConsent terms the members sign (EIP-712, each with its own GPURegistry
nonce); the market checks and relays the signatures, and once the head reports the swarm
registered on-chain, checks swarmInfo against the terms before serving its id.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query

from market.admission import retry_after
from market.errors import QuarryError
from market.protocol.errors import SignatureError
from market.protocol.messages import (
    recover_swarm_join,
    recover_swarm_registered,
    swarm_terms_consent,
)
from market.scheduler.cluster import ModelSpec
from market.scheduler.live import (
    CannotCover,
    LiveMember,
    PlanState,
    model_spec_from_architecture,
    plan_live,
    plan_terms,
)
from market.service.board import I64_MAX, checksum, deployment_identity, model_id_bytes
from market.service.deps import Market, MarketDep
from market.service.http import check_skew, errors, require_signer
from market.service.routers.miners import HEARTBEAT_SKEW_S
from market.service.schemas import (
    SwarmConsentIn,
    SwarmConsentOut,
    SwarmConsentsOut,
    SwarmJoinIn,
    SwarmJoinOut,
    SwarmPlanOut,
    SwarmRegisteredIn,
    SwarmRegisteredOut,
)

router = APIRouter(tags=["swarms"])

ModelIdPath = Annotated[str, Path(pattern=r"^0x[0-9a-fA-F]{64}$",
                                  description="the model's id, 0x + 64 hex digits")]


PLAN_ATTEMPTS = 3
"""Re-plans a join tries when other processes store versions meanwhile."""


class NoSwarm(QuarryError):
    """Nothing to plan: no manifest, or no live member."""


def _key(model_id: str) -> str:
    return "0x" + model_id_bytes(model_id).hex()


def _members(rows: list[dict[str, Any]]) -> list[LiveMember]:
    return [LiveMember(r["miner"], int(r["memory_mib"]), float(r["tflops"]), r["endpoint"],
                       r["public_key"], dict(r["rtts"]), int(r["price_per_token"]))
            for r in rows]


def _declared(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """What a plan version depends on, per member: a change makes the next version."""
    return {r["miner"]: [int(r["memory_mib"]), float(r["tflops"]), r["endpoint"],
                         r["public_key"], str(r["price_per_token"])] for r in rows}


def _model(market: Market, model_id: str) -> ModelSpec:
    """The planner's view of the model from its manifest; NoSwarm without one, CannotCover
    when its architecture cannot be planned (MAX_LAYERS included)."""
    manifest = market.board.model(model_id)
    if manifest is None:
        raise NoSwarm(f"no manifest for model {model_id} on this market: upload it with "
                      "POST /models (swarms are planned from its architecture)")
    try:
        return model_spec_from_architecture(str(manifest["name"]), manifest["architecture"])
    except QuarryError as exc:
        raise CannotCover(str(exc)) from exc


def _no_live_members(market: Market, model_id: str) -> NoSwarm:
    return NoSwarm(f"model {model_id}'s swarm has no live members (a member joins with POST "
                   f"/swarms/{model_id}/members and stays by joining again within "
                   f"{market.settings.swarm_member_ttl_s:g} s)")


def _served(stored: dict[str, Any]) -> dict[str, Any]:
    return {**stored["plan"], "version": stored["version"], "swarm_id": stored["swarm_id"]}


def current_plan(market: Market, model_id: str) -> dict[str, Any]:
    """The model's latest plan, re-planned first when its live members changed; NoSwarm
    or CannotCover when there is none to serve. Planning runs outside any write
    transaction: the plan is stored only if no other process stored a version meanwhile,
    else it is made again from that one."""
    model = _model(market, model_id)
    settings = market.settings
    q = market.deployment.quarry()
    identity = deployment_identity(q)
    latest: dict[str, Any] | None = None
    for _ in range(PLAN_ATTEMPTS):
        # last-seen times are the market's wall clock (a member's own clock is not trusted)
        rows, latest = market.board.swarm_planning_input(
            identity, model_id, time.time() - settings.swarm_member_ttl_s)
        if not rows:
            raise _no_live_members(market, model_id)
        declared = _declared(rows)
        if latest is not None and latest["state"]["declared"] == declared and \
                latest["plan"]["algorithm"] == settings.swarm_algorithm:
            return _served(latest)
        previous = None if latest is None else PlanState.from_dict(latest["state"]["placement"])
        members = _members(rows)
        lp = plan_live(model, members, algorithm=settings.swarm_algorithm, previous=previous)
        by = {m.address: m for m in members}
        chain_now = max(market.now(), q.chain.timestamp())  # consent deadlines: chain time
        plan = {
            "model_id": model_id, "algorithm": lp.algorithm, "num_layers": lp.num_layers,
            "head": lp.head,
            "members": [{"address": a, "endpoint": by[a].endpoint,
                         "public_key": by[a].public_key, "layers": list(r),
                         "memory_mib": by[a].memory_mib} for a, r in lp.ranges.items()],
            "standby": lp.standby, "predicted_s_per_token": lp.predicted_s_per_token,
            "terms": plan_terms(lp, model_id, members,
                                chain_now + settings.swarm_consent_window_s),
            "replanned": lp.how}
        stored = market.board.store_swarm_plan(
            identity, model_id, None if latest is None else int(latest["version"]), plan,
            {"declared": declared, "placement": lp.state.to_dict()})
        if stored is not None:
            return _served(stored)
    if latest is None:  # others kept storing versions first: serve the newest
        raise NoSwarm(f"model {model_id}'s swarm has no plan yet")
    return _served(market.board.swarm_plan(identity, model_id) or latest)


def stored_plan(market: Market, model_id: str) -> dict[str, Any]:
    """The latest stored plan, as joins left it: a read, never a re-plan (the members'
    joins re-plan, every few seconds each). NoSwarm without a manifest, a live member or a
    plan; CannotCover when members live but none of them made a plan."""
    _model(market, model_id)
    identity = deployment_identity(market.deployment.quarry())
    rows, latest = market.board.swarm_planning_input(
        identity, model_id, time.time() - market.settings.swarm_member_ttl_s)
    if not rows:
        raise _no_live_members(market, model_id)
    if latest is None:
        raise CannotCover(f"the {len(rows)} live members of model {model_id}'s swarm cannot "
                          "hold it (no plan covers it yet)")
    return _served(latest)


@router.post("/swarms/{model_id}/members", response_model=SwarmJoinOut,
             responses=errors(400, 401, 403, 404, 429, 503))
def join(model_id: ModelIdPath, body: SwarmJoinIn, market: MarketDep) -> dict[str, Any]:
    """A miner joins the model's swarm, or stays in it (send it again well within
    `swarm_member_ttl_s`, 15 s by default). 401 when not signed by `miner`, 400 when the body
    names another model or its timestamp is over 60 s off the market's clock, 403 for a miner
    not registered in GPURegistry or that does not list the model, 404 when the market has
    no manifest for the model, 429 with Retry-After past `swarm_joins_per_s` (everyone's)
    or `swarm_joins_per_miner_per_s` (the signer's newer joins). A join no newer than the
    stored one is ignored. Answers the
    current plan's version and the layers the miner serves in it (null: standby, or no plan
    covers the model yet)."""
    miner = require_signer("swarm join", body.miner,
                           lambda: recover_swarm_join(body.model_dump()))
    key = _key(model_id)
    if _key(body.model_id) != key:
        raise HTTPException(400, f"the join is for model {body.model_id}, not {model_id}")
    check_skew("swarm join", body.timestamp, 400, HEARTBEAT_SKEW_S)
    wait = market.joins_by_miner.wait_signed(miner, body.timestamp)
    if wait > 0:  # before the chain is asked or anything planned
        after = retry_after(wait)
        raise HTTPException(429, f"{miner} joins more often than "
                            f"{market.joins_by_miner.limit.describe()}: retry after {after} s",
                            headers={"Retry-After": after})
    q = market.deployment.quarry()
    if not q.gpu.is_registered(miner):
        raise HTTPException(403, f"{miner} is not a registered miner: swarm members are "
                            "miners registered in GPURegistry (`miner register`)")
    if model_id_bytes(key) not in q.gpu.models_of(miner):
        raise HTTPException(403, f"{miner} does not list model {key} in GPURegistry: "
                            "register it for the model it joins a swarm of")
    if market.board.model(key) is None:
        raise HTTPException(404, f"no manifest for model {key} on this market: upload it "
                            "with POST /models (swarms are planned from its architecture)")
    member = body.model_dump()
    member["rtts"] = {checksum(a, "rtts address"): t for a, t in body.rtts.items()}
    market.board.record_swarm_member(deployment_identity(q), key, member)
    version, layers = None, None
    try:
        plan = current_plan(market, key)
    except (NoSwarm, CannotCover):
        pass
    else:
        version = plan["version"]
        layers = next((m["layers"] for m in plan["members"] if m["address"] == miner), None)
    return {"miner": miner, "model_id": key, "version": version, "layers": layers,
            "ttl_s": market.settings.swarm_member_ttl_s}


@router.get("/swarms/{model_id}/plan", response_model=SwarmPlanOut,
            responses=errors(400, 404, 409, 503))
def plan(model_id: ModelIdPath, market: MarketDep) -> dict[str, Any]:
    """The live plan of the model's swarm: which member serves which layers, the head, the
    predicted time per token, and the SwarmConsent terms each member signs. `version` grows
    on every re-plan, which the members' joins make (a member joined, left, or changed what
    it declared); reading it never re-plans. 404 when the model has no manifest or no live
    member, 409 when the live members cannot hold it."""
    try:
        return stored_plan(market, _key(model_id))
    except NoSwarm as exc:
        raise HTTPException(404, str(exc)) from exc
    except CannotCover as exc:
        raise HTTPException(409, str(exc)) from exc


@router.post("/swarms/{model_id}/consents", response_model=SwarmConsentOut,
             responses=errors(400, 401, 403, 404, 409, 503))
def consent(model_id: ModelIdPath, body: SwarmConsentIn, market: MarketDep) -> dict[str, Any]:
    """A member's EIP-712 SwarmConsent signature of plan `version`'s terms at `nonce`, in
    GPURegistry's domain. 404 for an unknown version, 409 for a superseded one, one without
    terms, or a nonce that is not the member's current one in GPURegistry; 403 from a
    miner that is not a member of the terms, 401 when the signature is not the member's."""
    key = _key(model_id)
    q = market.deployment.quarry()
    identity = deployment_identity(q)
    stored = market.board.swarm_plan(identity, key, body.version)
    if stored is None:
        raise HTTPException(404, f"model {key}'s swarm has no plan version {body.version}")
    latest = market.board.swarm_plan(identity, key)
    assert latest is not None
    if latest["version"] != body.version:
        raise HTTPException(409, f"plan version {body.version} is superseded by version "
                            f"{latest['version']}: consent to the current plan")
    terms = stored["plan"]["terms"]
    if terms is None:
        raise HTTPException(409, f"plan version {body.version} has no swarm terms (fewer than "
                            "2 or more than 16 members serve layers)")
    member = checksum(body.member, "member")
    if member not in terms["members"]:
        raise HTTPException(403, f"{member} is not a member of plan version {body.version}")
    try:
        signer = swarm_terms_consent(terms, body.nonce).recover(
            bytes.fromhex(body.signature[2:]), q.chain_id, q.gpu.address)
    except SignatureError as exc:
        raise HTTPException(400, str(exc)) from exc
    if signer != member:
        raise HTTPException(401, f"the consent for {member} to plan version {body.version} "
                            f"at nonce {body.nonce} is signed by {signer}")
    current = q.gpu.nonces(member)
    if body.nonce != current:
        raise HTTPException(409, f"nonce {body.nonce} is not {member}'s current GPURegistry "
                            f"consent nonce ({current})")
    market.board.put_swarm_consent(identity, key, body.version, member, body.nonce,
                                   body.signature)
    return {"member": member, "version": body.version}


@router.get("/swarms/{model_id}/consents", response_model=SwarmConsentsOut,
            responses=errors(400, 404, 503))
def consents(model_id: ModelIdPath, market: MarketDep,
             version: int | None = Query(None, ge=1, le=I64_MAX)) -> dict[str, Any]:
    """The consents stored for plan `version` (the latest by default); `complete` once every
    member of its terms has consented, when the head can register the swarm on-chain."""
    key = _key(model_id)
    identity = deployment_identity(market.deployment.quarry())
    stored = market.board.swarm_plan(identity, key, version)
    if stored is None:
        raise HTTPException(404, f"model {key}'s swarm has no plan"
                            + ("" if version is None else f" version {version}"))
    signatures = market.board.swarm_consents(identity, key, stored["version"])
    terms = stored["plan"]["terms"]
    complete = terms is not None and all(m in signatures for m in terms["members"])
    return {"version": stored["version"], "signatures": signatures, "complete": complete}


@router.post("/swarms/{model_id}/registered", response_model=SwarmRegisteredOut,
             responses=errors(400, 401, 403, 404, 409, 503))
def registered(model_id: ModelIdPath, body: SwarmRegisteredIn,
               market: MarketDep) -> dict[str, Any]:
    """The plan's head reports plan `version` registered on-chain as `swarm_id`; the market
    serves the id with the plan once GPURegistry.swarmInfo matches the plan's terms (model,
    head, members, shares, price) and the swarm is active, else 409 naming the difference.
    401 when not signed by `head`, 403 when it is not the plan's head, 404 for an unknown
    version, 400 for a timestamp over 120 s off."""
    key = _key(model_id)
    head = require_signer("swarm registration report", body.head,
                          lambda: recover_swarm_registered(body.model_dump(), key), "head")
    check_skew("swarm registration report", body.timestamp, 400)
    q = market.deployment.quarry()
    identity = deployment_identity(q)
    stored = market.board.swarm_plan(identity, key, body.version)
    if stored is None:
        raise HTTPException(404, f"model {key}'s swarm has no plan version {body.version}")
    terms = stored["plan"]["terms"]
    if head != stored["plan"]["head"]:
        raise HTTPException(403, f"{head} is not the head of plan version {body.version} "
                            f"({stored['plan']['head']})")
    if terms is None:
        raise HTTPException(409, f"plan version {body.version} has no swarm terms")
    if body.swarm_id > q.gpu.swarm_count():
        raise HTTPException(409, f"GPURegistry {q.gpu.address} has no swarm {body.swarm_id}")
    info = q.gpu.swarm_info(body.swarm_id)
    want = {"model_id": key, "head": terms["head"], "members": list(terms["members"]),
            "shares": list(terms["shares"]), "price_per_token": int(terms["price_per_token"]),
            "active": True}
    have = {"model_id": "0x" + info.model_id.hex(), "head": info.head,
            "members": list(info.members), "shares": list(info.shares),
            "price_per_token": info.price_per_token, "active": info.active}
    wrong = [f"{k} {have[k]!r} (plan: {want[k]!r})" for k in want if have[k] != want[k]]
    if wrong:
        raise HTTPException(409, f"swarm {body.swarm_id} does not match plan version "
                            f"{body.version}: " + "; ".join(wrong))
    market.board.set_swarm_id(identity, key, body.version, body.swarm_id)
    return {"version": body.version, "swarm_id": body.swarm_id}
