"""The fast log product's first tier: one scale per row of a and per column of b, and one TF32 product.

    C[p, i, j] = logsumexp_k (A[p, i, k] + B[p, k, j])
               = (M[p, i] + N[p, j] + log2 sum_k 2^(a[p, i, k] - M[p, i]) 2^(b[p, k, j] - N[p, j])) ln 2

with a = A log2 e, b = B log2 e, M the row maxima of a over all of k and N the column maxima of b. Both
factors are in [0, 1] and the sum is a plain TF32 batched matmul (cuBLAS): no running maximum, no per-tile
combine, no exponential per output. cuBLAS rounds its float32 operands to TF32 to nearest (measured on the H100
with CUDA 13.0: the errors of its products match those of operands rounded to nearest beforehand, mean 1.7e-5
relative against 6.5e-4 for truncation; tests/test_bmm_fast_scaled.py checks it on every GPU run), so every
product is within ~2^-10 and so is their positive sum: |error of C| <= ~1e-3 nats, the tile kernel's bound.

The underflow guard is the tile kernel's (fast_log_kernels.cu), with the whole of k as one tile. A term whose
factor falls below 2^-126 is lost, but it is below 2^-126 in units of 2^(M + N), so an output whose sum is at
least 2^-64 has lost at most k 2^-62 of itself: TRUSTED. An output is also trusted, as exactly -inf, when its
row maximum or column maximum is -inf (every term is then -inf). Everything else is FLAGGED, for the host to
recompute exactly (fast_log.repair): sums under 2^-64 (the row's and the column's maxima sit at different k and
the terms near both are far below them), and every output of a row or column whose maximum is NaN, +inf or
beyond 2^125 in magnitude (NaN or infinite inputs, or sums that could overflow). Wide ranges within a row flag
more outputs here than in the tile kernel, whose maxima are per 32-term tile: fast_log falls back to that
kernel when more than a small fraction are flagged.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
from torch import Tensor

__all__ = ["TRUST", "fits", "scaled_product", "tf32_matmul"]

TRUST = 2.0**-64  # sums below this are flagged (module docstring)
_LN_TRUST = math.log(TRUST)
_HUGE = 2.0**125  # maxima beyond this flag their row / column (as the tile kernel's host check)
_LOG2E, _LN2 = 1.0 / math.log(2.0), math.log(2.0)


@contextlib.contextmanager
def tf32_matmul(on: bool = True):
    """cuBLAS float32 matmuls on TF32 tensor cores inside (``on``), or in IEEE float32 (the SGEMM, ``on`` False),
    whatever the caller's setting, which is restored as it was. On torch with
    ``torch.backends.cuda.matmul.fp32_precision`` (2.9 on) through that setting alone: a round trip through the
    legacy ``allow_tf32`` leaves it "ieee" where it was "none" (which follows torch.backends.fp32_precision), and
    mixing the two makes torch refuse to read ``allow_tf32`` afterwards."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        name, value = "fp32_precision", "tf32" if on else "ieee"
    else:
        name, value = "allow_tf32", on
    old = getattr(matmul, name)
    setattr(matmul, name, value)
    try:
        yield
    finally:
        setattr(matmul, name, old)


def _scaled(x: Tensor, dim: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Along dim of x: (the factors 2^(x log2 e - max); the maxima times log2 e, dim kept, 0
    where they are -inf or flag; the mask of -inf maxima (every term of their outputs is -inf); the mask of
    maxima that flag their row / column (NaN, +inf, beyond 2^125)). Three passes over x: its maximum,
    x log2 e - max, and the exponential in place."""
    top = x.amax(dim, keepdim=True).float().mul_(_LOG2E)
    empty = top == -math.inf
    bad = ~(top.abs() <= _HUGE) & ~empty
    top.masked_fill_(empty | bad, 0.0)
    factors = torch.add(top.neg(), x, alpha=_LOG2E)  # float32 whatever x's dtype
    return torch.exp2_(factors), top, empty, bad


def fits(a: Tensor, b: Tensor) -> bool:
    """Whether the tier's buffers (the two float32 factor tensors and the result, ~4 (nk + km + nm) bytes per batch
    entry, with the flags) take at most half of the memory the device has free, counting the caching
    allocator's free blocks: the tile kernel needs far less, so near the limit it answers instead. The allocator's
    statistics are read only when the device's free memory alone is short (each of the two reads builds torch's
    whole statistics dict: 78-85 µs of host time on the lent GPU machines' hosts, where the tier's kernels take
    0.55 ms)."""
    batch, n, k = a.shape
    m = b.shape[2]
    need = batch * (4 * (n * k + k * m + n * m) + n * m)
    free, _ = torch.cuda.mem_get_info(a.device)
    if 2 * need <= free:
        return True
    cached = torch.cuda.memory_reserved(a.device) - torch.cuda.memory_allocated(a.device)
    return 2 * need <= free + cached


def scaled_product(a: Tensor, b: Tensor, kernels: Any = None) -> tuple[Tensor, Tensor, Tensor] | None:
    """(out (B, n, m) float32, flags (B, n, m) bool, count (a 0-d int64 tensor)) for a (B, n, k) and b (B, k, m)
    on a CUDA device, float32 / bfloat16 / float16; out holds no particular value where flagged (the caller
    recomputes those: fast_log.repair). None for an empty dimension (left to the tile kernel). ``kernels``: the
    fast_log family's module, whose fused passes (log_bmm_fast_scales / _finish) then run around the product;
    without it (no compiled kernels, or a CPU tensor in tests), the same arithmetic in ATen passes."""
    if 0 in a.shape or b.shape[2] == 0:
        return None
    scales = getattr(kernels, "log_bmm_fast_scales", None) if a.is_cuda else None
    if scales is not None:
        fa, fb, row_top, row_state, col_top, col_state = scales(a, b)
        with tf32_matmul():
            out = torch.bmm(fa, fb)  # the sums
        del fa, fb
        flags, count = kernels.log_bmm_fast_finish(out, row_top, row_state, col_top, col_state)
        return out, flags, count
    return _aten_product(a, b)


def _aten_product(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """scaled_product in ATen passes (24 kernels a call around the product, where the fused path launches four:
    docs/perf_notes.md, "Fast log: the scaled tier's fused passes")."""
    fa, m_rows, empty_rows, bad_rows = _scaled(a, 2)  # (B, n, k), (B, n, 1) each
    fb, n_cols, empty_cols, bad_cols = _scaled(b, 1)  # (B, k, m), (B, 1, m) each
    with tf32_matmul():
        out = torch.bmm(fa, fb)  # the sums
    del fa, fb
    out = torch.log_(out)  # ln of the sum: -inf for the sums of rows / columns of -inf maxima (exactly -inf)
    flags = out < _LN_TRUST  # under 2^-64 (a NaN sum needs a NaN or infinite input: a bad row or column)
    flags.logical_and_(~(empty_rows | empty_cols)).logical_or_(bad_rows | bad_cols)
    out.add_(m_rows.mul_(_LN2)).add_(n_cols.mul_(_LN2))
    return out, flags, torch.count_nonzero(flags)
