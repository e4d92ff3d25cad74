"""How fast the torch engine decodes, against plain transformers `generate` and against a
minimal hand-written loop near what the CPU allows.

    python benchmarks/engine_speed.py [--smoke] [--tokens 32,128] [--rounds R] [--threads 1,2]

Two random-init Llama models made by `market model create` into a temporary directory (the
tiny 4 x 128 and 8 x 512), batch sizes 1, 8 and 32 of random prompts of 9 to 16 tokens
(left-padded, as a miner's batches are; a batch of 1 has none), greedy, a fixed number of
new tokens (stop tokens ignored by all three): 32 and 128 by default, because `generate`'s
per-step costs grow with the length (each step concatenates its cache and builds its mask
over every key so far) while a batch's fixed costs (prefill, commitments, texts) shrink per
token, and batch jobs' outputs run to hundreds of tokens. With one torch thread and with
all of them. The three contenders run alternately, round after round, in one process,
so machine noise hits them alike; each figure is the median round's tokens/s (wall clock,
prefill included), and again in the process's CPU time (one thread: the work done, without
the time a loaded machine kept the process waiting for a core). Quarry is
`TorchEngine.generate` as a miner runs it (commitments included); `generate` is
`model.generate` on the same weights loaded as transformers loads them by default (its
SDPA attention); the hand loop is the same weights in plain torch:
fused q/k/v and gate/up projections, a preallocated KV cache, RoPE tables computed once,
SDPA with native grouped-query attention, the padding mask built once and sliced per step
(none where no row is padded).
Threads, before and after: the engine as torch leaves it (one intra-op thread per CPU)
against the count the engine picks at load (`market.engine.threads`, `TorchEngine(threads=
None)`), the two alternating round by round on the same engine, same batches.
The last line printed is one JSON object. `--smoke`: the tiny model only, small batches,
a few tokens (seconds; figures meaningless). `--threads 1` runs the three-way comparison
at one thread only (on a loaded machine, several threads per process mostly measure the
contention). `--models 4x128` runs only the named models (comma-separated layers x hidden).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from market.engine.base import GenerationRequest  # noqa: E402
from market.engine.threads import usable_cpus  # noqa: E402
from market.engine.torch_engine import TorchEngine, left_pad  # noqa: E402
from market.model.create import create_model  # noqa: E402

PROMPT_LEN = 16  # the longest prompt; row i is PROMPT_LEN - i % 8 tokens long


class HandLoop:
    """Greedy decoding of a Llama model in plain torch: the reference for what a decode
    step costs without framework overhead."""

    def __init__(self, model: Any) -> None:
        cfg = model.config
        dec = model.get_decoder()
        self.heads = int(cfg.num_attention_heads)
        self.kv_heads = int(cfg.num_key_value_heads)
        self.head_dim = int(getattr(cfg, "head_dim", cfg.hidden_size // self.heads))
        self.eps = float(cfg.rms_norm_eps)
        self.inv_freq = dec.rotary_emb.inv_freq.float()
        self.embed = dec.embed_tokens.weight
        self.norm = dec.norm.weight
        self.head = model.get_output_embeddings().weight
        self.layers = []
        for layer in dec.layers:
            a, m = layer.self_attn, layer.mlp
            self.layers.append((
                layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
                torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
                a.o_proj.weight, torch.cat([m.gate_proj.weight, m.up_proj.weight]),
                m.down_proj.weight))

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    @staticmethod
    def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], new_tokens: int) -> torch.Tensor:
        ids, pad, pos = left_pad(prompts, 0)
        batch, width = ids.shape
        cap = width + new_tokens
        freqs = torch.arange(cap, dtype=torch.float32)[:, None] * self.inv_freq[None]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos_all, sin_all = emb.cos(), emb.sin()
        neg = torch.finfo(torch.float32).min
        key_ok = torch.ones(batch, cap, dtype=torch.bool)
        key_ok[:, :width] = pad.bool()
        padded = not bool(pad.all())
        keys_mask = torch.where(key_ok, 0.0, neg)[:, None, None, :] if padded else None
        causal = torch.ones(width, width, dtype=torch.bool).tril()
        prefill_mask = (torch.where(causal & key_ok[:, None, :width], 0.0, neg)[:, None]
                        if padded else None)
        nq, nk, hd = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.head_dim
        keys = [torch.empty(batch, self.kv_heads, cap, hd) for _ in self.layers]
        values = [torch.empty(batch, self.kv_heads, cap, hd) for _ in self.layers]
        h = self.embed[ids]
        start, out = 0, []
        for _ in range(new_tokens):
            q_len = h.shape[1]
            end = start + q_len
            cos, sin = cos_all[pos][:, None], sin_all[pos][:, None]
            mask = prefill_mask if q_len > 1 else (
                None if keys_mask is None else keys_mask[..., :end])
            for li, (ln1, ln2, qkv, o, gu, down) in enumerate(self.layers):
                x = self._rms(h, ln1) @ qkv.T
                q = x[..., :nq].view(batch, q_len, self.heads, hd).transpose(1, 2)
                k = x[..., nq:nq + nk].view(batch, q_len, self.kv_heads, hd).transpose(1, 2)
                v = x[..., nq + nk:].view(batch, q_len, self.kv_heads, hd).transpose(1, 2)
                keys[li][:, :, start:end] = self._rope(k, cos, sin)
                values[li][:, :, start:end] = v
                att = torch.nn.functional.scaled_dot_product_attention(
                    self._rope(q, cos, sin), keys[li][:, :, :end], values[li][:, :, :end],
                    attn_mask=mask, is_causal=q_len > 1 and mask is None, enable_gqa=True)
                h = h + att.transpose(1, 2).reshape(batch, q_len, nq) @ o.T
                g, u = (self._rms(h, ln2) @ gu.T).chunk(2, dim=-1)
                h = h + (torch.nn.functional.silu(g) * u) @ down.T
            logits = self._rms(h[:, -1], self.norm) @ self.head.T
            token = logits.argmax(-1)
            out.append(token)
            h = self.embed[token][:, None]
            pos = pos[:, -1:] + 1
            start = end
        return torch.stack(out, 1)


def _contenders(engine: TorchEngine, plain: Any, prompts: list[list[int]], new_tokens: int
                ) -> dict[str, Callable[[], list[list[int]]]]:
    hand = HandLoop(engine.model)
    requests = [GenerationRequest(tuple(p), new_tokens) for p in prompts]
    ids, mask, _ = left_pad(prompts, engine.pad_id)

    def quarry() -> list[list[int]]:
        return [list(o.token_ids) for o in engine.generate(requests)]

    def generate() -> list[list[int]]:
        with torch.inference_mode():
            out = plain.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                 max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                 pad_token_id=engine.pad_id, eos_token_id=None)
        return out[:, ids.shape[1]:].tolist()

    def hand_loop() -> list[list[int]]:
        return hand.generate(prompts, new_tokens).tolist()

    return {"quarry": quarry, "generate": generate, "hand": hand_loop}


def measure(engine: TorchEngine, plain: Any, batch: int, new_tokens: int, rounds: int,
            seed: int) -> dict[str, Any]:
    """Tokens/s of each contender at one point, alternating them round by round."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, engine.vocab_size, (batch, PROMPT_LEN), generator=gen).tolist()
    prompts = [row[: PROMPT_LEN - i % (PROMPT_LEN // 2)] for i, row in enumerate(tokens)]
    runs = _contenders(engine, plain, prompts, new_tokens)
    outputs = {name: fn() for name, fn in runs.items()}  # warm-up, and the tokens to compare
    times: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, fn in runs.items():
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    tps = {name: batch * new_tokens / statistics.median(t) for name, t in times.items()}
    cps = {name: batch * new_tokens / statistics.median(t) for name, t in cpu.items()}
    return {
        "batch": batch,
        "tokens_per_s": {k: round(v, 1) for k, v in tps.items()},
        "vs_generate": round(tps["quarry"] / tps["generate"], 2),
        "vs_hand": round(tps["quarry"] / tps["hand"], 2),
        "tokens_per_cpu_s": {k: round(v, 1) for k, v in cps.items()},
        "vs_generate_cpu": round(cps["quarry"] / cps["generate"], 2),
        "vs_hand_cpu": round(cps["quarry"] / cps["hand"], 2),
        "same_tokens_as_generate": outputs["quarry"] == outputs["generate"],
        "same_tokens_as_hand": outputs["quarry"] == outputs["hand"],
    }


def measure_threads(engine: TorchEngine, batch: int, new_tokens: int, rounds: int,
                    seed: int, counts: dict[str, int]) -> dict[str, Any]:
    """Quarry's tokens/s at each named thread count, alternating them round by round."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, engine.vocab_size, (batch, PROMPT_LEN), generator=gen).tolist()
    requests = [GenerationRequest(tuple(row[: PROMPT_LEN - i % (PROMPT_LEN // 2)]), new_tokens)
                for i, row in enumerate(tokens)]
    times: dict[str, list[float]] = {name: [] for name in counts}
    outputs = {}
    for name, n in counts.items():  # warm-up, and the tokens to compare
        torch.set_num_threads(n)
        outputs[name] = [o.token_ids for o in engine.generate(requests)]
    for _ in range(rounds):
        for name, n in counts.items():
            torch.set_num_threads(n)
            t0 = time.perf_counter()
            engine.generate(requests)
            times[name].append(time.perf_counter() - t0)
    tps = {name: batch * new_tokens / statistics.median(t) for name, t in times.items()}
    return {"batch": batch, "threads": counts,
            "tokens_per_s": {k: round(v, 1) for k, v in tps.items()},
            "picked_vs_default": round(tps["picked"] / tps["default"], 2),
            "same_tokens": outputs["picked"] == outputs["default"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="seconds; figures meaningless")
    ap.add_argument("--tokens", default="32,128",
                    help="new tokens per row, comma-separated lengths (default: 32,128)")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds per point")
    ap.add_argument("--threads", default="",
                    help="thread counts of the three-way comparison, comma-separated "
                         "(default: 1 and all)")
    ap.add_argument("--models", default="4x128,8x512",
                    help="models to run, comma-separated layers x hidden (default: both)")
    args = ap.parse_args(argv)
    try:
        picked = [tuple(int(n) for n in m.strip().split("x")) for m in args.models.split(",")
                  if m.strip()]
    except ValueError:
        ap.error(f"--models takes sizes like 4x128,8x512, got {args.models!r}")
    if not picked or any(len(m) != 2 or min(m) < 1 for m in picked):
        ap.error(f"--models takes sizes like 4x128,8x512, got {args.models!r}")
    models = [(4, 128)] if args.smoke else [(m[0], m[1]) for m in picked]
    batches = [1, 2] if args.smoke else [1, 8, 32]
    try:
        lengths = sorted({int(t) for t in args.tokens.split(",") if t.strip()})
    except ValueError:
        ap.error(f"--tokens takes lengths like 32,128, got {args.tokens!r}")
    if not lengths or lengths[0] < 1:
        ap.error(f"--tokens takes lengths >= 1 like 32,128, got {args.tokens!r}")
    lengths, rounds = ([4], 1) if args.smoke else (lengths, args.rounds)
    all_threads = torch.get_num_threads()  # torch's default: one per CPU
    try:
        thread_counts = sorted({int(t) for t in args.threads.split(",") if t.strip()}
                               or {1, all_threads})
    except ValueError:
        ap.error(f"--threads takes thread counts like 1,2, got {args.threads!r}")
    if thread_counts[0] < 1:
        ap.error(f"--threads takes counts >= 1, got {args.threads!r}")
    points, thread_points = [], []
    with tempfile.TemporaryDirectory(prefix="quarry-engine-speed-") as tmp:
        for layers, hidden in models:
            name = f"{layers}x{hidden}"
            d = Path(tmp) / name
            create_model(d, layers=layers, hidden=hidden, seed=1)
            t0 = time.perf_counter()
            engine = TorchEngine(d, device="cpu", precision="fp32", stop_token_ids=())
            load_s = time.perf_counter() - t0  # the thread pick included
            counts = {"default": all_threads, "picked": engine.threads}
            for batch in batches:
                point = {"model": name, "load_s": round(load_s, 2),
                         **measure_threads(engine, batch, lengths[0], rounds, batch, counts)}
                thread_points.append(point)
                tps = point["tokens_per_s"]
                print(f"{name:>7} batch {batch:>2}: torch's {all_threads} threads "
                      f"{tps['default']:8.1f} tok/s, picked {engine.threads}: "
                      f"{tps['picked']:8.1f} -> x{point['picked_vs_default']:.2f}", flush=True)
            plain = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
            for threads in thread_counts:
                torch.set_num_threads(threads)
                for tokens in lengths:
                    for batch in batches:
                        point = {"model": name, "threads": threads, "new_tokens": tokens,
                                 **measure(engine, plain, batch, tokens, rounds, seed=batch)}
                        points.append(point)
                        _print_point(point)
            torch.set_num_threads(all_threads)
    print(json.dumps({"benchmark": "engine_speed", "smoke": args.smoke, "new_tokens": lengths,
                      "prompt_len": PROMPT_LEN, "rounds": rounds, "usable_cpus": usable_cpus(),
                      "points": points, "threads": thread_points}))
    return 0


def _print_point(point: dict[str, Any]) -> None:
    tps = point["tokens_per_s"]
    print(f"{point['model']:>7} threads {point['threads']} {point['new_tokens']:>3} tokens "
          f"batch {point['batch']:>2}: quarry "
          f"{tps['quarry']:8.1f} tok/s, generate {tps['generate']:8.1f}, hand "
          f"{tps['hand']:8.1f}  -> x{point['vs_generate']:.2f} of generate, "
          f"x{point['vs_hand']:.2f} of the hand loop; CPU time: "
          f"x{point['vs_generate_cpu']:.2f}, x{point['vs_hand_cpu']:.2f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
