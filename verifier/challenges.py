"""Challenge sets: which miners an epoch challenges and with which prompts, and how the leader
sends them.

A challenge set names every miner eligible for the committee's model and gives each its own
job, drawn to look like a client's (`draw_challenge_set`): prompts made from private
randomness (never passages of the public corpus), chat or plain completions, temperature
profile (all greedy, all sampled, or mixed), top_p, seeds and custom ids each drawn per job
as clients choose them, and terms copied from a client task (below). The committee signs
its hash and commits it on-chain one epoch ahead; the prompts themselves travel only inside
the committee (the relay reads are members-only). The leader then posts each miner's
challenge as an ordinary paid task, from a fresh address, on those terms and with a
deadline of its own, directed at that miner with a market offer: exactly what a client that
picks its miner does.

A challenge's terms a miner can see (requests, max_tokens, price over its ask, whether the
task admits miners on probation, its accepted precisions and reputation floor) are copied
from the client tasks the chain holds (`client_jobs`, `draw_shapes`): the terms of one of the
last SAMPLE_JOBS client tasks of the model up to a block the set names that the challenged
miner could have claimed at that block, chosen with a seed the set carries, so every member
re-derives each miner's terms and signs only a set that follows that distribution. Only
single-shard tasks within CAP_FACTOR of the committee's token budget are copied: the scoring
work stays bounded, and larger, smaller or multi-shard tasks are never challenges.

What stays distinguishable on a public chain: the client is a fresh address funded by a
committee member shortly before; the task is always directed (an undirected challenge could
be served by another miner), has one shard, stays within the token bounds and asks no
activation commitments. Audits of client traffic (`verifier.audits`) are the structural
answer to a miner that acts on it.
"""

from __future__ import annotations

import dataclasses
import random
import secrets
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eth_account import Account
from eth_utils import encode_hex, to_checksum_address

from market.chain.contracts import MinerInfo, ShardState, Task, as_struct
from market.errors import QuarryError
from market.model.corpus import CORPUS
from market.protocol.canonical import canonical_json_bytes, keccak, request_hash
from market.protocol.merkle import input_tree
from market.protocol.precision import ANY as ANY_PRECISION
from market.protocol.precision import accepts
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


SAMPLE_JOBS = 256
"""How many of the model's latest client tasks (up to the set's block) shapes are drawn from."""
MIN_JOBS = 16
"""Fewer eligible client tasks than this and shapes come from the fallback (`_fallback`)."""
CAP_FACTOR = 2
"""A challenge's token budget (requests x max_tokens) is at most CAP_FACTOR x the committee's
`requests` x `max_tokens` (2,048 tokens at the defaults, 4/3 of the largest fallback job, so
a slow honest miner answers in its window what it answered before) and at least half of it
(each challenge still carries evidence): client tasks outside these bounds are never
copied."""
MAX_PREMIUM_BPS = 10_000
"""A drawn job pays at most twice the challenged miner's ask (the committee pays it)."""
BPS = 10_000


WITHHELD = "a result root was committed but its document is not published"


class ChallengeSetInvalid(QuarryError):
    """A proposed challenge set breaks a rule (the message names which)."""


@dataclass(frozen=True)
class Challenge:
    """One miner's prompts for an epoch, as OpenAI Batch request lines."""

    miner: str
    lines: tuple[dict[str, Any], ...]
    premium_bps: int = 0          # the task's price over the miner's ask when it is posted
    allow_probation: bool = True  # whether the task admits miners on probation
    precisions: int = ANY_PRECISION  # the task's accepted-precision mask
    min_reputation_bps: int = 0      # the task's reputation floor

    @property
    def terms(self) -> Terms:
        return Terms(len(self.lines), self.max_tokens, self.premium_bps, self.allow_probation,
                     self.precisions, self.min_reputation_bps)

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
    block: int = 0          # client tasks up to this block gave the shapes
    seed: bytes = bytes(32)  # the shapes' randomness (`draw_shapes`)

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "modelId": encode_hex(self.model_id),
                "block": self.block, "seed": encode_hex(self.seed),
                "challenges": [{"miner": c.miner, "requests": list(c.lines),
                                "premiumBps": c.premium_bps,
                                "allowProbation": c.allow_probation,
                                "precisions": c.precisions,
                                "minReputationBps": c.min_reputation_bps}
                               for c in self.challenges]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ChallengeSet:
        try:
            challenges = tuple(
                Challenge(to_checksum_address(c["miner"]),
                          tuple(validate_request(r, line=i + 1)
                                for i, r in enumerate(c["requests"])),
                          int(c["premiumBps"]), bool(c["allowProbation"]),
                          int(c["precisions"]), int(c["minReputationBps"]))
                for c in d["challenges"])
            return cls(int(d["epoch"]), bytes.fromhex(str(d["modelId"]).removeprefix("0x")),
                       challenges, int(d["block"]),
                       bytes.fromhex(str(d["seed"]).removeprefix("0x")))
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


@dataclass(frozen=True)
class Terms:
    """A task's terms a miner sees on-chain: its requests, max_tokens, price over the ask of
    the miner that claimed it (bps), whether it admits miners on probation, its
    accepted-precision mask (0: any) and reputation floor. Read from client tasks
    (`client_jobs`) and given to challenges (`draw_shapes`)."""

    requests: int
    max_tokens: int
    premium_bps: int
    allow_probation: bool
    precisions: int = ANY_PRECISION
    min_reputation_bps: int = 0


Claimable = Callable[[str, Terms], bool]
"""Whether a miner could claim a task of these terms (its standing at the set's block)."""


def client_jobs(q: Quarry, model_id: bytes, block: int,
                exclude_roots: frozenset[bytes] = frozenset()) -> list[Terms]:
    """The terms of the model's last SAMPLE_JOBS claimed single-shard client tasks created at
    or before `block` (among its last 2 x SAMPLE_JOBS single-shard ones), oldest first; tasks
    whose input root is in `exclude_roots` (the committee's own challenges) are left out.
    Everything is read from the chain as it stood at `block` (the premium is over the
    claimant's ask then: asks rarely move), so every member reads the same; a member's node
    must keep the state of the epoch's blocks (Anvil does; a pruning node keeps 128)."""
    since = q.deployment.deploy_block
    created = [ev for ev in q.tasks.events("TaskCreated", since, modelId=model_id)
               if int(ev["blockNumber"]) <= block and int(ev["numShards"]) == 1
               and bytes(ev["inputRoot"]) not in exclude_roots]
    created = created[-2 * SAMPLE_JOBS:]  # enough, unless most are unclaimed
    if not created:
        return []
    claims: dict[int, dict[str, Any]] = {}
    for ev in q.tasks.events("ShardClaimed", int(created[0]["blockNumber"])):
        if int(ev["blockNumber"]) <= block:
            claims.setdefault(int(ev["taskId"]), ev)  # the first claim's terms
    created = [ev for ev in created if int(ev["taskId"]) in claims][-SAMPLE_JOBS:]
    tasks = q.chain.read([q.tasks.fn("getTask", int(ev["taskId"])) for ev in created])
    jobs = []
    asks: dict[str, int] = {}
    for ev, raw in zip(created, tasks, strict=True):
        claimant = str(claims[int(ev["taskId"])]["miner"])
        if claimant not in asks:
            asks[claimant] = as_struct(MinerInfo, q.chain.call(
                q.gpu.fn("minerInfo", claimant), block=block)).price_per_token
        ask = asks[claimant]
        task = as_struct(Task, raw)
        jobs.append(Terms(int(ev["numRequests"]), task.max_tokens_per_request,
                          (task.price_per_token - ask) * BPS // ask if ask else 0,
                          bool(ev["allowProbation"]), int(ev["precisions"]),
                          task.min_reputation_bps))
    return jobs


def claimable_at(q: Quarry, model_id: bytes, block: int, miners: Sequence[str],
                 jobs: Sequence[Terms]) -> Claimable:
    """`Claimable` as GPURegistry answered at `block` (`isEligible` for each floor and
    probation flag the jobs use, the miner's declared precision), so every member agrees."""
    pairs = {(t.min_reputation_bps, t.allow_probation) for t in jobs}
    eligible = {(m, rep, allow): bool(q.chain.call(
        q.gpu.fn("isEligible", m, model_id, rep, allow), block=block))
        for m in miners for rep, allow in pairs}
    precision = {m: int(q.chain.call(q.gpu.fn("precisionOf", m, model_id), block=block))
                 for m in miners}
    return lambda m, t: eligible.get((m, t.min_reputation_bps, t.allow_probation), False) \
        and precision[m] > 0 and accepts(t.precisions, precision[m])


def _fallback(rng: random.Random, requests: int, max_tokens: int) -> tuple[int, int, int]:
    """The fixed shape distribution while the board has too few client tasks: `requests`
    to 1.5x `requests` lines, max_tokens from half `max_tokens` to `max_tokens`, 0 to 25%
    over the ask."""
    return (rng.randint(requests, max(requests, requests * 3 // 2)),
            rng.randint(max(1, max_tokens // 2), max_tokens), 100 * rng.randint(0, 25))


def drawable(jobs: Sequence[Terms], *, requests: int, max_tokens: int) -> list[Terms]:
    """The client jobs a challenge may copy: within the token bounds (CAP_FACTOR) and
    MAX_PREMIUM_BPS."""
    budget = requests * max_tokens
    return [j for j in jobs if budget // 2 <= j.requests * j.max_tokens <= CAP_FACTOR * budget
            and 0 <= j.premium_bps <= MAX_PREMIUM_BPS]


def draw_shapes(seed: bytes, miners: Sequence[str], jobs: Sequence[Terms],
                on_probation: Collection[str], *, requests: int, max_tokens: int,
                claimable: Claimable | None = None) -> dict[str, Terms]:
    """Each miner's challenge terms: those of a client job drawn uniformly from the drawable
    `jobs` that miner could claim (`claimable`; by default, jobs open to its probation
    standing with no precision mask or reputation floor), so the terms keep the joint
    distribution of the client tasks it sees; the fallback's when fewer than MIN_JOBS are
    left (open to probation only for a miner `on_probation`). Deterministic in `seed` and the
    miner, so members re-derive it."""
    if claimable is None:
        def claimable(m: str, t: Terms) -> bool:
            return (t.allow_probation or m not in on_probation) and \
                t.precisions == ANY_PRECISION and t.min_reputation_bps == 0
    pool = drawable(jobs, requests=requests, max_tokens=max_tokens)
    shapes: dict[str, Terms] = {}
    for miner in miners:
        miner = to_checksum_address(miner)
        rng = random.Random(keccak(seed + bytes.fromhex(miner[2:])))
        own = [j for j in pool if claimable(miner, j)]
        if len(own) >= MIN_JOBS:
            shapes[miner] = own[rng.randrange(len(own))]
        else:
            n, tokens, premium = _fallback(rng, requests, max_tokens)
            shapes[miner] = Terms(n, tokens, premium, miner in on_probation)
    return shapes


def draw_challenge_set(epoch: int, model_id: bytes, model_name: str, miners: Sequence[str], *,
                       requests: int, max_tokens: int, jobs: Sequence[Terms] = (),
                       on_probation: Collection[str] = (), claimable: Claimable | None = None,
                       block: int = 0, rng: random.Random | None = None) -> ChallengeSet:
    """Fresh jobs for every miner (all prompts distinct), each drawn like a client's job: the
    terms from `draw_shapes` (client tasks up to `block`, or the fallback), chat or
    completions, a temperature profile (PROFILES) at one temperature (TEMPERATURES) and top_p
    (TOP_PS), random seeds (sometimes none), custom ids in one of several styles.

    The randomness is private (the system's CSPRNG unless a test passes `rng`): anyone who
    could predict the prompts could answer challenges honestly and the rest not.
    """
    rng = rng or random.Random(secrets.randbits(128))
    seed = rng.randbytes(32)
    miners = sorted((to_checksum_address(m) for m in miners), key=lambda a: int(a, 16))
    shapes = draw_shapes(seed, miners, jobs, on_probation, requests=requests,
                         max_tokens=max_tokens, claimable=claimable)
    used: set[str] = set()
    challenges = []
    for miner in miners:
        shape = shapes[miner]
        chat = rng.random() < 0.5
        profile = rng.choice(PROFILES)
        temperature, top_p = rng.choice(TEMPERATURES), rng.choice(TOP_PS)
        seeded = rng.random() < 0.7
        style, tag = rng.choice(ID_STYLES), f"{rng.getrandbits(24):06x}"
        lines = []
        for i in range(shape.requests):
            prompt = _prompt(rng)
            while prompt in used:
                prompt = _prompt(rng)
            used.add(prompt)
            body: dict[str, Any] = {"model": model_name, "max_tokens": shape.max_tokens}
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
        challenges.append(Challenge(miner, tuple(lines), shape.premium_bps,
                                    shape.allow_probation, shape.precisions,
                                    shape.min_reputation_bps))
    return ChallengeSet(epoch, model_id, tuple(challenges), block, seed)


def check_challenge_set(cs: ChallengeSet, *, epoch: int, model_id: bytes,
                        eligible: Sequence[str], requests: int, max_tokens: int,
                        jobs: Sequence[Terms] = (), on_probation: Collection[str] = (),
                        claimable: Claimable | None = None) -> None:
    """Raise ChallengeSetInvalid unless `cs` is one an honest member would have drawn: its
    terms must be `draw_shapes` of its seed over `jobs` (the client tasks up to its block,
    which the caller reads), `on_probation` and `claimable`."""
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
    shapes = draw_shapes(cs.seed, cs.miners, jobs, on_probation, requests=requests,
                         max_tokens=max_tokens, claimable=claimable)
    prompts: set[str] = set()
    for c in cs.challenges:
        want, got = shapes[c.miner], c.terms
        if got != want or any(int(line["body"]["max_tokens"]) != want.max_tokens
                              for line in c.lines):
            raise ChallengeSetInvalid(f"miner {c.miner}'s challenge is shaped {got}, its seed "
                                      f"and the client tasks up to block {cs.block} give "
                                      f"{want}")
        for line in c.lines:
            body = line["body"]
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
    challenged miner, on its drawn terms: the premium over that miner's ask now (clients
    offer a maximum price, rarely the exact ask), its probation flag, reputation floor and
    accepted precisions. Terms the miner could not claim now (its standing changed since the
    set's block: a report lowered its reputation, it registered after that block) give way
    to a floor of 0, admitting probation and any precision, so an honest miner is never
    challenged with a task it cannot take. No activation commitments are required, so every
    miner is challenged whatever its engine (a miner that commits is still checked on its
    commitments, at its declared precision); the funds cover the bonds of an availability
    challenge and a dispute, the leader's remedies as this task's client."""
    from market.jobs import post_batch

    miner, terms = challenge.miner, challenge.terms
    if not q.gpu.is_eligible(miner, model_id, terms.min_reputation_bps, terms.allow_probation):
        terms = dataclasses.replace(terms, min_reputation_bps=0, allow_probation=True)
    declared = q.gpu.precision_of(miner, model_id)
    if declared is None or not accepts(terms.precisions, declared):
        terms = dataclasses.replace(terms, precisions=ANY_PRECISION)
    fresh = Account.create()
    ask = q.gpu.miner_info(miner).price_per_token
    price = ask + ask * terms.premium_bps // BPS
    payment = terms.requests * terms.max_tokens * price
    bonds = q.arbitration.min_bond() + q.arbitration.min_availability_bond()
    q.chain.transfer(leader, fresh.address, payment + GAS_ALLOWANCE_WEI + bonds)
    task_id, _ = post_batch(q, fresh, market, challenge.data, challenge.request_hashes,
                            model_id=model_id, shard_size=terms.requests,
                            max_tokens=terms.max_tokens, price=price, deadline=deadline,
                            min_reputation_bps=terms.min_reputation_bps, prefer_miner=miner,
                            allow_probation=terms.allow_probation,
                            precisions=terms.precisions, require_commitments=False)
    return PostedChallenge(miner, task_id, fresh.key.hex())


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
