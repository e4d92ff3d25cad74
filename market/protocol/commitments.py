"""Activation commitments (TOPLOC): a miner's short, signed record of what its model computed.

Token statistics see only the tokens; a miner running a slightly cheaper model (quantised
weights, a lower precision than declared) can return tokens that look likely. TOPLOC (Ong et
al., 2025, the `toploc` package) commits to the activations themselves, compactly and with
tolerances that survive honest GPU, kernel and batch differences. As the paper and the
package do, for each output:

- take the last hidden state (after the final norm: what the LM head reads) at every
  position that predicts an output token, in chunks of `CHUNK_TOKENS` (32) tokens;
- flatten a chunk and keep its `TOPK` (128) entries of largest magnitude, values in bf16;
- encode the (index, value) pairs as the polynomial through (index mod m, bf16 bits) over
  GF(65497), m the largest modulus <= 65497 under which the indices stay distinct, written
  as m then the 128 coefficients, 16 bits each, big-endian: 258 bytes per chunk.

This is the layout and arithmetic of `toploc.build_proofs_bytes(..., decode_batching_size=32,
topk=128, skip_prefill=True)` (ported to numpy: the package's compiled part is built
against other torch versions than the one this repository pins, and does not load, so the
bytes have not been compared with the package's own; the interpolating polynomial is
unique, so computing it in matrix form, many chunks at a time, gives the C++ Newton form's
coefficients). An output's commitment is its chunks' proofs concatenated; its receipt
signs `commitment_hash` of them.

A verifier recomputes the same hidden states in the teacher-forced pass it already runs for
the token test, takes its own top-k indices of each chunk, evaluates the miner's polynomial
there and compares the values (`check`): a chunk's `mismatches` are points whose sign or
exponent differ (an index the miner did not commit evaluates to an unrelated 16-bit value),
and `mant_err_mean`/`mant_err_median` the mantissa distance of the rest, in bf16 ulps. Another
model, prompt or a much cheaper precision moves nearly every point; rounding moves a few by an
ulp or two. How far is honest for each declared precision is the verifier's error model
(`verifier.scoring`, calibrated by `benchmarks/calibrate_numerics.py`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from market.protocol.canonical import keccak
from market.protocol.errors import ProtocolError

if TYPE_CHECKING:
    import torch

CHUNK_TOKENS = 32
TOPK = 128
MOD_N = 65497
"""The prime field of the interpolation (TOPLOC's)."""
BF16_INF = 0x7F80
"""The bits of bf16 infinity: larger magnitude bits are NaNs."""
ZERO_HASH = b"\x00" * 32
"""The receipt's commitment hash of an output that carries no commitment."""


class CommitmentError(ProtocolError):
    """A commitment whose bytes do not fit the output they claim to commit to."""


def commitment_hash(data: bytes) -> bytes:
    """What a receipt signs: keccak256 of the commitment bytes, zero for none."""
    return keccak(data) if data else ZERO_HASH


def chunk_sizes(tokens: int, hidden_size: int) -> list[int]:
    """The number of committed points of each chunk of an output of `tokens` tokens."""
    return [min(TOPK, min(CHUNK_TOKENS, tokens - start) * hidden_size)
            for start in range(0, tokens, CHUNK_TOKENS)]


MIN_TESTED_VALUES = 8 * TOPK
"""A chunk is held to a precision's tolerance only when its TOPK points are the largest of at
least this many activations (positions x hidden size). Fewer, and they include ordinary
activations, whose rounding error in bf16 ulps is several times the largest ones': the last
chunk of an output with 1 or 2 positions past a multiple of 32, at the trained test model's
hidden size 128, showed honest bf16 errors of 2.6 and 0.9 ulps (median) against 0.7 for a
full chunk (`verifier.error_models` was calibrated on full chunks)."""


def checked_chunks(tokens: int, hidden_size: int) -> list[bool]:
    """Per chunk of an output of `tokens` tokens, whether a verifier tests it against the
    tolerance (`MIN_TESTED_VALUES`): every chunk of a model whose hidden size is at least
    1,024, the full ones and long last ones of smaller models."""
    return [min(CHUNK_TOKENS, tokens - start) * hidden_size >= MIN_TESTED_VALUES
            for start in range(0, tokens, CHUNK_TOKENS)]


def expected_length(tokens: int, hidden_size: int) -> int:
    """The byte length of the commitment of an output of `tokens` tokens."""
    return sum(2 + 2 * k for k in chunk_sizes(tokens, hidden_size))


# ------------------------------------------------------------------------ field arithmetic

@functools.cache
def _inverses() -> np.ndarray:
    """a ** (p - 2) mod p for every residue a (index 0 unused): a 512 KiB table built once,
    so interpolation divides by a lookup."""
    a = np.arange(MOD_N, dtype=np.int64)
    result = np.ones_like(a)
    e = MOD_N - 2
    while e:
        if e & 1:
            result = result * a % MOD_N
        a = a * a % MOD_N
        e >>= 1
    return result


@functools.cache
def _powers() -> np.ndarray:
    """a ** t mod p for every residue a and t < TOPK, as uint16 (residues fit): a 16 MiB
    table built once, so each interpolation looks its Vandermonde rows up rather than
    raising its points to every power again."""
    a = np.arange(MOD_N, dtype=np.int64)
    table = np.empty((MOD_N, TOPK), dtype=np.uint16)
    column = np.ones_like(a)
    for t in range(TOPK):
        table[:, t] = column
        column = column * a % MOD_N
    return table


def _injective_modulus(x: np.ndarray) -> int:
    """The largest m <= MOD_N under which the indices `x` stay distinct (TOPLOC's rule)."""
    for m in range(MOD_N, 1 << 15, -1):
        if len(np.unique(x % m)) == len(x):
            return m
    raise CommitmentError("no injective modulus for the chunk's indices")


INTERPOLATE_ROWS = 8
"""Chunks whose [rows, n, n] power tables `_interpolate_rows` builds at once: few enough
that the tables stay in cache, enough that the array calls are few."""


def _interpolate(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Coefficients, lowest degree first, of the polynomials over GF(MOD_N) through the
    points (x[c], y[c]) of each row c (x distinct within a row, each < MOD_N): the
    interpolating polynomial of degree < n is unique, so this is TOPLOC's Newton form's
    result. Computed as Lagrange's form in matrix products: the vanishing polynomials of
    every row at once, the rest `INTERPOLATE_ROWS` rows at a time, a few dozen array
    operations per group rather than two per point."""
    x = x % MOD_N
    a = _from_roots(x)
    parts = [_interpolate_rows(x[r: r + INTERPOLATE_ROWS], y[r: r + INTERPOLATE_ROWS],
                               a[r: r + INTERPOLATE_ROWS])
             for r in range(0, x.shape[0], INTERPOLATE_ROWS)]
    return np.concatenate(parts) if parts else np.zeros_like(y)


def _interpolate_rows(x: np.ndarray, y: np.ndarray, a: np.ndarray) -> np.ndarray:
    """`_interpolate` of a few rows (x already reduced mod MOD_N) whose vanishing
    polynomials P(X) = prod_j (X - x_j) = sum_m a_m X^m are `a` (`_from_roots`). With
    u_i = y_i / P'(x_i), the interpolant sum_i u_i P(X) / (X - x_i) has coefficients
    c_k = sum_{m > k} a_m s_{m-k-1}, where s_t = sum_i u_i x_i^t. Sums of products of
    residues stay below 2**53, so float64 products and sums are exact before the final mod."""
    rows, n = x.shape
    table = np.take(_powers(), x, axis=0)[..., :n].astype(np.float64)  # x_i ** t, t < n
    slope = (a[:, 1:] * np.arange(1, n + 1) % MOD_N).astype(np.float64)  # P'
    at_x = _mod((table @ slope[:, :, None])[..., 0]).astype(np.int64)  # P'(x_i) != 0
    u = (y % MOD_N) * _inverses()[at_x] % MOD_N
    s = _mod((u.astype(np.float64)[:, None, :] @ table)[:, 0])
    # c_k = sum_t a_{k+t+1} s_t: each row's correlation of a_1.. with s, from lag 0 on
    high = a[:, 1:].astype(np.float64)
    c = np.stack([np.correlate(high[r], s[r], mode="full")[n - 1:] for r in range(rows)])
    return _mod(c).astype(np.int64)


def _mod(v: np.ndarray) -> np.ndarray:
    """v mod MOD_N of float64 integers 0 <= v < 2**45 (sums of products of residues), as
    float64: the quotient's floor is exact at that size, and this runs ten times faster
    than numpy's float remainder."""
    return v - np.floor(v / MOD_N) * MOD_N


def _from_roots(x: np.ndarray) -> np.ndarray:
    """Coefficients, lowest degree first, of prod_j (X - x_j) mod MOD_N for each row of
    `x` [rows, n] (residues): [rows, n + 1], by multiplying pairs of factors up a binary
    tree (padded with factors 1), each level's products one batched matrix product: the
    coefficients c_k = sum_j l_{k-j} r_j of l * r are a Hankel view of l zero-padded times
    r reversed. Residues are under 2**16 and a factor has at most 65 coefficients, so the
    float64 sums (under 2**39) are exact before the mod."""
    rows, n = x.shape
    size = 1 << max(0, (n - 1).bit_length())
    polys = np.zeros((rows, size, 2), dtype=np.float64)
    polys[:, :, 0] = 1
    polys[:, :n, 0] = (MOD_N - x) % MOD_N
    polys[:, :n, 1] = 1
    while polys.shape[1] > 1:
        left, right = polys[:, 0::2], polys[:, 1::2]
        width = left.shape[-1]
        padded = np.zeros(left.shape[:-1] + (3 * width - 2,), dtype=np.float64)
        padded[..., width - 1: 2 * width - 1] = left
        strides = padded.strides
        hankel = np.lib.stride_tricks.as_strided(
            padded, shape=left.shape[:-1] + (2 * width - 1, width),
            strides=strides[:-1] + (strides[-1], strides[-1]))  # [k, j]: l_{k+j-width+1}
        polys = _mod((hankel @ right[..., ::-1, None])[..., 0])
    return polys[:, 0, : n + 1].astype(np.int64)


def _evaluate(coeffs: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Each row's polynomial (coeffs [C, n]) at that row's points (x [C, m]): Horner, mod
    MOD_N, every row at once."""
    result = np.repeat(coeffs[:, -1:], x.shape[1], axis=1)
    for i in range(coeffs.shape[1] - 2, -1, -1):
        result = (result * x + coeffs[:, i: i + 1]) % MOD_N
    return result


# ------------------------------------------------------------------------ build and check

def _chunks(hidden: torch.Tensor) -> list[torch.Tensor]:
    """An output's hidden states [T, d] as flattened chunks of CHUNK_TOKENS positions."""
    return [hidden[s: s + CHUNK_TOKENS].reshape(-1) for s in range(0, hidden.shape[0],
                                                                     CHUNK_TOKENS)]


def _top(chunk: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(indices, bf16 bit patterns) of the chunk's TOPK entries of largest magnitude."""
    idx, bits = _top_rows(chunk[None])
    return idx[0], bits[0]


def build(hidden: torch.Tensor) -> bytes:
    """The commitment of one output from its hidden states [tokens, hidden_size] (the state
    predicting each output token, in the order of the tokens)."""
    return build_many([hidden])[0]


def build_many(hidden: Sequence[torch.Tensor]) -> list[bytes]:
    """`build` of each output's hidden states. Chunks of one size (all full chunks, and
    each shorter last one) go through the top-k, the modulus and the interpolation
    together, a few array operations per group rather than per chunk."""
    import torch

    chunks: list[tuple[int, torch.Tensor]] = []  # (output, flattened chunk)
    for out, h in enumerate(hidden):
        if h.dim() != 2:
            raise CommitmentError(f"hidden states must be [tokens, hidden], got "
                                  f"{tuple(h.shape)}")
        chunks += [(out, c) for c in _chunks(h)]
    proofs: list[bytes] = [b""] * len(chunks)
    for size in sorted({c.numel() for _, c in chunks}):
        group = [i for i, (_, c) in enumerate(chunks) if c.numel() == size]
        idx, bits = _top_rows(torch.stack([chunks[i][1] for i in group]))
        moduli = _moduli(idx)
        coeffs = _interpolate(idx % moduli[:, None], bits)
        packed = np.empty((len(group), 1 + coeffs.shape[1]), dtype=">u2")  # m, coefficients
        packed[:, 0], packed[:, 1:] = moduli, coeffs
        for i, proof in zip(group, packed, strict=True):
            proofs[i] = proof.tobytes()
    parts: list[bytearray] = [bytearray() for _ in hidden]
    for (out, _), proof in zip(chunks, proofs, strict=True):
        parts[out] += proof
    return [bytes(p) for p in parts]


def _top_rows(chunks: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """`_top` of each row of `chunks` [C, size] (torch's top-k runs row by row alike)."""
    import torch

    values = chunks.detach().to("cpu", torch.bfloat16)
    k = min(TOPK, values.shape[1])
    # A bf16 magnitude orders as its bits with the sign cleared (NaNs aside), so top-k over
    # those int16 keys runs the same selection on the same comparisons, 1.6x faster; in no
    # particular order (the selection is the same, and the polynomial through a set of
    # points does not depend on their order).
    top = (values.view(torch.int16) & 0x7FFF).topk(k, dim=1, sorted=False)
    if bool(top.values.max() > BF16_INF):  # a NaN: torch ranks every NaN alike, keys do not
        top = values.abs().topk(k, dim=1, sorted=False)
    idx = top.indices
    bits = values.gather(1, idx).view(torch.int16).numpy().astype(np.int64) & 0xFFFF
    return idx.numpy().astype(np.int64), bits


def _moduli(idx: np.ndarray) -> np.ndarray:
    """`_injective_modulus` of each row of `idx` [C, k]: MOD_N where the indices are
    distinct under it (always, for chunks under MOD_N values), else the row's own search."""
    ordered = np.sort(idx % MOD_N, axis=1)
    distinct = (np.diff(ordered, axis=1) != 0).all(axis=1)
    return np.array([MOD_N if ok else _injective_modulus(row)
                     for ok, row in zip(distinct.tolist(), idx, strict=True)], dtype=np.int64)


@dataclass(frozen=True)
class ChunkCheck:
    """How far one committed chunk is from the verifier's own activations."""

    points: int
    mismatches: int  # points whose sign or bf16 exponent differ
    mant_err_mean: float  # mean |mantissa difference| (bf16 ulps) over the other points
    mant_err_median: float

    def to_json(self) -> list[float]:
        return [self.points, self.mismatches, self.mant_err_mean, self.mant_err_median]

    @classmethod
    def from_json(cls, v: Sequence[float]) -> ChunkCheck:
        if len(v) != 4:
            raise CommitmentError(f"a chunk check is 4 numbers, got {list(v)!r}")
        return cls(int(v[0]), int(v[1]), float(v[2]), float(v[3]))


def split(data: bytes, tokens: int, hidden_size: int) -> list[tuple[int, np.ndarray]]:
    """The (modulus, coefficients) of each chunk of an output's commitment; raises
    CommitmentError when the length does not fit an output of `tokens` tokens."""
    want = expected_length(tokens, hidden_size)
    if len(data) != want:
        raise CommitmentError(f"commitment of {len(data)} bytes for {tokens} tokens; "
                              f"{want} expected ({CHUNK_TOKENS} tokens a chunk)")
    proofs, pos = [], 0
    for k in chunk_sizes(tokens, hidden_size):
        modulus = int.from_bytes(data[pos: pos + 2], "big")
        coeffs = np.frombuffer(data, dtype=">u2", count=k, offset=pos + 2).astype(np.int64)
        if not 1 << 15 < modulus <= MOD_N:
            raise CommitmentError(f"commitment chunk modulus {modulus} is out of range")
        proofs.append((modulus, coeffs))
        pos += 2 + 2 * k
    return proofs


def check(hidden: torch.Tensor, data: bytes) -> list[ChunkCheck]:
    """Compare a commitment with the verifier's hidden states [tokens, hidden_size] of the
    same output, chunk by chunk (see the module doc)."""
    return check_many([hidden], [data])[0]


def check_many(hidden: Sequence[torch.Tensor], data: Sequence[bytes]) -> list[list[ChunkCheck]]:
    """`check` of each output; raises CommitmentError naming the first output whose
    commitment does not fit its length."""
    rows: list[tuple[int, int, np.ndarray, np.ndarray]] = []  # (output, modulus, coeffs, mine)
    points: list[np.ndarray] = []
    for out, (h, d) in enumerate(zip(hidden, data, strict=True)):
        try:
            proofs = split(d, h.shape[0], h.shape[1])
        except CommitmentError as exc:
            raise CommitmentError(f"output {out}: {exc}") from exc
        for chunk, (modulus, coeffs) in zip(_chunks(h), proofs, strict=True):
            idx, mine = _top(chunk)
            rows.append((out, modulus, coeffs, mine))
            points.append(idx % modulus)
    theirs: list[np.ndarray | None] = [None] * len(rows)
    for k in sorted({len(r[2]) for r in rows}):
        group = [i for i, r in enumerate(rows) if len(r[2]) == k]
        values = _evaluate(np.stack([rows[i][2] for i in group]),
                           np.stack([points[i] for i in group]))
        for i, v in zip(group, values, strict=True):
            theirs[i] = v
    checks: list[list[ChunkCheck]] = [[] for _ in hidden]
    for (out, _, _, mine), other in zip(rows, theirs, strict=True):
        assert other is not None
        sign_exp = (mine >> 7) != (other >> 7)  # sign bit and 8 exponent bits
        mant = np.abs((mine & 0x7F) - (other & 0x7F))[~sign_exp]
        mean = float(mant.mean()) if mant.size else float(1 << 7)
        median = float(np.sort(mant)[mant.size // 2]) if mant.size else float(1 << 7)
        checks[out].append(ChunkCheck(len(mine), int(sign_exp.sum()), mean, median))
    return checks
