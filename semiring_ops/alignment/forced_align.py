"""``forced_align`` with torchaudio.functional.forced_align's signature and results, batched: the best CTC
alignment of each item's frames to its target (the max semiring on the CTC structure, structures/ctc.py), by the
fused kernels (one launch: csrc/ctc_dp.h's max program) or, without them, the structure's PyTorch program.

Accepted as torchaudio does: log_probs (N, T, C) (batch first, unlike ctc_loss) float32 / float64 / float16 (and
bfloat16), computed in float32 at least; targets (N, L) int32 or int64; input_lengths, target_lengths (N,), or
None for every item's full length. Returns (alignments (N, T) in targets' dtype: the label at each frame, scores
(N, T) in log_probs' dtype: log_probs at it). Ties are broken as torchaudio's: a skip only when strictly better
than both other moves, a step only when strictly better than staying, the final blank only when strictly better
than the last label.

Differences from torchaudio, on purpose:
- any batch size N (torchaudio takes N = 1), and frames past an item's input length (a batch padded to its
  longest item) get the blank and a score of 0;
- an item its frames cannot align (T < L + the target's repeats) raises ValueError naming the items (torchaudio:
  RuntimeError);
- log_probs and targets may lie on any device and need not be contiguous.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .ctc import checked_inputs, fused_ok, in_compute_dtype

__all__ = ["forced_align"]


def forced_align(
    log_probs: Tensor,
    targets: Tensor,
    input_lengths: Tensor | None = None,
    target_lengths: Tensor | None = None,
    blank: int = 0,
    *,
    top_k: int | None = None,
) -> tuple[Tensor, Tensor]:
    """The best CTC alignment of every item (module docstring): log_probs (N, T, C), targets (N, L) ->
    (alignments (N, T), scores (N, T)).

    ``top_k``: the k best alignments of every item instead, best first: (alignments (N, k, T), scores (N, k, T));
    an item with fewer than k alignments gets the blank and scores of -inf in the slots past them. By the CTC
    structure's k-best semiring (structures/base.py, ``topk``), in PyTorch operations; with ties, slot 0 may be
    another best alignment than the top_k=None one (whose ties are torchaudio's)."""
    if not isinstance(log_probs, Tensor) or log_probs.dim() != 3:
        got = tuple(log_probs.shape) if isinstance(log_probs, Tensor) else type(log_probs).__name__
        raise ValueError(f"forced_align: log_probs must be (N, T, C), got {got}")
    if not isinstance(targets, Tensor) or targets.dim() != 2 or targets.dtype not in (torch.int32, torch.int64):
        got = f"{tuple(targets.shape)} {targets.dtype}" if isinstance(targets, Tensor) else type(targets).__name__
        raise ValueError(f"forced_align: targets must be an int32 or int64 (N, L) tensor, got {got}")
    N, T, _ = log_probs.shape
    if input_lengths is None:
        input_lengths = torch.full((N,), T, dtype=torch.long, device=log_probs.device)
    if target_lengths is None:
        target_lengths = torch.full((N,), targets.shape[1], dtype=torch.long, device=log_probs.device)
    lp, padded, input_lengths, target_lengths, _, _ = checked_inputs(
        log_probs.transpose(0, 1), targets, input_lengths, target_lengths, blank, "forced_align"
    )
    lp = in_compute_dtype(lp).detach()
    repeats = ((padded[:, 1:] == padded[:, :-1]) & (padded[:, 1:] != blank)).sum(1)
    short = input_lengths < target_lengths + repeats
    if not torch.compiler.is_compiling() and bool(short.any()):  # (checked by eager calls)
        items = short.nonzero()[:, 0].tolist()
        raise ValueError(
            f"forced_align: items {items} have fewer frames than their target's labels plus repeats "
            f"(input_lengths {input_lengths[short].tolist()}, needed {(target_lengths + repeats)[short].tolist()})"
        )
    if top_k is not None:
        return _top_k(log_probs, lp, padded, input_lengths, target_lengths, blank, top_k, targets.dtype)
    if fused_ok(lp, padded):
        from ..ops.ctc_ops import ctc_viterbi

        states = ctc_viterbi(lp, padded, input_lengths, target_lengths, blank)[1]
    else:
        from ..structures.ctc import CTC

        structure = CTC(padded, target_lengths, blank)
        states = structure.best_path(structure.emissions(lp.transpose(0, 1)), input_lengths)[1]
    return _labels_and_scores(log_probs, states, padded, blank, targets.dtype)


def _labels_and_scores(
    log_probs: Tensor, states: Tensor, padded: Tensor, blank: int, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """states (N, ..., T) of the extended targets (-1: no frame) -> (their labels in ``dtype``, blank past the
    frames; log_probs (N, T, C) at them, 0 past the frames)."""
    from ..ops.ctc_ops import state_labels

    N, T = log_probs.shape[:2]
    labels = state_labels(padded, blank)
    on = states >= 0
    flat = states.reshape(N, -1)
    alignments = torch.where(on, labels.gather(1, flat.clamp(min=0)).view_as(states), blank)
    index = alignments.to(log_probs.device).reshape(N, -1, T).transpose(1, 2)  # (N, T, slots)
    scores = log_probs.gather(2, index).transpose(1, 2).reshape(states.shape)
    scores = torch.where(on.to(scores.device), scores, torch.zeros((), dtype=scores.dtype, device=scores.device))
    return alignments.to(dtype), scores


def _top_k(
    log_probs: Tensor,
    lp: Tensor,
    padded: Tensor,
    input_lengths: Tensor,
    target_lengths: Tensor,
    blank: int,
    k: int,
    dtype: torch.dtype,
) -> tuple[Tensor, Tensor]:
    """forced_align's top_k: (alignments (N, k, T), scores (N, k, T))."""
    from ..structures.ctc import CTC

    if not isinstance(k, int) or k < 1:
        raise ValueError(f"forced_align: top_k must be a positive int, got {k!r}")
    structure = CTC(padded, target_lengths, blank)
    parts = structure.topk(structure.emissions(lp.transpose(0, 1)), k, input_lengths.clamp(min=1))
    found = parts.flatten(2).any(-1)  # (k, N): slots holding an alignment
    states = torch.where(parts.any(-1), parts.argmax(-1), -1).permute(1, 0, 2)  # (N, k, T)
    alignments, scores = _labels_and_scores(log_probs, states, padded, blank, dtype)
    missing = ~found.T[..., None]  # (N, k, 1)
    alignments = torch.where(missing, torch.tensor(blank, dtype=dtype, device=alignments.device), alignments)
    scores = torch.where(missing.to(scores.device), float("-inf"), scores)
    return alignments, scores
