"""The matrix-unit route: a plan whose cells see their wide variables only through squared distances or dot
products (inner_products.py) runs as GEMMs on the tensor cores (CUDA) or BLAS (CPU), block of output rows by
block, each followed by the plan's own generated kernel reading the block's matrix in place of those sums.

For a block of ``rows`` output rows and all n_inner terms:

- dot: G = x_block . y^T;
- squared distance: both sides shifted by the inner terms' mean (distances do not change, norms shrink, so
  large-norm points keep their digits), G = x_block . y^T, and the squared norms |x|^2, |y|^2; the kernel forms
  |x|^2 + |y|^2 - 2 G and sums the cell again from the unshifted variables where that is below 1 /
  codegen.GRAM_CANCEL of |x|^2 + |y|^2 (near-duplicate points, where it cancels).

The matrix is (n_inner, rows) on CUDA (a warp's 32 rows read 32 consecutive floats at one j) and (rows, n_inner)
on the CPU (a row's lanes read consecutive j). Blocks hold at most BLOCK_BYTES of matrix, so memory stays linear
in M + N: nothing of size M x N exists at once.

Precision. On the CPU a float32 BLAS GEMM, float64 a float64 GEMM. On CUDA float32 one of four products
(route_mm, chosen by product_mode from the plan's precision):

- IEEE: the SGEMM (TF32 off whatever the caller's setting), as the torch form computes it;
- 3xTF32: each operand split into a TF32 part and the float32 rest, the three products that matter in one cuBLAS
  TF32 GEMM of depth 3 D, the small ones first (x_lo y_hi + x_hi y_lo + x_hi y_hi; the dropped x_lo y_lo is
  2^-22 of the product). The tensor cores' float32 accumulation is not IEEE's: on an H200 (cuBLAS, torch 2.11) each
  step seems to round toward zero, so a product of depth k is off by ~1e-8 x k relative to its running sum
  (docs/perf_notes.md, "3xTF32 on Hopper"; adding the small products first, while the sum is small, halves it).
  Random points lose little (their x.y is small beside |x||y|), near neighbours much: a squared distance
  |x|^2 + |y|^2 - 2 x.y between unit-norm embeddings at cosine 0.96 is off by 1e-4 relative at D = 784, a
  Gaussian sum over them by 1e-4 (the IEEE product: 1e-5, as torch; the plain kernel 5e-7);
- PROMOTED: the same 3xTF32 operands on our own Hopper GEMM (hopper_gemm.py), each 32-deep tile's products added
  into IEEE registers: the truncation costs 32 terms whatever D, so it is more accurate than the SGEMM, at ~1.9x
  its speed. On sm_90 devices only (H100, H200); elsewhere PROMOTED is the IEEE product;
- TF32: one plain TF32 GEMM (products to about 2^-11 relative).

precision="exact" (the default): sums (linear_route.py and the kernels' sums) take the PROMOTED product above
THREE_TF32_SUM_MAX_DIM components (3xTF32 up to it, where its error is within ~3x of the IEEE one's, and faster than
PROMOTED); a selection (k-best, max, min) takes 3xTF32 candidates and evaluates its winners again as written
(winners.py), so its values are the formula's, as the plain kernel's, and its indices an exact selection's but
where two candidates differ by less than the 3xTF32 error. precision="high": 3xTF32 for sums too (faster still
than PROMOTED). precision="fast": TF32 for everything (and no winners evaluated again). Deep reductions
(linear_route's S @ y over all the inner terms) take the IEEE product but under "fast": 3xTF32 is no faster there,
and 150x less accurate.

The route is taken (dispatch.execute) for unbatched, dense plans with such a sum of at least MIN_DIM
components and at least MIN_PAIRS (row, term) pairs. SEMIRING_OPS_LAZY_GEMM=off never takes it, =on takes it
for every matching sum whatever its size (tests).
"""

from __future__ import annotations

import dataclasses
import os

import torch

from ..ops.fast_log_scaled import tf32_matmul
from . import distance_blocks, hopper_gemm, winners
from .codegen import GRAM_CANCEL
from .formula import InnerProduct
from .inner_products import GramSpec, gram_plan
from .plan import CallArgs, Plan, new_outputs

__all__ = [
    "IEEE",
    "PROMOTED",
    "TF32",
    "THREE_TF32",
    "GramInner",
    "block_gram",
    "block_rows",
    "fused_kbest_setting",
    "gram_inner",
    "product_mode",
    "route_mm",
    "route_mode",
    "run_routed",
    "runnable_mode",
]

# a sum of fewer components stays in the plain kernel (its cells read x_i from registers and y_j from shared
# memory or contiguous lanes; the route's matrix costs 8 bytes of memory traffic a cell): on an H200 50,000^2 k-NN
# at D = 16 takes 5.0 ms either way, at D = 64 18.5 ms plain against 12.7 routed; on the 2-core CPU (4,000 x 2,000)
# 12.9 ms plain against 22.0 routed at D = 16, 67.9 against 28.8 at D = 64
MIN_DIM = {"cpu": 32, "cuda": 32}
MIN_PAIRS = {"cpu": 1 << 16, "cuda": 1 << 22}  # smaller reductions: the plain kernel (no GEMM launch, no matrix)
# the matrix of one block of rows: on CUDA at most a quarter of the free device memory. Few large blocks matter
# there: a block of fewer rows than fill the GPU has its reduction split over j and merged per row, and the
# merge of split K-best lists is serial per row (H200, 50,000^2 k-NN at D = 128: 20.0 ms in blocks of 5,120
# rows, 14.3 in blocks of 20,480). On the CPU one GEMM of all the rows where it fits 64 MiB, as the torch form
# runs it (4,000 x 2,000: 16 and 64 MiB blocks were within the machine's noise of each other, 148-156 ms for
# k-NN at D = 784)
BLOCK_BYTES = {"cpu": 64 << 20, "cuda": 4 << 30}
FREE_FRACTION = 4
ROW_QUANTUM = 256  # block rows are a multiple of this (or all the rows)
MAX_MATRIX_BYTES = 8 << 30  # a single row quantum's matrix above this (n_inner > ~8M): the plain kernel
# where a selection's winners are evaluated again as written (winners.py): the tensor cores' 3xTF32 matrices. The
# CPU's float32 BLAS rounds to nearest and keeps the torch form's accuracy (2,000 clustered unit-norm points of
# D = 784: median relative error of the 10 nearest 1.6e-6, the plain kernel's 2.9e-7), and the route ties with the
# torch form there (4,000 x 2,000 k-NN at D = 784: 84.9 against 85.0 ms), where evaluating the winners again adds
# 20 ms even in cache-sized chunks (120 ms in winners.CHUNK_VALUES)
WINNERS_AGAIN = {("cuda", torch.float32)}
# the fused selections (hopper_gemm.kbest_nt: candidates from the tensor cores' tiles, no matrix), taken by default
# for FUSED_KBEST_DIMS components, where they were measured to beat the matrix (H200, K = 10, one run, fused / matrix
# ms: 50,000^2 k-NN 8.85 / 12.80 at D = 128, 15.52 / 18.08 at 256, 44.75 / 42.05 at 784; 20,000^2 at D = 2048
# 21.59 / 19.54; MNIST's 10,000 x 60,000 at D = 784 11.63 / 11.05): past 256 the GEMM is most of the time, and
# ours, epilogue included (it waits for the tile's products), takes ~10% longer than cuBLAS's 3xTF32 GEMM alone
# (docs/perf_notes.md, "The Hopper engine"); below 128 (the route from MIN_DIM) not measured yet.
# SEMIRING_OPS_LAZY_FUSED_KBEST: "auto" (default), "1" at every D, "0" never
FUSED_KBEST_DIMS = (128, 256)
# the products of a matrix on CUDA float32 (module docstring)
IEEE, THREE_TF32, PROMOTED, TF32 = "ieee", "3xtf32", "3xtf32-promoted", "tf32"
# a sum's matrices up to this many components take 3xTF32 under precision="exact", PROMOTED above (the IEEE product
# off Hopper): H200, a Gaussian sum over unit-norm embeddings at cosine 0.96 against float64 (median relative error),
# 50,000^2 b(N,1) ms
#   D = 128: 3xTF32 1.4e-5 (11.1 ms), IEEE 4.3e-6 (22.1 ms; the torch form 4.5e-6)
#   D = 256: 3xTF32 3.0e-5 (15.2 ms), IEEE 6.1e-6 (32.0 ms), PROMOTED (18.9 ms)
#   D = 784: 3xTF32 1.0e-4 (36.3 ms), IEEE 1.0e-5 (83.2 ms), PROMOTED 3.5e-6 (49.5 ms)
# 3xTF32's error grows as D, the IEEE product's as ~sqrt(D): up to D = 128 within ~3x of the torch form's, for half
# the time; PROMOTED's does not grow with D, but its GEMM is slower than cuBLAS's 3xTF32 at D = 128 (16,384^2:
# 0.97 ms against 0.82)
THREE_TF32_SUM_MAX_DIM = 128


def route_mode() -> str:
    """SEMIRING_OPS_LAZY_GEMM: "auto" (default), "off" or "on" (module docstring)."""
    mode = os.environ.get("SEMIRING_OPS_LAZY_GEMM", "auto")
    if mode not in ("auto", "off", "on"):
        raise ValueError(f"SEMIRING_OPS_LAZY_GEMM must be auto, off or on, got {mode!r}")
    return mode


def run_routed(plan: Plan, call: CallArgs, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """The plan's (values, indices) by the route, or None when the route does not apply (module docstring)."""
    if call.nbatch != 1 or plan.ranged or call.ranges is not None or call.dtype not in (torch.float32, torch.float64):
        return None
    mode = route_mode()
    if mode == "off":
        return None
    kind = device.type
    if mode == "auto" and call.n_outer * call.n_inner < MIN_PAIRS.get(kind, 1 << 62):
        return None  # (before the plan lookup: small reductions are the host-time-bound ones)
    min_dim = 1 if mode == "on" else MIN_DIM.get(kind, 1 << 30)
    routed = gram_plan(plan, min_dim)
    if routed is None:
        return None
    # a selection on the tensor cores' matrices: candidates, evaluated again as written (winners.py)
    again = plan.reduction.selects and (kind, call.dtype) in WINNERS_AGAIN and not plan.fast and call.n_inner > 0
    routed_plan, specs = gram_plan(winners.candidate_plan(plan), min_dim) if again else routed
    modes = [runnable_mode(product_mode(plan.precision, plan.reduction.selects, spec.dim), device) for spec in specs]
    fused = again and _fused_selection(routed_plan, specs, modes, device)
    rows = max(1, call.n_outer) if fused else block_rows(call, device)  # (fused: no matrix, one block)
    if rows is None:
        return None
    vals, idx = new_outputs(plan, call, device)
    if vals.numel() == 0 and (idx is None or idx.numel() == 0):
        return vals, idx
    sides = [_inner_side(spec, call, kind, mode) for spec, mode in zip(specs, modes, strict=True)]
    outer_slots = [k for k in range(len(plan.arg_cats)) if plan.role(k) == "outer"]
    for lo in range(0, call.n_outer, rows):
        n = min(rows, call.n_outer - lo)
        tensors = list(call.tensors)
        for k in outer_slots:
            tensors[k] = tensors[k].narrow(-2, lo, n)
        if fused:  # the candidates straight from the tensor cores' tiles (no matrix), then evaluated again
            spec, side = specs[0], sides[0]
            i = _fused_candidates(routed_plan, spec, side, call, tensors[spec.outer_slot].reshape(n, spec.dim))
            block = dataclasses.replace(call, tensors=tensors, n_outer=n)
            v, i = winners.evaluate_winners(plan, block, vals, i[None])
            vals[:, lo : lo + n] = v
            if idx is not None:
                idx[:, lo : lo + n] = i
            continue
        grams: list[torch.Tensor] = []
        for spec, side in zip(specs, sides, strict=True):
            grams += _block_matrix(spec, side, tensors[spec.outer_slot].reshape(n, spec.dim), kind)
        block = dataclasses.replace(call, tensors=tensors, n_outer=n, grams=tuple(grams))
        if kind == "cuda":
            from .cuda_kernels import run_cuda

            v, i = run_cuda(routed_plan, block, device)
        else:
            from .cpu_kernels import run_cpu

            v, i = run_cpu(routed_plan, block)
        if again:
            v, i = winners.evaluate_winners(plan, block, v, i)
        vals[:, lo : lo + n] = v
        if idx is not None:
            idx[:, lo : lo + n] = i
    return vals, idx


def fused_kbest_setting() -> str:
    """SEMIRING_OPS_LAZY_FUSED_KBEST: "auto" (default), "0" or "1" (FUSED_KBEST_DIMS' comment)."""
    setting = os.environ.get("SEMIRING_OPS_LAZY_FUSED_KBEST", "auto")
    if setting not in ("auto", "0", "1"):
        raise ValueError(f"SEMIRING_OPS_LAZY_FUSED_KBEST must be auto, 0 or 1, got {setting!r}")
    return setting


def _fused_selection(routed: Plan, specs: tuple[GramSpec, ...], modes: list[str], device: torch.device) -> bool:
    """Whether a selection's candidates come from hopper_gemm.kbest_nt (no matrix): a k-best of one squared distance
    (weighted or not) or dot product itself, of K <= KBEST_MAX, on 3xTF32 where hopper_gemm runs, of
    FUSED_KBEST_DIMS components unless SEMIRING_OPS_LAZY_FUSED_KBEST says otherwise (its comment)."""
    setting = fused_kbest_setting()
    r = routed.reduction
    return (
        setting != "0"
        and (setting == "1" or FUSED_KBEST_DIMS[0] <= specs[0].dim <= FUSED_KBEST_DIMS[1])
        and r.kind == "kbest"
        and r.k <= hopper_gemm.KBEST_MAX
        and isinstance(routed.formula, InnerProduct)
        and routed.formula.dim == 1
        and modes == [THREE_TF32]
        and hopper_gemm.available(device)
    )


def _fused_candidates(routed: Plan, spec: GramSpec, side: _InnerSide, call: CallArgs, x: torch.Tensor) -> torch.Tensor:
    """(rows, K) candidate indices of the routed k-best for the rows x (rows, D): the K best squared distances
    |x|^2 + |y|^2 - 2 x.y (summed again where that cancels, as the kernels' rule) or dot products x.y, on the
    shifted, split operands (_inner_side)."""
    largest, k = routed.reduction.semiring == "max", routed.reduction.k
    if side.shift is None:  # a dot product
        return hopper_gemm.kbest_nt(_three_tf32(x, small_first=True), side.operand, k, largest)
    xs = x - side.shift
    y = call.tensors[spec.inner_slot].reshape(call.n_inner, spec.dim)
    distance = hopper_gemm.Distance(_squared_norms(xs, side.weights), side.norms, x, y, side.weights, 1 / GRAM_CANCEL)
    return hopper_gemm.kbest_nt(_three_tf32(xs, small_first=True), side.operand, k, largest, distance)


def block_rows(call: CallArgs, device: torch.device, copies: int = 1) -> int | None:
    """Output rows per block: ``copies`` (rows, n_inner) matrices within the block budget (module docstring),
    a multiple of ROW_QUANTUM or all the rows; None when one quantum's matrix alone is too large."""
    kind, elem = device.type, call.tensors[0].element_size()
    if ROW_QUANTUM * call.n_inner * elem * copies > MAX_MATRIX_BYTES:
        return None
    budget = BLOCK_BYTES[kind]
    if kind == "cuda" and call.n_outer > ROW_QUANTUM:  # (cudaMemGetInfo: tens of us, for more than one block)
        budget = min(budget, torch.cuda.mem_get_info(device)[0] // FREE_FRACTION)
    rows = budget // max(1, call.n_inner * elem * copies) // ROW_QUANTUM * ROW_QUANTUM
    return min(max(ROW_QUANTUM, rows), call.n_outer)


def product_mode(precision: str, selects: bool, dim: int) -> str:
    """The product of a routed matrix of ``dim`` components on CUDA float32 for a plan's ``precision``, of a
    selection or not (module docstring)."""
    if precision == "fast":
        return TF32
    return THREE_TF32 if precision == "high" or selects or dim <= THREE_TF32_SUM_MAX_DIM else PROMOTED


def runnable_mode(mode: str, device: torch.device) -> str:
    """``mode`` as it runs on ``device``: PROMOTED is the IEEE product where hopper_gemm is not available."""
    return IEEE if mode == PROMOTED and not hopper_gemm.available(device) else mode


def route_mm(a: torch.Tensor, b: torch.Tensor, mode: str = IEEE) -> torch.Tensor:
    """a @ b as the route's ``mode`` makes it on CUDA float32 (IEEE, THREE_TF32, PROMOTED or TF32: module docstring),
    whatever the caller's TF32 setting; torch.mm elsewhere."""
    if not _tf32_split(a.device.type, a.dtype):
        return torch.mm(a, b)
    mode = runnable_mode(mode, a.device)
    if mode == PROMOTED:
        return hopper_gemm.mm_nt(_three_tf32(a, small_first=True), _three_tf32(b.t(), small_first=False))
    if mode == THREE_TF32:
        a, b = _three_tf32(a, small_first=True), _three_tf32(b.t(), small_first=False).t()
    with tf32_matmul(mode != IEEE):
        return torch.mm(a, b)


@dataclasses.dataclass
class GramInner:
    """What block_gram needs of the inner variable, made once per call (not once per block of rows)."""

    y: torch.Tensor  # (n_inner, D) as given
    weights: torch.Tensor | float  # a weighted squared distance's (D,), else 1.0
    shift: torch.Tensor | None  # (D,): the inner terms' mean (squared distances; None for a dot product)
    operand: torch.Tensor  # (n_inner, D): y itself (dot), w (y - shift) (TF32 split), -2 w (y - shift) (else)
    norms: torch.Tensor  # (n_inner,) |y - shift|^2, weighted (empty for a dot product)


def gram_inner(spec: GramSpec, call: CallArgs) -> GramInner:
    """block_gram's inner side of the call (module docstring's shift, norms and GEMM operand)."""
    y = call.tensors[spec.inner_slot].reshape(call.n_inner, spec.dim)
    if spec.kind == "dot":
        return GramInner(y, 1.0, None, y, y.new_empty(0))
    w = _weights(spec, call)
    ones = w if w is not None else 1.0
    shift = y.mean(0)
    ys = y - shift
    ny = _squared_norms(ys, w)
    if _tf32_split(y.device.type, y.dtype):
        return GramInner(y, ones, shift, ys * ones, ny)
    return GramInner(y, ones, shift, (ys * (-2 * ones)).contiguous(), ny)


def block_gram(
    spec: GramSpec,
    inner: GramInner,
    call: CallArgs,
    lo: int,
    n: int,
    mode: str = IEEE,
    out: torch.Tensor | None = None,
    exp_scale: float | None = None,
) -> torch.Tensor:
    """The values (n, n_inner) of an inner product for output rows [lo, lo + n), as torch tensors: x.y, or the
    squared distance from the shifted GEMM with the cells below 1 / GRAM_CANCEL of the norms' sum summed again
    from the variables (the kernels' rule, codegen._gram_cells; on the CPU in C++, and up to
    distance_blocks.DIRECT_MAX_DIM components summed directly there, with no GEMM). ``inner``: gram_inner(spec,
    call), made once for all the blocks of a call. ``out``: on the CPU, a contiguous (>= n, n_inner) buffer the
    squared distances are written into (its first n rows, returned), reused from block to block. ``exp_scale``: the
    values v made exp(exp_scale v) (a Gaussian cell, linear_route), in the C++ pass that completes the distances
    where that runs."""
    values, applied = _block_gram(spec, inner, call, lo, n, mode, out, exp_scale)
    return values if exp_scale is None or applied else (values * exp_scale).exp()


def _block_gram(
    spec: GramSpec,
    inner: GramInner,
    call: CallArgs,
    lo: int,
    n: int,
    mode: str,
    out: torch.Tensor | None,
    exp_scale: float | None,
) -> tuple[torch.Tensor, bool]:
    """block_gram's values, and whether exp_scale was applied to them (the C++ completion's pass does it)."""
    x = call.tensors[spec.outer_slot].reshape(call.n_outer, spec.dim)[lo : lo + n]
    y, ny, ones = inner.y, inner.norms, inner.weights
    w = ones if isinstance(ones, torch.Tensor) else None  # a weighted distance's weights
    if spec.kind == "dot":
        return route_mm(x, y.t(), mode), False
    # the C++ blocks and the buffer on the CPU, unless autograd records this (the route runs inside the reductions'
    # autograd.Function, grad mode off; a direct call under grad mode with an input that requires grad stays in torch)
    cpu = x.device.type == "cpu" and not (torch.is_grad_enabled() and (x.requires_grad or y.requires_grad))
    out = out[:n] if cpu and out is not None else None
    if cpu and spec.dim <= distance_blocks.DIRECT_MAX_DIM:  # summed directly, exact
        return distance_blocks.squared_distances(x, y, w, out), False
    xs = x - inner.shift
    nx = _squared_norms(xs, w)[:, None]
    if _tf32_split(x.device.type, x.dtype):
        total = nx + ny
        values = total - 2 * route_mm(xs, inner.operand.t(), mode)
        return _resum_with_torch(values, x, y, total, ones), False
    # the GEMM gives -2 x.y; on the CPU one pass of C++ adds the norms and sums the cells that cancel again
    # (distance_blocks.py)
    if not cpu:  # (CUDA float64; autograd)
        total = nx + ny
        return _resum_with_torch(total + torch.mm(xs, inner.operand.t()), x, y, total, ones), False
    values = torch.mm(xs, inner.operand.t(), out=out) if out is not None else torch.mm(xs, inner.operand.t())
    distance_blocks.complete_distances(values, x, y, nx, ny, w, exp_scale)
    return values, True


def _squared_norms(v: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """(rows,) sum_d w_d v_d^2 of v (rows, D): one pass (a weightless ``(v * v * 1.0).sum(1)`` made three)."""
    return torch.linalg.vecdot(v, v if weights is None else v * weights)


def _resum_with_torch(
    values: torch.Tensor, x: torch.Tensor, y: torch.Tensor, total: torch.Tensor, ones: torch.Tensor | float
) -> torch.Tensor:
    """values with its cells below 1 / GRAM_CANCEL of ``total`` (|x|^2 + |y|^2, shifted) summed again from x and
    y (NaN fails the comparison, so it is summed again too)."""
    rows, cols = (~(values >= total / GRAM_CANCEL)).nonzero(as_tuple=True)
    if rows.numel():
        values[rows, cols] = ((x[rows] - y[cols]) ** 2 * ones).sum(1)
    return values


@dataclasses.dataclass
class _InnerSide:
    """What one inner product needs of the inner variable, made once per call."""

    shift: torch.Tensor | None  # (D,): the inner terms' mean (squared distances)
    norms: torch.Tensor  # (n_inner,) squared norms after the shift (empty for a dot product)
    operand: torch.Tensor  # (n_inner, D), or (n_inner, 3 D) split for 3xTF32
    mode: str  # the product on CUDA float32 (IEEE, THREE_TF32, PROMOTED or TF32), as it runs there
    weights: torch.Tensor | None  # a weighted squared distance's (D,)


def _split_tf32(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo): hi is x rounded to TF32's 10 mantissa bits (to nearest, ties away), lo = x - hi exactly."""
    bits = x.contiguous().view(torch.int32)
    hi = ((bits + 0x1000) & ~0x1FFF).view(torch.float32)
    return hi, x - hi


def _three_tf32(x: torch.Tensor, small_first: bool) -> torch.Tensor:
    """An operand (rows, 3 D) of the 3xTF32 product: [lo, hi, hi] (small_first) or [hi, lo, hi], so that their
    product of depth 3 D is x_lo y_hi + x_hi y_lo + x_hi y_hi, the small products added while the sum is small."""
    hi, lo = _split_tf32(x)
    return torch.cat([lo, hi, hi] if small_first else [hi, lo, hi], dim=1)


def _tf32_split(kind: str, dtype: torch.dtype) -> bool:
    return kind == "cuda" and dtype == torch.float32


def _weights(spec: GramSpec, call: CallArgs) -> torch.Tensor | None:
    """A weighted squared distance's weights (D,), else None."""
    return None if spec.weight_slot < 0 else call.tensors[spec.weight_slot].reshape(spec.dim)


def _inner_side(spec: GramSpec, call: CallArgs, kind: str, mode: str) -> _InnerSide:
    y = call.tensors[spec.inner_slot].reshape(call.n_inner, spec.dim)
    shift = norms = None
    if spec.kind == "sqdist":
        shift = y.mean(0) if call.n_inner else torch.zeros_like(y[0:1, :]).squeeze(0)
        y = y - shift
        w = _weights(spec, call)
        norms = (y * y).sum(1) if w is None else (y * y * w).sum(1)
        y = y if w is None else y * w  # G = x.(w y)
    else:
        norms = y.new_empty(0)
    split = _tf32_split(kind, y.dtype) and mode in (THREE_TF32, PROMOTED)
    operand = _three_tf32(y, small_first=False) if split else y
    return _InnerSide(shift, norms, operand.contiguous(), mode, _weights(spec, call))


def _block_matrix(spec: GramSpec, side: _InnerSide, x: torch.Tensor, kind: str) -> list[torch.Tensor]:
    """[G, |x|^2, |y|^2] of a block of rows x (rows, D): G (n_inner, rows) on CUDA, (rows, n_inner) on the CPU."""
    norms = x.new_empty(0)
    if side.shift is not None:
        x = x - side.shift
        norms = (x * x).sum(1) if side.weights is None else (x * x * side.weights).sum(1)
    if _tf32_split(kind, x.dtype) and side.mode == PROMOTED:
        g = hopper_gemm.mm_nt(side.operand, _three_tf32(x, small_first=True))
    elif _tf32_split(kind, x.dtype):
        right = _three_tf32(x, small_first=True) if side.mode == THREE_TF32 else x
        with tf32_matmul(side.mode != IEEE):
            g = torch.mm(side.operand, right.t())
    elif kind == "cuda":
        g = torch.mm(side.operand, x.t())
    else:
        g = torch.mm(x, side.operand.t())
    return [g.contiguous(), norms.contiguous(), side.norms]
