"""The vLLM engine: the same `Engine` interface, run by vLLM on a CUDA GPU.

`import vllm` happens inside the constructor; where vLLM is absent the constructor raises
`VllmNotInstalled` saying how to install it. The model directory is checked against its
manifest before vLLM sees it, exactly as for the torch engine.

What vLLM gives, and how it maps onto Quarry's rules:

- generate: one `SamplingParams(temperature, top_p, seed, max_tokens, stop, logprobs=1)` per
  request (temperature 0 is greedy in vLLM too; `sampling_params` builds the fields), with
  every other filter and penalty at its neutral value (`NEUTRAL_FILTERS`: top_k and min_p
  off, no repetition, presence or frequency penalty, no minimum length, no logit bias or
  banned words): the protocol's one sampling rule is temperature then the top_p nucleus
  (`market.engine.sampling`), and a model's `generation_config.json` defaults never reach
  explicit `SamplingParams`.
- precision: `precision` fp32, fp16 or bf16 sets vLLM's `dtype`; fp8 asks for its fp8
  weight quantisation over bf16 (int8 has no single vLLM scheme this engine picks; run the
  torch engine). Without one, vLLM's "auto" dtype decides and names it. vLLM does not
  expose the hidden states, so its outputs carry no activation commitment: tasks that
  require commitments are not for this engine. vLLM's V1 sampler returns *raw* logprobs
  (log_softmax of the model's logits before temperature, penalties or top_p; its default
  `logprobs_mode="raw_logprobs"`, which this engine also asks for explicitly where the
  installed vLLM accepts it), which is the untempered distribution Quarry records. The
  older V0 engine returned logprobs after temperature scaling; with it, sampled requests'
  logprobs differ from `score()` (greedy ones do not, as temperature 0 is not applied).
- An EOS stop keeps the EOS id in `token_ids` (vLLM's behaviour, and the torch engine's).
- Stop strings go to vLLM as `SamplingParams(stop=[...])`. vLLM, too, keeps every generated
  id (the one that completed the stop string included) and cuts only the text; the text
  is re-derived here by the torch engine's rule (`base.text_for` on the ids), so a row's
  text, finish reason and outputHash follow the same rule whichever engine ran it.
  Text is decoded here with the model's tokenizer (special tokens skipped), as the torch
  engine does, so the same ids give the same text and outputHash.
- `max_tokens == 0` is answered locally (vLLM requires at least 1).
- Seeds reproduce samples within vLLM; vLLM's random stream is not the torch engine's, so
  a sampled output from one engine kind is not expected to equal the other's.
- score: the prompt followed by the output is submitted with `max_tokens=1` and
  `prompt_logprobs=1`; for each output position vLLM returns the actual token's logprob
  and the top-1 token (rank 1), which gives the argmax id. Prefix caching is off by
  default because some vLLM versions do not return prompt logprobs for cached tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from market.engine.base import GenerationOutput, GenerationRequest, ScoreResult, text_for
from market.engine.sampling import validate_sampling
from market.engine.text import TextEngine
from market.errors import QuarryError
from market.model.manifest import Manifest, load_manifest
from market.protocol.precision import Precision, parse_precision

INSTALL_HINT = "pip install 'quarry[vllm]' on a Linux machine with an NVIDIA GPU and CUDA"


class VllmNotInstalled(QuarryError):
    """vLLM is not importable here."""


class VllmEngineError(QuarryError):
    """Bad input to the vLLM engine, or an output vLLM returned in an unexpected shape."""


def _logprob_value(entry: Any) -> float:
    return float(entry.logprob if hasattr(entry, "logprob") else entry)


def output_from_vllm(completion: Any, decode: Any, stop: Sequence[str] = ()) -> GenerationOutput:
    """Convert one vLLM `CompletionOutput` (requested with logprobs, and with `stop` as its
    stop strings) into a GenerationOutput."""
    token_ids = tuple(int(t) for t in completion.token_ids)
    steps = completion.logprobs
    if steps is None or len(steps) != len(token_ids):
        raise VllmEngineError(
            f"vLLM returned {0 if steps is None else len(steps)} logprob entries for "
            f"{len(token_ids)} tokens"
        )
    logprobs = []
    for i, (tok, step) in enumerate(zip(token_ids, steps, strict=True)):
        if tok not in step:
            raise VllmEngineError(f"vLLM logprobs at step {i} lack the sampled token {tok}")
        logprobs.append(_logprob_value(step[tok]))
    reason = completion.finish_reason
    text, stopped = text_for(decode, token_ids, stop)
    finish = "length" if reason == "length" and not stopped else "stop"
    return GenerationOutput(
        token_ids=token_ids, text=text, logprobs=tuple(logprobs), finish_reason=finish
    )


def score_from_prompt_logprobs(
    prompt_logprobs: Sequence[Mapping[int, Any] | None], prompt_len: int, output: Sequence[int]
) -> ScoreResult:
    """Per-token logprobs and argmax ids of `output` from vLLM `prompt_logprobs` over p + o."""
    if len(prompt_logprobs) != prompt_len + len(output):
        raise VllmEngineError(
            f"vLLM returned {len(prompt_logprobs)} prompt logprob entries for "
            f"{prompt_len + len(output)} tokens"
        )
    lps, arg = [], []
    for j, tok in enumerate(output):
        step = prompt_logprobs[prompt_len + j]
        if step is None or tok not in step:
            raise VllmEngineError(f"vLLM prompt logprobs lack output token {j} ({tok})")
        lps.append(_logprob_value(step[tok]))
        top = [t for t, e in step.items() if getattr(e, "rank", None) == 1]
        if top:
            arg.append(int(top[0]))
        else:  # no rank information: the most likely entry returned
            arg.append(int(max(step.items(), key=lambda kv: _logprob_value(kv[1]))[0]))
    return ScoreResult(logprobs=tuple(lps), argmax_ids=tuple(arg))


# vLLM's sampling filters and penalties, each at the value that leaves the distribution
# alone (vLLM >= 0.11: top_k 0 means no top-k): a request names none of them, and a model's
# generation_config.json defaults must not reach the sampler either.
NEUTRAL_FILTERS: dict[str, Any] = {
    "n": 1,
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "min_tokens": 0,
    "ignore_eos": False,
    "logit_bias": None,
    "allowed_token_ids": None,
    "bad_words": None,
}


def sampling_params(request: GenerationRequest) -> dict[str, Any]:
    """The `vllm.SamplingParams` fields of one request, as a plain mapping (testable
    without vLLM): the protocol's rule (temperature, then the top_p nucleus; temperature 0
    is greedy), its seed (vLLM takes it below 2**63), max_tokens, stop strings, raw
    logprobs of the sampled token, every other filter neutral."""
    return {
        "temperature": max(0.0, float(request.temperature)),
        "top_p": float(request.top_p),
        "seed": int(request.seed) % (1 << 63),
        "max_tokens": int(request.max_tokens),
        "stop": list(request.stop),
        "logprobs": 1,
        **NEUTRAL_FILTERS,
    }


def _precision_options(precision: Any, dtype: str | None
                       ) -> tuple[Precision | None, str | None, str | None]:
    """(declared precision, vLLM dtype, vLLM quantization) from the engine's options."""
    if precision is None:
        return None, dtype, None
    try:
        declared = parse_precision(precision)
    except QuarryError as exc:
        raise VllmEngineError(str(exc)) from exc
    if declared is Precision.INT8:
        raise VllmEngineError("the vLLM engine serves fp32, fp16, bf16 or fp8; for int8 "
                              "weights run the torch engine (engine = \"torch\")")
    wanted = declared.torch_dtype_name
    if dtype is not None and dtype not in ("auto", wanted):
        raise VllmEngineError(f"dtype {dtype!r} contradicts precision {declared.label!r}")
    return declared, wanted, "fp8" if declared is Precision.FP8 else None


def _served_precision(config: Any) -> Precision:
    """The precision vLLM's "auto" dtype chose, from its model config."""
    dtype = str(getattr(config, "dtype", "bfloat16")).removeprefix("torch.")
    return parse_precision(dtype)


class VllmEngine(TextEngine):
    """A verified local model served by vLLM (`vllm.LLM`) in this process."""

    def __init__(
        self,
        model_dir: Path | str,
        *,
        manifest: Manifest | None = None,
        dtype: str | None = None,
        precision: Any = None,
        max_batch_size: int = 256,
        gpu_memory_utilization: float = 0.85,
        seed: int = 0,
        enable_prefix_caching: bool = False,
        **llm_options: Any,
    ) -> None:
        try:
            import vllm
        except ImportError as exc:
            raise VllmNotInstalled(f"vLLM is not installed ({exc}); {INSTALL_HINT}") from exc
        self._vllm = vllm
        declared, dtype, quantization = _precision_options(precision, dtype)
        if quantization is not None:
            llm_options.setdefault("quantization", quantization)
        self.model_dir = Path(model_dir)
        self.manifest = manifest if manifest is not None else load_manifest(self.model_dir)
        self.manifest.verify(self.model_dir)
        options: dict[str, Any] = {
            "model": str(self.model_dir),
            "tokenizer": str(self.model_dir),
            "dtype": dtype or "auto",
            "max_num_seqs": max_batch_size,
            "gpu_memory_utilization": gpu_memory_utilization,
            "seed": seed,
            "enable_prefix_caching": enable_prefix_caching,
            "trust_remote_code": False,
            "logprobs_mode": "raw_logprobs",
            **llm_options,
        }
        try:
            self.llm = vllm.LLM(**options)
        except TypeError as exc:  # an older vLLM without logprobs_mode
            if "logprobs_mode" not in str(exc) or "logprobs_mode" in llm_options:
                raise
            options.pop("logprobs_mode")
            self.llm = vllm.LLM(**options)
        self.tokenizer = self.llm.get_tokenizer()
        config = getattr(self.llm.llm_engine, "model_config", None)
        self.max_positions = int(getattr(config, "max_model_len", 0) or 0)
        self.vocab_size = int(self.manifest.architecture.get("vocab_size", 0) or 0)
        self.precision = declared if declared is not None else _served_precision(config)

    def _check(self, ids: Sequence[int], what: str) -> None:
        if not ids:
            raise VllmEngineError(f"{what}: empty prompt (it needs at least one token)")
        limit = self.vocab_size or None
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, int) or t < 0 or (limit and t >= limit):
                raise VllmEngineError(f"{what}: token id {t!r} is outside the vocabulary")

    def _tokens_prompt(self, ids: Sequence[int]) -> Any:
        from vllm.inputs import TokensPrompt

        return TokensPrompt(prompt_token_ids=[int(t) for t in ids])

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationOutput]:
        requests = list(requests)
        for i, r in enumerate(requests):
            self._check(r.prompt_ids, f"request {i}")
            if isinstance(r.max_tokens, bool) or not isinstance(r.max_tokens, int) or (
                r.max_tokens < 0
            ):
                raise VllmEngineError(f"request {i}: max_tokens must be an integer >= 0")
            try:
                validate_sampling(r, i)
            except QuarryError as exc:
                raise VllmEngineError(str(exc)) from exc
        todo = [i for i, r in enumerate(requests) if r.max_tokens > 0]
        results = [GenerationOutput((), "", (), "length") for _ in requests]
        if not todo:
            return results
        params = [self._vllm.SamplingParams(**sampling_params(requests[i])) for i in todo]
        outs = self.llm.generate(
            [self._tokens_prompt(requests[i].prompt_ids) for i in todo], params, use_tqdm=False
        )
        for i, out in zip(todo, outs, strict=True):
            results[i] = output_from_vllm(out.outputs[0], self.decode, requests[i].stop)
        return results

    def score(
        self, prompt_ids: Sequence[Sequence[int]], output_ids: Sequence[Sequence[int]]
    ) -> list[ScoreResult]:
        if len(prompt_ids) != len(output_ids):
            raise VllmEngineError(
                f"{len(prompt_ids)} prompts but {len(output_ids)} outputs; they pair up"
            )
        for i, (p, o) in enumerate(zip(prompt_ids, output_ids, strict=True)):
            self._check(list(p), f"sequence {i} prompt")
            if o:
                self._check(list(o), f"sequence {i} output")
        results = [ScoreResult((), ()) for _ in prompt_ids]
        todo = [i for i, o in enumerate(output_ids) if len(o)]
        if not todo:
            return results
        params = self._vllm.SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
        outs = self.llm.generate(
            [self._tokens_prompt(list(prompt_ids[i]) + list(output_ids[i])) for i in todo],
            params,
            use_tqdm=False,
        )
        for i, out in zip(todo, outs, strict=True):
            results[i] = score_from_prompt_logprobs(
                out.prompt_logprobs, len(prompt_ids[i]), list(output_ids[i])
            )
        return results

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is not None:
            del self.llm
            try:
                import gc

                import torch

                gc.collect()
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
            except ImportError:
                pass
