"""Gas of Quarry's on-chain steps, on a fresh Anvil with the devnet parameters.

- The task life cycle (createTask, claimShard, submitResult, finalizeShard) for a task of 10
  requests and one of 10,000, each a single shard. Only roots, hashes and counts go on-chain,
  so the two should cost the same to within a few percent whatever the batch size (the
  flatness ratio).
- An availability challenge and its answer on a 10-request and on a 10,000-request shard:
  the answer carries a result-tree proof, which grows with log2(n), so it is reported for
  both; settling an unanswered challenge.
- A dispute: openDispute (with the receipt's proof), then the castVotes that resolves it
  (three of four equal stakes), for either verdict. The committee is the devnet's: four
  verifiers of 1 ETH, registered and seated here.
- proveBillingFault on a receipt billing more than maxTokensPerRequest (proven by the receipt
  alone), and VerifierCommittee.register of a fifth verifier.
- proveSumFault on a 10-request and a 10,000-request shard whose tree records one token too
  many for receipt 0 in its parent (a lie in an inner node, which every other receipt's
  proof hides): the path from receipt 0 grows with log2(n), as the answer's proof does.
- Swarms: registerSwarm of four members (four EIP-712 consents checked on-chain), then a
  10-request shard claimed by the head for the swarm (collateral locked from the head alone),
  submitted, and finalized (the payment credited to four members), next to the same steps
  for a single miner; an unanswered challenge on a swarm shard (the head alone slashed).

The roots are real: the input tree over the requests' hashes and the result sum tree over
the receipts, built by `market.protocol`; tokensUsed is the tree's sum. Every receipt signs an
activation commitment's hash (what a committing engine's outputs carry), and every task
accepts a set of precisions (bf16 and fp32: the miner's fp32 and the swarm's bf16) and
requires commitments, so the figures include storing and checking both. The miner registers
with probation switched off (`gpu.set_probation(deployer, 0, ...)` around its registration,
as the devnet fixture does for its established miners), so it claims ordinary tasks. One
warm-up of each kind runs first, so no figure pays the first write of a counter or a
balance. Runs its own Anvil (stopped at the end); prints one JSON object last.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass

from eth_account.signers.local import LocalAccount

from market.chain.client import Chain, TxResult, anvil_account
from market.chain.contracts import GpuSpec
from market.chain.deploy import Quarry, deploy
from market.chain.devnet import start_anvil
from market.protocol import (
    Receipt,
    ResultTree,
    SumNode,
    Vote,
    input_tree,
    keccak,
    output_hash,
    quorum_signatures,
    receipts_tree,
    request_hash,
)
from market.protocol.commitments import commitment_hash
from market.protocol.eip712 import SwarmConsent
from market.protocol.merkle import receipt_leaf, sum_lie_path
from market.protocol.precision import Precision, precision_mask

MODEL_ID = keccak(b"benchmark model manifest")
MAX_TOKENS = 16
PRICE = 10**9
SIZES = (10, 10_000)
ETHER = 10**18

DEPLOYER, CLIENT, MINER, ANYONE = (anvil_account(i) for i in (0, 1, 2, 3))
VERIFIERS = [anvil_account(i) for i in (6, 7, 8, 9)]
NEWCOMER = anvil_account(10)
SWARM = sorted((anvil_account(i) for i in (11, 12, 13, 14)), key=lambda a: int(a.address, 16))
SWARM_LAYERS = (3, 2, 2, 1)  # layers of an 8-layer model per member


def requests(n: int, tag: str) -> list[dict]:
    return [
        {"custom_id": f"{tag}-{i}", "method": "POST", "url": "/v1/completions",
         "body": {"model": "tiny", "prompt": f"Question {i}: what is {i} + {i}?",
                  "max_tokens": MAX_TOKENS, "temperature": 0, "seed": i}}
        for i in range(n)
    ]


@dataclass
class Submitted:
    task_id: int
    receipts: list[Receipt]
    tree: ResultTree
    create: TxResult
    claim: TxResult
    submit: TxResult


def submitted_shard(q: Quarry, chain: Chain, n: int, tag: str,
                    over_cap: bool = False, swarm_id: int = 0, lie: int = 0) -> Submitted:
    """A task of n requests in one shard, claimed and submitted with its result sum tree
    (`over_cap`: receipt 0 bills maxTokensPerRequest + 1 tokens; `swarm_id`: claimed by
    that swarm's head, SWARM[0], for the swarm; `lie`: receipt 0's parent records `lie`
    tokens more than it bills)."""
    hashes = [request_hash(r) for r in requests(n, tag)]
    root = input_tree(hashes).root
    task_id, create = q.tasks.create_task(
        CLIENT, model_id=MODEL_ID, input_root=root, input_uri=f"store://inputs/{root.hex()}",
        num_requests=n, shard_size=n, max_tokens_per_request=MAX_TOKENS,
        price_per_token=PRICE, deadline=chain.timestamp() + 3600,
        precisions=precision_mask([Precision.FP32, Precision.BF16]), require_commitments=True,
    )
    miner = SWARM[0] if swarm_id else MINER
    claim = (q.tasks.claim_shard_for_swarm(miner, task_id, 0, swarm_id) if swarm_id
             else q.tasks.claim_shard(miner, task_id, 0))
    receipts = []
    for i, h in enumerate(hashes):
        ids = [(i * 7 + k) % 50_000 for k in range(1 + i % MAX_TOKENS)]
        count = MAX_TOKENS + 1 if over_cap and i == 0 else len(ids)
        receipts.append(Receipt(task_id, 0, i, h, output_hash(f"{2 * i}", ids), count,
                                MODEL_ID, commitment_hash(b"activations %d" % i)))
    tree = receipts_tree(receipts)
    if lie:
        leaves = list(tree.leaves)
        leaves[0] = SumNode(leaves[0].hash, leaves[0].sum + lie)
        tree = ResultTree(leaves)
    submit = q.tasks.submit_result(miner, task_id, 0, tree.root,
                                   f"store://results/{tree.root.hex()}", tree.total)
    return Submitted(task_id, receipts, tree, create, claim, submit)


def lifecycle(q: Quarry, chain: Chain, n: int, swarm_id: int = 0) -> dict[str, int]:
    s = submitted_shard(q, chain, n, f"life{n}-{swarm_id}", swarm_id=swarm_id)
    chain.advance_time(q.tasks.params()["challenge_window"])
    finalize = q.tasks.finalize_shard(ANYONE, s.task_id, 0)
    steps = {"createTask": s.create.gas_used, "claimShard": s.claim.gas_used,
             "submitResult": s.submit.gas_used, "finalizeShard": finalize.gas_used}
    return steps | {"total": sum(steps.values())}


def availability(q: Quarry, chain: Chain, n: int) -> dict[str, int]:
    """Challenge the shard's middle request and answer with its proof."""
    s = submitted_shard(q, chain, n, f"avail{n}")
    index = n // 2
    bond = q.arbitration.min_availability_bond()
    challenge_id, challenge = q.arbitration.challenge_availability(CLIENT, s.task_id, 0,
                                                                   index, bond)
    proof = s.tree.proof(index)
    answer = q.arbitration.answer_availability(MINER, challenge_id, s.receipts[index], proof)
    return {"challengeAvailability": challenge.gas_used, "answerAvailability": answer.gas_used,
            "proof_nodes": len(proof)}


def form_swarm(q: Quarry, chain: Chain) -> tuple[int, int]:
    """The four SWARM miners consent to one swarm (head SWARM[0]); returns (id, gas)."""
    consent = SwarmConsent.for_plan(
        MODEL_ID, SWARM[0].address, dict(zip((m.address for m in SWARM), SWARM_LAYERS,
                                             strict=True)),
        PRICE, chain.timestamp() + 600)
    sigs = [q.gpu.sign_swarm_consent(consent, m) for m in SWARM]
    swarm_id, tx = q.gpu.register_swarm(ANYONE, consent, sigs)
    return swarm_id, tx.gas_used


def unanswered(q: Quarry, chain: Chain, swarm_id: int = 0) -> int:
    s = submitted_shard(q, chain, 10, f"unanswered{swarm_id}", swarm_id=swarm_id)
    bond = q.arbitration.min_availability_bond()
    challenge_id, _ = q.arbitration.challenge_availability(CLIENT, s.task_id, 0, 3, bond)
    chain.advance_time(q.arbitration.response_window())
    return q.arbitration.settle_unanswered(ANYONE, challenge_id).gas_used


def dispute(q: Quarry, chain: Chain, fault: bool, tag: str) -> dict[str, int]:
    """A dispute over receipt 4 of a 10-request shard, resolved by three of the four
    verifiers' signatures."""
    s = submitted_shard(q, chain, 10, tag)
    dispute_id, opened = q.arbitration.open_dispute(
        CLIENT, s.task_id, 0, s.receipts[4], s.tree.proof(4), "store://evidence",
        q.arbitration.min_bond())
    sigs = quorum_signatures(Vote(dispute_id, fault), [v.key for v in VERIFIERS[:3]],
                             chain.chain_id, q.arbitration.address)
    votes = q.arbitration.cast_votes(ANYONE, dispute_id, fault, sigs)
    assert votes.all("DisputeResolved"), "three of four equal stakes must resolve it"
    return {"openDispute": opened.gas_used, "castVotes": votes.gas_used}


def billing_fault(q: Quarry, chain: Chain, tag: str) -> int:
    s = submitted_shard(q, chain, 10, tag, over_cap=True)
    return q.arbitration.prove_billing_fault(CLIENT, s.task_id, 0, s.receipts[0],
                                             s.tree.proof(0), bytes(32), []).gas_used


def sum_fault(q: Quarry, chain: Chain, n: int, tag: str) -> dict[str, int]:
    """proveSumFault from receipt 0's path, found as a client finds it (`sum_lie_path`): from
    the receipts and the sums another receipt's proof records."""
    s = submitted_shard(q, chain, n, tag, lie=1)
    found = sum_lie_path([receipt_leaf(r) for r in s.receipts], {1: s.tree.proof(1)},
                         s.tree.root, s.tree.total, prefer=(0,))
    assert found is not None and found[0] == 0, "the lie is on receipt 0's path"
    tx = q.arbitration.prove_sum_fault(CLIENT, s.task_id, 0, s.receipts[0], found[1])
    return {"proveSumFault": tx.gas_used, "path_steps": len(found[1])}


def seat(q: Quarry, chain: Chain, verifiers: list[LocalAccount]) -> list[int]:
    """Register `verifiers` with 1 ETH each and move the clock to the epoch where they sit;
    returns each registration's gas."""
    gas = [q.committee.register(v, ETHER).gas_used for v in verifiers]
    at = max(q.committee.verifier_info(v.address).active_from for v in verifiers)
    chain.advance_time(max(1, q.committee.epoch_start(at) - chain.timestamp()))
    return gas


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true",
                        help="seconds: the large task has 100 requests, not 10,000; checks "
                        "that the script runs (make test), not its figures")
    args = parser.parse_args(argv)
    sizes = (SIZES[0], 100) if args.smoke else SIZES
    anvil = start_anvil(silent=True, die_with_parent=True)
    try:
        chain = Chain(anvil.rpc_url)
        deployment, _ = deploy(chain, DEPLOYER)
        q = Quarry(deployment, chain)
        probation = q.gpu.probation_params()
        q.gpu.set_probation(DEPLOYER, 0, probation[1])  # an established miner
        q.gpu.register(MINER, [MODEL_ID], GpuSpec("NVIDIA H100", 81920, 1),
                       "http://127.0.0.1:9100", PRICE, 10**18, [Precision.FP32])
        for i, m in enumerate(SWARM):  # swarm members serve layers of the model, in bf16
            q.gpu.register(m, [MODEL_ID], GpuSpec("RTX 4090", 24576, 1),
                           f"http://127.0.0.1:{9200 + i}", PRICE, 10**18, [Precision.BF16])
        q.gpu.set_probation(DEPLOYER, *probation)
        seat(q, chain, VERIFIERS)

        # Warm-ups: the first task, challenge, dispute and billing proof pay first writes
        # (taskCount, escrow totals, the miner's lock slot, challenge and dispute counters,
        # the voters' escrow balances), not the measured ones.
        lifecycle(q, chain, 2)
        availability(q, chain, 2)
        dispute(q, chain, True, "warm-dispute")
        billing_fault(q, chain, "warm-billing")
        form_swarm(q, chain)
        lifecycle(q, chain, 2, swarm_id=1)

        results = {}
        for n in sizes:
            started = time.perf_counter()
            results[n] = lifecycle(q, chain, n)
            print(f"{n:>6} requests: {results[n]} ({time.perf_counter() - started:.1f}s)")
        challenges = {n: availability(q, chain, n) for n in sizes}
        for n, c in challenges.items():
            print(f"{n:>6} requests: availability {c}")
        settle = unanswered(q, chain)
        fault = dispute(q, chain, True, "fault")
        no_fault = dispute(q, chain, False, "no-fault")
        billing = billing_fault(q, chain, "billing")
        sums = {n: sum_fault(q, chain, n, f"sum{n}") for n in sizes}
        for n, f in sums.items():
            print(f"{n:>6} requests: billing lie in an inner node {f}")
        register = q.committee.register(NEWCOMER, ETHER).gas_used
        swarm_id, swarm_register = form_swarm(q, chain)
        single = lifecycle(q, chain, 10)
        swarm = lifecycle(q, chain, 10, swarm_id=swarm_id)
        swarm_settle = unanswered(q, chain, swarm_id)
        print(f"swarm of {len(SWARM)}: registerSwarm {swarm_register}; 10 requests {swarm} "
              f"(single miner {single}); settleUnanswered {swarm_settle}")
        print(f"settleUnanswered {settle}; dispute, fault {fault}; no fault {no_fault}; "
              f"proveBillingFault {billing}; VerifierCommittee.register {register}")
    finally:
        anvil.stop()
    small, large = results[sizes[0]]["total"], results[sizes[1]]["total"]
    ratio = large / small
    print(json.dumps({
        "gas_lifecycle_10": small,
        "gas_lifecycle_10000": large,
        "ratio": round(ratio, 4),
        "within_5pct": abs(ratio - 1) <= 0.05,
        "steps_10": results[sizes[0]],
        "steps_10000": results[sizes[1]],
        "gas_challenge_availability_10": challenges[sizes[0]]["challengeAvailability"],
        "gas_answer_availability_10": challenges[sizes[0]]["answerAvailability"],
        "proof_nodes_10": challenges[sizes[0]]["proof_nodes"],
        "gas_challenge_availability_10000": challenges[sizes[1]]["challengeAvailability"],
        "gas_answer_availability_10000": challenges[sizes[1]]["answerAvailability"],
        "proof_nodes_10000": challenges[sizes[1]]["proof_nodes"],
        "smoke": args.smoke,
        "gas_settle_unanswered": settle,
        "gas_open_dispute": fault["openDispute"],
        "gas_cast_votes_fault": fault["castVotes"],
        "gas_cast_votes_no_fault": no_fault["castVotes"],
        "gas_dispute_fault_total": fault["openDispute"] + fault["castVotes"],
        "gas_prove_billing_fault_cap": billing,
        "gas_prove_sum_fault_10": sums[sizes[0]]["proveSumFault"],
        "path_steps_10": sums[sizes[0]]["path_steps"],
        "gas_prove_sum_fault_10000": sums[sizes[1]]["proveSumFault"],
        "path_steps_10000": sums[sizes[1]]["path_steps"],
        "gas_verifier_register": register,
        "swarm_members": len(SWARM),
        "gas_register_swarm": swarm_register,
        "gas_claim_shard_single": single["claimShard"],
        "gas_claim_shard_swarm": swarm["claimShard"],
        "gas_finalize_shard_single": single["finalizeShard"],
        "gas_finalize_shard_swarm": swarm["finalizeShard"],
        "gas_lifecycle_swarm_10": swarm["total"],
        "gas_settle_unanswered_swarm": swarm_settle,
    }))
    return 0 if abs(ratio - 1) <= 0.05 or args.smoke else 1


if __name__ == "__main__":
    raise SystemExit(main())
