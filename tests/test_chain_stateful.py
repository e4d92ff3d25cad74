"""Random task life cycles on Anvil (Hypothesis stateful testing).

Whatever the sequence of create, claim, submit, wait, finalize, reclaim, refund, cancel and
withdraw: PaymentEscrow's balance equals totalEscrowed + totalWithdrawable, the per-task
escrows add up to totalEscrowed, no miner's locked collateral exceeds its stake, every
withdraw pays exactly what was owed, nothing panics, and a Python mirror of every shard's
state, updated only from the actions' own results, agrees with the contract's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from market.chain.contracts import ShardState
from market.chain.errors import ContractRevert
from market.protocol import input_tree, keccak

if TYPE_CHECKING:
    from conftest import Devnet

pytestmark = [pytest.mark.chain, pytest.mark.timeout(300)]
MAX_TOKENS = 4
S = ShardState


def attempt(action: Any) -> Any:
    """Run an action that may legitimately revert (returns None then); a Panic, a bare revert
    or an unknown error is a bug and propagates."""
    try:
        return action()
    except ContractRevert as exc:
        if exc.error in ("Panic", "Unknown", "", "Error"):
            raise
        return None


def make_machine(net: Devnet) -> type[RuleBasedStateMachine]:
    q, chain = net.q, net.chain
    clients = [net.client, net.client2]
    miners = [net.miner, net.miner2, net.outsider]  # the outsider is never eligible
    everyone = [*clients, net.miner, net.miner2, net.anyone]

    class EscrowMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.snapshot = chain.snapshot()
            self.shards: dict[tuple[int, int], ShardState] = {}  # the mirror
            self.client_of: dict[int, Any] = {}
            self.cancelled: set[int] = set()
            self.deadline: dict[int, int] = {}
            self.now = chain.timestamp()
            self.touched: set[tuple[int, int]] = set()  # shards the last step may have changed

        def teardown(self) -> None:
            try:
                self.touched = set(self.shards)
                self.mirror_matches_chain()
            finally:
                chain.revert_to(self.snapshot)

        def _set(self, key: tuple[int, int], state: ShardState) -> None:
            self.shards[key] = state
            self.touched.add(key)

        def _in(self, *states: ShardState) -> list[tuple[int, int]]:
            return sorted(k for k, v in self.shards.items() if v in states)

        def _pick(self, i: int, *states: ShardState) -> tuple[int, int]:
            keys = self._in(*states)
            return keys[i % len(keys)]

        @initialize(n=st.integers(1, 5), size=st.integers(1, 3))
        def first_task(self, n: int, size: int) -> None:
            self.create(n, size, 0)

        @precondition(lambda self: len(self.client_of) < 4)
        @rule(n=st.integers(1, 5), size=st.integers(1, 3), who=st.integers(0, 1))
        def create(self, n: int, size: int, who: int) -> None:
            hashes = [keccak(f"{len(self.client_of)}-{i}".encode()) for i in range(n)]
            task_id, _ = q.tasks.create_task(
                clients[who], model_id=net.MODEL_ID, input_root=input_tree(hashes).root,
                input_uri="store://in", num_requests=n, shard_size=size,
                max_tokens_per_request=MAX_TOKENS, price_per_token=net.PRICE,
                deadline=self.now + 3000,
            )
            self.client_of[task_id] = clients[who]
            self.deadline[task_id] = self.now + 3000
            for s in range(-(-n // size)):
                self._set((task_id, s), S.OPEN)

        @precondition(lambda self: self._in(S.OPEN))
        @rule(i=st.integers(0, 50), who=st.sampled_from([0, 0, 1, 1, 2]))
        def claim(self, i: int, who: int) -> None:
            key = self._pick(i, S.OPEN)
            if attempt(lambda: q.tasks.claim_shard(miners[who], *key)):
                self._set(key, S.CLAIMED)

        @precondition(lambda self: self._in(S.CLAIMED))
        @rule(i=st.integers(0, 50), frac=st.floats(0, 1))
        def submit(self, i: int, frac: float) -> None:
            key = self._pick(i, S.CLAIMED)
            miner_address = q.tasks.get_shard(*key).miner
            miner = next(m for m in miners if m.address == miner_address)
            start, end = q.tasks.shard_range(*key)
            tokens = int(frac * (end - start) * MAX_TOKENS)
            if attempt(lambda: q.tasks.submit_result(miner, *key, keccak(b"out"), "o", tokens)):
                self._set(key, S.SUBMITTED)

        @rule(seconds=st.sampled_from([1, 61, 61, 601, 3001]))
        def wait(self, seconds: int) -> None:
            self.now = chain.advance_time(seconds)

        @precondition(lambda self: self._in(S.SUBMITTED))
        @rule(i=st.integers(0, 50))
        def finalize(self, i: int) -> None:
            key = self._pick(i, S.SUBMITTED)
            if attempt(lambda: q.tasks.finalize_shard(net.anyone, *key)):
                self._set(key, S.FINALIZED)

        @precondition(lambda self: self._in(S.CLAIMED))
        @rule(i=st.integers(0, 50))
        def reclaim(self, i: int) -> None:
            key = self._pick(i, S.CLAIMED)
            tx = attempt(lambda: q.tasks.reclaim_expired(net.anyone, *key))
            if tx:
                reopened = tx.event("ClaimReclaimed")["reopened"]
                self._set(key, S.OPEN if reopened else S.REFUNDED)

        def _overdue(self) -> list[tuple[int, int]]:
            return [k for k in self._in(S.OPEN, S.CLAIMED) if self.deadline[k[0]] <= self.now]

        @precondition(lambda self: self._overdue())
        @rule(i=st.integers(0, 50))
        def refund(self, i: int) -> None:
            overdue = self._overdue()
            key = overdue[i % len(overdue)]
            if attempt(lambda: q.tasks.refund_unfinished(net.anyone, *key)):
                self._set(key, S.REFUNDED)

        def _cancellable(self) -> list[int]:
            """Tasks not cancelled with work in flight: the interesting (and rarer) case."""
            busy = {t for t, _ in self._in(S.CLAIMED, S.SUBMITTED)}
            return sorted(busy - self.cancelled)

        @precondition(lambda self: self._cancellable())
        @rule(i=st.integers(0, 50))
        def cancel(self, i: int) -> None:
            live = self._cancellable()
            task_id = live[i % len(live)]
            if attempt(lambda: q.tasks.cancel_task(self.client_of[task_id], task_id)):
                self.cancelled.add(task_id)
                for key, state in list(self.shards.items()):
                    if key[0] == task_id and state == S.OPEN:
                        self._set(key, S.REFUNDED)

        @rule(who=st.integers(0, 4))
        def withdraw(self, who: int) -> None:
            account = everyone[who]
            owed = q.escrow.withdrawable(account.address)
            before = chain.balance(account.address)
            tx = attempt(lambda: q.escrow.withdraw(account))
            if owed == 0:
                assert tx is None
            else:
                assert chain.balance(account.address) == before + owed - tx.gas_cost

        @invariant()
        def escrow_balance_is_escrowed_plus_withdrawable(self) -> None:
            total_escrowed = q.escrow.total_escrowed()
            assert q.escrow.balance() == total_escrowed + q.escrow.total_withdrawable()
            assert sum(q.escrow.escrowed(t) for t in self.client_of) == total_escrowed

        @invariant()
        def collateral_never_exceeds_stake(self) -> None:
            for m in (net.miner, net.miner2):
                info = q.gpu.miner_info(m.address)
                assert 0 <= info.locked <= info.stake

        @invariant()
        def mirror_matches_chain(self) -> None:
            """The shards the last step touched (every shard at teardown)."""
            for key in sorted(self.touched):
                assert q.tasks.get_shard(*key).state == self.shards[key], key
            self.touched = set()

    return EscrowMachine


def test_escrow_invariant_under_random_life_cycles(devnet: Devnet) -> None:
    run_state_machine_as_test(make_machine(devnet), settings=settings(
        max_examples=6, stateful_step_count=30, deadline=None, derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    ))
