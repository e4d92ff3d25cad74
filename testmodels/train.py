"""Train `quarry-pydoc`, the small test model with a real language model's statistics.

The embedded tiny model (`market model create`) is a random init scaled to be peaked (about
0.6 nats of entropy on its own samples), which makes greedy decoding stable under any
rounding: good for fast tests, useless for measuring verification, since a real model has
2 to 3 nats and many near-ties. This script trains the same architecture family (Llama,
the embedded byte-level BPE tokenizer, 512 tokens) on the Python 3.11 tutorial and language
reference (`corpus/`, PSF licence), as plain text and as chat turns
(`<|user|>` a paragraph's first sentence, `<|assistant|>` the paragraph, `<|eos|>`), so it
answers both endpoints and ends its turns where a paragraph ends.

Deterministic: fixed seeds, one data order (numpy PCG64), deterministic torch algorithms and
a fixed thread count, float32 on the CPU. The same torch build on the same CPU family gives
the same bytes; the committed `quarry-pydoc/` is the canonical result (its manifest names
every file's sha256, so a different build shows up as another modelId, never silently).

    .venv/bin/python testmodels/train.py            # 320 steps: 3 to 45 minutes on 2 cores
    .venv/bin/python testmodels/train.py --steps 3 --out /tmp/m   # a smoke run
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus" / "python-3.11-docs.txt.gz"
DEFAULT_OUT = HERE / "quarry-pydoc"
NAME = "quarry-pydoc"
ARCH = {"layers": 4, "hidden": 128, "heads": 4, "kv_heads": 2, "intermediate": 384,
        "max_positions": 1024}
SEQ = 160
BATCH = 32
STEPS = 320
LR = 3e-3
WARMUP = 40
SEED = 20261127
THREADS = 2
HELD_OUT = 0.02  # the corpus tail kept out of training, for the reported perplexity


def paragraphs(text: str) -> list[str]:
    return [p.strip() for p in re.split(r"\n\s*\n", text) if len(p.strip()) > 40]


def first_sentence(paragraph: str) -> str:
    line = " ".join(paragraph.split())
    cut = re.search(r"[.?!:](\s|$)", line)
    return (line[: cut.end()] if cut else line)[:120].strip()


def main() -> None:
    import numpy as np
    import torch
    from tokenizers import Tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    from market.model.create import llama_config, write_model_files
    from market.model.tokenizer import BOS_ID, EOS_ID, PAD_ID, write_tokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()

    torch.manual_seed(SEED)
    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(out)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    text = gzip.decompress(CORPUS.read_bytes()).decode("utf-8")
    split = int(len(text) * (1 - HELD_OUT))
    split = text.index("\n\n", split)
    train_text, held_text = text[:split], text[split:]

    def encode(s: str) -> list[int]:
        return tok.encode(s, add_special_tokens=False).ids

    stream = np.array(encode(train_text), dtype=np.int64)
    held = np.array([BOS_ID, *encode(held_text)], dtype=np.int64)
    chats = []
    for para in paragraphs(train_text):
        user = encode(f"<|user|>\n{first_sentence(para)}<|eos|>\n<|assistant|>\n")
        reply = encode(para)[: SEQ - len(user) - 2] + [EOS_ID]
        chats.append([BOS_ID, *user, *reply])
    say(f"{len(stream)} training tokens ({len(train_text) / len(stream):.2f} bytes each), "
        f"{len(chats)} chat turns, vocabulary {vocab}")

    cfg = llama_config(vocab_size=vocab, **ARCH)
    model = LlamaForCausalLM(LlamaConfig(**cfg))
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.95))
    rng = np.random.Generator(np.random.PCG64(SEED))

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        ids = np.full((BATCH, SEQ), PAD_ID, dtype=np.int64)
        for row in range(BATCH):
            if rng.random() < 0.5:
                chat = chats[int(rng.integers(len(chats)))]
                ids[row, : len(chat)] = chat
            else:
                start = int(rng.integers(len(stream) - SEQ))
                ids[row, 0] = BOS_ID
                ids[row, 1:] = stream[start : start + SEQ - 1]
        x = torch.from_numpy(ids)
        return x, (x != PAD_ID).long()

    started = time.monotonic()
    model.train()
    for step in range(1, args.steps + 1):
        lr = LR * min(1.0, step / WARMUP) * (0.1 + 0.9 * 0.5 * (1 + math.cos(
            math.pi * min(1.0, step / args.steps))))
        for group in opt.param_groups:
            group["lr"] = lr
        x, mask = batch()
        labels = x.masked_fill(mask == 0, -100)
        loss = model(input_ids=x, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == args.steps:
            say(f"step {step}: loss {loss.item():.3f} ({time.monotonic() - started:.0f}s)")

    model.eval()
    with torch.inference_mode():
        windows = [held[i : i + SEQ] for i in range(0, len(held) - SEQ, SEQ)][:16]
        x = torch.from_numpy(np.stack(windows)) if windows else None
        held_loss = model(input_ids=x, labels=x).loss.item() if x is not None else math.nan
    tensors = {k: v.detach().to(torch.float32).numpy()
               for k, v in model.state_dict().items()}
    manifest = write_model_files(out, NAME, cfg, tensors)
    say(f"held-out loss {held_loss:.3f} nats/token; wrote {out} ({manifest.model_id_hex})")
    print(json.dumps({"model_id": manifest.model_id_hex, "held_out_loss": held_loss,
                      "steps": args.steps, "seconds": round(time.monotonic() - started, 1)}))


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
