"""The default single-process engine: transformers model classes, fp32 on CPU, bf16 on GPU
unless told a `precision` (`market.protocol.precision`: fp32, fp16, bf16, or int8/fp8
weights over bf16, `market.engine.quantize`).

generate: requests are batched (up to `max_batch_size`), left-padded with an attention mask
and explicit position ids (so a padded row sees exactly the positions it would see alone),
prefilled once, then decoded one token per step through the model's own decoder layers with
a preallocated KV cache and masks built once per batch (`market.engine.decode`). Finished
rows are dropped from the batch and the cache. A row stops at a stop token (EOS by default; the
token is kept in `token_ids` and `logprobs`, not in `text`), at the first token after which
its decoded text contains one of the request's stop strings (`base.text_for`: the ids are
kept, the text is cut before the stop string), or after `max_tokens`. Only rows with stop
strings pay for the check: one decode of the row's output per step.
Tokens are chosen by `sampling.choose_next`; their logprobs (untempered) are taken
from the kept logits many steps at a time (`sampling.chosen_logprobs`). On a CPU the
engine runs with the torch thread count that decodes its model fastest, timed once at load
(`threads=None`), or the `threads` it is given (`market.engine.threads`).

score: prompt + output per row, right-padded, one forward pass per batch through the
decoder; the lm_head runs only at the positions that predict output tokens, so memory
stays proportional to the output length, not to the vocabulary times the sequence.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from market.engine.base import (
    GenerationOutput,
    GenerationRequest,
    GreedyTest,
    ScoreResult,
    SupportTest,
)
from market.engine.decode import DecodeCache, embed, layer_windows, rotaries, run_layers
from market.engine.framestack import fresh_frame_chunk
from market.engine.fused import fuse_layers
from market.engine.quantize import quantize_weights_
from market.engine.sampling import (
    choose_next,
    chosen_logprobs,
    edge_distances,
    greedy_ratios,
    likelihood_ratios,
    make_generators,
)
from market.engine.text import EngineError, TextEngine
from market.engine.threads import check_threads, engine_threads
from market.model.archs import SDPA_KINDS, arch_of, final_logits
from market.model.loading import load_model, resolve_device, resolve_precision
from market.model.manifest import Manifest, load_manifest
from market.protocol.commitments import ChunkCheck, CommitmentError
from market.protocol.commitments import build_many as build_commitments
from market.protocol.commitments import check_many as check_commitments


def left_pad(
    prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-pad prompts: (input_ids, attention_mask, position_ids), each [B, T].

    Positions count real tokens only (0 at each row's first token), so padding never shifts
    RoPE positions: a padded row computes what it would compute alone.
    """
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts],
                       dtype=torch.long).reshape(len(prompts), width)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts],
                        dtype=torch.long).reshape(len(prompts), width)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids.to(device), mask.to(device), positions.to(device)


LOGITS_KEPT = 1 << 22
"""Logits (floats) a batch keeps before taking their tokens' logprobs: 16 MiB, every step
of a small vocabulary's batch, one or a few steps of a large one."""


def _stop_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    for source in (getattr(model, "generation_config", None), model.config):
        eos = getattr(source, "eos_token_id", None)
        if eos is not None:
            return frozenset([eos] if isinstance(eos, int) else [int(e) for e in eos])
    if tokenizer.eos_token_id is not None:
        return frozenset([int(tokenizer.eos_token_id)])
    return frozenset()


class TorchEngine(TextEngine):
    """A model from a verified local directory, run in this process with transformers."""

    def __init__(
        self,
        model_dir: Path | str,
        *,
        manifest: Manifest | None = None,
        device: Any = None,
        dtype: Any = None,
        max_batch_size: int = 32,
        max_batch_tokens: int = 65536,
        stop_token_ids: Iterable[int] | None = None,
        commit: bool = True,
        precision: Any = None,
        attention: str | None = None,
        threads: int | None = None,
        fused: bool = True,
    ) -> None:
        if max_batch_size < 1 or max_batch_tokens < 1:
            raise EngineError("max_batch_size and max_batch_tokens must be >= 1")
        threads = check_threads(threads)
        self.model_dir = Path(model_dir)
        self.manifest = manifest if manifest is not None else load_manifest(self.model_dir)
        self.device = resolve_device(device)
        self.precision, self.dtype, quantize = resolve_precision(precision, dtype, self.device)
        self.model, self.tokenizer = load_model(
            self.model_dir, self.manifest, device=self.device, dtype=self.dtype,
            attention=attention,
        )
        if quantize is not None:
            quantize_weights_(self.model, quantize)
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.commit = bool(commit)  # build each output's activation commitment
        config = self.model.config
        self.vocab_size = int(config.vocab_size)
        self.hidden_size = int(config.hidden_size)  # what commitments are built over
        self.max_positions = int(getattr(config, "max_position_embeddings", 1 << 30))
        self.arch = arch_of(config.model_type)
        self.windows = layer_windows(config)  # each layer's sliding window, None: full
        self.sdpa = config._attn_implementation in SDPA_KINDS
        self.decoder = decoder = self.model.get_decoder()
        self.head = self.model.get_output_embeddings()
        # a decode step's head as one F.linear call where it is a plain nn.Linear, and the
        # soft-cap only where the architecture has one (`logits`): on a tiny model the
        # module call and the config lookup cost as much as the head's matmul
        self._head_linear = type(self.head) is nn.Linear
        self._softcapped = getattr(config, "final_logit_softcapping", None) is not None
        self.rotary = rotaries(self.arch, decoder)
        # the plain-torch decode of the Llama family (`market.engine.fused`), None where it
        # does not apply or `fused=False` asks for the modules' path
        self.fused = (fuse_layers(config, decoder.layers, self.rotary, self.sdpa)
                      if fused else None)
        self.stop_token_ids = (
            frozenset(int(t) for t in stop_token_ids)
            if stop_token_ids is not None
            else _stop_ids(self.model, self.tokenizer)
        )
        pad = self.tokenizer.pad_token_id
        if pad is None:
            pad = min(self.stop_token_ids) if self.stop_token_ids else 0
        self.pad_id = int(pad)
        self.threads = self._decide_threads(threads)

    def _decide_threads(self, threads: int | None) -> int:
        """The torch threads this engine runs with (`market.engine.threads`): `threads`
        where given, else the process's choice; on a CPU a process that made none gets the
        fastest count for this model's decode steps (timed once per process and operation
        sizes); on a GPU torch's own."""
        if threads is None and self.device.type != "cpu":
            return torch.get_num_threads()
        probe = [GenerationRequest(tuple(3 + (i + j) % max(1, self.vocab_size - 3)
                                         for j in range(8)), 2) for i in range(4)]
        # the sizes of its operations decide the count, not how many layers repeat them
        shape = (self.hidden_size, int(self.model.config.intermediate_size), self.vocab_size,
                 str(self.dtype))
        return engine_threads(threads, shape, lambda: self.generate(probe))

    def _batches(self, order: list[int], lengths: Sequence[int]) -> Iterable[list[int]]:
        """Consecutive chunks of `order` within the batch-size and padded-token budgets."""
        chunk: list[int] = []
        width = 0
        for i in order:
            new_width = max(width, lengths[i])
            if chunk and (
                len(chunk) >= self.max_batch_size
                or new_width * (len(chunk) + 1) > self.max_batch_tokens
            ):
                yield chunk
                chunk, new_width = [], lengths[i]
            chunk.append(i)
            width = new_width
        if chunk:
            yield chunk

    # ----------------------------------------------------------------- generate
    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationOutput]:
        requests = list(requests)
        for i, r in enumerate(requests):
            self.validate_request(i, r)
        lengths = [len(r.prompt_ids) + r.max_tokens for r in requests]
        order = sorted(range(len(requests)), key=lambda i: (len(requests[i].prompt_ids), i))
        results: list[GenerationOutput | None] = [None] * len(requests)
        for chunk in self._batches(order, lengths):
            for i, out in zip(chunk, self._generate_batch([requests[i] for i in chunk]),
                              strict=True):
                results[i] = out
        return [r for r in results if r is not None]

    def _next_logits(self, ids: torch.Tensor, positions: torch.Tensor, cache: DecodeCache
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the decoder on the next columns (extending `cache`) and the lm_head on the
        last position only: (last hidden states [B, d], logits [B, V])."""
        decoder = self.decoder
        h = embed(decoder.embed_tokens, self.arch, self.hidden_size, ids)
        if self.fused is not None:
            h = self.fused.run(h, positions, cache)
            hidden = self.fused.norm(h[:, -1, :], decoder.norm.weight)
        else:
            h = run_layers(decoder.layers, self.rotary, h, positions, cache)
            hidden = decoder.norm(h[:, -1, :])
        return hidden, self.logits(hidden)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 next-token logits from final hidden states, as the model class computes
        them (lm_head, then the architecture's soft-cap: `market.model.archs.final_logits`);
        the engine runs the decoder and the head apart so the head sees only the positions
        it needs."""
        head = self.head
        out = (F.linear(hidden, head.weight, head.bias) if self._head_linear
               else head(hidden)).float()
        return final_logits(self.model.config, out) if self._softcapped else out

    def _select(self, logits: torch.Tensor, requests: list[GenerationRequest],
                generators: list[torch.Generator | None]) -> torch.Tensor:
        """The next token of every live row: the protocol's rule (`sampling.choose_next`).
        Only `miner.cheats` overrides it, to serve what the protocol forbids; the logprobs
        recorded are always the honest untempered ones of the tokens it returns."""
        return choose_next(logits, requests, generators)

    @fresh_frame_chunk
    @torch.inference_mode()
    def _generate_batch(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        n = len(requests)
        finish = ["length"] * n
        texts: list[str | None] = [None] * n  # set where a stop string cut the text
        # Each step's live rows (request indices), chosen tokens, their logits (turned into
        # the tokens' logprobs many steps at a time, `_logprobs`) and the hidden states that
        # chose them: a row's outputs are gathered once at the end, so a step costs no
        # per-row Python unless a row may end there.
        steps: list[list[Any]] = []
        pending = 0  # steps[pending:] still hold logits
        live = [i for i in range(n) if requests[i].max_tokens > 0]
        stop_tokens: dict[int, list[int]] = {i: [] for i in live if requests[i].stop}
        if live:
            ids, mask, positions = left_pad(
                [requests[i].prompt_ids for i in live], self.pad_id, self.device
            )
            width = int(ids.shape[1])
            cache = DecodeCache(mask, self.windows, width + max(r.max_tokens for r in requests),
                                self.dtype, self.device, self.sdpa)
            hidden, logits = self._next_logits(ids, positions, cache)
            next_pos = positions[:, -1:] + 1  # [B, 1]
            generators = make_generators([requests[i] for i in live])
            live_reqs = [requests[i] for i in live]
            shortest = min(r.max_tokens for r in live_reqs)
        made = 0  # tokens every live row has
        while live:
            chosen = self._select(logits, live_reqs, generators)
            steps.append([live, chosen, logits, hidden])
            if (len(steps) - pending) * logits.numel() >= LOGITS_KEPT:
                pending = self._logprobs(steps, pending)
            made += 1
            chosen_list = chosen.tolist()
            if stop_tokens:
                for row, i in enumerate(live):
                    if i in stop_tokens:
                        stop_tokens[i].append(chosen_list[row])
            if (made < shortest and not stop_tokens
                    and self.stop_token_ids.isdisjoint(chosen_list)):
                keep = list(range(len(live)))
            else:
                keep = self._still_live(live, chosen_list, made, requests, stop_tokens, finish,
                                        texts)
            if not keep:
                break
            if len(keep) < len(live):
                index = torch.tensor(keep, device=self.device)
                cache.select(index)
                chosen, next_pos = chosen[index], next_pos[index]
                generators = [generators[row] for row in keep]
                live = [live[row] for row in keep]
                live_reqs = [requests[i] for i in live]
                shortest = min(r.max_tokens for r in live_reqs)
            hidden, logits = self._next_logits(chosen.unsqueeze(1), next_pos, cache)
            next_pos = next_pos + 1
        self._logprobs(steps, pending)
        tokens, logprobs, states = self._gather_rows(n, steps)
        commitments = (build_commitments(states) if self.commit else [b""] * n)
        return [
            GenerationOutput(
                token_ids=tuple(tokens[i]),
                text=self.decode(tokens[i]) if texts[i] is None else str(texts[i]),
                logprobs=tuple(logprobs[i]),
                finish_reason=finish[i],
                commitment=commitments[i],
            )
            for i in range(n)
        ]

    @staticmethod
    def _logprobs(steps: list[list[Any]], start: int) -> int:
        """Replace the logits of steps[start:] by their chosen tokens' logprobs, one
        log-softmax over all of them (each row's values as its own step's would be);
        returns the new count of steps done."""
        if start < len(steps):
            todo = steps[start:]
            lps = chosen_logprobs(torch.cat([s[2] for s in todo]),
                                  torch.cat([s[1] for s in todo]))
            for s, lp in zip(todo, lps.split([s[1].shape[0] for s in todo]), strict=True):
                s[2] = lp
        return len(steps)

    def _still_live(self, live: list[int], chosen: list[int], made: int,
                    requests: list[GenerationRequest], stop_tokens: dict[int, list[int]],
                    finish: list[str], texts: list[str | None]) -> list[int]:
        """The positions in `live` of the rows that go on after a step that chose `chosen`
        (each live row now has `made` tokens; `stop_tokens` holds the tokens of rows with
        stop strings); records why the others finished in `finish` and `texts`."""
        keep: list[int] = []
        for row, i in enumerate(live):
            if chosen[row] in self.stop_token_ids:
                finish[i] = "stop"
                stop_tokens.pop(i, None)
                continue
            if i in stop_tokens:
                text, stopped = self.output_text(stop_tokens[i], requests[i].stop)
                if stopped:
                    finish[i], texts[i] = "stop", text
                    del stop_tokens[i]
                    continue
            if made < requests[i].max_tokens:
                keep.append(row)
            else:
                stop_tokens.pop(i, None)
        return keep

    def _gather_rows(self, n: int,
                     steps: list[list[Any]]
                     ) -> tuple[list[list[int]], list[list[float]], list[torch.Tensor]]:
        """Each request's tokens, logprobs and (with commitments on) hidden states [T, d]
        from the per-step records of `_generate_batch`."""
        if not steps:
            return [[] for _ in range(n)], [[] for _ in range(n)], [torch.empty(0, 0)] * n
        live = steps[0][0]
        if all(s[0] is live for s in steps):  # no row left early: each record a column
            return self._gather_columns(n, live, steps)
        at: list[list[int]] = [[] for _ in range(n)]  # each row's entries in the flat steps
        offset = 0
        for live, *_ in steps:
            for row, i in enumerate(live):
                at[i].append(offset + row)
            offset += len(live)
        ids = torch.cat([s[1] for s in steps]).tolist()
        lps = torch.cat([s[2] for s in steps]).tolist()
        tokens = [[ids[k] for k in row] for row in at]
        logprobs = [[lps[k] for k in row] for row in at]
        states: list[torch.Tensor] = []
        if self.commit:
            hidden = torch.cat([s[3] for s in steps])
            order = torch.tensor([k for row in at for k in row], device=hidden.device)
            states = list(hidden.index_select(0, order).split([len(row) for row in at]))
            states = [h if h.shape[0] else torch.empty(0, 0) for h in states]
        return tokens, logprobs, states

    def _gather_columns(self, n: int, live: list[int], steps: list[list[Any]]
                        ) -> tuple[list[list[int]], list[list[float]], list[torch.Tensor]]:
        """`_gather_rows` where every step had the same live rows: the records stacked
        side by side are the rows' outputs, with no per-entry indexing."""
        tokens: list[list[int]] = [[] for _ in range(n)]
        logprobs: list[list[float]] = [[] for _ in range(n)]
        states: list[torch.Tensor] = [torch.empty(0, 0)] * n
        ids = torch.stack([s[1] for s in steps], 1).tolist()
        lps = torch.stack([s[2] for s in steps], 1).tolist()
        hidden = torch.stack([s[3] for s in steps], 1).unbind(0) if self.commit else ()
        for row, i in enumerate(live):
            tokens[i], logprobs[i] = ids[row], lps[row]
            if self.commit:
                states[i] = hidden[row]
        return tokens, logprobs, states

    # ----------------------------------------------------------------- score
    def score(
        self, prompt_ids: Sequence[Sequence[int]], output_ids: Sequence[Sequence[int]]
    ) -> list[ScoreResult]:
        return self._score_all(prompt_ids, output_ids, None, ())

    def evidence(
        self,
        prompt_ids: Sequence[Sequence[int]],
        output_ids: Sequence[Sequence[int]],
        sampling: Sequence[tuple[float, float]],
        exponents: Sequence[float],
        commitments: Sequence[bytes] | None = None,
        greedy: GreedyTest | None = None,
        support: SupportTest | None = None,
    ) -> list[ScoreResult]:
        if len(sampling) != len(prompt_ids):
            raise EngineError(f"{len(prompt_ids)} prompts but {len(sampling)} sampling "
                              "settings; they pair up")
        if commitments is not None and len(commitments) != len(prompt_ids):
            raise EngineError(f"{len(prompt_ids)} prompts but {len(commitments)} "
                              "commitments; they pair up")
        return self._score_all(prompt_ids, output_ids, list(sampling), tuple(exponents),
                               None if commitments is None else list(commitments), greedy,
                               support)

    def _score_all(
        self,
        prompt_ids: Sequence[Sequence[int]],
        output_ids: Sequence[Sequence[int]],
        sampling: list[tuple[float, float]] | None,
        exponents: tuple[float, ...],
        commitments: list[bytes] | None = None,
        greedy: GreedyTest | None = None,
        support: SupportTest | None = None,
    ) -> list[ScoreResult]:
        pairs = self.validate_score_inputs(prompt_ids, output_ids)
        prompts = [p for p, _ in pairs]
        outputs = [o for _, o in pairs]
        results: list[ScoreResult] = [ScoreResult((), ()) for _ in prompts]
        todo = [i for i in range(len(prompts)) if outputs[i]]
        lengths = [len(p) + len(o) for p, o in zip(prompts, outputs, strict=True)]
        todo.sort(key=lambda i: (lengths[i], i))
        for chunk in self._batches(todo, lengths):
            scored = self._score_batch(
                [prompts[i] for i in chunk], [outputs[i] for i in chunk],
                None if sampling is None else [sampling[i] for i in chunk], exponents,
                None if commitments is None else [commitments[i] for i in chunk], greedy,
                support)
            for i, res in zip(chunk, scored, strict=True):
                results[i] = res
        return results

    @fresh_frame_chunk
    @torch.inference_mode()
    def _score_batch(
        self,
        prompts: list[tuple[int, ...]],
        outputs: list[tuple[int, ...]],
        sampling: list[tuple[float, float]] | None = None,
        exponents: tuple[float, ...] = (),
        commitments: list[bytes] | None = None,
        greedy: GreedyTest | None = None,
        support: SupportTest | None = None,
    ) -> list[ScoreResult]:
        seqs = [p + o for p, o in zip(prompts, outputs, strict=True)]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        rows: list[int] = []
        cols: list[int] = []
        targets: list[int] = []
        for r, (p, o) in enumerate(zip(prompts, outputs, strict=True)):
            seq = p + o
            ids[r, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask[r, : len(seq)] = 1
            rows += [r] * len(o)
            cols += range(len(p) - 1, len(p) - 1 + len(o))
            targets += o
        decoder = self.model.get_decoder()
        hidden = decoder(
            input_ids=ids.to(self.device), attention_mask=mask.to(self.device), use_cache=False
        ).last_hidden_state
        dev = self.device
        picked = hidden[torch.tensor(rows, device=dev), torch.tensor(cols, device=dev)]
        target = torch.tensor(targets, device=self.device)
        lps, arg, top = [], [], []
        step = 8192 if sampling is None else 1024  # evidence holds float64 [step, V] tables
        for start in range(0, picked.shape[0], step):
            logits = self.logits(picked[start : start + step])
            logp = torch.log_softmax(logits, dim=-1)
            lps.append(logp.gather(1, target[start : start + step, None]).squeeze(1))
            arg.append(torch.argmax(logits, dim=-1))
            top.append(logp.max(dim=-1).values)
        lp_all = torch.cat(lps).tolist()
        arg_all = torch.cat(arg).tolist()
        top_all = torch.cat(top).tolist()
        checks = self._commitment_checks(picked, outputs, commitments)
        results, pos = [], 0
        for r, o in enumerate(outputs):
            ratios: tuple[float, ...] = ()
            distances: tuple[float, ...] = ()
            greedy_ratios_: tuple[float, ...] = ()
            rows_hidden, rows_target = picked[pos : pos + len(o)], target[pos : pos + len(o)]
            if sampling is not None and sampling[r][0] > 0:
                ratios, distances = self._row_ratios(rows_hidden, rows_target, sampling[r],
                                                  exponents, support)
            elif sampling is not None and greedy is not None:
                greedy_ratios_ = self._row_greedy(rows_hidden, rows_target, greedy)
            results.append(
                ScoreResult(
                    logprobs=tuple(lp_all[pos : pos + len(o)]),
                    argmax_ids=tuple(arg_all[pos : pos + len(o)]),
                    top_logprobs=() if sampling is None else tuple(top_all[pos : pos + len(o)]),
                    log_ratios=ratios,
                    edge_distances=distances,
                    greedy_log_ratios=greedy_ratios_,
                    commitment_checks=checks[r],
                )
            )
            pos += len(o)
        return results

    @staticmethod
    def _commitment_checks(picked: torch.Tensor, outputs: list[tuple[int, ...]],
                           commitments: list[bytes] | None) -> list[tuple[ChunkCheck, ...]]:
        """Each row's commitment checked against its hidden states (rows of `picked`, the
        states that predict its output tokens); () where no commitment was given. A
        commitment whose length does not fit its output raises EngineError."""
        if not commitments or not any(commitments):
            return [() for _ in outputs]
        starts = [0]
        for o in outputs:
            starts.append(starts[-1] + len(o))
        rows = [r for r, c in enumerate(commitments) if c]
        try:
            found = check_commitments([picked[starts[r]: starts[r + 1]] for r in rows],
                                      [commitments[r] for r in rows])
        except CommitmentError as exc:
            raise EngineError(f"a commitment does not fit its output: {exc}") from exc
        checks: list[tuple[ChunkCheck, ...]] = [() for _ in outputs]
        for r, c in zip(rows, found, strict=True):
            checks[r] = tuple(c)
        return checks

    def _row_greedy(self, hidden: torch.Tensor, targets: torch.Tensor, test: GreedyTest
                    ) -> tuple[float, ...]:
        """One greedy row's greedy-test log ratios, summed over its positions."""
        total = torch.zeros(len(test.exponents), dtype=torch.float64)
        for start in range(0, hidden.shape[0], 512):
            logits = self.logits(hidden[start : start + 512])
            total += greedy_ratios(logits, targets[start : start + 512], test).sum(0)
        return tuple(total.tolist())

    def _row_ratios(self, hidden: torch.Tensor, targets: torch.Tensor,
                    setting: tuple[float, float], exponents: tuple[float, ...],
                    support: SupportTest | None = None
                    ) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """One sampled row's log likelihood ratios, summed over its positions, and (under
        top_p < 1) how far beyond the nucleus' edge each position's token lies
        (`sampling.edge_distances`)."""
        total = torch.zeros(len(exponents) + (support.width if support else 0),
                            dtype=torch.float64)
        distances: list[float] = []
        temperature, top_p = float(setting[0]), float(setting[1])
        for start in range(0, hidden.shape[0], 512):
            logits = self.logits(hidden[start : start + 512])
            part = targets[start : start + 512]
            total += likelihood_ratios(logits, part, temperature, top_p, exponents, support,
                                       self.stop_token_ids).sum(0)
            if top_p < 1.0:
                distances += edge_distances(logits, part, temperature, top_p).tolist()
        return tuple(total.tolist()), tuple(distances)
