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

This is the reference path (a recursion over frames in PyTorch operations, memory of a row of 2 S + 1 states per
frame for autograd, as torch stores alpha and beta); the fused kernels are the next step of issue 43.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..semirings import LogSemiring, MaxSemiring
from ..structures.ctc import CTC

__all__ = ["CTCLoss", "ctc_loss"]

_SEMIRINGS = {"log": LogSemiring, "max": MaxSemiring}
_REDUCTIONS = ("none", "mean", "sum")


def _lengths(value: Tensor | Sequence[int] | int, name: str, n: int, device: torch.device) -> Tensor:
    """``value`` as (n,) int64 on ``device`` (a scalar for one item), or ValueError naming it."""
    t = torch.as_tensor(value, device=device)
    if t.dtype.is_floating_point or t.dtype == torch.bool or t.dtype.is_complex:
        raise ValueError(f"ctc_loss: {name} must be integers, got {t.dtype}")
    t = t.reshape(-1) if t.dim() == 0 else t
    if t.shape != (n,):
        raise ValueError(f"ctc_loss: {name} must have one entry per batch item ({n}), got shape {tuple(t.shape)}")
    if n and int(t.min()) < 0:
        raise ValueError(f"ctc_loss: {name} must be >= 0, got {t.tolist()}")
    return t.long()


def _padded_targets(targets: Tensor, target_lengths: Tensor, n: int) -> Tensor:
    """targets as (n, S) int64, padded with 0 past each item's length (concatenated targets are split)."""
    if targets.dtype.is_floating_point or targets.dtype == torch.bool:
        raise ValueError(f"ctc_loss: targets must be integers, got {targets.dtype}")
    if targets.dim() == 2:
        if targets.shape[0] != n:
            raise ValueError(f"ctc_loss: targets must be (N, S) with N = {n}, got {tuple(targets.shape)}")
        if n and int(target_lengths.max()) > targets.shape[1]:
            raise ValueError(
                f"ctc_loss: target_lengths {target_lengths.tolist()} exceed targets' {targets.shape[1]} columns"
            )
        return targets.long()
    if targets.dim() != 1:
        raise ValueError(f"ctc_loss: targets must be (N, S) or 1-D concatenated, got {tuple(targets.shape)}")
    total = int(target_lengths.sum()) if n else 0
    if targets.shape[0] < total:
        raise ValueError(f"ctc_loss: 1-D targets hold {targets.shape[0]} labels, target_lengths sum to {total}")
    width = int(target_lengths.max()) if n else 0
    out = torch.zeros((n, width), dtype=torch.long, device=targets.device)
    keep = torch.arange(width, device=targets.device)[None, :] < target_lengths[:, None]
    out[keep] = targets[:total].long()
    return out


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
    if not isinstance(log_probs, Tensor) or log_probs.dim() not in (2, 3) or not log_probs.is_floating_point():
        got = tuple(log_probs.shape) if isinstance(log_probs, Tensor) else type(log_probs).__name__
        raise ValueError(f"ctc_loss: log_probs must be a floating (T, N, C) or (T, C) tensor, got {got}")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"ctc_loss: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if semiring not in _SEMIRINGS:
        raise ValueError(f"ctc_loss: semiring must be one of {tuple(_SEMIRINGS)}, got {semiring!r}")
    if not isinstance(targets, Tensor):
        raise ValueError(f"ctc_loss: targets must be a tensor, got {type(targets).__name__}")
    unbatched = log_probs.dim() == 2
    if unbatched:
        log_probs = log_probs[:, None]
        targets = targets[None] if targets.dim() == 1 else targets
    T, N, C = log_probs.shape
    if not 0 <= blank < C:
        raise ValueError(f"ctc_loss: blank must be in [0, C = {C}), got {blank}")
    device = log_probs.device
    input_lengths = _lengths(input_lengths, "input_lengths", N, device)
    target_lengths = _lengths(target_lengths, "target_lengths", N, device)
    if N and int(input_lengths.max()) > T:
        raise ValueError(f"ctc_loss: input_lengths must be <= T = {T}, got {input_lengths.tolist()}")
    padded = _padded_targets(targets.to(device), target_lengths, N)
    valid = torch.arange(padded.shape[1], device=device)[None, :] < target_lengths[:, None]
    labels = padded[valid]
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= C or bool((labels == blank).any())):
        raise ValueError(f"ctc_loss: target labels must be in [0, C = {C}) and not the blank ({blank})")
    padded = torch.where(valid, padded, blank)

    compute = torch.float32 if log_probs.dtype in (torch.float16, torch.bfloat16) else log_probs.dtype
    scores = log_probs.to(compute).transpose(0, 1)  # (N, T, C)
    structure = CTC(padded, target_lengths, blank)
    # an item of 0 frames: no alignment unless its target is empty too (then the empty one, score 1)
    frames = input_lengths.clamp(min=1)
    if T == 0:
        scores = scores.new_zeros((N, 1, C))
    total = structure.logpartition(structure.emissions(scores), frames, _SEMIRINGS[semiring])
    empty = input_lengths == 0
    total = torch.where(empty, torch.where(target_lengths == 0, 0.0, -torch.inf).to(total), total)
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
