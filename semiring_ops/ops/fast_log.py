"""The log semiring's fast mode: ``semiring_matmul(..., precision="fast")`` on tensor cores.

    semiring_ops::log_bmm_fast(a, b, passes) -> out
        a (B, n, k), b (B, k, m), CUDA, float32 / bfloat16 / float16 -> out (B, n, m) float32,
        out[p, i, j] = logsumexp_k (a[p, i, k] + b[p, k, j]); differentiable, its backward is the exact
        log backward (registry.log_bmm_backward, given this output)

Two tiers, both on TF32 tensor cores with the same error bound and underflow guard:

1. (passes=1) fast_log_scaled.py: one scale per row of a and per column of b over all of k, then one cuBLAS
   TF32 batched matmul: no running maximum at all. When it flags at most SCALED_GATHER_FRACTION of the outputs,
   those are recomputed one by one and that is the answer. Its buffers (input-sized factor tensors) must fit
   in half the free device memory (fast_log_scaled.fits), else the tile kernel runs.
2. Otherwise (more flags: rows whose values span a wide range; or passes=3), the tile kernel:

The kernel (csrc/cuda/log_bmm_fast_kernels.cu) turns each k-tile of 32 terms into a plain product of
exponentials scaled by the tile's row and column maxima, computed with TF32 mma (``passes=1``: error
<= ~1e-3 nats; ``passes=3``, the 3xTF32 split: ~1e-6), and combines the tiles with a running maximum. It
flags every output whose scaled sum fell under 2^-64 (a tile whose row and column maxima sit at different
k can underflow), or whose row / column holds NaN, +inf or |x| > 2^125; this module recomputes those
exactly: one by one (a chunked logsumexp over k) when they are few, the exact kernel on the whole product
when they are more than 1/16 of the outputs. So a fast result is never -inf or garbage where the exact one
is finite.

Off the GPU (and on GPUs before sm_80, or without the compiled CUDA kernels) the op runs the exact path.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..build.backends import backend_for
from ..semirings import LogSemiring
from . import registry
from .fast_log_scaled import fits, scaled_product
from .registry import eager_function

__all__ = ["DEFAULT_PASSES", "FAST_DTYPES", "MIN_CELLS", "log_bmm_fast", "reset_stats", "stats", "supports"]

FAST_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Below this many cells (B n k m) the exact kernel is faster (H100: exact 0.11 ms vs fast 0.43 ms at B = 8,
# n = k = m = 256, 1.3e8 cells; fast wins from B = 8, n = 512, 1.1e9 cells): semiring_matmul runs exact there.
MIN_CELLS = 1 << 29
DEFAULT_PASSES = 1  # 1: TF32 (~1e-3 nats), 3: 3xTF32 (~1e-6 nats); the lead picks the default from measurements
FULL_RECOMPUTE_FRACTION = 1 / 16  # more flagged outputs than this fraction: rerun the exact kernel on everything
# the scaled tier's answer stands when it flags at most this fraction of the outputs (recomputed one by one);
# more, and the tile kernel, whose per-tile maxima flag far fewer on wide ranges, runs instead
SCALED_GATHER_FRACTION = 1 / 1024
SCALED_TIER = True  # whether passes=1 tries the scaled tier first (tests of the tile kernel turn it off)
_GATHER_ELEMENTS = 1 << 22  # terms per chunk of the one-by-one recompute (bounds its memory)
_LOG = LogSemiring.kernel_id

# Counters of what the fast op did (since the last reset_stats()), for tests and benchmarks:
#   calls: fast-mode forwards; kernel: those that ran a tensor-core tier (others fell back to exact);
#   scaled: those the scaled tier answered; tiled: those that ran the tile kernel;
#   flagged: outputs flagged by the tier that answered; gathered: calls that recomputed flagged outputs one by
#   one; full_exact: calls that reran the exact kernel on the whole product.
stats = {"calls": 0, "kernel": 0, "scaled": 0, "tiled": 0, "flagged": 0, "gathered": 0, "full_exact": 0}


def reset_stats() -> None:
    for key in stats:
        stats[key] = 0


def supports(t: Tensor) -> bool:
    """Whether fast mode can take a tensor of this device type and dtype (the op itself still falls back to
    exact on GPUs before sm_80 or without compiled kernels). A static test: dynamo traces it."""
    return t.device.type == "cuda" and t.dtype in FAST_DTYPES


_capable: dict[int, bool] = {}


def _tensor_cores(device: torch.device) -> bool:
    index = device.index if device.index is not None else torch.cuda.current_device()
    ok = _capable.get(index)
    if ok is None:
        ok = _capable[index] = torch.cuda.get_device_capability(index) >= (8, 0)
    return ok


def _forward(a: Tensor, b: Tensor, passes: int) -> Tensor:
    stats["calls"] += 1
    backend = backend_for(a.device)
    if a.device.type != "cuda" or a.dtype not in FAST_DTYPES or not _tensor_cores(a.device):
        return backend.bmm_forward(a, b, _LOG, False)[0]
    if passes == 1 and SCALED_TIER and fits(a, b):  # fused passes when compiled, else ATen's; cuBLAS's product
        scaled = scaled_product(a, b, backend.family("fast_log"))
        if scaled is not None:
            out, flags, count = scaled
            flagged = int(count.item())  # the one synchronisation of this tier
            if flagged <= SCALED_GATHER_FRACTION * out.numel():
                stats["kernel"] += 1
                stats["scaled"] += 1
                return repair(a, b, out, flags, flagged) if flagged else out
            del out, flags
    kernel = getattr(backend.family("fast_log"), "log_bmm_fast", None)
    if kernel is None:
        return backend.bmm_forward(a, b, _LOG, False)[0]
    stats["kernel"] += 1
    stats["tiled"] += 1
    out, flags, count = kernel(a, b, passes)
    flagged = int(count.item())  # the one synchronisation of the tile kernel
    if flagged:
        out = repair(a, b, out, flags, flagged)
    return out


def repair(a: Tensor, b: Tensor, out: Tensor, flags: Tensor, flagged: int) -> Tensor:
    """Recomputes the outputs with a nonzero flag exactly; returns the repaired output (out itself, or a
    fresh exact result when many are flagged). a (B, n, k), b (B, k, m), out / flags (B, n, m)."""
    stats["flagged"] += flagged
    if flagged > FULL_RECOMPUTE_FRACTION * out.numel():
        stats["full_exact"] += 1
        return backend_for(a.device).bmm_forward(a, b, _LOG, False)[0]
    stats["gathered"] += 1
    index = flags.nonzero()  # (N, 3): batch, row, column
    k = a.shape[2]
    chunk = max(1, _GATHER_ELEMENTS // max(k, 1))
    for start in range(0, index.shape[0], chunk):
        p, i, j = index[start : start + chunk].unbind(1)
        terms = a[p, i].float() + b[p, :, j].float()  # (chunk, k): a[p, i, :] + b[p, :, j]
        out[p, i, j] = torch.logsumexp(terms, dim=1)
    return out


# ---------------------------------------------------------------- the custom op


@torch.library.custom_op("semiring_ops::log_bmm_fast", mutates_args=())
def log_bmm_fast_op(a: Tensor, b: Tensor, passes: int) -> Tensor:
    """Fast-mode log-semiring batched matmul of 3-D a (B, n, k) and b (B, k, m); see the module docstring."""
    return _forward(a, b, passes)


@log_bmm_fast_op.register_fake
def _(a, b, passes):
    return a.new_empty((a.shape[0], a.shape[1], b.shape[2]), dtype=torch.float32)


def _setup_context(ctx, inputs, output):
    a, b, _passes = inputs
    ctx.save_for_backward(a, b, output)


def _backward(ctx, grad_out):
    """The exact log backward, weights exp(a + b - out) from the fast output (registry's log_bmm_backward)."""
    a, b, out = ctx.saved_tensors
    need_a, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    if grad_out is None or not (need_a or need_b):
        return None, None, None
    ga, gb = registry.log_bmm_backward_eager(a, b, out, grad_out, need_a, need_b)
    return (ga.to(a.dtype) if need_a else None, gb.to(b.dtype) if need_b else None, None)


log_bmm_fast_op.register_autograd(_backward, setup_context=_setup_context)


_LogBmmFastEager = eager_function("_LogBmmFastEager", _forward, _setup_context, _backward)


def log_bmm_fast(a: Tensor, b: Tensor, passes: int = DEFAULT_PASSES) -> Tensor:
    """Fast-mode log bmm of 3-D a (B, n, k) and b (B, k, m) -> (B, n, m) float32 (matmul.py's entry): the
    registered op under torch.compile / dispatch modes / tensor subclasses, its body directly otherwise."""
    if passes not in (1, 3):
        raise ValueError(f"log_bmm_fast: passes must be 1 or 3, got {passes!r}")
    if not registry.plain_eager(a, b):
        return log_bmm_fast_op(a, b, passes)
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        return _LogBmmFastEager.apply(a, b, passes)
    return _forward(a, b, passes)
