"""A reduction plan: what one kernel computes, independent of the data (the key it is compiled and cached
under), and the arguments of one call laid out for the kernels.

The output rows are indexed by the *outer* category ("i" when reducing over j, "j" when reducing over i) and
the reduction runs over the *inner* one; parameters ("p") are the same for every pair. Every argument is
passed to a kernel contiguous, in the compute dtype (float32 for 16-bit inputs, which is also the
accumulation type), with a batch stride that is 0 when the argument is broadcast over the batch.

The numbers of a formula (formula.Num) are not part of the plan: a call passes them as one more tensor after
the variables, the number vector (n_numbers,), in the compute dtype (:func:`numbers_tensor`), so the
kernel of a plan serves every value of its numbers.

A block-sparse plan (``ranged``, KeOps' ranges=) is a kernel of its own: its call passes, after those, the six
int64 CPU tensors of block_sparse.oriented_ranges (the output axis's RangeMap, then the other axis's).
"""

from __future__ import annotations

import array
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..ops.registry import plain_eager
from .formula import Formula, FormulaError, InnerProduct, _postorder, number_count, variables
from .formula_key import parse_formula
from .reductions import Reduction

__all__ = ["CallArgs", "Plan", "new_outputs", "numbers_tensor", "prepare_call", "set_poison_outputs"]

_poison = False
RANGE_TENSORS = 6  # a ranged call's range tensors (block_sparse.oriented_ranges)
_PRECISION_FLAGS = {"exact": "", "high": "h", "fast": "f"}  # a plan key's letter for each precision


def set_poison_outputs(enabled: bool) -> None:
    """Testing aid: kernels' outputs start as NaN (indices as -1) instead of uninitialised memory, so an
    element a kernel fails to write cannot pass for a right answer."""
    global _poison
    _poison = enabled


@dataclass(frozen=True)
class Plan:
    """A canonical formula (slot variables 0..n-1), the reduction, and which category indexes the output."""

    formula: Formula
    arg_cats: tuple[str, ...]
    arg_dims: tuple[int, ...]
    reduction: Reduction
    outer: str  # "i" or "j"
    with_arg: bool  # whether the kernel tracks the selected indices (max / min)
    ranged: bool = False  # block-sparse (block_sparse.py): each row reduces over its block's inner ranges only
    # the matrix-unit route's GEMM products on CUDA float32 (gemm_route.py, module docstring): "exact" (the default),
    # "high" or "fast" (LazyTensor reductions' precision=)
    precision: str = "exact"
    # the compile key, made once (a cached_property would take a lock, which torch.compile cannot trace)
    key: str = field(init=False, repr=False, compare=False)
    n_numbers: int = field(init=False, repr=False, compare=False)  # the number vector's length (0: none)
    grams: int = field(init=False, repr=False, compare=False)  # InnerProduct nodes (inner_products.py; 0: none)

    def __post_init__(self) -> None:
        r = self.reduction
        if self.precision not in _PRECISION_FLAGS:
            raise ValueError(f"lazy plan: precision must be one of {list(_PRECISION_FLAGS)}, got {self.precision!r}")
        flags = f"{int(self.with_arg)}{'r' if self.ranged else ''}{_PRECISION_FLAGS[self.precision]}"
        key = f"{self.formula.key}|{r.kind}:{r.semiring}:{r.k}|{self.outer}|{flags}"
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "n_numbers", number_count(self.formula))
        grams = sum(isinstance(n, InnerProduct) for n in _postorder(self.formula)) if "Gram" in key else 0
        object.__setattr__(self, "grams", grams)

    def check_call(self, tensors: Sequence[torch.Tensor]) -> None:
        """Raises ValueError unless ``tensors`` are a call's: one per slot, then the number vector (at least
        n_numbers long) when the formula has numbers, then the six range tensors when ranged."""
        slots = len(self.arg_cats)
        want = slots + (1 if self.n_numbers else 0) + (RANGE_TENSORS if self.ranged else 0)
        if len(tensors) != want:
            raise ValueError(
                f"lazy plan {self.key[:200]!r}: {want} tensors expected ({slots} variables"
                f"{', then the number vector' if self.n_numbers else ''}"
                f"{', then the six range tensors' if self.ranged else ''}), got {len(tensors)}"
            )
        if self.n_numbers and (tensors[slots].dim() != 1 or tensors[slots].shape[0] < self.n_numbers):
            raise ValueError(
                f"lazy plan: the number vector must have shape (n,) with n >= {self.n_numbers}, "
                f"got {tuple(tensors[slots].shape)}"
            )

    @property
    def fast(self) -> bool:
        """precision="fast": the route's products in plain TF32."""
        return self.precision == "fast"

    @property
    def inner(self) -> str:
        return "j" if self.outer == "i" else "i"

    def role(self, slot: int) -> str:
        """ "outer", "inner" or "param" for argument ``slot``."""
        cat = self.arg_cats[slot]
        return "param" if cat == "p" else ("outer" if cat == self.outer else "inner")

    @property
    def value_dim(self) -> int:
        return self.reduction.value_dim(self.formula.dim)

    @property
    def index_dim(self) -> int:
        """Indices per output row (0 when none are tracked)."""
        if self.reduction.kind == "kbest":
            return self.value_dim
        return self.formula.dim if self.with_arg else 0

    @staticmethod
    def from_key(key: str) -> Plan:
        """The plan whose key is ``key`` (``Plan.from_key(p.key).key == p.key``); cached."""
        return _plan_from_key(key)


@functools.lru_cache(maxsize=4096)
def _plan_from_key(key: str) -> Plan:
    try:
        formula_key, reduction, outer, flags = key.rsplit("|", 3)
        with_arg, ranged = flags[:1], "r" in flags[1:]
        precision = next((name for name, flag in _PRECISION_FLAGS.items() if flag and flag in flags[1:]), "exact")
        kind, semiring, k = reduction.split(":")
        formula = parse_formula(formula_key)
        by_slot = {v.slot: v for v in variables(formula)}
        args = [by_slot[s] for s in range(len(by_slot))]
        plan = Plan(
            formula,
            tuple(v.cat for v in args),
            tuple(v.dim for v in args),
            Reduction(kind, semiring, int(k)),
            outer,
            bool(int(with_arg)),
            ranged,
            precision,
        )
    except (ValueError, KeyError) as e:
        raise FormulaError(f"not a plan key: {key[:200]!r} ({e})") from e
    if plan.key != key or outer not in ("i", "j"):
        raise FormulaError(f"not a plan key: {key[:200]!r}")
    return plan


@dataclass
class CallArgs:
    """One call's arguments: contiguous tensors in the compute dtype (outer / inner variables (*b_k, n, D_k),
    parameters (*b_k, D_k), b_k empty, all ones or the batch shape) and their batch strides in elements
    (0: shared by the whole batch). ``batched(k)`` views argument k as (B_k, n, D_k) / (B_k, D_k)."""

    tensors: list[torch.Tensor]
    batch_strides: list[int]
    nbatch: int
    n_outer: int
    n_inner: int
    dtype: torch.dtype

    def batched(self, slot: int) -> torch.Tensor:
        t = self.tensors[slot]
        trailing = 1 if self._is_param[slot] else 2
        return t.reshape(self.nbatch if self.batch_strides[slot] else 1, *t.shape[t.dim() - trailing :])

    _is_param: tuple[bool, ...] = ()
    numbers: torch.Tensor | None = None  # the number vector (n,), contiguous, in dtype; None without numbers
    ranges: tuple[torch.Tensor, ...] | None = None  # a ranged plan's six range tensors (module docstring)
    # a routed plan's matrices (inner_products.py, gemm_route.py), three per InnerProduct n: the matrix of
    # (row, j) values (row-major (n_outer, n_inner) on the CPU, (n_inner, n_outer) on CUDA), the rows' and the
    # inner terms' squared norms (n_outer,) and (n_inner,) (empty for a dot product)
    grams: tuple[torch.Tensor, ...] = ()


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


NUMBERS_CACHE_SIZE = 1024  # distinct (values, dtype, device) number vectors kept by numbers_tensor


def numbers_tensor(values: Sequence[float], like: torch.Tensor | None) -> torch.Tensor:
    """The number vector of a call: ``values`` (Python floats, exact) as a (n,) tensor in the compute dtype of
    ``like``'s dtype (a float64 formula's numbers are exact, a 16-bit one's are float32, like the
    computation) on ``like``'s device (float32 on the CPU without ``like``).

    Eager, the last NUMBERS_CACHE_SIZE vectors are kept, keyed by the values' bits: a formula rebuilt each
    call with the same numbers copies nothing to the device (``torch.tensor`` on a GPU is a synchronous
    copy). The tensors are shared and only ever read."""
    dtype = compute_dtype(like.dtype) if like is not None else torch.float32
    device = like.device if like is not None else torch.device("cpu")
    if like is not None and not plain_eager(like):  # tracing or a dispatch mode: no cached real tensor
        return torch.tensor(list(values), dtype=dtype, device=device)
    return _cached_numbers(array.array("d", values).tobytes(), dtype, device)


@functools.lru_cache(maxsize=NUMBERS_CACHE_SIZE)
def _cached_numbers(bits: bytes, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    # a normal tensor even when first asked for under inference_mode: an inference tensor could not be
    # saved for backward by a later reduction that records a graph
    with torch.inference_mode(False), torch.no_grad():
        return torch.tensor(array.array("d", bits).tolist(), dtype=dtype, device=device)


def prepare_call(
    plan: Plan, batch: tuple[int, ...], n_outer: int, n_inner: int, tensors: list[torch.Tensor]
) -> CallArgs:
    """Lays out the variables' tensors ((*b, n, D) for i / j variables, (*b, D) for parameters, with b
    broadcastable to ``batch``), then the number vector when the plan has numbers, for a kernel call."""
    nbatch = 1
    for s in batch:
        nbatch *= s
    numbers = ranges = None
    if plan.ranged:
        tensors, ranges = tensors[:-RANGE_TENSORS], tuple(tensors[-RANGE_TENSORS:])
    if plan.n_numbers:
        tensors, numbers = tensors[: len(plan.arg_cats)], tensors[len(plan.arg_cats)]
    dtype = compute_dtype(tensors[0].dtype) if tensors else torch.float32
    if numbers is not None:
        numbers = numbers.to(dtype).contiguous()
    out: list[torch.Tensor] = []
    strides: list[int] = []
    for slot, t in enumerate(tensors):
        trailing = 1 if plan.arg_cats[slot] == "p" else 2
        if t.dtype != dtype:
            t = t.to(dtype)
        if t.dim() > trailing:
            own_batch = t.shape[:-trailing]
            if own_batch.numel() != 1:
                if tuple(own_batch) != tuple(batch):
                    t = t.expand(*batch, *t.shape[-trailing:])
                strides.append(t.shape[-trailing:].numel())
                out.append(t.contiguous())
                continue
        strides.append(0)  # no batch of its own (or a batch of one): shared by the whole batch
        out.append(t if t.is_contiguous() else t.contiguous())
    is_param = tuple(c == "p" for c in plan.arg_cats)
    return CallArgs(out, strides, nbatch, n_outer, n_inner, dtype, is_param, numbers, ranges)


def new_outputs(plan: Plan, call: CallArgs, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Uninitialised (or, under set_poison_outputs, poisoned) value and index outputs for one call:
    (nbatch, n_outer, value_dim) and (nbatch, n_outer, index_dim) or None."""
    rows = (call.nbatch, call.n_outer)
    if _poison:
        vals = torch.full((*rows, plan.value_dim), float("nan"), dtype=call.dtype, device=device)
        idx = torch.full((*rows, plan.index_dim), -1, dtype=torch.int64, device=device) if plan.index_dim else None
    else:
        vals = torch.empty(*rows, plan.value_dim, dtype=call.dtype, device=device)
        idx = torch.empty(*rows, plan.index_dim, dtype=torch.int64, device=device) if plan.index_dim else None
    return vals, idx
