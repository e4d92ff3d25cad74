"""The declared cheating modes (miner/cheats.py) on real forward passes of the tiny model,
and their wiring into `miner run --test-mode` (flag, [miner] TOML, QUARRY_MINER_TEST_MODE).

The last test runs a real `miner run --test-mode random` against Anvil and a market app: the
shards are submitted with receipts naming the registered model, but the tokens are junk.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from market.engine.base import GenerationOutput, GenerationRequest
from market.engine.text import EngineError, TextEngine
from miner.cheats import (
    CHEAT_MODES,
    CRUDE_MODES,
    PERTURB_SCALE,
    SAMPLING_MODES,
    SELECTIVE_MODES,
    CheatError,
    SubstituteEngine,
    WrongPromptEngine,
    cheating_engine,
)

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parent.parent
MAX_TOKENS = 24
PROMPTS = [
    "Hello world", "The capital of France is", "Once upon a time there was", "def add(a, b):",
    "Water boils at", "Tell me a story about a cat", "List three prime numbers",
    "Why is the sky blue?", "the river flows into the sea", "Count from one to ten",
    "What is the opposite of cold?", "Name a colour of the rainbow",
    "Write a haiku about snow", "How many legs has a spider?", "Translate cat to French",
    "Give me a word that rhymes with moon",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from market.model.create import create_model

    d = tmp_path_factory.mktemp("cheats") / "quarry-tiny"
    create_model(d, name="quarry-tiny", seed=0)  # the default size: 4 layers
    return d


@pytest.fixture(scope="module")
def honest(model_dir: Path, one_torch_thread: None) -> Iterator[TextEngine]:
    from market.engine.torch_engine import TorchEngine

    eng = TorchEngine(model_dir, max_batch_size=16)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def requests(honest: TextEngine) -> list[GenerationRequest]:
    """Greedy chat requests, one sampled request and one asking for no token at all."""
    reqs = [GenerationRequest(honest.encode_chat([{"role": "user", "content": p}]), MAX_TOKENS)
            for p in PROMPTS]
    reqs.append(GenerationRequest(honest.encode_prompt("Sampled: the sea"), 10,
                                  temperature=1.0, top_p=0.9, seed=5))
    reqs.append(GenerationRequest(honest.encode_prompt("nothing"), 0))
    return reqs


@pytest.fixture(scope="module")
def honest_outputs(honest: TextEngine, requests: list[GenerationRequest]
                   ) -> list[GenerationOutput]:
    return honest.generate(requests)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cheat-cache")


@pytest.fixture(scope="module")
def cheats(honest: TextEngine, model_dir: Path, cache_dir: Path) -> Iterator[dict[str, Any]]:
    """One wrapper per mode. Wrappers close the honest engine, so each wraps a view of it
    whose close() is a no-op: the module's honest engine stays usable."""

    class Shared(TextEngine):  # the honest engine, minus close()
        def __init__(self, inner: TextEngine) -> None:
            self.inner = inner
            self.__dict__.update({k: getattr(inner, k) for k in (
                "tokenizer", "manifest", "model_dir", "vocab_size", "max_positions", "device",
                "dtype", "stop_token_ids")})

        def generate(self, reqs: Any) -> list[GenerationOutput]:
            return self.inner.generate(reqs)

        def score(self, p: Any, o: Any) -> Any:
            return self.inner.score(p, o)

    engines = {m: cheating_engine(m, Shared(honest), model_dir, cache_dir=cache_dir)
               for m in CHEAT_MODES}
    yield engines
    for e in engines.values():
        e.close()


def greedy(outs: list[GenerationOutput]) -> list[GenerationOutput]:
    return outs[: len(PROMPTS)]


def changed_share(a: list[GenerationOutput], b: list[GenerationOutput]) -> float:
    """Share of positions (over the shorter of each pair) where the token ids differ."""
    diff = sum(x != y for p, q in zip(a, b, strict=True)
               for x, y in zip(p.token_ids, q.token_ids, strict=False))
    total = sum(min(len(p.token_ids), len(q.token_ids)) for p, q in zip(a, b, strict=True))
    return diff / total


def reference_stats(honest: TextEngine, reqs: list[GenerationRequest],
                    outs: list[GenerationOutput]) -> tuple[float, float]:
    """(share of tokens that are not the honest model's teacher-forced argmax, mean
    perplexity under the honest model), over the greedy requests."""
    reqs, outs = reqs[: len(PROMPTS)], greedy(outs)
    scored = honest.score([r.prompt_ids for r in reqs], [o.token_ids for o in outs])
    n = sum(len(o.token_ids) for o in outs)
    off = sum(a != t for s, o in zip(scored, outs, strict=True)
              for a, t in zip(s.argmax_ids, o.token_ids, strict=True))
    return off / n, sum(s.perplexity for s in scored) / len(scored)


# ----------------------------------------------------------------------------- every mode

SUPPORT_MODES = ("likely-end-0.03", "likely-end-0.1", "top-k-5", "top-k-20",
                 "sampled-noise-0.25", "sampled-noise-0.5")
"""Cheats on sampled requests only, which the tiny model's peaked distributions hide
(`test_support_cheats_are_caught_on_the_trained_model` judges them)."""


def test_modes_are_the_declared_seventeen() -> None:
    assert CRUDE_MODES == ("substitute", "perturb", "random", "wrong-prompt")
    assert SAMPLING_MODES == ("greedy-sampled", "cold", "noise", "truncate", "int8",
                              "logit-noise", *SUPPORT_MODES)
    assert SELECTIVE_MODES == ("selective",)
    assert CHEAT_MODES == CRUDE_MODES + SAMPLING_MODES + SELECTIVE_MODES


def test_unknown_mode_is_refused_naming_the_valid_ones(honest: TextEngine,
                                                       model_dir: Path) -> None:
    with pytest.raises(CheatError) as err:
        cheating_engine("lazy", honest, model_dir)
    assert all(m in str(err.value) for m in CHEAT_MODES)
    with pytest.raises(CheatError, match="TextEngine"):
        cheating_engine("random", object(), model_dir)  # type: ignore[arg-type]
    with pytest.raises(CheatError, match="seed"):
        cheating_engine("random", honest, model_dir, seed=-1)


@pytest.mark.parametrize("mode", CHEAT_MODES)
def test_mode_keeps_the_interface_and_limits(
        mode: str, cheats: dict[str, Any], honest: TextEngine,
        requests: list[GenerationRequest], honest_outputs: list[GenerationOutput]) -> None:
    eng = cheats[mode]
    assert isinstance(eng, TextEngine) and eng.mode == mode
    assert eng.model_id == honest.model_id  # receipts name the registered model
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "quarry-tiny", "max_tokens": 5,
                     "messages": [{"role": "user", "content": "Hello world"}]}}
    assert eng.request_from_line(line) == honest.request_from_line(line)
    with pytest.raises(EngineError, match="exceeds"):
        eng.validate_request(0, GenerationRequest((1, 50), honest.max_positions))
    with pytest.raises(EngineError, match="outside"):
        eng.generate([GenerationRequest((1, honest.vocab_size), 3)])

    outs = eng.generate(requests)
    assert len(outs) == len(requests)
    for r, o in zip(requests, outs, strict=True):
        assert len(o.token_ids) <= r.max_tokens and len(o.logprobs) == len(o.token_ids)
        assert all(0 <= t < honest.vocab_size for t in o.token_ids)
        assert o.text == honest.decode(o.token_ids)
        assert o.finish_reason in ("stop", "length")
    assert outs[-1].token_ids == ()  # max_tokens 0
    assert eng.generate(requests) == outs  # deterministic
    changed = sum(o.token_ids != h.token_ids for o, h in zip(
        greedy(outs), greedy(honest_outputs), strict=True))
    if mode in CRUDE_MODES or mode in ("truncate", "selective"):
        assert changed >= len(PROMPTS) // 2
    elif mode in ("noise", "int8", "logit-noise"):
        assert 0 < changed  # a few near-ties move
    elif mode in SUPPORT_MODES:  # sampled requests only (on this model, barely)
        assert changed == 0
    else:  # greedy-sampled and cold only change sampled requests
        assert changed == 0 and outs[len(PROMPTS)] != honest_outputs[len(PROMPTS)]
    assert honest.generate(requests) == honest_outputs  # the honest engine is untouched


def test_modes_are_caught_by_the_honest_model(
        cheats: dict[str, Any], honest: TextEngine, requests: list[GenerationRequest],
        honest_outputs: list[GenerationOutput]) -> None:
    """Under the honest model every cheat leaves tokens off its argmax and has a higher
    perplexity than honest output; perturb is the subtlest."""
    base_off, base_ppl = reference_stats(honest, requests, honest_outputs)
    assert base_off == 0.0  # greedy outputs are the argmax (the tiny model is peaked)
    stats = {m: reference_stats(honest, requests, cheats[m].generate(requests))
             for m in CRUDE_MODES}
    print(json.dumps({"honest_ppl": round(base_ppl, 3), **{
        m: {"off_argmax": round(off, 3), "ppl": round(ppl, 3)} for m, (off, ppl) in
        stats.items()}}))
    for off, ppl in stats.values():
        assert off > 0.01 and ppl > base_ppl
    assert stats["perturb"][0] < min(stats[m][0] for m in ("substitute", "random",
                                                           "wrong-prompt"))
    for mode in ("substitute", "random"):  # unrelated tokens: off the scale
        assert stats[mode][0] > 0.9 and stats[mode][1] > 100 * base_ppl


# ----------------------------------------------------------------------------- per mode

def test_substitute_is_a_cheaper_sibling_built_once(
        cheats: dict[str, Any], honest: TextEngine, model_dir: Path, cache_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import market.model.create

    sub = cheats["substitute"]
    assert isinstance(sub, SubstituteEngine)
    assert sub.substitute_model_id != honest.model_id == sub.model_id
    (sibling,) = [p for p in cache_dir.iterdir() if not p.name.startswith(".")]
    cfg = json.loads((sibling / "config.json").read_text())
    real = json.loads((model_dir / "config.json").read_text())
    assert cfg["num_hidden_layers"] == real["num_hidden_layers"] // 2
    assert (sibling / "tokenizer.json").read_bytes() == (model_dir / "tokenizer.json").read_bytes()
    weights = sibling / "model.safetensors"
    before = weights.stat().st_mtime_ns, weights.stat().st_ino

    def no_rebuild(*_: Any, **__: Any) -> None:
        raise AssertionError("the cached substitute was rebuilt")

    monkeypatch.setattr(market.model.create, "create_model", no_rebuild)
    again = cheating_engine("substitute", honest, model_dir, cache_dir=cache_dir)
    try:
        assert again.substitute_model_id == sub.substitute_model_id  # type: ignore[attr-defined]
    finally:
        again.other.close()  # type: ignore[attr-defined]  # not `close`: keep the honest one
    assert (weights.stat().st_mtime_ns, weights.stat().st_ino) == before
    assert [p.name for p in cache_dir.iterdir()] == [sibling.name]  # no stray temp dirs
    with pytest.raises(AssertionError, match="rebuilt"):  # another seed: another sibling
        cheating_engine("substitute", honest, model_dir, cache_dir=cache_dir, seed=1)
    assert [p.name for p in cache_dir.iterdir()] == [sibling.name]  # the failed build is gone


def test_perturb_changes_some_greedy_tokens_not_all(
        cheats: dict[str, Any], honest: TextEngine, requests: list[GenerationRequest],
        honest_outputs: list[GenerationOutput]) -> None:
    outs = cheats["perturb"].generate(requests)
    assert cheats["perturb"].scale == PERTURB_SCALE
    per_step, _ = reference_stats(honest, requests, outs)
    positions = changed_share(greedy(outs), greedy(honest_outputs))
    first_token_same = sum(o.token_ids[:1] == h.token_ids[:1] for o, h in zip(
        greedy(outs), greedy(honest_outputs), strict=True)) / len(PROMPTS)
    print(json.dumps({"perturb_scale": PERTURB_SCALE, "steps_off_honest_argmax":
                      round(per_step, 3), "positions_changed": round(positions, 3),
                      "first_token_same": round(first_token_same, 3)}))
    # Slight: most single steps still pick the honest token; completions drift apart.
    assert 0.03 < per_step < 0.4
    assert 0.3 < positions < 0.97
    assert first_token_same >= 0.5


def test_perturb_scale_is_checked(honest: TextEngine, model_dir: Path) -> None:
    with pytest.raises(CheatError, match="scale"):
        cheating_engine("perturb", honest, model_dir, perturb_scale=0.0)


def test_random_emits_max_tokens_ordinary_tokens(
        cheats: dict[str, Any], honest: TextEngine, model_dir: Path,
        requests: list[GenerationRequest]) -> None:
    eng = cheats["random"]
    outs = eng.generate(requests)
    special = set(honest.tokenizer.all_special_ids)
    for r, o in zip(requests, outs, strict=True):
        assert len(o.token_ids) == r.max_tokens and not special & set(o.token_ids)
    assert len({t for o in outs for t in o.token_ids}) > 100  # spread over the vocabulary
    other = cheating_engine("random", honest, model_dir, seed=1)
    assert other.generate(requests[:3]) != outs[:3]  # the seed matters


def test_wrong_prompt_answers_a_decoy_with_the_real_model(
        cheats: dict[str, Any], honest: TextEngine, requests: list[GenerationRequest]) -> None:
    eng = cheats["wrong-prompt"]
    assert isinstance(eng, WrongPromptEngine)
    special = set(honest.tokenizer.all_special_ids)
    decoys = [eng.decoy_prompt(r.prompt_ids) for r in requests]
    for r, d in zip(requests, decoys, strict=True):
        assert len(d) == len(r.prompt_ids) and d != r.prompt_ids
        assert [t for t in d if t in special] == [t for t in r.prompt_ids if t in special]
    assert eng.decoy_prompt((1,)) != (1,) and eng.decoy_prompt((1, 4)) == (1, eng.decoy_prompt(
        (1, 4))[1])  # all-special prompts still change, BOS kept
    expected = honest.generate([GenerationRequest(d, r.max_tokens, r.temperature, r.top_p,
                                                  r.seed) for r, d in zip(requests, decoys,
                                                                          strict=True)])
    assert eng.generate(requests) == expected


# ----------------------------------------------------------------------------- CLI wiring

def miner_cli(*args: str, env: dict[str, str] | None = None,
              home: Path) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("QUARRY_MINER_")}
    full_env.update({"QUARRY_HOME": str(home), **(env or {})})
    return subprocess.run([sys.executable, "-m", "miner.cli", *args], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=120)


def test_cli_parses_test_mode_and_config_sources(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from market.errors import ConfigError
    from miner.cli import build_parser
    from miner.config import MinerConfig

    args = build_parser().parse_args(["run", "--test-mode", "perturb", "--once"])
    assert args.test_mode == "perturb"
    assert build_parser().parse_args(["run"]).test_mode is None
    monkeypatch.delenv("QUARRY_MINER_TEST_MODE", raising=False)
    assert MinerConfig.load().test_mode is None
    toml = tmp_path / "miner.toml"
    toml.write_text('[miner]\ntest_mode = "wrong-prompt"\n')
    assert MinerConfig.load(toml).test_mode == "wrong-prompt"
    assert MinerConfig.load(toml, test_mode="random").test_mode == "random"  # the flag wins
    monkeypatch.setenv("QUARRY_MINER_TEST_MODE", "substitute")
    assert MinerConfig.load().test_mode == "substitute"
    monkeypatch.setenv("QUARRY_MINER_TEST_MODE", "")
    assert MinerConfig.load().test_mode is None  # empty: honest
    with pytest.raises(ConfigError, match="valid modes: substitute, perturb, random, "
                                          "wrong-prompt"):
        MinerConfig.load(test_mode="nonsense")


def test_cli_unknown_test_mode_is_one_line_and_exit_1(tmp_path: Path) -> None:
    res = miner_cli("run", "--test-mode", "nonsense", home=tmp_path)
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "nonsense" in lines[0]
    assert all(m in lines[0] for m in CHEAT_MODES)
    res = miner_cli("run", env={"QUARRY_MINER_TEST_MODE": "nonsense"}, home=tmp_path)
    assert res.returncode == 1 and len(res.stderr.strip().splitlines()) == 1


def test_cli_test_mode_warns_loudly_and_plain_run_does_not(tmp_path: Path) -> None:
    # No key is configured, so both runs stop right after the configuration is read.
    res = miner_cli("run", "--test-mode", "random", home=tmp_path)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and "missing miner setting key" in lines[-1]
    warnings = [ln for ln in lines if "CHEATS ON PURPOSE" in ln]
    assert len(warnings) == 1 and "'random'" in warnings[0]
    res = miner_cli("run", home=tmp_path)
    assert res.returncode == 1 and "CHEATS" not in res.stderr


# ----------------------------------------------------------------------------- a real run

@pytest.mark.chain
@pytest.mark.timeout(180)
def test_miner_run_with_test_mode_submits_junk_under_the_registered_model(
        devnet: Any, tmp_path: Path) -> None:
    """`miner run --test-mode random --once` through a market app: every shard is submitted
    with validly signed receipts for the registered model, and its tokens are random."""
    from market.chain.client import anvil_account
    from market.chain.contracts import ShardState
    from market.chain.devnet import free_port
    from market.engine.torch_engine import TorchEngine
    from market.marketapi import MarketAPI
    from market.model.create import create_model
    from market.protocol.merkle import input_tree
    from market.protocol.requests import parse_jsonl
    from market.protocol.results import ShardResult, verify_shard_result
    from market.service.app import serve_in_thread
    from market.service.board import Board
    from market.service.settings import MarketSettings

    model = tmp_path / "quarry-cheat-test"
    create_model(model, name="quarry-cheat-test", layers=2, hidden=64, max_positions=256)
    miner = anvil_account(13)
    key_file = tmp_path / "miner.key"
    key_file.write_text(bytes(miner.key).hex())
    root = tmp_path / "market"
    settings = MarketSettings(deployment=devnet.deployment.save(root / "deployment.json"),
                              store_dir=root / "store", db_path=root / "board.sqlite",
                              port=free_port())
    with serve_in_thread(settings) as url:
        cfg = tmp_path / "miner.toml"
        cfg.write_text("\n".join([
            "[miner]", f'key_file = "{key_file}"', f'market_url = "{url}"',
            f'model_dirs = ["{model}"]', "price_per_token = 1000000000", 'stake = "1ether"',
            'endpoint = "http://127.0.0.1:9300"', "max_batch = 4", "poll_interval_s = 0.1",
            'gpu = {name = "Test GPU", memory_mib = 1024, count = 1}']) + "\n")
        reg = miner_cli("register", "--config", str(cfg), home=tmp_path)
        assert reg.returncode == 0, reg.stderr
        model_id = devnet.q.gpu.models_of(miner.address)[0]
        lines = [json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                             "body": {"model": "quarry-cheat-test", "max_tokens": 6,
                                      "prompt": f"the river {i}"}}) for i in range(4)]
        data = ("\n".join(lines) + "\n").encode()
        parsed = parse_jsonl(data)
        with MarketAPI(url) as api:
            uri = api.put(data)
            task_id, _ = devnet.q.tasks.create_task(
                devnet.client, model_id=model_id,
                input_root=input_tree([r.request_hash for r in parsed]).root, input_uri=uri,
                num_requests=4, shard_size=4, max_tokens_per_request=6,
                price_per_token=10**9, deadline=devnet.chain.timestamp() + 3600,
                allow_probation=True)  # the miner just registered: on probation
            Board(settings.db_path).index(devnet.q)
            run = miner_cli("run", "--config", str(cfg), "--once", "--no-progress",
                            "--test-mode", "random", home=tmp_path)
            assert run.returncode == 0, run.stderr
            assert "CHEATS ON PURPOSE" in run.stderr and "submitted 1 shard(s)" in run.stdout
            sh = devnet.q.tasks.get_shard(task_id, 0)
            assert (sh.state, sh.miner) == (ShardState.SUBMITTED, miner.address)
            doc = ShardResult.from_bytes(api.get(sh.result_uri))
            start, end = devnet.q.tasks.shard_range(task_id, 0)
            verify_shard_result(doc, task_id=task_id, shard=0, start=start, miner=sh.miner,
                                model_id=model_id, result_root=sh.result_root,
                                tokens_used=sh.tokens_used,
                                request_hashes=[r.request_hash for r in parsed[start:end]],
                                chain_id=devnet.q.chain_id,
                                task_registry=devnet.q.tasks.address)
    honest = TorchEngine(model)
    try:
        reqs = [honest.request_from_line(r.request) for r in parsed]
        right = honest.generate(reqs)
    finally:
        honest.close()
    got = [it.token_ids for it in doc.items]
    assert doc.model_id == model_id  # the receipts verified above name the registered model
    assert len(got) == 4 and all(len(g) == 6 for g in got)  # random fills max_tokens
    assert sum(g != o.token_ids for g, o in zip(got, right, strict=True)) >= 3


def test_every_mode_fails_the_verifiers_judgement(cheats: dict[str, Any],
                                                  honest: TextEngine) -> None:
    """A challenge-sized set (16 requests of 64 tokens: 8 greedy chat requests, 8 sampled at
    0.8 and 1.0 with top_p 1 and 0.9): the honest answers pass `verifier.scoring.judge`,
    every mode's fail."""
    from verifier.scoring import judge, score_outputs

    reqs = [GenerationRequest(honest.encode_chat([{"role": "user", "content": p}]), 64,
                              temperature=0.0 if i % 2 == 0 else (0.8, 1.0)[i % 4 // 2],
                              top_p=1.0 if i % 3 else 0.9, seed=100 + i)
            for i, p in enumerate(PROMPTS)]

    def verdict(outs: list[GenerationOutput]) -> Any:
        return judge(score_outputs(honest, reqs, [o.token_ids for o in outs],
                                   [o.finish_reason for o in outs],
                                   commitments=[o.commitment for o in outs]))

    assert verdict(honest.generate(reqs)).passed
    reasons = {}
    for mode in (m for m in CHEAT_MODES if m not in SUPPORT_MODES):
        v = verdict(cheats[mode].generate(reqs))
        assert not v.passed, mode
        reasons[mode] = v.reason
    print(json.dumps(reasons, indent=1))
    assert "sampled tokens are not what honest sampling" in reasons["greedy-sampled"]
    assert "sampled tokens are not what honest sampling" in reasons["cold"]
    for mode in ("noise", "int8", "logit-noise"):  # against an fp32 declaration
        assert ("greedy tokens left the reference's argmax" in reasons[mode]
                or "activation commitments are further" in reasons[mode]), mode


def test_selective_recognises_corpus_passages_but_not_todays_challenges(
        cheats: dict[str, Any], honest: TextEngine) -> None:
    """The selective miner is exactly honest on prompts that are passages of the public
    corpus (how challenges used to be drawn) and the substitute on client prompts; the
    committee's challenges now come from private randomness, so its lookup no longer finds
    them and it is the substitute there too."""
    import random

    from market.model.corpus import CORPUS
    from verifier.challenges import draw_challenge_set

    sel = cheats["selective"]
    words = CORPUS.split()
    passages = [GenerationRequest(honest.encode_prompt(" ".join(words[k:k + 8])), 16)
                for k in range(0, 400, 50)]
    assert all(sel.looks_like_challenge(r) for r in passages)
    assert sel.generate(passages) == honest.generate(passages)
    client = [GenerationRequest(honest.encode_chat([{"role": "user", "content": p}]), 16)
              for p in ("Summarise my meeting notes from Tuesday", "Draft a polite reminder",
                        "Which of these invoices is overdue?", "Rewrite this more briefly")]
    assert not any(sel.looks_like_challenge(r) for r in client)
    assert sel.generate(client) == cheats["substitute"].generate(client)
    cs = draw_challenge_set(1, honest.model_id, "quarry-tiny", ["0x" + "11" * 20],
                            requests=16, max_tokens=16, rng=random.Random(3))
    reqs = [honest.request_from_line(line) for line in cs.challenges[0].lines]
    assert not any(sel.looks_like_challenge(r) for r in reqs)
