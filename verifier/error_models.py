"""The calibrated error models: how far an honest miner's numbers may drift, per model.

How much rounding moves a model's logits depends on the model (its depth, its logits' and
activations' magnitudes), not only on the precision: the embedded tiny model's huge
embeddings make its bf16 greedy flips reach 0.2 nats where the trained test model's stay
under 0.04. So an error model belongs to a modelId. `benchmarks/calibrate_numerics.py`
measured these, on this repository's 2-core CPU (AVX512-BF16: fp32-accumulated bf16
products, as GPUs compute them), with every honest setup of `benchmarks/_numerics.py`
(fp32, fp16, bf16, int8 and fp8 weights; batch 32, 1 and shuffled batches of 5; sdpa and
eager attention; 192 greedy outputs of 64 tokens each). Each entry is
(beta, (mismatches, mean, median)): the Gumbel scale of the greedy test in nats, and the
largest sign/exponent mismatches and mean and median mantissa errors (bf16 ulps) an honest
commitment chunk may show, for a (miner's declared precision, verifier's precision) pair.
Against an fp32 verifier they are twice the smallest that fit every measured honest output
(at least 0.005 nats for fp32); against a bf16 verifier, the miner's and the verifier's
own fp32 models added up.

A model without an entry is judged by `DEFAULT`, the largest of every calibrated model's
numbers: safe for models like these, and less sharp. An operator serving another model
runs the calibration on it and adds its entry (every verifier must hold the same table, or
their verdicts on the same shard may differ).
"""

from __future__ import annotations

Pair = tuple[float, tuple[int, float, float]]

CALIBRATED: dict[str, dict[str, Pair]] = {
    # quarry-tiny: `market model create` with its defaults (the demo's and most tests' model).
    # fp16/fp32's beta from a second sample (2026-11-28): largest gap 0.025 where the first
    # had 0.012 (smallest fitting scale 0.0075); the second sample's other pairs fit.
    "0x6b69454fa9c1856ab18838ed2975cee46a953be718aedb249f7e75e6f664e0fc": {
        "fp32/fp32": (0.005, (6, 0.52, 1.0)),
        "fp16/fp32": (0.015, (10, 2.34, 1.0)),
        "bf16/fp32": (0.1125, (12, 3.16, 3.0)),
        "fp8/fp32": (0.7303, (28, 5.95, 5.0)),
        "int8/fp32": (0.2, (16, 2.92, 3.0)),
        "fp32/bf16": (0.1175, (18, 3.68, 4.0)),
        "fp16/bf16": (0.1275, (22, 5.5, 4.0)),
        "bf16/bf16": (0.225, (24, 6.32, 6.0)),
        "fp8/bf16": (0.8428, (40, 9.11, 8.0)),
        "int8/bf16": (0.3125, (28, 6.08, 6.0)),
    },
    # quarry-pydoc: testmodels/quarry-pydoc, trained on the Python documentation. bf16/fp32's
    # beta from a second sample (192 other greedy prompts, 2026-11-28): an eager-attention
    # bf16 miner flipped at a gap of 0.080 nats, smallest fitting scale 0.0154 (the first
    # sample's largest gap was 0.033, scale 0.0075); the bf16 verifier's pairs recomposed.
    "0xaeb78152202e1fbe78f690da9604a55f771daef719ae3efaa56296ba046afcc0": {
        "fp32/fp32": (0.005, (2, 0.52, 1.0)),
        "fp16/fp32": (0.005, (12, 1.51, 1.0)),
        "bf16/fp32": (0.0308, (22, 2.79, 3.0)),
        "fp8/fp32": (0.0974, (32, 7.54, 7.0)),
        "int8/fp32": (0.0411, (24, 3.17, 3.0)),
        "fp32/bf16": (0.0358, (24, 3.31, 4.0)),
        "fp16/bf16": (0.0358, (34, 4.3, 4.0)),
        "bf16/bf16": (0.0616, (44, 5.58, 6.0)),
        "fp8/bf16": (0.1282, (54, 10.33, 10.0)),
        "int8/bf16": (0.0719, (46, 5.96, 6.0)),
    },
}


def _largest(pairs: list[Pair]) -> Pair:
    return (max(p[0] for p in pairs),
            (max(p[1][0] for p in pairs), max(p[1][1] for p in pairs),
             max(p[1][2] for p in pairs)))


DEFAULT: dict[str, Pair] = {
    key: _largest([table[key] for table in CALIBRATED.values()])
    for key in next(iter(CALIBRATED.values()))
}

DRIFT: dict[str, dict[str, float]] = {
    # quarry-pydoc, bf16 declared against an fp32 verifier. Of the chunks a verifier tests
    # (`market.protocol.commitments.checked_chunks`), 64-token outputs at temperatures 0,
    # 0.5, 0.8 and 1, about 2,150 chunks per setup, above 0.91 ulps: honest bf16 1.5% (batch
    # 32, sdpa), 1.3% (batch 1), 1.5% (shuffled 5), 2.6% (eager); int8 weights 39%, 1%
    # weight noise 92%. (At 0.95, the line when short last chunks were counted: honest 0.4
    # to 0.8%, int8 23%.)
    # fp16 declared: honest fp16 tested chunks (3 setups, ~1,430 each) median 0.10 ulps,
    # the 1-in-30 quantile 0.158, none above 0.43 (a second sample: 2 of 1,803 above 0.48);
    # the line takes three times the quantile (room for a GPU's fp16 reductions): int8
    # weights 100% above it, 1% weight noise 98%.
    "0xaeb78152202e1fbe78f690da9604a55f771daef719ae3efaa56296ba046afcc0": {
        "bf16/fp32": 0.91, "fp16/fp32": 0.48},
}
"""Per model and pair, the mean mantissa error (bf16 ulps) above which a tested chunk inside
the tolerance *drifts* (`verifier.scoring`'s drift test, which allows an honest chunk to
drift with chance up to `DRIFT_FALSE_RATE`, 0.1): the smallest multiple of 0.01 above which
at most 1 in `DRIFT_SAFETY` (3) of that many honest tested chunks fall in every calibrated
setup, times the pair's room (`benchmarks/calibrate_numerics.py`'s `DRIFT_PAIRS`: 1 for
bf16, 3 for fp16). Only where a cheaper computation was seen to hide inside the tolerance
(int8 weights, 1% weight noise under a bf16 or an fp16 declaration on the trained model:
under fp16 they took 4 and 3 epochs to be untrusted without a line); elsewhere no chunk is
checked for drift. (The tiny model's int8 chunks drift too
little to matter: 3% above the threshold its honest bf16 chunks need, on this CPU and on an
H200 alike.)"""

EDGE: dict[str, dict[str, float]] = {
    # quarry-tiny. Farthest honest token against an fp32 verifier: bf16 0.0278 nats (75 of
    # 61,682 nucleus-limited tokens outside its nucleus), fp16 0.0012 (5 of 37,812), fp32 0
    # (none of 60,461); an fp32 miner against a bf16 verifier 0.0508 (70 outside).
    "0x6b69454fa9c1856ab18838ed2975cee46a953be718aedb249f7e75e6f664e0fc": {
        "fp32/fp32": 0.005, "bf16/fp32": 0.0556, "fp16/fp32": 0.005,
        "fp32/bf16": 0.0606, "bf16/bf16": 0.1112, "fp16/bf16": 0.0606},
    # quarry-pydoc. Farthest against an fp32 verifier: bf16 0.0091 (44 of 58,355 outside),
    # fp16 0.0007 (3 of 35,996), fp32 0 (none of 57,601); fp32 against bf16: 0.0215 (20).
    "0xaeb78152202e1fbe78f690da9604a55f771daef719ae3efaa56296ba046afcc0": {
        "fp32/fp32": 0.005, "bf16/fp32": 0.0182, "fp16/fp32": 0.005,
        "fp32/bf16": 0.0232, "bf16/bf16": 0.0364, "fp16/bf16": 0.0232},
}
"""Per model and pair, the nucleus-edge margin in logit nats: how far beyond the verifier's
top_p nucleus an honest sampled token may lie (`market.engine.sampling.edge_distances`) but
for a chance of at most `verifier.scoring.EDGE_FALSE_RATE`; `verifier.scoring`'s edge test
counts the tokens further out. Calibrated by `benchmarks/calibrate_numerics.py` as
`EDGE_SAFETY` (2) times the largest honest distance of the pair (at least `EDGE_FLOOR`,
0.005), fp32, bf16 and fp16 miners in every batch shape and kernel against an fp32
verifier; against a bf16 verifier the miner's and the verifier's margins add up. A pair
without an entry (int8 and fp8 weights, uncalibrated models) checks no token."""
