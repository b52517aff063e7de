"""BiaffineArcScorer: Dozat & Manning's (2017) biaffine arc and label scorer, laid out for DependencyCRF.

Scores come out in torch-struct's DepTree layout, the one ``semiring_ops.distributions.DependencyCRF`` and
``NonProjectiveDependencyCRF`` take: ``arcs[b, h, m]`` scores word h heading word m (h != m) and the
diagonal ``arcs[b, m, m]`` scores the root heading m. The root is not a token of the input: it is a learned
vector in the head space, scored against each word like any other head and written onto the diagonal.

    scorer = BiaffineArcScorer(2 * hidden, arc_dim=128, n_labels=len(relations))
    arcs, labels = scorer(encoded, lengths)               # (B, N, N), (B, N, N, L)
    dist = DependencyCRF(arcs, lengths, multiroot=False)  # a tree model over the arcs
    loss = -dist.log_prob(gold_arcs).sum()
    heads = arcs.argmax(dim=1)                           # or: per-word head selection, no tree constraint
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

__all__ = ["BiaffineArcScorer", "BiaffineScores"]


class BiaffineScores(NamedTuple):
    """``arcs`` (B, N, N) [head, modifier], the root on the diagonal; ``labels`` (B, N, N, n_labels) in the
    same layout, or None when the scorer has no labels."""

    arcs: Tensor
    labels: Tensor | None


class BiaffineArcScorer(nn.Module):
    """Biaffine scores of every head -> modifier arc and, optionally, of each relation label on it.

    Two MLPs (linear, LeakyReLU(0.1), dropout) map each word's encoding to a head view h_i and a dependent
    view d_j, two more to the label views h'_i, d'_j; then

        arcs[b, i, j]      = h_i^T U d_j + u . h_i                            (i != j: word i heads word j)
        arcs[b, j, j]      = r^T U d_j + u . r                                (the root heads word j)
        labels[b, i, j, l] = h'_i^T U_l d'_j + v_l . h'_i + w_l . d'_j + c_l  (the root: r' for h'_i)

    with r (and r' for the labels) a learned root vector in the head space, scored onto the diagonal. The
    term u . h_i is each candidate head's prior; an arc term of the dependent alone would add the same amount
    to every head of word j, so it is left out (it changes neither a softmax over heads nor a tree's
    probability). U and u start at zero, so every arc scores 0 before training.

    Args:
        in_dim: size of each word's encoding (e.g. 2 * hidden for a BiLSTM).
        arc_dim: size of the arc MLPs' outputs.
        n_labels: number of relation labels; 0 (default) scores arcs only.
        label_dim: size of the label MLPs' outputs (default: min(arc_dim, 128)).
        dropout: dropout after each MLP.

    Shapes:
        x (B, N, in_dim), lengths (B,) integers or None (every word real) ->
        arcs (B, N, N), labels (B, N, N, n_labels) or None.

    Padding: an arc whose head is a padding word (h >= lengths[b], h != m) scores -inf, so a softmax over
    each column (a word's candidate heads) and ``DependencyCRF(arcs, lengths)`` see the real words only; each
    column keeps at least its finite root score. Columns of padding modifiers and the label scores are left
    as computed: losses and decoders skip them by length.
    """

    def __init__(
        self, in_dim: int, arc_dim: int = 128, n_labels: int = 0, label_dim: int | None = None, dropout: float = 0.33
    ) -> None:
        super().__init__()
        self.in_dim, self.arc_dim, self.n_labels = in_dim, arc_dim, n_labels
        self.arc_head = _mlp(in_dim, arc_dim, dropout)
        self.arc_dep = _mlp(in_dim, arc_dim, dropout)
        self.arc_weight = nn.Parameter(torch.zeros(1, arc_dim, arc_dim))  # U
        self.arc_head_bias = nn.Parameter(torch.zeros(arc_dim, 1))  # u
        self.arc_root = nn.Parameter(torch.empty(arc_dim))  # r
        self.label_dim = 0
        if n_labels > 0:
            self.label_dim = label_dim or min(arc_dim, 128)
            self.label_head = _mlp(in_dim, self.label_dim, dropout)
            self.label_dep = _mlp(in_dim, self.label_dim, dropout)
            self.label_weight = nn.Parameter(torch.zeros(n_labels, self.label_dim, self.label_dim))  # U_l
            self.label_head_bias = nn.Parameter(torch.zeros(self.label_dim, n_labels))  # v_l
            self.label_dep_linear = nn.Linear(self.label_dim, n_labels)  # w_l, c_l
            self.label_root = nn.Parameter(torch.empty(self.label_dim))  # r'
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Root vectors N(0, 1 / dim), the other biaffine weights zero; the MLPs as nn.Linear initialises them."""
        with torch.no_grad():
            self.arc_root.normal_(0.0, self.arc_dim**-0.5)
            self.arc_weight.zero_()
            self.arc_head_bias.zero_()
            if self.n_labels > 0:
                self.label_root.normal_(0.0, self.label_dim**-0.5)
                self.label_weight.zero_()
                self.label_head_bias.zero_()

    def forward(self, x: Tensor, lengths: Tensor | None = None) -> BiaffineScores:
        """(arcs, labels) of encodings ``x`` (B, N, in_dim) (class docstring)."""
        if x.dim() != 3 or x.shape[-1] != self.in_dim:
            raise ValueError(f"BiaffineArcScorer: x must be (B, N, {self.in_dim}), got {tuple(x.shape)}")
        N = x.shape[1]
        arcs = _biaffine(self.arc_head(x), self.arc_dep(x), self.arc_root, self.arc_weight, self.arc_head_bias)
        arcs = arcs.squeeze(-1)
        if lengths is not None:
            lengths = torch.as_tensor(lengths, device=x.device)
            pos = torch.arange(N, device=x.device)
            pad_head = (pos[None, :, None] >= lengths[:, None, None]) & (pos[:, None] != pos[None, :])  # (B, N, N)
            arcs = arcs.masked_fill(pad_head, float("-inf"))
        labels = None
        if self.n_labels > 0:
            dep = self.label_dep(x)
            labels = _biaffine(self.label_head(x), dep, self.label_root, self.label_weight, self.label_head_bias)
            labels = labels + self.label_dep_linear(dep).unsqueeze(1)
        return BiaffineScores(arcs, labels)

    def extra_repr(self) -> str:
        return f"in_dim={self.in_dim}, arc_dim={self.arc_dim}, n_labels={self.n_labels}, label_dim={self.label_dim}"


def _mlp(in_dim: int, out_dim: int, dropout: float) -> nn.Sequential:
    return nn.Sequential(nn.Linear(in_dim, out_dim), nn.LeakyReLU(0.1), nn.Dropout(dropout))


def _biaffine(head: Tensor, dep: Tensor, root: Tensor, weight: Tensor, head_bias: Tensor) -> Tensor:
    """(B, N, N, K): [b, h, m, k] = head[b, h] . weight[k] . dep[b, m] + head[b, h] . head_bias[:, k], with the
    root vector in place of head[b, m] on the diagonal h == m. head (B, N, D), dep (B, N, E), root (D,),
    weight (K, D, E), head_bias (D, K)."""
    N = head.shape[1]
    pairs = torch.einsum("bhd,kde,bme->bhmk", head, weight, dep) + (head @ head_bias).unsqueeze(2)
    root_arcs = torch.einsum("d,kde,bme->bmk", root, weight, dep) + root @ head_bias  # (B, N, K)
    eye = torch.eye(N, dtype=torch.bool, device=head.device)[None, :, :, None]
    return torch.where(eye, root_arcs.unsqueeze(1), pairs)
