"""The chain engine against brute-force enumeration of all C^T tag paths, with random lengths."""

from __future__ import annotations

import itertools

import pytest
import torch
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


def _path_scores(init, edges, final, length):
    """{path: score} for one chain (tensors of one batch entry), every path of `length` tags."""
    C = init.shape[-1]
    scores = {}
    for path in itertools.product(range(C), repeat=length):
        s = init[path[0]]
        for t in range(1, length):
            s = s + edges[t - 1, path[t - 1], path[t]]
        if final is not None:
            s = s + final[path[-1]]
        scores[path] = s
    return scores


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
