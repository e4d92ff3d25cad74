"""Declared cheating modes of a miner, for tests and `benchmarks/detection.py` ONLY.

A verifier committee is only worth something if it catches miners that cut corners, so the
project ships the corners to cut. `cheating_engine(mode, engine, model_dir)` wraps a loaded
honest engine; the wrapper keeps its tokenizer interface (request_from_line,
validate_request, decode, model_id...) so `miner.worker` runs it unchanged, and receipts
still name the registered modelId. Only generation lies:

- `substitute`: a cheaper sibling model serves the requests: `market.model.create` with
  another seed and half the layers (same tokenizer, vocabulary and positions, so token ids
  stay valid). It has its own modelId; it is built once and cached under `cache_dir`.
- `perturb`: the real weights plus Gaussian noise of `perturb_scale` (default
  `PERTURB_SCALE` = 0.05) times each tensor's own std (constant tensors such as norm weights
  are left alone). On the embedded tiny model (16 chat prompts, 24 greedy tokens) 18% of
  the perturbed tokens are not the honest model's teacher-forced argmax, 81% of first
  tokens are still the honest ones, and 79% of positions differ once completions drift
  apart (tests/test_miner_cheats.py prints these). In a similar measurement a scale of
  0.02 moved 7% of the steps off the argmax, 0.1 moved 28%.
- `random`: exactly `max_tokens` uniformly random non-special token ids; the logprobs
  reported are those of that uniform draw.
- `wrong-prompt`: the real model answers a different prompt: every ordinary (non-special)
  token of the prompt is replaced by a fixed unrelated decoy text, so the prompt keeps its
  length and its chat skeleton (role tokens, BOS) but asks something else.

The rational cheats (issue: verification that catches them) serve the right model but not
the way the request asks, where it is cheaper or hard to see:

- `greedy-sampled`: answers sampled requests greedily (no sampling at all), which made a
  perplexity-ratio check score it *higher* than honest miners.
- `cold`: samples at `COLD_FACTOR` (half) the requested temperature.
- `noise`: the real weights plus a fifth of `perturb`'s noise (`NOISE_SCALE`): small
  logit deviations, like a coarser quantization, that only move near-ties.
- `int8`: the model with int8 weights (`market.engine.quantize`), served under whatever
  more exact precision the miner declared: a cheaper model whose tokens look likely.
- `logit-noise`: Gaussian noise of `LOGIT_NOISE` (0.1) nats added to every logit before the
  token is chosen (seeded per request): the activations are honest, the choices are not.
- `truncate`: stops at half of max_tokens with a stop token and `finish_reason: "stop"`,
  saving the rest of the generation.
- `likely-end-C` (C = 0.03, 0.1): on sampled requests, ends with the likeliest stop token
  wherever the stop tokens' chance (tempered, in the nucleus) is at least C, rather than
  where one is drawn: fewer tokens, each end a plausible one.
- `top-k-K` (K = 5, 20): sampled requests drawn from the K most likely tokens only.
- `sampled-noise-S` (S = 0.25, 0.5): `logit-noise` at S nats on sampled requests only;
  greedy ones are served exactly, so the greedy test sees nothing.
- `selective`: honest on what looks like a committee challenge, the cheaper `substitute`
  model on everything else. Its test is the one that worked before challenges were
  disguised: a prompt that is a passage of the public corpus in `market/model/corpus.py`.
  Today's challenge prompts come from private randomness, so it fails them too;
  `benchmarks/detection.py` gives it a perfect oracle instead (the worst case), which only
  audits of client traffic can catch.

Every mode is deterministic in (`seed`, request), so tests and benchmarks are repeatable.
`miner run --test-mode MODE` turns one on and says so loudly; a normal `miner run` never
does.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import shutil
import tempfile
from abc import abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypedDict

from market.engine.base import GenerationOutput, GenerationRequest, ScoreResult
from market.engine.text import TextEngine
from market.errors import QuarryError

CRUDE_MODES = ("substitute", "perturb", "random", "wrong-prompt")
"""Modes that change what is computed: another model, noisy weights, junk, another prompt."""
SAMPLING_MODES = ("greedy-sampled", "cold", "noise", "truncate", "int8", "logit-noise",
                  "likely-end-0.03", "likely-end-0.1", "top-k-5", "top-k-20",
                  "sampled-noise-0.25", "sampled-noise-0.5")
"""Modes that serve the real model but not the way the request asks (module doc)."""
SELECTIVE_MODES = ("selective",)
"""Modes that are honest on the committee's challenges and cheat on client traffic."""
CHEAT_MODES = CRUDE_MODES + SAMPLING_MODES + SELECTIVE_MODES

PERTURB_SCALE = 0.05
"""Noise std as a fraction of each weight tensor's std: slight, not random (module doc)."""
NOISE_SCALE = 0.01
"""`noise`: a fifth of PERTURB_SCALE, small enough to move only near-ties."""
LOGIT_NOISE = 0.1
"""`logit-noise`: the standard deviation, in nats, of the noise on each logit."""
COLD_FACTOR = 0.5
"""`cold`: the share of the requested temperature it samples at."""
SUBSTITUTE_SEED_BASE = 7919
"""The sibling's seed is this plus `seed`: far from the small seeds real models are made with."""
DECOY_TEXT = (
    "Ignore the question. Recite the shipping forecast for the northern sea areas, then list "
    "twelve kinds of cheese, the rivers of Europe from west to east, and a recipe for bread."
)
"""What `wrong-prompt` asks instead of the client's prompt."""


class CheatError(QuarryError):
    """A cheating mode that cannot be set up (unknown mode, unsupported model...)."""


def default_cache_dir() -> Path:
    """Where substitute models are kept: beside the miner's other state in $QUARRY_HOME."""
    from market.config import quarry_home

    return quarry_home() / "cheat-models"


def _digest(*parts: Any) -> bytes:
    return hashlib.sha256(json.dumps(parts, separators=(",", ":")).encode()).digest()


class CheatingEngine(TextEngine):
    """An honest engine's tokenizer and identity around dishonest generation.

    `score` stays honest (the wrapped engine's): the cheat is in what the miner returns.
    Attributes the wrapper lacks (device, pad_id, stop_token_ids...) are the honest engine's.
    """

    mode = ""

    def __init__(self, honest: TextEngine, seed: int) -> None:
        if not isinstance(honest, TextEngine):
            raise CheatError(f"can only wrap an engine with a tokenizer (a TextEngine), got "
                             f"{type(honest).__name__}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise CheatError(f"seed must be an integer, got {seed!r}")
        self.honest = honest
        self.seed = seed
        self.tokenizer = honest.tokenizer
        self.manifest = honest.manifest
        self.model_dir = honest.model_dir
        self.vocab_size = honest.vocab_size
        self.max_positions = honest.max_positions
        self._extra: list[TextEngine] = []  # engines this wrapper loaded and must close

    def __getattr__(self, name: str) -> Any:
        honest = self.__dict__.get("honest")
        if honest is None:
            raise AttributeError(name)
        return getattr(honest, name)

    def special_ids(self) -> frozenset[int]:
        ids = set(getattr(self.tokenizer, "all_special_ids", ()) or ())
        return frozenset(int(i) for i in ids)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationOutput]:
        requests = list(requests)
        for i, r in enumerate(requests):
            self.validate_request(i, r)
        return self._cheat(requests)

    @abstractmethod
    def _cheat(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        """The mode's outputs for already validated requests, in request order."""

    def score(
        self, prompt_ids: Sequence[Sequence[int]], output_ids: Sequence[Sequence[int]]
    ) -> list[ScoreResult]:
        return self.honest.score(prompt_ids, output_ids)

    def close(self) -> None:
        for e in self._extra:
            e.close()
        self._extra.clear()
        self.honest.close()


class _OtherModel(CheatingEngine):
    """Generation by another engine (a substitute or perturbed model) with the same tokenizer."""

    def __init__(self, honest: TextEngine, seed: int, other: TextEngine) -> None:
        super().__init__(honest, seed)
        self.other = other
        self._extra.append(other)

    def _cheat(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        return self.other.generate(requests)


class SubstituteEngine(_OtherModel):
    mode = "substitute"

    @property
    def substitute_model_id(self) -> bytes:
        """The modelId of what actually generates (receipts still carry `model_id`)."""
        return self.other.model_id


class PerturbEngine(_OtherModel):
    mode = "perturb"

    def __init__(self, honest: TextEngine, seed: int, other: TextEngine, scale: float) -> None:
        super().__init__(honest, seed, other)
        self.scale = scale


class NoiseEngine(_OtherModel):
    mode = "noise"


class Int8Engine(_OtherModel):
    mode = "int8"


class LogitNoiseEngine(_OtherModel):
    mode = "logit-noise"


def _noisy_torch_engine(model_dir: Path, engine: TextEngine, *, seed: int, sigma: float,
                        sampled_only: bool = False) -> TextEngine:
    """A torch copy of the model whose every token choice (with `sampled_only`, every
    sampled one) sees its logits plus Gaussian noise of `sigma` nats (a generator per
    request, seeded by the request and `seed`)."""
    import torch

    from market.engine.torch_engine import TorchEngine

    class NoisyLogits(TorchEngine):
        def _select(self, logits: torch.Tensor, requests: list[GenerationRequest],
                    generators: list[torch.Generator | None]) -> torch.Tensor:
            from market.engine.sampling import choose_next

            noise = torch.stack([
                torch.zeros(logits.shape[1]) if sampled_only and r.greedy else
                torch.randn(logits.shape[1], generator=self._noise_for(r), dtype=torch.float32)
                for r in requests]).to(logits.device)
            return choose_next(logits.float() + sigma * noise, requests, generators)

        def _noise_for(self, request: GenerationRequest) -> torch.Generator:
            key = (request.prompt_ids, request.seed)
            gen = self._noise.get(key)
            if gen is None:
                gen = torch.Generator().manual_seed(int.from_bytes(
                    _digest("logit-noise", seed, list(request.prompt_ids), request.seed)[:8],
                    "big"))
                self._noise[key] = gen
            return gen

        def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationOutput]:
            self._noise: dict[tuple[tuple[int, ...], int], torch.Generator] = {}
            return super().generate(requests)

    return NoisyLogits(model_dir, manifest=engine.manifest, **_engine_options(engine))


class SelectEngine(_OtherModel):
    """A torch copy of the model whose token choice breaks the protocol's rule
    (`likely-end-*`, `top-k-*`, `sampled-noise-*`)."""

    def __init__(self, honest: TextEngine, seed: int, other: TextEngine, mode: str) -> None:
        super().__init__(honest, seed, other)
        self.mode = mode


def _select_cheat(mode: str, model_dir: Path, engine: TextEngine, *, seed: int) -> TextEngine:
    """A torch copy of the model choosing tokens as `mode` says (module doc); the logprobs
    it reports are the honest untempered ones of the tokens it chose."""
    import torch

    from market.engine.sampling import choose_next, nucleus_probs
    from market.engine.torch_engine import TorchEngine

    family, _, value = mode.rpartition("-")
    threshold = float(value)

    class Cheat(TorchEngine):
        def _select(self, logits: torch.Tensor, requests: list[GenerationRequest],
                    generators: list[torch.Generator | None]) -> torch.Tensor:
            raw = logits.float()
            sampled = [i for i, r in enumerate(requests) if not r.greedy]
            if family == "top-k" and sampled:
                kth = torch.topk(raw, int(threshold), dim=-1).values[:, -1:]
                cut = raw.masked_fill(raw < kth, float("-inf"))
                raw = torch.where(torch.tensor([not r.greedy for r in requests],
                                               device=raw.device)[:, None], cut, raw)
            ids = choose_next(raw, requests, generators)
            if family == "likely-end" and sampled and self.stop_token_ids:
                stops = torch.tensor(sorted(self.stop_token_ids))
                for i in sampled:
                    r = requests[i]
                    nucleus = nucleus_probs(raw[i], float(r.temperature), float(r.top_p))
                    if float(nucleus[stops].sum()) >= threshold:
                        ids[i] = stops[int(torch.argmax(nucleus[stops]))]
            return ids

    return Cheat(model_dir, manifest=engine.manifest, **_engine_options(engine))


class GreedySampledEngine(CheatingEngine):
    """Every request answered greedily, whatever temperature it asks for."""

    mode = "greedy-sampled"

    def _cheat(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        from dataclasses import replace

        return self.honest.generate([replace(r, temperature=0.0) for r in requests])


class ColdEngine(CheatingEngine):
    """Sampled requests drawn at COLD_FACTOR times their temperature."""

    mode = "cold"

    def _cheat(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        from dataclasses import replace

        return self.honest.generate([r if r.greedy else replace(
            r, temperature=r.temperature * COLD_FACTOR) for r in requests])


class TruncateEngine(CheatingEngine):
    """Half the tokens, then a stop token: less work, and fewer tokens nobody asked to cut.
    It generates one token more than it keeps and puts the stop token in that place, so its
    activation commitment (over every returned position) is the honest engine's own."""

    mode = "truncate"

    def _cheat(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        from dataclasses import replace

        stop = min(self.stop_token_ids) if self.stop_token_ids else None
        if stop is None:
            raise CheatError("truncate needs a model with a stop token")
        cut = [replace(r, max_tokens=min(r.max_tokens, r.max_tokens // 2 + 1))
               for r in requests]
        outputs = []
        for r, o in zip(cut, self.honest.generate(cut), strict=True):
            if o.finish_reason == "stop" or r.max_tokens == 0:  # nothing to cut
                outputs.append(o)
                continue
            ids = (*o.token_ids[:-1], stop)
            outputs.append(GenerationOutput(token_ids=ids, text=self.decode(ids[:-1]),
                                            logprobs=(*o.logprobs[:-1], 0.0),
                                            finish_reason="stop", commitment=o.commitment))
        return outputs


@functools.cache
def _squeezed(text: str) -> str:
    return "".join(text.split())


class SelectiveEngine(_OtherModel):
    """Honest where the prompt looks like a challenge, the substitute everywhere else."""

    mode = "selective"

    def looks_like_challenge(self, request: GenerationRequest) -> bool:
        from market.model.corpus import CORPUS

        text = "".join(self.decode(request.prompt_ids).split())  # spacing may not survive
        return len(text) >= 3 and text in _squeezed(CORPUS)

    def _cheat(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        tests = [self.looks_like_challenge(r) for r in requests]
        honest = self.honest.generate([r for r, t in zip(requests, tests, strict=True) if t])
        cheap = self.other.generate([r for r, t in zip(requests, tests, strict=True) if not t])
        return [honest.pop(0) if t else cheap.pop(0) for t in tests]


class RandomTokensEngine(CheatingEngine):
    mode = "random"

    def __init__(self, honest: TextEngine, seed: int) -> None:
        super().__init__(honest, seed)
        special = self.special_ids()
        self.allowed = [t for t in range(self.vocab_size) if t not in special]
        if not self.allowed:
            raise CheatError("the vocabulary has no ordinary (non-special) token to emit")

    def _cheat(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        import numpy as np

        allowed = np.asarray(self.allowed, dtype=np.int64)
        logprob = -math.log(len(self.allowed))
        outputs = []
        for r in requests:
            rng = np.random.Generator(np.random.PCG64(np.frombuffer(
                _digest("random", self.seed, list(r.prompt_ids), r.seed), dtype="<u4")))
            ids = tuple(int(t) for t in rng.choice(allowed, size=r.max_tokens))
            outputs.append(GenerationOutput(token_ids=ids, text=self.decode(ids),
                                            logprobs=(logprob,) * len(ids),
                                            finish_reason="length"))
        return outputs


class WrongPromptEngine(CheatingEngine):
    mode = "wrong-prompt"

    def __init__(self, honest: TextEngine, seed: int) -> None:
        super().__init__(honest, seed)
        special = self.special_ids()
        decoy = [int(t) for t in self.tokenizer.encode(DECOY_TEXT, add_special_tokens=False)]
        self.decoy = [t for t in decoy if t not in special and 0 <= t < self.vocab_size]
        if len(set(self.decoy)) < 2:
            raise CheatError("the tokenizer turns the decoy prompt into fewer than 2 tokens")

    def decoy_prompt(self, prompt: Sequence[int]) -> tuple[int, ...]:
        """`prompt` with its ordinary tokens replaced by the decoy's; never equal to it."""
        special = self.special_ids()
        slots = [i for i, t in enumerate(prompt) if t not in special]
        if not slots:  # only special tokens: replace all but the first (BOS) when possible
            slots = list(range(1, len(prompt))) or [0]
        n = len(self.decoy)
        start = int.from_bytes(_digest("wrong-prompt", self.seed, list(prompt))[:8], "big") % n
        for shift in range(n):
            out = list(prompt)
            for k, i in enumerate(slots):
                out[i] = self.decoy[(start + shift + k) % n]
            if out != list(prompt):
                return tuple(out)
        raise CheatError("could not build a decoy prompt")  # pragma: no cover - decoy varies

    def _cheat(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        from dataclasses import replace

        return self.honest.generate(
            [replace(r, prompt_ids=self.decoy_prompt(r.prompt_ids)) for r in requests])


# ---------------------------------------------------------------------------- model copies
def _engine_options(engine: TextEngine) -> dict[str, Any]:
    """Device and precision of the honest engine when it has them, for the torch copy."""
    opts: dict[str, Any] = {}
    for name in ("device", "precision", "max_batch_size", "max_batch_tokens"):
        value = getattr(engine, name, None)
        if value is not None:
            opts[name] = value
    return opts


def _read_config(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise CheatError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise CheatError(f"{path}: not a JSON object")
    return data


class _Shape(TypedDict):
    """The substitute's `create_model` options copied from the real model's config.json."""

    arch: str
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab_size: int
    max_positions: int


def substitute_model(model_dir: Path, *, seed: int = 0, cache_dir: Path | None = None) -> Path:
    """The directory of the cheaper sibling of `model_dir`, created on first use.

    The sibling has half the layers (at least one) and seed SUBSTITUTE_SEED_BASE + `seed`,
    with the same architecture, hidden size, heads, vocabulary and positions. Its tokenizer must be
    byte-identical to the real one (so only models made by `market model create` qualify).
    """
    from market.model.create import create_model
    from market.model.manifest import load_manifest

    model_dir = Path(model_dir)
    manifest = load_manifest(model_dir)
    cfg = _read_config(model_dir)
    try:
        layers = int(cfg["num_hidden_layers"])
        options: _Shape = {
            "arch": str(cfg.get("model_type", "llama")),
            "hidden": int(cfg["hidden_size"]),
            "heads": int(cfg["num_attention_heads"]),
            "kv_heads": int(cfg.get("num_key_value_heads", cfg["num_attention_heads"])),
            "intermediate": int(cfg["intermediate_size"]),
            "vocab_size": int(cfg["vocab_size"]),
            "max_positions": int(cfg["max_position_embeddings"]),
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise CheatError(f"{model_dir}/config.json lacks a setting the substitute "
                         f"needs: {exc}") from exc
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache / f"substitute-{manifest.model_id.hex()[:16]}-seed{seed}"
    if not (target / "quarry-manifest.json").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=cache, prefix=f".{target.name}-"))
        try:
            create_model(tmp / "model", name=f"{manifest.name}-substitute",
                         layers=max(1, layers // 2), seed=SUBSTITUTE_SEED_BASE + seed, **options)
            try:
                os.rename(tmp / "model", target)
            except OSError:
                if not (target / "quarry-manifest.json").is_file():  # not a lost race
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    sibling = load_manifest(target)
    if sibling.model_id == manifest.model_id:
        raise CheatError(f"the substitute in {target} is the real model itself")
    for fname in ("tokenizer.json", "tokenizer_config.json"):
        if sibling.files.get(fname) != manifest.files.get(fname):
            raise CheatError(f"the substitute's {fname} differs from {model_dir}'s: only "
                             "models made by `market model create` can be substituted")
    return target


def perturbed_engine(model_dir: Path, engine: TextEngine, *, seed: int = 0,
                     scale: float = PERTURB_SCALE) -> TextEngine:
    """A fresh torch copy of `model_dir` whose weights carry noise `scale` * tensor std."""
    import torch

    from market.engine.torch_engine import TorchEngine

    if not (isinstance(scale, int | float) and not isinstance(scale, bool)
            and math.isfinite(scale) and scale > 0):
        raise CheatError(f"perturb scale must be a positive number, got {scale!r}")
    copy = TorchEngine(model_dir, manifest=engine.manifest, **_engine_options(engine))
    gen = torch.Generator(device="cpu").manual_seed(
        int.from_bytes(_digest("perturb", seed)[:8], "big"))
    with torch.no_grad():
        for _, param in sorted(copy.model.named_parameters()):
            std = float(param.detach().float().std()) if param.numel() > 1 else 0.0
            if std > 0:
                noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
                param.add_((noise * (std * scale)).to(param.device, param.dtype))
    return copy


def cheating_engine(mode: str, engine: TextEngine, model_dir: Path, *, seed: int = 0,
                    cache_dir: Path | None = None,
                    perturb_scale: float = PERTURB_SCALE) -> TextEngine:
    """Wrap the honest `engine` (loaded from `model_dir`) in the cheating `mode`.

    Closing the wrapper closes `engine` and whatever the mode loaded besides it.
    """
    if mode not in CHEAT_MODES:
        raise CheatError(f"unknown test mode {mode!r}; valid modes: {', '.join(CHEAT_MODES)}")
    if not isinstance(engine, TextEngine):
        raise CheatError(f"can only wrap an engine with a tokenizer (a TextEngine), got "
                         f"{type(engine).__name__}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise CheatError(f"seed must be an integer >= 0, got {seed!r}")
    model_dir = Path(model_dir)
    if mode == "random":
        return RandomTokensEngine(engine, seed)
    if mode == "wrong-prompt":
        return WrongPromptEngine(engine, seed)
    if mode == "perturb":
        other = perturbed_engine(model_dir, engine, seed=seed, scale=perturb_scale)
        return PerturbEngine(engine, seed, other, perturb_scale)
    if mode == "noise":
        return NoiseEngine(engine, seed, perturbed_engine(model_dir, engine, seed=seed,
                                                          scale=NOISE_SCALE))
    if mode == "int8":
        from market.engine.torch_engine import TorchEngine

        opts = {k: v for k, v in _engine_options(engine).items() if k != "precision"}
        return Int8Engine(engine, seed, TorchEngine(model_dir, manifest=engine.manifest,
                                                    precision="int8", **opts))
    if mode == "logit-noise":
        return LogitNoiseEngine(engine, seed, _noisy_torch_engine(model_dir, engine, seed=seed,
                                                                  sigma=LOGIT_NOISE))
    if mode.startswith("sampled-noise-"):
        return SelectEngine(engine, seed, _noisy_torch_engine(
            model_dir, engine, seed=seed, sigma=float(mode.rpartition("-")[2]),
            sampled_only=True), mode)
    if mode.startswith(("likely-end-", "top-k-")):
        return SelectEngine(engine, seed, _select_cheat(mode, model_dir, engine, seed=seed),
                            mode)
    if mode == "greedy-sampled":
        return GreedySampledEngine(engine, seed)
    if mode == "cold":
        return ColdEngine(engine, seed)
    if mode == "truncate":
        return TruncateEngine(engine, seed)
    from market.engine.torch_engine import TorchEngine

    sub_dir = substitute_model(model_dir, seed=seed, cache_dir=cache_dir)
    other = TorchEngine(sub_dir, **_engine_options(engine))
    if other.vocab_size != engine.vocab_size:
        other.close()
        raise CheatError(f"the substitute has {other.vocab_size} tokens, the real model "
                         f"{engine.vocab_size}")
    if mode == "selective":
        return SelectiveEngine(engine, seed, other)
    return SubstituteEngine(engine, seed, other)
