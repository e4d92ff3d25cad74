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
topk=128, skip_prefill=True)` (a port of its C++ to numpy: the package's compiled part is
built against other torch versions than the one this repository pins, and does not load,
so the bytes have not been compared with the package's own). An output's commitment is its
chunks' proofs concatenated; its receipt signs `commitment_hash` of them.

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


def _injective_modulus(x: np.ndarray) -> int:
    """The largest m <= MOD_N under which the indices `x` stay distinct (TOPLOC's rule)."""
    for m in range(MOD_N, 1 << 15, -1):
        if len(np.unique(x % m)) == len(x):
            return m
    raise CommitmentError("no injective modulus for the chunk's indices")


def _interpolate(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Coefficients, lowest degree first, of the polynomials over GF(MOD_N) through the
    points (x[c], y[c]) of each row c: Newton's divided differences, then expansion to the
    monomial basis (as TOPLOC's C++), every row at once."""
    inv = _inverses()
    n = x.shape[1]
    dd = y % MOD_N
    for k in range(1, n):
        dd[:, k:] = ((dd[:, k:] - dd[:, k - 1:n - 1]) % MOD_N
                     * inv[(x[:, k:] - x[:, : n - k]) % MOD_N] % MOD_N)
    coeffs = np.zeros_like(dd)
    factor = np.zeros_like(dd)
    factor[:, 0] = 1
    for i in range(n):
        coeffs[:, : i + 1] = (coeffs[:, : i + 1] + dd[:, i: i + 1] * factor[:, : i + 1]) % MOD_N
        if i + 1 < n:
            minus_x = -x[:, i: i + 1] % MOD_N
            shifted = np.concatenate((np.zeros_like(minus_x), factor[:, : i + 1]), axis=1)
            factor[:, : i + 2] = (shifted + factor[:, : i + 2] * minus_x) % MOD_N
    return coeffs


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
    import torch

    values = chunk.detach().to("cpu", torch.bfloat16)
    k = min(TOPK, values.numel())
    idx = values.abs().topk(k).indices
    bits = values[idx].view(torch.int16).numpy().astype(np.int64) & 0xFFFF
    return idx.numpy().astype(np.int64), bits


def build(hidden: torch.Tensor) -> bytes:
    """The commitment of one output from its hidden states [tokens, hidden_size] (the state
    predicting each output token, in the order of the tokens)."""
    return build_many([hidden])[0]


def build_many(hidden: Sequence[torch.Tensor]) -> list[bytes]:
    """`build` of each output's hidden states; the chunks of every output are interpolated
    together (one vectorised pass per chunk size)."""
    tops: list[tuple[int, int, np.ndarray, np.ndarray]] = []  # (output, modulus, x, y)
    for out, h in enumerate(hidden):
        if h.dim() != 2:
            raise CommitmentError(f"hidden states must be [tokens, hidden], got "
                                  f"{tuple(h.shape)}")
        for chunk in _chunks(h):
            idx, bits = _top(chunk)
            modulus = _injective_modulus(idx)
            tops.append((out, modulus, idx % modulus, bits))
    coeffs: list[np.ndarray | None] = [None] * len(tops)
    for k in sorted({len(t[2]) for t in tops}):
        rows = [i for i, t in enumerate(tops) if len(t[2]) == k]
        solved = _interpolate(np.stack([tops[i][2] for i in rows]),
                              np.stack([tops[i][3] for i in rows]))
        for i, c in zip(rows, solved, strict=True):
            coeffs[i] = c
    parts: list[bytearray] = [bytearray() for _ in hidden]
    for (out, modulus, _, _), c in zip(tops, coeffs, strict=True):
        assert c is not None
        parts[out] += modulus.to_bytes(2, "big") + c.astype(">u2").tobytes()
    return [bytes(p) for p in parts]


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
