"""What `calibrate_numerics.py` and `numerics.py` share: honest miners in every declared
precision and batch shape, the requests they answer, and the reference passes.

An honest miner here is `TorchEngine` in a precision (fp32, fp16 and bf16 compute; int8 and
fp8 weights over bf16, `market.engine.quantize`), an attention kernel (transformers' sdpa or
eager) and a batch shape: all requests at once in batches of 32, one at a time, or shuffled
into batches of 5 (other padding, other batch-dependent kernels). The CPU's bf16 path
(AVX512-BF16, fp32 accumulation) is the same arithmetic a GPU's bf16 GEMMs use; other GPU
kernels are the reason the error model carries a safety factor.

Requests are drawn like the committee's challenges (`verifier.challenges`: private words,
chat or completions) and like client traffic on the trained model (the first sentence of a
paragraph of the held-out Python documentation, as a chat question or a completion prompt).
"""

from __future__ import annotations

import gzip
import random
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TRAINED_MODEL = ROOT / "testmodels" / "quarry-pydoc"
CORPUS = ROOT / "testmodels" / "corpus" / "python-3.11-docs.txt.gz"
HELD_OUT = 0.02  # the corpus tail the trained model never saw (testmodels/train.py)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class MinerSetup:
    """One honest miner: declared precision, attention kernel, batch shape."""

    precision: str
    batching: str = "32"  # "32", "1" or "shuffled5"
    attention: str = "sdpa"

    @property
    def label(self) -> str:
        return f"{self.precision}/b{self.batching}/{self.attention}"


HONEST_SETUPS = (
    MinerSetup("fp32"), MinerSetup("fp32", "1"), MinerSetup("fp32", "shuffled5"),
    MinerSetup("fp32", "32", "eager"),
    MinerSetup("bf16"), MinerSetup("bf16", "1"), MinerSetup("bf16", "shuffled5"),
    MinerSetup("bf16", "32", "eager"),
    MinerSetup("fp16"), MinerSetup("fp16", "1"), MinerSetup("fp16", "shuffled5"),
    MinerSetup("int8"), MinerSetup("fp8"),
)
VLLM_SETUPS = (MinerSetup("bf16"), MinerSetup("fp16"))
"""The honest miners of `--miner-engine vllm` (it batches by itself; one kernel)."""
VERIFIER_PRECISIONS = ("fp32", "bf16")


class Engines:
    """Engines loaded once per (model, precision, attention, kind, role): the verifiers' torch
    engines on `device`, the honest miners' on `miner_device` (default `device`: a GPU
    miner against a CPU verifier is the cross-hardware case), vLLM ones for
    `--miner-engine vllm`."""

    def __init__(self, device: str = "cpu", miner_device: str | None = None) -> None:
        self.device = device
        self.miner_device = miner_device or device
        self._cache: dict[tuple[str, str, str, str, str], Any] = {}

    def get(self, model_dir: Path, precision: str, attention: str = "sdpa",
            kind: str = "torch", miner: bool = False) -> Any:
        device = self.miner_device if miner else self.device
        key = (str(model_dir), precision, attention, kind, device)
        if key not in self._cache:
            if kind == "vllm":  # imported lazily; says how to install it where it is absent
                from market.engine.factory import load_engine

                self._cache[key] = load_engine("vllm", model_dir, precision=precision)
            else:
                from market.engine.torch_engine import TorchEngine

                self._cache[key] = TorchEngine(model_dir, precision=precision,
                                               attention=attention, device=device)
        return self._cache[key]


def outputs_for(setup: MinerSetup, per_setup: int) -> int:
    """Fewer outputs for the slow batch shapes: one at a time costs a decode step each."""
    return {"1": max(1, per_setup // 8), "shuffled5": max(1, per_setup // 2)}.get(
        setup.batching, per_setup)


def generate(engine: Any, requests: Sequence[Any], batching: str,
             rng: random.Random) -> list[Any]:
    """The engine's outputs for `requests` (in order) under one batch shape."""
    requests = list(requests)
    if batching == "32":
        engine.max_batch_size = 32
        return engine.generate(requests)
    size = {"1": 1, "shuffled5": 5}[batching]
    order = list(range(len(requests)))
    if batching == "shuffled5":
        rng.shuffle(order)
    outputs: list[Any] = [None] * len(requests)
    engine.max_batch_size = 32
    for start in range(0, len(order), size):
        part = order[start: start + size]
        for i, out in zip(part, engine.generate([requests[i] for i in part]), strict=True):
            outputs[i] = out
    return outputs


def corpus_sentences() -> list[str]:
    """First sentences of the held-out paragraphs of the trained model's corpus."""
    text = gzip.decompress(CORPUS.read_bytes()).decode("utf-8")
    start = text.index("\n\n", int(len(text) * (1 - HELD_OUT)))
    out = []
    for para in re.split(r"\n\s*\n", text[start:]):
        line = " ".join(para.split())
        cut = re.search(r"[.?!:](\s|$)", line)
        sentence = (line[: cut.end()] if cut else line)[:120].strip()
        if len(sentence) > 15:
            out.append(sentence)
    return out


def draw_lines(n: int, rng: random.Random, *, model_name: str, temperatures: Sequence[float],
               max_tokens: int, client_share: float = 0.5,
               top_ps: Sequence[float] = (1.0,)) -> list[dict[str, Any]]:
    """`n` request lines: a `client_share` of them questions from held-out documentation,
    the rest words drawn as the committee draws challenge prompts; chat or completions at
    random; temperatures cycled through `temperatures` (0 is greedy); every sampled line
    seeded, at a top_p drawn from `top_ps` (no draw when it holds one value)."""
    from market.protocol.requests import CHAT_COMPLETIONS_URL, COMPLETIONS_URL, validate_request
    from verifier.challenges import draw_challenge_set

    sentences = corpus_sentences()
    filler = draw_challenge_set(0, b"\x00" * 32, model_name, ["0x" + "11" * 20],
                                requests=n, max_tokens=max_tokens, rng=rng).challenges[0].lines
    lines = []
    for i in range(n):
        if rng.random() < client_share:
            prompt = rng.choice(sentences)
        else:
            body = filler[i % len(filler)]["body"]
            prompt = body["messages"][0]["content"] if "messages" in body else body["prompt"]
        chat = rng.random() < 0.5
        t = temperatures[i % len(temperatures)]
        body2: dict[str, Any] = {"model": model_name, "max_tokens": max_tokens,
                                 "temperature": t}
        body2 |= ({"messages": [{"role": "user", "content": prompt}]} if chat
                  else {"prompt": prompt})
        if t > 0:
            body2["seed"] = rng.randrange(2**31)
            top_p = rng.choice(top_ps) if len(top_ps) > 1 else top_ps[0]
            if top_p < 1.0:
                body2["top_p"] = top_p
        lines.append(validate_request(
            {"custom_id": f"r{i}", "method": "POST",
             "url": CHAT_COMPLETIONS_URL if chat else COMPLETIONS_URL, "body": body2},
            line=i + 1))
    return lines


def reference_logits(engine: Any, prompts: Sequence[Sequence[int]],
                     outputs: Sequence[Sequence[int]], batch: int = 16) -> list[Any]:
    """The reference's float32 logits [len(output), V] at the positions that predict each
    output's tokens (teacher forcing, right-padded batches, as `TorchEngine.score`)."""
    import torch

    result: list[Any] = []
    decoder = engine.model.get_decoder()
    for start in range(0, len(prompts), batch):
        ps, os_ = prompts[start: start + batch], outputs[start: start + batch]
        seqs = [list(p) + list(o) for p, o in zip(ps, os_, strict=True)]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), engine.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for r, seq in enumerate(seqs):
            ids[r, : len(seq)] = torch.tensor(seq)
            mask[r, : len(seq)] = 1
        with torch.inference_mode():
            hidden = decoder(input_ids=ids.to(engine.device),
                             attention_mask=mask.to(engine.device)).last_hidden_state
            for r, (p, o) in enumerate(zip(ps, os_, strict=True)):
                if not o:
                    result.append(torch.empty(0, engine.vocab_size))
                    continue
                rows = hidden[r, len(p) - 1: len(p) - 1 + len(o)]
                result.append(engine.logits(rows).cpu())
    return result


BIN_EDGES = tuple(10 ** (k / 8) for k in range(-32, 11))  # 1e-4 .. 17.8 nats
BETAS = tuple(10 ** (k / 16) for k in range(-64, 1))  # 1e-4 .. 1 nat


@dataclass
class FlipTable:
    """Greedy flips against the reference, binned by the gap beyond rounding: `observed`
    flips per bin, and `expected[b]` per bin under the Gumbel bound at BETAS[b]."""

    positions: int = 0
    argmax: int = 0  # positions whose token is the reference's argmax or tied with it
    observed: list[int] | None = None
    expected: list[list[float]] | None = None
    largest_gap: float = 0.0  # the largest gap beyond rounding of an honest token

    def add(self, logits: Any, tokens: Sequence[int], roundings: tuple[int, ...]) -> None:
        import torch

        from market.engine.sampling import GreedyTest, forgiven_gaps

        if self.observed is None:
            self.observed = [0] * (len(BIN_EDGES) + 1)
            self.expected = [[0.0] * (len(BIN_EDGES) + 1) for _ in BETAS]
        assert self.expected is not None
        gap = forgiven_gaps(logits, GreedyTest(1.0, roundings, (0.5,)))
        y = torch.tensor(list(tokens))[:, None]
        chosen = gap.gather(1, y).squeeze(1)
        edges = torch.tensor(BIN_EDGES, dtype=torch.float64)
        bins = torch.bucketize(gap, edges)  # 0: below 1e-4
        self.positions += len(tokens)
        for g in chosen.tolist():
            if g > 0:
                self.observed[int(torch.bucketize(torch.tensor(g), edges))] += 1
                self.largest_gap = max(self.largest_gap, g)
            else:
                self.argmax += 1
        nonzero = gap > 0
        for b, beta in enumerate(BETAS):
            p = torch.softmax(-gap / beta, dim=-1) * nonzero
            sums = torch.zeros(len(BIN_EDGES) + 1, dtype=torch.float64)
            sums.scatter_add_(0, bins.reshape(-1), p.reshape(-1))
            row = self.expected[b]
            for k, v in enumerate(sums.tolist()):
                row[k] += v

    def smallest_beta(self, slack: float = 0.5) -> float | None:
        """The smallest BETAS scale under which, beyond every gap, the honest flips observed
        are at most `slack` times those the bound allows (tails, because the e-values grow
        with the gap: a flip beyond the largest gaps the bound expects is what would fault
        an honest miner). None when none fits."""
        assert self.observed is not None and self.expected is not None
        observed = _tails(self.observed)
        for b, beta in enumerate(BETAS):
            expected = _tails(self.expected[b])
            if all(o <= slack * e for o, e in zip(observed, expected, strict=True) if o):
                return beta
        return None


def _tails(counts: Sequence[float]) -> list[float]:
    """Each bin's count plus every later bin's."""
    out, total = [], 0.0
    for c in reversed(counts):
        total += c
        out.append(total)
    return out[::-1]
