"""semiring_ops.nn.BiaffineArcScorer: shapes, the root on the diagonal, padding, gradients, and its scores
as DependencyCRF's log-potentials."""

from __future__ import annotations

import pytest
import torch

from semiring_ops.distributions import DependencyCRF
from semiring_ops.nn import BiaffineArcScorer


def scorer_and_input(device: str, n_labels: int = 5, B: int = 3, N: int = 7, D: int = 12):
    torch.manual_seed(0)
    scorer = BiaffineArcScorer(D, arc_dim=8, n_labels=n_labels, label_dim=6, dropout=0.0).to(device)
    with torch.no_grad():  # the bilinear weights start at zero: give them values, so the tests see them
        for p in scorer.parameters():
            p.normal_(0.0, 0.5)
    return scorer, torch.randn(B, N, D, device=device)


def test_shapes(device):
    scorer, x = scorer_and_input(device)
    arcs, labels = scorer(x)
    assert arcs.shape == (3, 7, 7) and labels.shape == (3, 7, 7, 5)
    assert BiaffineArcScorer(12, arc_dim=8)(x.cpu()).labels is None
    with pytest.raises(ValueError, match="x must be"):
        scorer(x[..., :5])


def test_formula_and_root_on_the_diagonal():
    """arcs[h, m] = h_h U d_m + u . h_h off the diagonal, r U d_m + u . r on it; labels likewise per label
    plus the dependent's linear term."""
    scorer, x = scorer_and_input("cpu")
    arcs, labels = scorer(x)
    h, d, r = scorer.arc_head(x), scorer.arc_dep(x), scorer.arc_root
    U, u = scorer.arc_weight[0], scorer.arc_head_bias[:, 0]
    want = h @ U @ d.transpose(1, 2) + (h @ u)[:, :, None]
    root = (r @ U) @ d.transpose(1, 2) + r @ u  # (B, N)
    eye = torch.eye(7, dtype=torch.bool)
    torch.testing.assert_close(arcs[:, ~eye], want[:, ~eye])
    torch.testing.assert_close(torch.diagonal(arcs, dim1=1, dim2=2), root)
    lh, ld, lr = scorer.label_head(x), scorer.label_dep(x), scorer.label_root
    W, v, dep_lin = scorer.label_weight, scorer.label_head_bias, scorer.label_dep_linear
    for b, i, j in [(0, 1, 4), (2, 6, 0), (1, 3, 3)]:
        head = lr if i == j else lh[b, i]
        want_l = torch.einsum("d,lde,e->l", head, W, ld[b, j]) + head @ v + dep_lin(ld[b, j])
        torch.testing.assert_close(labels[b, i, j], want_l)


def test_padding(device):
    """Arcs from padding heads score -inf (the diagonal excepted); the real words' scores do not depend on
    the padding; a softmax over a word's heads gives the padding none."""
    scorer, x = scorer_and_input(device)
    lengths = torch.tensor([7, 4, 1], device=device)
    arcs, labels = scorer(x, lengths)
    for b, n in enumerate(lengths.tolist()):
        alone, alone_labels = scorer(x[b : b + 1, :n], lengths[b : b + 1])
        torch.testing.assert_close(arcs[b, :n, :n], alone[0])
        torch.testing.assert_close(labels[b, :n, :n], alone_labels[0])
        pad_head = arcs[b, n:, :].clone()
        pad_head[:, n:].diagonal().fill_(float("-inf"))  # (the diagonal: the root's score of a padding word)
        assert torch.isneginf(pad_head).all()
        assert torch.isfinite(torch.diagonal(arcs[b])).all()
        probs = arcs[b, :, :n].softmax(dim=0)  # each real word's distribution over its heads
        assert (probs[n:] == 0).all() and torch.allclose(probs.sum(0), torch.ones(n, device=device))


def test_gradients_reach_every_parameter(device):
    scorer, x = scorer_and_input(device)
    x.requires_grad_(True)
    lengths = torch.tensor([7, 5, 2], device=device)
    arcs, labels = scorer(x, lengths)
    (DependencyCRF(arcs, lengths, multiroot=False).partition.sum() + labels.logsumexp(-1).sum()).backward()
    for name, p in [("x", x), *scorer.named_parameters()]:
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_untrained_scorer_is_uniform():
    """U and u start at zero: every arc scores 0 (the label scores do not)."""
    arcs, _ = BiaffineArcScorer(12, arc_dim=8, n_labels=3)(torch.randn(2, 5, 12))
    assert (arcs == 0).all()


@pytest.mark.parametrize("multiroot", [False, True])
def test_dependency_crf_on_the_scores(device, multiroot):
    """Finite partition and gradients with padding (-inf arcs); the argmax is a tree over each item's words
    (one root child when multiroot=False), its log-probability the max minus the partition."""
    scorer, x = scorer_and_input(device, B=4, N=9)
    lengths = torch.tensor([9, 6, 3, 1], device=device)
    arcs, _ = scorer(x, lengths)
    dist = DependencyCRF(arcs, lengths, multiroot=multiroot)
    assert torch.isfinite(dist.partition).all()
    best = dist.argmax
    for b, n in enumerate(lengths.tolist()):
        tree = best[b].cpu()
        assert tree[:, n:].sum() == 0 and tree[n:, :].sum() == 0  # nothing touches the padding
        assert (tree[:n, :n].sum(0) == 1).all()  # one head per word
        roots = torch.diagonal(tree)[:n].sum()
        assert roots == 1 if not multiroot else roots >= 1
        heads = tree[:n, :n].argmax(0).tolist()
        for m in range(n):  # following heads reaches the root (no cycle)
            node, steps = m, 0
            while heads[node] != node and steps <= n:
                node, steps = heads[node], steps + 1
            assert steps <= n
    torch.testing.assert_close(dist.log_prob(best), dist.max - dist.partition)
    assert (dist.log_prob(best) <= 1e-5).all()
