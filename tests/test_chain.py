"""The chain engine against brute-force enumeration of all C^T tag paths, with random lengths."""

from __future__ import annotations

import pytest
import torch
from brute import chain_path_scores as _path_scores
from hypothesis import given
from hypothesis import strategies as st

from semiring_ops.structures import chain_sum, chain_viterbi


def _random_chain(B, T, C, device, with_final=True):
    g = torch.Generator().manual_seed(torch.randint(0, 2**31, ()).item())
    init = torch.randn(B, C, generator=g, dtype=torch.float64).to(device)
    edges = torch.randn(B, max(T - 1, 0), C, C, generator=g, dtype=torch.float64).to(device)
    final = torch.randn(B, C, generator=g, dtype=torch.float64).to(device) if with_final else None
    lengths = torch.randint(0, T + 1, (B,), generator=g).to(device)
    return init, edges, final, lengths


@pytest.mark.parametrize("semiring", ["log", "max"])
@pytest.mark.parametrize("strategy", ["sequential", "parallel"])
@given(B=st.integers(1, 3), T=st.integers(1, 5), C=st.integers(1, 3), with_final=st.booleans())
def test_chain_sum_matches_enumeration(device, semiring, strategy, B, T, C, with_final):
    init, edges, final, lengths = _random_chain(B, T, C, device, with_final)
    out = chain_sum(init, edges, final, lengths, semiring, strategy)
    for b in range(B):
        L = int(lengths[b])
        if L == 0:
            assert out[b].item() == 0.0
            continue
        scores = torch.stack(list(_path_scores(init[b], edges[b], None if final is None else final[b], L).values()))
        want = torch.logsumexp(scores, 0) if semiring == "log" else scores.max()
        torch.testing.assert_close(out[b], want)


@given(B=st.integers(1, 3), T=st.integers(2, 5), C=st.integers(1, 3))
def test_log_partition_gradient_gives_edge_marginals(device, B, T, C):
    init, edges, final, lengths = _random_chain(B, T, C, device)
    edges.requires_grad_()
    (marg,) = torch.autograd.grad(chain_sum(init, edges, final, lengths).sum(), (edges,), allow_unused=True)
    if marg is None:  # every chain shorter than 2: no edge on any path
        marg = torch.zeros_like(edges)
    for b in range(B):
        L = int(lengths[b])
        want = torch.zeros_like(edges[b])
        if L > 0:
            scores = _path_scores(init[b], edges[b].detach(), final[b], L)
            logz = torch.logsumexp(torch.stack(list(scores.values())), 0)
            for path, s in scores.items():
                for t in range(1, L):
                    want[t - 1, path[t - 1], path[t]] += torch.exp(s - logz)
        torch.testing.assert_close(marg[b], want)


@given(B=st.integers(1, 4), T=st.integers(1, 5), C=st.integers(1, 3), with_final=st.booleans())
def test_viterbi_matches_enumeration(device, B, T, C, with_final):
    init, edges, final, lengths = _random_chain(B, T, C, device, with_final)
    score, tags = chain_viterbi(init, edges, final, lengths)
    assert tags.shape == (B, T) and tags.dtype == torch.int64
    for b in range(B):
        L = int(lengths[b])
        assert torch.all(tags[b, L:] == -1)
        if L == 0:
            assert score[b].item() == 0.0
            continue
        scores = _path_scores(init[b], edges[b], None if final is None else final[b], L)
        best = max(scores, key=lambda p: scores[p].item())
        assert tuple(tags[b, :L].tolist()) == best
        torch.testing.assert_close(score[b], scores[best])


def test_strategies_agree_on_long_chains(device):
    init, edges, final, lengths = _random_chain(4, 70, 5, device)
    for semiring in ("log", "max"):
        seq = chain_sum(init, edges, final, lengths, semiring, "sequential")
        par = chain_sum(init, edges, final, lengths, semiring, "parallel")
        torch.testing.assert_close(seq, par)


def test_unknown_strategy_is_refused():
    init, edges, final, lengths = _random_chain(1, 3, 2, "cpu")
    with pytest.raises(ValueError, match="strategy"):
        chain_sum(init, edges, final, lengths, strategy="magic")


@given(B=st.integers(1, 3), T=st.integers(1, 4), C=st.integers(1, 3), k=st.integers(1, 6), with_final=st.booleans())
def test_topk_matches_enumeration(device, B, T, C, k, with_final):
    from semiring_ops.structures.chain import chain_topk

    init, edges, final, lengths = _random_chain(B, T, C, device, with_final)
    scores, tags = chain_topk(init, edges, final, lengths, k)
    assert scores.shape == (B, k) and tags.shape == (B, k, T)
    for b in range(B):
        L = int(lengths[b])
        if L == 0:
            assert scores[b, 0].item() == 0.0 and torch.all(scores[b, 1:] == -float("inf"))
            assert torch.all(tags[b] == -1)
            continue
        paths = _path_scores(init[b], edges[b], None if final is None else final[b], L)
        want = sorted((s.item() for s in paths.values()), reverse=True)[:k]
        got = scores[b, : len(want)].tolist()
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want))
        assert torch.all(scores[b, len(want) :] == -float("inf"))
        seen = set()
        for r in range(len(want)):
            path = tuple(tags[b, r, :L].tolist())
            assert path in paths and path not in seen, "each of the k paths is a distinct real path"
            seen.add(path)
            torch.testing.assert_close(paths[path].item(), got[r])
            assert torch.all(tags[b, r, L:] == -1)
        assert torch.all(tags[b, len(want) :] == -1)


@given(B=st.integers(1, 3), T=st.integers(1, 4), C=st.integers(1, 3))
def test_entropy_matches_enumeration_and_is_differentiable(device, B, T, C):
    from semiring_ops.structures.chain import chain_entropy

    init, edges, final, lengths = _random_chain(B, T, C, device)
    edges.requires_grad_()
    h = chain_entropy(init, edges, final, lengths)
    for b in range(B):
        L = int(lengths[b])
        if L == 0:
            torch.testing.assert_close(h[b].detach(), torch.zeros((), dtype=h.dtype, device=device))
            continue
        s = torch.stack(list(_path_scores(init[b], edges[b].detach(), final[b], L).values()))
        p = torch.softmax(s, 0)
        torch.testing.assert_close(h[b].detach(), -(p * torch.log(p)).sum())
    if T > 1:
        (g,) = torch.autograd.grad(h.sum(), (edges,))
        assert torch.isfinite(g).all()


def test_sampling_follows_the_distribution(device):
    from semiring_ops.structures.chain import chain_sample

    init, edges, final, _ = _random_chain(1, 3, 2, device)
    lengths = torch.tensor([3], device=device)
    n = 20_000
    tags = chain_sample(init, edges, final, lengths, n=n)
    assert tags.shape == (n, 1, 3)
    paths = _path_scores(init[0], edges[0], final[0], 3)
    probs = torch.softmax(torch.stack(list(paths.values())), 0)
    codes = (tags[:, 0, 0] * 4 + tags[:, 0, 1] * 2 + tags[:, 0, 2]).cpu()
    freq = torch.bincount(codes, minlength=8).double() / n
    want = torch.zeros(8, dtype=torch.float64)
    for (a, b, c), p in zip(paths, probs, strict=True):
        want[a * 4 + b * 2 + c] = p.item()
    assert (freq - want).abs().max().item() < 0.02
