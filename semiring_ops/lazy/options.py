"""KeOps' reduction options (``K.sum(1, backend="GPU_1D", dtype_acc="float64", ...)``), parsed and checked.

KeOps scripts pass these routinely; every one is accepted. What each does here:

=================  =======================================================================================
option             here
=================  =======================================================================================
backend            "auto": the tensors' device, except CPU tensors reduced over at least AUTO_GPU_PAIRS (i, j)
                   pairs when there is a GPU: those go to the current one, as KeOps' "auto" sends every
                   reduction there; "CPU": the CPU; "GPU", "GPU_1D", "GPU_2D" (and their
                   "_host" / "_device" forms): a CUDA device. Data on another device is copied there for the
                   reduction and the result copied back (KeOps' "from host" mode). The 1D / 2D scheme is the
                   kernel's own choice (the suffix is accepted and ignored).
device_id          the CUDA device to reduce on (-1 or None: the tensors' own, or the current one for CPU
                   tensors with a GPU backend); tensors on another CUDA device are refused, as by KeOps.
dtype_acc          "auto", "float16", "float32", "float64" (or a torch dtype): the reduction runs in that
                   dtype when it is wider than the inputs' compute dtype (16-bit inputs always run in float32);
                   the result is cast back. Sum-type reductions only, and never narrower than the inputs
                   (KeOps' rules).
use_double_acc     True: dtype_acc="float64" (not both).
sum_scheme         "auto", "direct_sum", "block_sum": accepted (sums are always block sums, KeOps' default:
                   csrc/lazy/reducers.h); "kahan_scheme": float16 / float32 inputs are reduced in float64.
                   block_sum and kahan_scheme are for sum-type reductions only (KeOps' rule).
enable_chunks,     accepted and ignored: KeOps' code-generation knobs; the kernels tile wide variables on
use_fast_math,     their own, float32 exp is always the fast one (docs/lazy.md, Numerics), and compiler flags
optional_flags     are not configurable.
ranges             block-sparse reductions (KeOps' 6-tuple): honoured, by one reduction per block of output
                   rows over its selected inner indices (LazyTensor._reduce_ranges): a Python loop over the
                   blocks, meant for tens to hundreds of them; no batch dimensions.
out                the result is written into this tensor (or NumPy array) in place: shape, dtype and device
                   must match; not while recording a graph, as torch's out= arguments.
keepdim            the reduced axis kept, with size 1 (torch's keepdim).
precision          ours: the matrix-unit route's float32 inner products on CUDA (gemm_route.py, docs/lazy.md
                   "Precision"). "exact" (default): sums take them from the IEEE float32 GEMM above D = 128
                   (the torch form's accuracy; 3xTF32 up to it), selections from 3xTF32 with their winners
                   evaluated again as written. "high" (as torch.set_float32_matmul_precision's): 3xTF32 for
                   sums too, ~2x faster from D = 256, with an error growing with D. "fast" (as logbmm's): one
                   plain TF32 GEMM (about 10 bits of the products' mantissa). The generated kernels and the
                   CPU are the same in all three.
call               taken by the reductions themselves (symbolic.deferrable): call=False returns a callable.
=================  =======================================================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["BACKENDS", "ReduceOptions", "parse_options"]

BACKENDS = (
    "auto",
    "CPU",
    "GPU",
    "GPU_1D",
    "GPU_2D",
    "GPU_1D_host",
    "GPU_1D_device",
    "GPU_2D_host",
    "GPU_2D_device",
)
SUM_SCHEMES = ("auto", "direct_sum", "block_sum", "kahan_scheme")
PRECISIONS = ("exact", "high", "fast")
_DTYPES = {"float16": torch.float16, "float32": torch.float32, "float64": torch.float64}
_WIDTH = {torch.float16: 16, torch.bfloat16: 16, torch.float32: 32, torch.float64: 64}


@dataclass(frozen=True)
class ReduceOptions:
    """The options of one reduction, checked (see the module docstring for what each does)."""

    backend: str = "auto"
    device_id: int = -1
    dtype_acc: torch.dtype | None = None  # None: "auto"
    sum_scheme: str = "auto"
    ranges: tuple | None = None
    out: torch.Tensor | np.ndarray | None = None  # a NumPy array is written through a tensor view of it
    keepdim: bool = False
    precision: str = "exact"

    @property
    def is_plain(self) -> bool:
        """Whether the reduction runs as without options (out= aside): on the tensors' device, in their dtype."""
        return (
            self.backend == "auto"
            and self.device_id < 0
            and self.dtype_acc is None
            and self.sum_scheme != "kahan_scheme"
            and self.ranges is None
            and not self.keepdim
            and self.precision == "exact"
        )

    @property
    def automatic_device(self) -> bool:
        """Whether the device is left to the reduction (backend "auto" and no device_id): see auto_gpu."""
        return self.backend == "auto" and self.device_id < 0

    def check_sum_type(self, is_sum: bool, what: str) -> None:
        """KeOps' rule: accumulation options belong to sum-type reductions (sum, logsumexp, sumsoftmaxweight)."""
        if is_sum:
            return
        if self.dtype_acc is not None:
            raise ValueError(f"{what}: dtype_acc / use_double_acc are for sum-type reductions (sum, logsumexp)")
        if self.sum_scheme in ("block_sum", "kahan_scheme"):
            raise ValueError(f"{what}: sum_scheme={self.sum_scheme!r} is for sum-type reductions (sum, logsumexp)")

    def compute_dtype(self, dtype: torch.dtype, what: str) -> torch.dtype:
        """The dtype to run a reduction of ``dtype`` inputs in: theirs, or dtype_acc when wider."""
        acc = self.dtype_acc
        if acc is None and self.sum_scheme == "kahan_scheme" and dtype != torch.float64:
            acc = torch.float64
        if acc is None:
            return dtype
        if _WIDTH[acc] < _WIDTH[dtype]:
            raise ValueError(f"{what}: dtype_acc={acc} is narrower than the {dtype} inputs; it can only widen")
        if _WIDTH[acc] <= 32:  # 16-bit inputs are already reduced in float32
            return dtype
        return acc

    def compute_device(self, device: torch.device, what: str) -> torch.device:
        """The device to run a reduction of tensors on ``device`` on (backend and device_id)."""
        gpu = self.backend.startswith("GPU") or self.device_id >= 0
        if self.backend == "CPU":
            if self.device_id >= 0:
                raise ValueError(f"{what}: backend='CPU' with device_id={self.device_id} (a GPU)")
            return torch.device("cpu")
        if not gpu:
            return device
        if not torch.cuda.is_available():
            asked = f"backend={self.backend!r}" if self.backend != "auto" else f"device_id={self.device_id}"
            raise RuntimeError(f"{what}: {asked} asks for a CUDA device, and none is available")
        if self.device_id >= torch.cuda.device_count():
            raise ValueError(
                f"{what}: device_id={self.device_id}, but there are {torch.cuda.device_count()} CUDA devices"
            )
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            if self.device_id >= 0 and index != self.device_id:
                raise ValueError(
                    f"{what}: device_id={self.device_id}, but the tensors are on {device}; move them, or leave "
                    f"device_id out"
                )
            return torch.device("cuda", index)
        return torch.device("cuda", self.device_id if self.device_id >= 0 else torch.cuda.current_device())


DEFAULT = ReduceOptions()

# KeOps' backend "auto" reduces CPU tensors on the GPU whenever there is one (and copies the result back). Here a
# reduction of CPU tensors goes to the current GPU from this many (i, j) pairs (4096 x 4096): smaller ones stay on
# the CPU, where they take less than the copies, the launch and a first compile would.
AUTO_GPU_PAIRS = 1 << 24


def auto_gpu(pairs: int) -> bool:
    """Whether a reduction of CPU tensors with this many (i, j) pairs and an automatic device runs on the GPU."""
    return pairs >= AUTO_GPU_PAIRS and torch.cuda.is_available()


def _flag(name: str, value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{what}: {name} must be True or False, got {value!r}")
    return value


def parse_options(what: str, kwargs: dict[str, Any]) -> ReduceOptions:
    """The ReduceOptions of a reduction called with KeOps' keyword arguments ``kwargs``; unknown names raise
    TypeError, bad values ValueError / TypeError naming the argument."""
    if not kwargs:
        return DEFAULT
    known = {
        "backend",
        "device_id",
        "dtype_acc",
        "use_double_acc",
        "sum_scheme",
        "enable_chunks",
        "use_fast_math",
        "optional_flags",
        "ranges",
        "out",
        "keepdim",
        "call",
        "precision",
    }
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise TypeError(f"{what}() got unexpected keyword arguments {unknown}; the options are {sorted(known)}")
    backend = kwargs.get("backend", "auto")
    if backend not in BACKENDS:
        raise ValueError(f"{what}: backend={backend!r} is not one of {list(BACKENDS)}")
    device_id = kwargs.get("device_id", -1)
    if device_id is None:
        device_id = -1
    if isinstance(device_id, bool) or not isinstance(device_id, int):
        raise TypeError(f"{what}: device_id must be an int (-1: automatic), got {device_id!r}")
    dtype_acc = kwargs.get("dtype_acc", "auto")
    if isinstance(dtype_acc, str) and dtype_acc != "auto":
        if dtype_acc not in _DTYPES:
            raise ValueError(f"{what}: dtype_acc={dtype_acc!r} is not one of ['auto', {', '.join(map(repr, _DTYPES))}]")
        dtype_acc = _DTYPES[dtype_acc]
    elif isinstance(dtype_acc, torch.dtype):
        if dtype_acc not in _DTYPES.values():
            raise ValueError(f"{what}: dtype_acc={dtype_acc} is not float16, float32 or float64")
    elif dtype_acc != "auto":
        raise TypeError(f"{what}: dtype_acc must be a string or a torch dtype, got {dtype_acc!r}")
    acc = None if dtype_acc == "auto" else dtype_acc
    if _flag("use_double_acc", kwargs.get("use_double_acc", False), what):
        if acc is not None:
            raise ValueError(f"{what}: use_double_acc=True and dtype_acc={dtype_acc!r}: set one of them")
        acc = torch.float64
    sum_scheme = kwargs.get("sum_scheme", "auto")
    if sum_scheme not in SUM_SCHEMES:
        raise ValueError(f"{what}: sum_scheme={sum_scheme!r} is not one of {list(SUM_SCHEMES)}")
    _flag("enable_chunks", kwargs.get("enable_chunks", True), what)
    _flag("use_fast_math", kwargs.get("use_fast_math", True), what)
    flags = kwargs.get("optional_flags")
    if flags is not None and not (isinstance(flags, (list, tuple)) and all(isinstance(f, str) for f in flags)):
        raise TypeError(f"{what}: optional_flags must be a list of strings, got {flags!r}")
    if not _flag("call", kwargs.get("call", True), what):
        raise NotImplementedError(
            f"{what}: call=False (a callable reduction of symbolic variables) is not supported; reduce a "
            f"LazyTensor of tensors"
        )
    out = kwargs.get("out")
    if out is not None and not isinstance(out, (torch.Tensor, np.ndarray)):
        raise TypeError(f"{what}: out must be a tensor (or a NumPy array), got {type(out).__name__}")
    ranges = kwargs.get("ranges")
    if ranges is not None:
        if not (
            isinstance(ranges, (tuple, list))
            and len(ranges) == 6
            and all(isinstance(r, torch.Tensor) and not r.is_floating_point() for r in ranges)
        ):
            raise TypeError(
                f"{what}: ranges must be KeOps' 6-tuple of integer tensors (ranges_i, slices_i, redranges_j, "
                f"ranges_j, slices_j, redranges_i)"
            )
        ranges = tuple(ranges)
    precision = kwargs.get("precision", "exact")
    if precision not in PRECISIONS:
        raise ValueError(f"{what}: precision must be one of {list(PRECISIONS)}, got {precision!r}")
    return ReduceOptions(
        precision=precision,
        backend=backend,
        device_id=device_id,
        dtype_acc=acc,
        sum_scheme=sum_scheme,
        ranges=ranges,
        out=out,
        keepdim=_flag("keepdim", kwargs.get("keepdim", False), what),
    )
