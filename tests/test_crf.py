"""LinearChainCRF against brute-force enumeration: log-likelihood, decoding, marginals, masks."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from semiring_ops.structures import LinearChainCRF


def _crf(C, device, batch_first=True):
    crf = LinearChainCRF(C, batch_first=batch_first).to(device=device, dtype=torch.float64)
    with torch.no_grad():
        for p in crf.parameters():
            p.normal_()
    return crf


def _brute(crf, em, L):
    """{path: score} over all tag paths of one sequence's first L positions (em: (T, C))."""
    out = {}
    for path in itertools.product(range(crf.num_tags), repeat=L):
        s = crf.start_transitions[path[0]] + crf.end_transitions[path[-1]]
        s = s + sum(em[t, path[t]] for t in range(L))
        s = s + sum(crf.transitions[path[t - 1], path[t]] for t in range(1, L))
        out[path] = s
    return out


def _case(B, T, C, device):
    em = torch.randn(B, T, C, dtype=torch.float64, device=device)
    lengths = torch.randint(0, T + 1, (B,), device=device)
    mask = torch.arange(T, device=device)[None, :] < lengths[:, None]
    tags = torch.randint(0, C, (B, T), device=device)
    return em, mask, tags, lengths


@given(B=st.integers(1, 3), T=st.integers(1, 4), C=st.integers(1, 3))
def test_log_likelihood_decode_and_marginals_match_enumeration(device, B, T, C):
    crf = _crf(C, device)
    em, mask, tags, lengths = _case(B, T, C, device)
    llh = crf(em, tags, mask, reduction="none")
    best, best_scores = crf.viterbi(em, mask)
    marg = crf.marginals(em, mask)
    for b in range(B):
        L = int(lengths[b])
        if L == 0:
            assert llh[b].item() == 0.0 and torch.all(best[b] == -1) and torch.all(marg[b] == 0)
            continue
        with torch.no_grad():
            scores = _brute(crf, em[b], L)
            logz = torch.logsumexp(torch.stack(list(scores.values())), 0)
            want = scores[tuple(tags[b, :L].tolist())] - logz
            torch.testing.assert_close(llh[b], want)
            arg = max(scores, key=lambda p: scores[p].item())
            assert tuple(best[b, :L].tolist()) == arg and torch.all(best[b, L:] == -1)
            torch.testing.assert_close(best_scores[b], scores[arg])
            want_marg = torch.zeros(T, C, dtype=torch.float64, device=device)
            for path, s in scores.items():
                for t, y in enumerate(path):
                    want_marg[t, y] += torch.exp(s - logz)
            torch.testing.assert_close(marg[b], want_marg)


def test_batch_first_false_and_reductions(device):
    crf = _crf(4, device, batch_first=False)
    em, mask, tags, lengths = _case(3, 5, 4, device)
    per = crf(em.transpose(0, 1), tags.T, mask.T, reduction="none")
    assert torch.allclose(crf(em.transpose(0, 1), tags.T, mask.T), per.sum())
    assert torch.allclose(crf(em.transpose(0, 1), tags.T, mask.T, reduction="mean"), per.mean())
    token_mean = crf(em.transpose(0, 1), tags.T, mask.T, reduction="token_mean")
    assert torch.allclose(token_mean, per.sum() / lengths.sum().clamp_min(1))
    assert torch.allclose(crf.nll(em.transpose(0, 1), tags.T, lengths=lengths, reduction="none"), -per)
    decoded = crf.decode(em.transpose(0, 1), mask.T)
    assert [len(d) for d in decoded] == lengths.tolist()


def test_parameters_have_pytorch_crf_names():
    crf = LinearChainCRF(5)
    assert set(crf.state_dict()) == {"start_transitions", "end_transitions", "transitions"}
    assert crf.transitions.shape == (5, 5)


def test_training_increases_the_likelihood(device):
    torch.manual_seed(0)
    crf = LinearChainCRF(3, batch_first=True).to(device)
    em = torch.randn(8, 6, 3, device=device)
    tags = torch.randint(0, 3, (8, 6), device=device)
    opt = torch.optim.Adam(crf.parameters(), lr=0.1)
    first = crf(em, tags).item()
    for _ in range(30):
        opt.zero_grad()
        crf.nll(em, tags).backward()
        opt.step()
    assert crf(em, tags).item() > first


def test_bad_masks_tags_and_shapes_are_refused():
    crf = LinearChainCRF(3, batch_first=True)
    em = torch.randn(2, 4, 3)
    tags = torch.zeros(2, 4, dtype=torch.long)
    holes = torch.tensor([[1, 0, 1, 0], [1, 1, 0, 0]], dtype=torch.uint8)
    with pytest.raises(ValueError, match="holes"):
        crf(em, tags, holes)
    with pytest.raises(ValueError, match=r"tags must lie in \[0, 3\)"):
        crf(em, torch.full((2, 4), 3))
    with pytest.raises(ValueError, match="num_tags=3"):
        crf(torch.randn(2, 4, 5), tags)
    with pytest.raises(ValueError, match="reduction"):
        crf(em, tags, reduction="avg")
    with pytest.raises(ValueError, match="lengths must lie"):
        crf(em, tags, lengths=torch.tensor([5, 1]))


SCHEME_LABELS = {
    "BIO": ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"],
    "IOB1": ["O", "B-PER", "I-PER", "I-LOC"],
    "BIOUL": ["O", "B-PER", "I-PER", "L-PER", "U-PER", "U-LOC"],
    "BMES": ["B", "M", "E", "S"],
}


def _legal(path, c):
    return (
        bool(c.start[path[0]])
        and bool(c.end[path[-1]])
        and all(bool(c.transitions[a, b]) for a, b in itertools.pairwise(path))
    )


@pytest.mark.parametrize("scheme", sorted(SCHEME_LABELS))
def test_constrained_crf_sums_and_decodes_only_legal_paths(device, scheme):
    from semiring_ops.structures import allowed_transitions

    labels = SCHEME_LABELS[scheme]
    c = allowed_transitions(scheme, labels)
    C, T, B = len(labels), 4, 3
    crf = LinearChainCRF(C, batch_first=True, constraints=c).to(device=device, dtype=torch.float64)
    with torch.no_grad():
        for p in crf.parameters():
            p.normal_()
    em = torch.randn(B, T, C, dtype=torch.float64, device=device) * 3
    lengths = torch.tensor([4, 3, 1], device=device)
    logz = crf.log_partition(em, lengths=lengths)
    best, _ = crf.viterbi(em, lengths=lengths)
    for b in range(B):
        L = int(lengths[b])
        unconstrained = LinearChainCRF(C).to(device=device, dtype=torch.float64)
        unconstrained.load_state_dict(crf.state_dict())
        scores = _brute(unconstrained, em[b], L)
        legal = [s for path, s in scores.items() if _legal(path, c)]
        with torch.no_grad():
            torch.testing.assert_close(logz[b], torch.logsumexp(torch.stack(legal), 0))
        assert _legal(tuple(best[b, :L].tolist()), c), f"illegal decode {best[b, :L].tolist()}"
    # training sees the constraints too: an illegal gold path has log-likelihood -inf, a legal one is finite
    tags = best.clamp_min(0)
    llh = crf(em, tags, lengths=lengths, reduction="none")
    assert torch.isfinite(llh).all()
    llh.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in crf.parameters())


def test_scheme_rules_spot_checks():
    from semiring_ops.structures import allowed_transitions

    bio = allowed_transitions("BIO", ["O", "B-PER", "I-PER", "I-LOC"])
    assert not bio.start[2] and bio.transitions[1, 2] and not bio.transitions[1, 3] and not bio.transitions[0, 2]
    bioul = allowed_transitions("BIOUL", ["O", "B-X", "I-X", "L-X", "U-X"])
    assert not bioul.end[1] and not bioul.transitions[1, 0] and bioul.transitions[2, 3] and bioul.transitions[3, 4]
    with pytest.raises(ValueError, match="does not fit"):
        allowed_transitions("BIO", ["O", "U-PER"])
    with pytest.raises(ValueError, match="scheme"):
        allowed_transitions("XYZ", ["O"])


def test_crf_top_k_entropy_and_samples(device):
    from semiring_ops.structures import allowed_transitions

    c = allowed_transitions("BIOUL", ["O", "B-X", "I-X", "L-X", "U-X"])
    crf = LinearChainCRF(5, batch_first=True, constraints=c).to(device=device, dtype=torch.float64)
    em = torch.randn(2, 4, 5, dtype=torch.float64, device=device, requires_grad=True)
    lengths = torch.tensor([4, 2], device=device)
    tags, scores = crf.viterbi(em, lengths=lengths, top_k=3)
    best, best_score = crf.viterbi(em, lengths=lengths)
    assert tags.shape == (2, 3, 4) and torch.equal(tags[:, 0], best)
    torch.testing.assert_close(scores[:, 0], best_score)
    assert torch.all(scores[:, :-1] >= scores[:, 1:])
    h = crf.entropy(em, lengths=lengths)  # constraints put -inf potentials in: no NaN anywhere
    assert torch.isfinite(h).all() and torch.all(h >= 0)
    (g,) = torch.autograd.grad(h.sum(), (em,))
    assert torch.isfinite(g).all()
    draws = crf.sample(em, lengths=lengths, n=50)
    assert draws.shape == (50, 2, 4) and torch.all(draws[:, 1, 2:] == -1)
    for row in draws.reshape(-1, 4).tolist():
        path = [y for y in row if y >= 0]
        assert _legal(tuple(path), c), f"sampled an illegal path {path}"
