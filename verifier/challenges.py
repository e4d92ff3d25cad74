"""Challenge sets: which miners an epoch challenges and with which prompts, and how the leader
sends them.

A challenge set names every miner eligible for the committee's model and gives each its own
job, drawn to look like a client's (`draw_challenge_set`): prompts made from private
randomness (never passages of the public corpus), chat or plain completions, a batch size,
max_tokens, temperature profile (all greedy, all sampled, or mixed), top_p, seeds and
custom ids each drawn per job as clients choose them. The committee signs its hash and
commits it on-chain one epoch ahead; the prompts themselves travel only inside the
committee (the relay reads are members-only). The leader then posts each miner's challenge
as an ordinary paid task, from a fresh address, at a price a little above the miner's ask
and with a deadline of its own, directed at that miner with a market offer: exactly what a
client that picks its miner does.

What stays distinguishable on a public chain: the client is a fresh address funded by a
committee member shortly before; the task is always directed (an undirected challenge could
be served by another miner); and the job's size stays within the committee's bounds. Audits
of client traffic (`verifier.audits`) are the structural answer to a miner that acts on it.
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eth_account import Account
from eth_utils import encode_hex, to_checksum_address

from market.chain.contracts import ShardState
from market.errors import QuarryError
from market.model.corpus import CORPUS
from market.protocol.canonical import canonical_json_bytes, keccak, request_hash
from market.protocol.merkle import input_tree
from market.protocol.precision import ANY as ANY_PRECISION
from market.protocol.requests import (
    CHAT_COMPLETIONS_URL,
    COMPLETIONS_URL,
    encode_jsonl,
    validate_request,
)
from market.protocol.results import ResultCheckFailed
from market.store import ContentNotFound, StoreError

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from market.chain.deploy import Quarry
    from market.marketapi import MarketAPI
    from market.protocol.results import ResultItem

SAMPLED_TEMPERATURE = 0.8
"""The temperature a mixed or sampled job is drawn around (see TEMPERATURES)."""
TEMPERATURES = (0.5, 0.7, 0.8, 0.9, 1.0)
TOP_PS = (1.0, 1.0, 1.0, 0.95, 0.9)
PROFILES = ("mixed", "mixed", "mixed", "sampled", "greedy")
"""Per job: every line greedy, every line sampled, or each line either (a fair coin); mixed
is the likeliest, so most epochs carry both kinds of evidence."""
ID_STYLES = ("request-{i}", "req_{i:04d}", "row-{i}", "item{i}", "{tag}-{i}", "q{i}")
OPENERS = ("", "", "", "Please ", "Can you ", "Quick question: ", "Summarise: ", "Rewrite: ",
           "Translate to plain English: ", "Explain ", "List ", "Write about ")
# Gas the fresh client address needs for createTask, an availability challenge and a dispute,
# funded by the leader (the bonds are funded on top).
GAS_ALLOWANCE_WEI = 10**16


WITHHELD = "a result root was committed but its document is not published"


class ChallengeSetInvalid(QuarryError):
    """A proposed challenge set breaks a rule (the message names which)."""


@dataclass(frozen=True)
class Challenge:
    """One miner's prompts for an epoch, as OpenAI Batch request lines."""

    miner: str
    lines: tuple[dict[str, Any], ...]

    @property
    def data(self) -> bytes:
        return encode_jsonl(self.lines)

    @property
    def request_hashes(self) -> list[bytes]:
        return [request_hash(line) for line in self.lines]

    @property
    def input_root(self) -> bytes:
        return input_tree(self.request_hashes).root

    @property
    def max_tokens(self) -> int:
        return max(int(line["body"]["max_tokens"]) for line in self.lines)


@dataclass(frozen=True)
class ChallengeSet:
    """An epoch's challenges, one per miner, sorted by miner address."""

    epoch: int
    model_id: bytes
    challenges: tuple[Challenge, ...]

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "modelId": encode_hex(self.model_id),
                "challenges": [{"miner": c.miner, "requests": list(c.lines)}
                               for c in self.challenges]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ChallengeSet:
        try:
            challenges = tuple(
                Challenge(to_checksum_address(c["miner"]),
                          tuple(validate_request(r, line=i + 1)
                                for i, r in enumerate(c["requests"])))
                for c in d["challenges"])
            return cls(int(d["epoch"]), bytes.fromhex(str(d["modelId"]).removeprefix("0x")),
                       challenges)
        except QuarryError as exc:
            raise ChallengeSetInvalid(f"challenge set: {exc}") from exc
        except (KeyError, TypeError, ValueError) as exc:
            raise ChallengeSetInvalid(f"challenge set is malformed: {exc!r}") from exc

    def digest(self) -> bytes:
        """What the committee signs and commits: keccak256 of the canonical JSON."""
        return keccak(canonical_json_bytes(self.to_json()))

    def challenge_for(self, miner: str) -> Challenge | None:
        miner = to_checksum_address(miner)
        return next((c for c in self.challenges if c.miner == miner), None)

    @property
    def miners(self) -> list[str]:
        return [c.miner for c in self.challenges]


def eligible_miners(q: Quarry, model_id: bytes) -> list[str]:
    """Registered miners that may claim challenge tasks for `model_id` now, sorted by
    address. Miners on probation are included: the committee's challenges are how they
    leave it."""
    seen = {to_checksum_address(ev["miner"])
            for ev in q.gpu.events("MinerRegistered", q.deployment.deploy_block)}
    return sorted((m for m in seen if q.gpu.is_eligible(m, model_id, 0, allow_probation=True)),
                  key=lambda a: int(a, 16))


_WORDS = tuple(sorted({w.strip(".,;:!?\"'()") for w in CORPUS.split()} - {""}))


def _prompt(rng: random.Random) -> str:
    """A user-like prompt from private randomness: an opener and words of the tokenizer's
    language in an order of its own, so it is no passage of the public corpus (a miner
    cannot look challenges up), ending like a sentence or a question."""
    words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 16))]
    text = rng.choice(OPENERS) + " ".join(words)
    return text[0].upper() + text[1:] + rng.choice((".", "?", "", "!"))


def draw_challenge_set(epoch: int, model_id: bytes, model_name: str, miners: Sequence[str], *,
                       requests: int, max_tokens: int,
                       rng: random.Random | None = None) -> ChallengeSet:
    """Fresh jobs for every miner (all prompts distinct), each drawn like a client's job:
    `requests` to 1.5x `requests` lines, chat or completions, one max_tokens between half
    `max_tokens` and `max_tokens`, a temperature profile (PROFILES) at one temperature
    (TEMPERATURES) and top_p (TOP_PS), random seeds (sometimes none), custom ids in one of
    several styles.

    The randomness is private (the system's CSPRNG unless a test passes `rng`): anyone who
    could predict the prompts could answer challenges honestly and the rest not.
    """
    rng = rng or random.Random(secrets.randbits(128))
    used: set[str] = set()
    challenges = []
    for miner in sorted((to_checksum_address(m) for m in miners), key=lambda a: int(a, 16)):
        n = rng.randint(requests, max(requests, requests * 3 // 2))
        chat = rng.random() < 0.5
        tokens = rng.randint(max(1, max_tokens // 2), max_tokens)
        profile = rng.choice(PROFILES)
        temperature, top_p = rng.choice(TEMPERATURES), rng.choice(TOP_PS)
        seeded = rng.random() < 0.7
        style, tag = rng.choice(ID_STYLES), f"{rng.getrandbits(24):06x}"
        lines = []
        for i in range(n):
            prompt = _prompt(rng)
            while prompt in used:
                prompt = _prompt(rng)
            used.add(prompt)
            body: dict[str, Any] = {"model": model_name, "max_tokens": tokens}
            body |= ({"messages": [{"role": "user", "content": prompt}]} if chat
                     else {"prompt": prompt})
            sampled = profile == "sampled" or (profile == "mixed" and rng.random() < 0.5)
            if sampled:
                body["temperature"] = temperature
                if top_p < 1.0:
                    body["top_p"] = top_p
            else:
                body["temperature"] = 0.0
            if seeded:
                body["seed"] = rng.randrange(2**31)
            lines.append(validate_request(
                {"custom_id": style.format(i=i, tag=tag), "method": "POST",
                 "url": CHAT_COMPLETIONS_URL if chat else COMPLETIONS_URL, "body": body},
                line=i + 1))
        challenges.append(Challenge(miner, tuple(lines)))
    return ChallengeSet(epoch, model_id, tuple(challenges))


def check_challenge_set(cs: ChallengeSet, *, epoch: int, model_id: bytes,
                        eligible: Sequence[str], requests: int, max_tokens: int) -> None:
    """Raise ChallengeSetInvalid unless `cs` is one an honest member would have drawn."""
    if cs.epoch != epoch:
        raise ChallengeSetInvalid(f"challenge set is for epoch {cs.epoch}, expected {epoch}")
    if cs.model_id != model_id:
        raise ChallengeSetInvalid(f"challenge set is for model {encode_hex(cs.model_id)}, "
                                  f"the committee serves {encode_hex(model_id)}")
    if sorted(cs.miners, key=lambda a: int(a, 16)) != cs.miners or \
            len(set(cs.miners)) != len(cs.miners):
        raise ChallengeSetInvalid("challenge set miners must be distinct and sorted")
    if set(cs.miners) != set(eligible):
        extra = sorted(set(cs.miners) - set(eligible))
        left_out = sorted(set(eligible) - set(cs.miners))
        raise ChallengeSetInvalid(f"challenge set miners differ from the eligible miners "
                                  f"(not eligible: {extra}; left out: {left_out})")
    prompts: set[str] = set()
    for c in cs.challenges:
        if not requests <= len(c.lines) <= max(requests, requests * 3 // 2):
            raise ChallengeSetInvalid(f"miner {c.miner} has {len(c.lines)} requests, "
                                      f"expected {requests} to {requests * 3 // 2}")
        for line in c.lines:
            body = line["body"]
            if int(body["max_tokens"]) > max_tokens:
                raise ChallengeSetInvalid(f"miner {c.miner}: max_tokens {body['max_tokens']} "
                                          f"is over {max_tokens}")
            prompt = str(body.get("prompt", body.get("messages")))
            if prompt in prompts:
                raise ChallengeSetInvalid(f"prompt {prompt[:40]!r} is given twice; every "
                                          "miner gets its own prompts")
            prompts.add(prompt)


@dataclass(frozen=True)
class PostedChallenge:
    """A challenge sent as a task: the fresh client key stays with the leader (to dispute)."""

    miner: str
    task_id: int
    client_key: str

    def to_json(self) -> dict[str, Any]:
        return {"miner": self.miner, "taskId": self.task_id, "clientKey": self.client_key}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PostedChallenge:
        return cls(to_checksum_address(d["miner"]), int(d["taskId"]), str(d["clientKey"]))


def post_challenge(q: Quarry, leader: LocalAccount, market: MarketAPI, challenge: Challenge,
                   model_id: bytes, deadline: int) -> PostedChallenge:
    """Fund a fresh address and post `challenge` from it as an ordinary task directed at the
    challenged miner, at a price 0 to 25% above that miner's ask (clients offer a maximum
    price, rarely the exact ask). The task allows miners on probation, so a new miner is
    challenged like the others; it accepts any precision and does not require activation
    commitments, so every miner is challenged whatever it declared and whatever its engine
    (a miner that commits is still checked on its commitments, at its declared precision);
    the funds cover the bonds of an availability challenge and a dispute, the leader's
    remedies as this task's client."""
    from market.jobs import post_batch

    fresh = Account.create()
    ask = q.gpu.miner_info(challenge.miner).price_per_token
    price = ask + ask * secrets.randbelow(26) // 100
    payment = len(challenge.lines) * challenge.max_tokens * price
    bonds = q.arbitration.min_bond() + q.arbitration.min_availability_bond()
    q.chain.transfer(leader, fresh.address, payment + GAS_ALLOWANCE_WEI + bonds)
    task_id, _ = post_batch(q, fresh, market, challenge.data, challenge.request_hashes,
                            model_id=model_id, shard_size=len(challenge.lines),
                            max_tokens=challenge.max_tokens, price=price, deadline=deadline,
                            prefer_miner=challenge.miner, allow_probation=True,
                            precisions=ANY_PRECISION, require_commitments=False)
    return PostedChallenge(challenge.miner, task_id, fresh.key.hex())


@dataclass(frozen=True)
class Answer:
    """What became of one posted challenge: "answered", "invalid" (signed but failing its
    checks), "other-miner", "pending" (not submitted, its answer window still open) or
    "missing" (not submitted when its window closed, or submitted without a document)."""

    miner: str
    task_id: int
    status: str
    items: tuple[ResultItem, ...] = ()
    reason: str = ""
    precision: int = 0  # the shard's recorded precision (what its outputs are judged at)

    @property
    def withheld(self) -> bool:
        """Missing although the miner committed a result on-chain: it published no
        document (the leader then challenges its availability)."""
        return self.status == "missing" and self.reason == WITHHELD


def collect_answer(q: Quarry, market: MarketAPI, challenge: Challenge, task_id: int, *,
                   answer_window: int, now: int) -> Answer:
    """The challenged miner's verified outputs at chain time `now`, or why there are none.
    An unsubmitted challenge is "missing" only once `answer_window` seconds have passed since
    its task was created (VerifierCommittee.challengeAnswerWindow), "pending" before: the
    window runs from the posting, so a challenge posted late in an epoch loses nothing. A
    result root committed without its document is a missing answer (`Answer.withheld`), not
    an invalid one: nothing signed was shown, and the chain can be asked for it.

    Raises ChallengeSetInvalid when the task on-chain is not this challenge (a leader that
    lies about which task it posted).
    """
    from market.jobs import fetch_shard_result

    t = q.tasks.get_task(task_id)
    if t.input_root != challenge.input_root or t.num_requests != len(challenge.lines):
        raise ChallengeSetInvalid(f"task {task_id} is not miner {challenge.miner}'s challenge "
                                  "(its inputRoot differs)")
    s = q.tasks.get_shard(task_id, 0)
    if s.state in (ShardState.SUBMITTED, ShardState.DISPUTED, ShardState.FINALIZED):
        if to_checksum_address(s.miner) != challenge.miner:
            return Answer(challenge.miner, task_id, "other-miner")
        try:
            items = fetch_shard_result(q, market, task_id, 0, challenge.request_hashes)
        except ContentNotFound:
            return Answer(challenge.miner, task_id, "missing", reason=WITHHELD)
        except (ResultCheckFailed, StoreError) as exc:  # a signed answer that fails its checks
            return Answer(challenge.miner, task_id, "invalid", reason=str(exc))
        return Answer(challenge.miner, task_id, "answered", tuple(items),
                      precision=s.precision)
    due = t.created_at + answer_window
    if now < due:
        return Answer(challenge.miner, task_id, "pending", reason=f"due at chain time {due}")
    return Answer(challenge.miner, task_id, "missing", reason=f"not answered by {due}")
