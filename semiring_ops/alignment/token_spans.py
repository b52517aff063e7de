"""``merge_tokens`` and ``TokenSpan``, with torchaudio.functional's signatures and results: a frame-level alignment
(forced_align's) turned into the spans of its labels, so that torchaudio's alignment code runs with its import
swapped (docs/structures.md, "CTC").

A span is a run of equal consecutive frame labels that is not the blank; the same label after a blank starts a new
span (``a - a`` is two). Its score is the mean of the frame scores over the run, as torch's ``mean`` of that slice
computes it (so the numbers are torchaudio's to the bit)."""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

__all__ = ["TokenSpan", "merge_tokens"]


@dataclasses.dataclass
class TokenSpan:
    """One label's frames [start, end) of an alignment, and its score (the mean frame score)."""

    token: int
    start: int
    end: int
    score: float

    def __len__(self) -> int:
        return self.end - self.start


def merge_tokens(tokens: Tensor, scores: Tensor, blank: int = 0) -> list[TokenSpan]:
    """The label spans of one alignment: tokens (T,) integer frame labels, scores (T,) their scores (e.g.
    forced_align's, or their exp) -> [TokenSpan], in frame order, the blank's runs left out.

    Raises ValueError when tokens or scores is not 1-D or their lengths differ."""
    if not isinstance(tokens, Tensor) or not isinstance(scores, Tensor) or tokens.dim() != 1 or scores.dim() != 1:
        shapes = [tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__ for t in (tokens, scores)]
        raise ValueError(f"merge_tokens: tokens and scores must be 1-D tensors, got {shapes[0]} and {shapes[1]}")
    if tokens.shape[0] != scores.shape[0]:
        raise ValueError(f"merge_tokens: tokens ({tokens.shape[0]},) and scores ({scores.shape[0]},) differ in length")
    n = tokens.shape[0]
    if n == 0:
        return []
    change = torch.ones(n, dtype=torch.bool, device=tokens.device)
    change[1:] = tokens[1:] != tokens[:-1]
    starts = change.nonzero()[:, 0].tolist()
    labels = tokens.tolist()
    spans = [(start, end) for start, end in zip(starts, [*starts[1:], n], strict=True) if labels[start] != blank]
    if not spans:
        return []
    # each span's mean as torch computes it on the scores' device (its launches queued, read back in one transfer)
    means = torch.stack([scores[start:end].mean() for start, end in spans]).tolist()
    return [TokenSpan(labels[start], start, end, mean) for (start, end), mean in zip(spans, means, strict=True)]
