"""SemiMarkovSegmenter: scores labelled segments of a sequence for the semi-Markov CRF (named entities, chunks,
word segmentation, speech units), in torch-struct's SemiMarkov layout.

A segment of length k from boundary n to n + k (covering positions n + 1 .. n + k of the features, the item's
position 0 a start boundary) labelled c after a segment labelled c' scores

    edge[b, n, k, c, c'] = w_c . tanh(U [h_n ; h_{n+k} ; h_{n+k} - h_n] + u) + duration[k, c] + transition[c, c']

from the encoder features h (B, N, H): the two boundaries' features and their difference (the span
representation of span-based parsers and NER taggers), a learned score per duration and label, and a learned
label transition. Segments that would run past position N - 1 get -inf (they are never read by the dynamic
program; -inf keeps their marginals exactly 0). The structure gives the start boundary a label too; here it is
label 0 (the first segment's c' = 0, other c' -inf), so each segmentation is counted once.

    seg = SemiMarkovSegmenter(hidden, n_labels=5, max_length=6)
    dist = seg(h, lengths)                        # a SemiMarkovCRF over (B, N - 1, 6, 5, 5) potentials
    loss = -dist.log_prob(seg.parts(gold, N)).sum()
    best = seg.segments(dist.argmax)              # per item: [(start, end, label), ...]
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["SemiMarkovSegmenter"]


class SemiMarkovSegmenter(nn.Module):
    """Segment scores for a semi-Markov CRF (module docstring).

    Args:
        in_dim: H, the features' size.
        n_labels: C, the segment labels.
        max_length: the longest segment (segments of length 1 .. max_length; the potentials' K = max_length + 1).
        hidden: the span MLP's width (default 128).
        dropout: on the span representation (default 0).

    Shapes: ``forward(h (B, N, H), lengths (B,) or None)`` -> ``SemiMarkovCRF`` with potentials
    (B, N - 1, max_length + 1, C, C); ``potentials(h)`` returns the tensor alone.
    """

    def __init__(self, in_dim: int, n_labels: int, max_length: int, hidden: int = 128, dropout: float = 0.0) -> None:
        super().__init__()
        if in_dim < 1 or n_labels < 1 or max_length < 1:
            raise ValueError(
                f"SemiMarkovSegmenter: in_dim, n_labels and max_length must be >= 1, got {in_dim}, {n_labels}, "
                f"{max_length}"
            )
        self.n_labels, self.max_length = n_labels, max_length
        self.span = nn.Sequential(nn.Linear(3 * in_dim, hidden), nn.Tanh(), nn.Dropout(dropout))
        self.label = nn.Linear(hidden, n_labels)
        self.duration = nn.Parameter(torch.zeros(max_length + 1, n_labels))
        self.transition = nn.Parameter(torch.zeros(n_labels, n_labels))

    def potentials(self, h: Tensor) -> Tensor:
        """(B, N - 1, K, C, C) segment potentials from features ``h`` (B, N, H); K = max_length + 1, k = 0 unused."""
        if h.dim() != 3:
            raise ValueError(f"SemiMarkovSegmenter: h must be (B, N, H), got {tuple(h.shape)}")
        B, N, _ = h.shape
        K, C = self.max_length + 1, self.n_labels
        starts = torch.arange(max(N - 1, 0), device=h.device)
        ks = torch.arange(K, device=h.device)
        ends = starts[:, None] + ks  # (N - 1, K)
        valid = (ends <= N - 1) & (ks > 0)
        left = h[:, starts].unsqueeze(2).expand(B, starts.numel(), K, h.shape[-1])
        right = h[:, ends.clamp(max=max(N - 1, 0))]  # (B, N - 1, K, H)
        scores = self.label(self.span(torch.cat([left, right, right - left], -1)))  # (B, N - 1, K, C)
        scores = scores + self.duration
        edge = scores.unsqueeze(-1) + self.transition  # (B, N - 1, K, C, C'): [c, c']
        first = torch.zeros(max(N - 1, 0), 1, 1, C, dtype=torch.bool, device=h.device)
        first[:1, :, :, 1:] = True  # segments from boundary 0 follow the start label 0
        return edge.masked_fill(~valid[:, :, None, None] | first, float("-inf"))

    def forward(self, h: Tensor, lengths: Tensor | None = None):
        """A ``semiring_ops.distributions.SemiMarkovCRF`` over the segmentations of each item."""
        from ..distributions import SemiMarkovCRF

        return SemiMarkovCRF(self.potentials(h), lengths)

    def parts(self, segments: list[list[tuple[int, int, int]]], N: int) -> Tensor:
        """0 / 1 parts (B, N - 1, K, C, C) of given segmentations: per item a list of (start, end, label) with
        start < end boundaries covering 0 .. length - 1 in order (the inverse of ``segments``)."""
        K, C = self.max_length + 1, self.n_labels
        t = self.transition
        out = torch.zeros(len(segments), max(N - 1, 0), K, C, C, dtype=t.dtype, device=t.device)
        for b, item in enumerate(segments):
            prev = 0  # the start boundary's label (see the module docstring)
            for start, end, label in item:
                if not (0 <= start < end <= N - 1 and end - start < K and 0 <= label < C):
                    what = f"segment {(start, end, label)} of item {b}"
                    raise ValueError(f"SemiMarkovSegmenter.parts: {what} is out of range (N = {N}, K = {K}, C = {C})")
                out[b, start, end - start, label, prev] = 1
                prev = label
        return out

    @staticmethod
    def segments(parts: Tensor) -> list[list[tuple[int, int, int]]]:
        """Per item, the (start, end, label) segments marked 1 in ``parts`` (B, N - 1, K, C, C), in order."""
        found = parts.nonzero().tolist()  # rows (b, start, k, c, c'), sorted by b then start
        out: list[list[tuple[int, int, int]]] = [[] for _ in range(parts.shape[0])]
        for b, start, k, c, _ in found:
            out[b].append((start, start + k, c))
        return out
