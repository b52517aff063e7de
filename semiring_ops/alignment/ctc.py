"""``ctc_loss`` and ``CTCLoss`` with torch.nn.functional.ctc_loss's signature and results, on the CTC structure
(structures/ctc.py), in the log semiring (the loss) or the max semiring (``semiring="max"``: the Viterbi loss,
minus the best alignment's score).

Accepted as torch does: log_probs (T, N, C), or (T, C) unbatched; targets padded (N, S) or concatenated 1-D
(sum of target_lengths), (S,) unbatched; lengths as tensors, lists or tuples ((N,), or scalars unbatched);
reduction "none" (N,), "sum", or "mean" (each loss divided by its target length, at least 1, then the batch
mean); an impossible alignment gives inf, or 0 with a zero gradient under ``zero_infinity``. float16 and
bfloat16 log_probs are computed in float32, the loss returned in their dtype.

Differences from torch, on purpose:
- the gradient is d loss / d log_probs, minus the state occupancies. torch's is exp(log_probs) minus them, the
  gradient with respect to the logits under a log_softmax; through log_softmax (how CTC is used) the two are
  equal;
- an impossible item's gradient is 0 (not NaN) also without ``zero_infinity``;
- float16 / bfloat16 and ``semiring="max"`` are accepted.

The log and max semirings run on the fused kernels (csrc/ctc_dp.h through ops/ctc_ops.py: one launch for the
loss and its state occupancies, one in the backward to sum them per label times the loss's gradient; memory a row
of 2 S + 1 states per frame, half of torch's alpha and beta) where they apply (fused_ok), else the CTC structure's
PyTorch program, which also gives the double backward.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from ..ops import ctc_ops
from ..semirings import LogSemiring, MaxSemiring
from ..structures.ctc import CTC

__all__ = ["CTCLoss", "ctc_loss", "ctc_posteriors"]

_SEMIRINGS = {"log": LogSemiring, "max": MaxSemiring}
_REDUCTIONS = ("none", "mean", "sum")


def _lengths(value: Tensor | Sequence[int] | int, name: str, n: int, device: torch.device, who: str) -> Tensor:
    """``value`` as (n,) int64 on ``device`` (a scalar for one item), or ValueError naming it (its values are
    checked by checked_inputs, with the others' in one device synchronisation)."""
    t = torch.as_tensor(value, device=device)
    if t.dtype.is_floating_point or t.dtype == torch.bool or t.dtype.is_complex:
        raise ValueError(f"{who}: {name} must be integers, got {t.dtype}")
    t = t.reshape(-1) if t.dim() == 0 else t
    if t.shape != (n,):
        raise ValueError(f"{who}: {name} must have one entry per batch item ({n}), got shape {tuple(t.shape)}")
    return t.long()


def _within_lengths(padded: Tensor, target_lengths: Tensor) -> Tensor:
    """(N, S) bool: which columns of the padded targets (N, S) are labels, not padding."""
    return torch.arange(padded.shape[1], device=padded.device)[None, :] < target_lengths[:, None]


def _padded_targets(targets: Tensor, target_lengths: Tensor, n: int, who: str) -> Tensor:
    """targets as (n, S) int64 (concatenated targets split, padded with 0; their lengths' sum and maximum read
    here, a synchronisation; while torch.compile traces, S is the concatenation's length and nothing is read)."""
    if targets.dtype.is_floating_point or targets.dtype == torch.bool:
        raise ValueError(f"{who}: targets must be integers, got {targets.dtype}")
    if targets.dim() == 2:
        if targets.shape[0] != n:
            raise ValueError(f"{who}: targets must be (N, S) with N = {n}, got {tuple(targets.shape)}")
        return targets.long()
    if targets.dim() != 1:
        raise ValueError(f"{who}: targets must be (N, S) or 1-D concatenated, got {tuple(targets.shape)}")
    if torch.compiler.is_compiling():  # each item's labels from its offset; the columns past its length are masked
        width = targets.shape[0]
        if not width:
            return targets.new_zeros((n, 0), dtype=torch.long)
        starts = torch.cumsum(target_lengths, 0) - target_lengths
        columns = starts[:, None] + torch.arange(width, device=targets.device)[None, :]
        return targets.long()[columns.clamp(max=width - 1)]
    total, width = torch.stack([target_lengths.sum(), target_lengths.max()]).tolist() if n else (0, 0)
    if min(target_lengths.tolist(), default=0) < 0:
        raise ValueError(f"{who}: target_lengths must be >= 0, got {target_lengths.tolist()}")
    if targets.shape[0] < total:
        raise ValueError(f"{who}: 1-D targets hold {targets.shape[0]} labels, target_lengths sum to {total}")
    out = torch.zeros((n, width), dtype=torch.long, device=targets.device)
    out[_within_lengths(out, target_lengths)] = targets[:total].long()
    return out


# Padded targets up to this many labels are checked on the host (one transfer each way); longer ones on the device.
_HOST_CHECKED_LABELS = 1 << 16


def _checked_labels(
    input_lengths: Tensor, target_lengths: Tensor, padded: Tensor, T: int, C: int, blank: int, who: str
) -> Tensor:
    """The lengths and labels checked (ValueError naming what is wrong; their values read in one synchronisation
    where they are on a device), and the labels (N, width) with ``blank`` past each item's length, cut to the
    longest length."""
    N = padded.shape[0]
    valid = _within_lengths(padded, target_lengths)
    bad = valid & ((padded < 0) | (padded >= C) | (padded == blank))
    low_in, low_target, high_in, width, bad_labels = (
        torch.stack(
            [input_lengths.min(), target_lengths.min(), input_lengths.max(), target_lengths.max(), bad.sum()]
        ).tolist()
        if N
        else (0, 0, 0, 0, 0)
    )
    if low_in < 0 or low_target < 0:
        name, t = ("input_lengths", input_lengths) if low_in < 0 else ("target_lengths", target_lengths)
        raise ValueError(f"{who}: {name} must be >= 0, got {t.tolist()}")
    if high_in > T:
        raise ValueError(f"{who}: input_lengths must be <= T = {T}, got {input_lengths.tolist()}")
    if width > padded.shape[1]:
        raise ValueError(f"{who}: target_lengths {target_lengths.tolist()} exceed targets' {padded.shape[1]} columns")
    if bad_labels:
        raise ValueError(f"{who}: target labels must be in [0, C = {C}) and not the blank ({blank})")
    return torch.where(valid, padded, blank)[:, :width]


def _no_pending_check() -> None:
    """checked_inputs' last item when the values were checked before it returned."""


def checked_inputs(
    log_probs: Tensor,
    targets: Tensor,
    input_lengths: Tensor | Sequence[int] | int,
    target_lengths: Tensor | Sequence[int] | int,
    blank: int,
    who: str,
    defer: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor, bool, Callable[[], None]]:
    """The inputs as torch's ctc_loss accepts them (module docstring), checked (ValueError naming the argument):
    (log_probs (T, N, C), targets (N, S) int64 padded with ``blank`` to the longest target, input_lengths (N,),
    target_lengths (N,) int64, whether the call was unbatched, finish). The values are read in one synchronisation
    (two for concatenated targets); while torch.compile traces, only shapes and dtypes are checked, and the targets
    keep their columns (a graph without data-dependent shapes; the eager call checks the values).

    ``finish`` is a function to call once the kernels are queued: with ``defer`` on a GPU, for padded targets, the
    values' check is left pending. Their copy to the host is queued, and what comes back is what the fused kernels
    take as it is (they read only lengths and labels in range: csrc/ctc_dp.h, ctc_setup), or, for the PyTorch
    program, made safe on the device (lengths clamped to the shapes, labels past each length blanked, labels
    clamped to [0, C)), the targets keeping their columns; ``finish`` waits for the copy alone and raises the
    ValueError, so that the GPU runs the loss while the host checks (at T = 1,000, N = 32 a fifth of the loss's
    time idle otherwise). Without ``defer``, ``finish`` does nothing."""
    if not isinstance(log_probs, Tensor) or log_probs.dim() not in (2, 3) or not log_probs.is_floating_point():
        got = tuple(log_probs.shape) if isinstance(log_probs, Tensor) else type(log_probs).__name__
        raise ValueError(f"{who}: log_probs must be a floating (T, N, C) or (T, C) tensor, got {got}")
    if not isinstance(targets, Tensor):
        raise ValueError(f"{who}: targets must be a tensor, got {type(targets).__name__}")
    unbatched = log_probs.dim() == 2
    if unbatched:
        log_probs = log_probs[:, None]
        targets = targets[None] if targets.dim() == 1 else targets
    T, N, C = log_probs.shape
    if not 0 <= blank < C:
        raise ValueError(f"{who}: blank must be in [0, C = {C}), got {blank}")
    device = log_probs.device
    input_lengths = _lengths(input_lengths, "input_lengths", N, device, who)
    target_lengths = _lengths(target_lengths, "target_lengths", N, device, who)
    concatenated = targets.dim() == 1
    padded = _padded_targets(targets.to(device), target_lengths, N, who)
    if torch.compiler.is_compiling():
        padded = torch.where(_within_lengths(padded, target_lengths), padded, blank)
        return log_probs, padded, input_lengths, target_lengths, unbatched, _no_pending_check
    if device.type != "cpu" and padded.numel() <= _HOST_CHECKED_LABELS:
        # the lengths and labels in one transfer, checked and masked on the host, the labels sent back: 3 launches
        # where the checks on the device take ~15 (at T = 1,000, N = 32 a tenth of the loss's time)
        values = torch.cat([input_lengths, target_lengths, padded.reshape(-1)])
        if defer and device.type == "cuda" and not concatenated:
            finish = _check_when_copied(values, padded.shape, T, C, blank, who)
            if fused_ok(log_probs, padded):  # the kernels read only in-range values (csrc/ctc_dp.h, ctc_setup)
                return log_probs, padded, input_lengths, target_lengths, unbatched, finish
            input_lengths, target_lengths = input_lengths.clamp(0, T), target_lengths.clamp(0, padded.shape[1])
            labels = torch.where(_within_lengths(padded, target_lengths), padded, blank).clamp_(0, C - 1)
            return log_probs, labels, input_lengths, target_lengths, unbatched, finish
        host = values.cpu()
        lengths = (host[:N], host[N : 2 * N])
        labels = _checked_labels(*lengths, host[2 * N :].view(padded.shape), T, C, blank, who)
        return log_probs, labels.to(device), input_lengths, target_lengths, unbatched, _no_pending_check
    labels = _checked_labels(input_lengths, target_lengths, padded, T, C, blank, who)
    return log_probs, labels, input_lengths, target_lengths, unbatched, _no_pending_check


def _check_when_copied(values: Tensor, shape: torch.Size, T: int, C: int, blank: int, who: str) -> Callable[[], None]:
    """Queues the copy of ``values`` (input lengths, target lengths, padded labels of ``shape``, on a GPU) to pinned
    host memory; the function returned waits for that copy (not for what is queued after it) and checks them."""
    host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
    host.copy_(values, non_blocking=True)
    copied = torch.cuda.Event()
    copied.record(torch.cuda.current_stream(values.device))
    N = shape[0]

    def finish() -> None:
        copied.synchronize()
        _checked_labels(host[:N], host[N : 2 * N], host[2 * N :].view(shape), T, C, blank, who)

    return finish


def in_compute_dtype(log_probs: Tensor) -> Tensor:
    """float32 and float64 as they are; float16 and bfloat16 in float32."""
    return log_probs.float() if log_probs.dtype in (torch.float16, torch.bfloat16) else log_probs


def ctc_loss(
    log_probs: Tensor,
    targets: Tensor,
    input_lengths: Tensor | Sequence[int] | int,
    target_lengths: Tensor | Sequence[int] | int,
    blank: int = 0,
    reduction: str = "mean",
    zero_infinity: bool = False,
    *,
    semiring: str = "log",
) -> Tensor:
    """The CTC loss (module docstring): log_probs (T, N, C) or (T, C); targets (N, S), 1-D concatenated, or (S,)
    unbatched; input_lengths, target_lengths (N,) or scalars; returns (N,) for reduction="none", else a scalar."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"ctc_loss: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if semiring not in _SEMIRINGS:
        raise ValueError(f"ctc_loss: semiring must be one of {tuple(_SEMIRINGS)}, got {semiring!r}")
    log_probs, padded, input_lengths, target_lengths, unbatched, finish_checks = checked_inputs(
        log_probs, targets, input_lengths, target_lengths, blank, "ctc_loss", defer=True
    )
    total = log_partition(in_compute_dtype(log_probs), padded, input_lengths, target_lengths, blank, semiring)
    finish_checks()  # the inputs' values, checked while the GPU runs the loss
    loss = -total
    if zero_infinity:
        loss = torch.where(torch.isinf(loss), torch.zeros_like(loss), loss)
    if reduction == "mean":
        loss = (loss / target_lengths.clamp(min=1).to(loss)).mean()
    elif reduction == "sum":
        loss = loss.sum()
    elif unbatched:
        loss = loss[0]
    return loss.to(log_probs.dtype)


def fused_ok(log_probs: Tensor, targets: Tensor) -> bool:
    """Whether CTC's fused kernels take these (T, N, C) float32 / float64 log_probs and (N, S) targets: compiled
    kernels on the device, no ``generic_only()`` block, and on CUDA targets whose states' rows fit the device's
    shared memory a block (cuda_max_labels: 1,023 labels in float32 and 511 in float64 on an A100, H100 or H200,
    631 / 340 on GPUs of 99 KiB; longer targets run the structure's PyTorch program). While torch.compile
    traces, the kernels are taken to be there (the ops load them when the graph runs:
    ctc_ops.ctc_kernels_or_raise)."""
    from ..ops.ctc_ops import ctc_kernels
    from ..structures.fused import generic_active

    if generic_active() or log_probs.dtype not in _CUDA_MAX_STATES:
        return False
    if log_probs.device.type == "cuda":
        index = log_probs.device.index if log_probs.device.index is not None else torch.cuda.current_device()
        if targets.shape[1] > _device_max_labels(index, log_probs.dtype):
            return False
    return torch.compiler.is_compiling() or ctc_kernels(log_probs.device) is not None


_CUDA_MAX_STATES = {torch.float32: 2047, torch.float64: 1023}  # csrc/cuda/ctc_launch.h, ctc_max_states


def cuda_max_labels(shared_bytes: int, dtype: torch.dtype) -> int:
    """The most labels S whose K = 2 S + 1 states' scratch (csrc/ctc_dp.h, ctc_scratch_bytes: 3 K + 2 int32, then
    16-byte aligned 36 + 4 (K + 4) + 13 K values) fits ``shared_bytes`` of shared memory a block, within the
    kernels' own bound (_CUDA_MAX_STATES); -1 when not even S = 0 fits."""
    size = 4 if dtype == torch.float32 else 8

    def scratch(K: int) -> int:
        return -(-(4 * (3 * K + 2)) // 16) * 16 + (36 + 4 * (K + 4) + 13 * K) * size

    K = _CUDA_MAX_STATES[dtype]
    while K >= 1 and scratch(K) > shared_bytes:
        K -= 2
    return (K - 1) // 2


@functools.lru_cache(maxsize=64)
def _device_max_labels(index: int, dtype: torch.dtype) -> int:
    shared = getattr(torch.cuda.get_device_properties(index), "shared_memory_per_block_optin", None)
    return cuda_max_labels(1 << 30 if shared is None else shared, dtype)  # (a torch without it: the kernels' bound)


def log_partition(
    log_probs: Tensor, targets: Tensor, input_lengths: Tensor, target_lengths: Tensor, blank: int, semiring: str
) -> Tensor:
    """(N,): each item's semiring sum over its alignments, log_probs (T, N, C) float32 / float64, targets (N, S)
    int64 padded with ``blank``, lengths (N,) int64 (all checked); by the fused kernels where they apply (one launch
    each way), else the structure's PyTorch program. Differentiable in log_probs."""
    if fused_ok(log_probs, targets):
        from ..ops import ctc_ops

        if semiring == "max":
            return ctc_ops.ctc_viterbi(log_probs, targets, input_lengths, target_lengths, blank)[0]
        need = torch.is_grad_enabled() and log_probs.requires_grad
        return ctc_ops.ctc_log_fast(log_probs, targets, input_lengths, target_lengths, blank, need)[0]
    return reference_log_partition(log_probs, targets, input_lengths, target_lengths, blank, semiring)


@ctc_ops.reference_log_partition.install
def reference_log_partition(
    log_probs: Tensor, targets: Tensor, input_lengths: Tensor, target_lengths: Tensor, blank: int, semiring: str
) -> Tensor:
    """log_partition by the CTC structure's PyTorch program (autograd through it, to any order)."""
    T, N, C = log_probs.shape
    scores = log_probs.transpose(0, 1)  # (N, T, C)
    structure = CTC(targets, target_lengths, blank)
    # an item of 0 frames: no alignment unless its target is empty too (then the empty one, score 1)
    frames = input_lengths.clamp(min=1)
    if T == 0:  # (the sum of no log_probs keeps the result in their graph)
        scores = scores.new_zeros((N, 1, C)) + log_probs.sum()
    total = structure.logpartition(structure.emissions(scores), frames, _SEMIRINGS[semiring])
    empty = input_lengths == 0
    return torch.where(empty, torch.where(target_lengths == 0, 0.0, -torch.inf).to(total), total)


def ctc_posteriors(
    log_probs: Tensor,
    targets: Tensor,
    input_lengths: Tensor | Sequence[int] | int,
    target_lengths: Tensor | Sequence[int] | int,
    blank: int = 0,
) -> Tensor:
    """Each frame's label posteriors under CTC (arguments as :func:`ctc_loss`): (T, N, C) (or (T, C) unbatched)
    in log_probs' dtype, entry [t, n, c] the probability that item n's alignment emits label c at frame t, given
    its target; each frame's entries sum to 1 within the item's frames, and are 0 past them and for an item with
    no alignment. The same as minus the gradient of the unreduced loss. Two launches of the fused kernels (the log
    program, the collection; 16-bit inputs computed in float32), else the structure's PyTorch program."""
    lp, padded, input_lengths, target_lengths, unbatched, _ = checked_inputs(
        log_probs, targets, input_lengths, target_lengths, blank, "ctc_posteriors"
    )
    lp = in_compute_dtype(lp).detach()
    if fused_ok(lp, padded):
        posteriors = ctc_ops.ctc_occupancy(lp, padded, input_lengths, target_lengths, blank)[1]
    else:
        with torch.enable_grad():
            x = lp.requires_grad_()
            total = reference_log_partition(x, padded, input_lengths, target_lengths, blank, "log")
            weight = torch.isfinite(total).to(total)
            (posteriors,) = torch.autograd.grad(total, x, weight)
    posteriors = posteriors.to(log_probs.dtype)
    return posteriors[:, 0] if unbatched else posteriors


class CTCLoss(nn.Module):
    """torch.nn.CTCLoss's interface on :func:`ctc_loss` (``semiring="max"``: the Viterbi loss)."""

    def __init__(self, blank: int = 0, reduction: str = "mean", zero_infinity: bool = False, semiring: str = "log"):
        super().__init__()
        self.blank, self.reduction, self.zero_infinity, self.semiring = blank, reduction, zero_infinity, semiring

    def forward(
        self,
        log_probs: Tensor,
        targets: Tensor,
        input_lengths: Tensor | Sequence[int],
        target_lengths: Tensor | Sequence[int],
    ) -> Tensor:
        return ctc_loss(
            log_probs,
            targets,
            input_lengths,
            target_lengths,
            self.blank,
            self.reduction,
            self.zero_infinity,
            semiring=self.semiring,
        )
