"""HMM against brute-force enumeration and against hmmlearn: likelihood, posteriors, Viterbi, EM, sampling."""

from __future__ import annotations

import io
import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from semiring_ops import HMM
from semiring_ops.hmm import ConvergenceMonitor

LENGTHS = [100, 1, 7, 70, 12]  # long and short sequences; 1 has no transition


def _distributions(rng: np.random.Generator, C: int, V: int, zeros: bool = True):
    """start (C,), transmat (C, C) with a forbidden move per row when zeros, emission rows (C, V)."""
    start = rng.dirichlet(np.ones(C))
    trans = rng.dirichlet(np.ones(C), size=C)
    if zeros and C > 1:
        trans[np.arange(C), (np.arange(C) + 1) % C] = 0.0  # i -> i+1 is forbidden
        trans /= trans.sum(1, keepdims=True)
    return start, trans, rng.dirichlet(np.ones(V), size=C)


def _categorical(C: int, V: int, device, seed: int = 0, zeros: bool = True) -> HMM:
    start, trans, emis = _distributions(np.random.default_rng(seed), C, V, zeros)
    model = HMM(C, n_symbols=V).to(device=device, dtype=torch.float64)
    model.startprob_, model.transmat_, model.emissionprob_ = start, trans, emis
    return model


def _gaussian(C: int, D: int, device, seed: int = 0) -> HMM:
    rng = np.random.default_rng(seed)
    start, trans, _ = _distributions(rng, C, 1)
    model = HMM(C, "gaussian", n_features=D).to(device=device, dtype=torch.float64)
    model.startprob_, model.transmat_ = start, trans
    model.means_, model.covars_ = rng.normal(size=(C, D)) * 2, rng.uniform(0.5, 2.0, size=(C, D))
    return model


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


# ---------------------------------------------------------------------------------------------- enumeration


def _brute(model: HMM, log_em: torch.Tensor) -> dict[tuple[int, ...], torch.Tensor]:
    """{path: log p(x, path)} over all C^L state paths of one sequence (log_em: (L, C))."""
    start, trans = model.startprob_.log(), model.transmat_.log()
    out = {}
    for path in itertools.product(range(model.n_states), repeat=len(log_em)):
        s = start[path[0]] + sum(log_em[t, y] for t, y in enumerate(path))
        out[path] = s + sum(trans[a, b] for a, b in itertools.pairwise(path))
    return out


@given(B=st.integers(1, 3), T=st.integers(1, 4), C=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_padded_calls_match_enumeration(device, B, T, C, seed):
    model = _categorical(C, 4, device, seed)
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, T + 1, (B,), generator=g).to(device)
    x = torch.randint(0, 4, (B, T), generator=g).to(device)
    x = torch.where(torch.arange(T, device=device) < lengths[:, None], x, -1)  # padding need not be a symbol
    ll = model.log_likelihood(x, lengths=lengths)
    post = model.posteriors(x, lengths=lengths)
    tags, best = model.viterbi(x, lengths=lengths)
    assert ll.shape == (B,) and post.shape == (B, T, C) and tags.shape == (B, T) and best.shape == (B,)
    for b in range(B):
        L = int(lengths[b])
        assert torch.all(tags[b, L:] == -1) and torch.all(post[b, L:] == 0)
        if L == 0:
            assert ll[b].item() == 0.0 and best[b].item() == 0.0
            continue
        scores = _brute(model, model.emissionprob_.log().T[x[b, :L]])
        logp = torch.logsumexp(torch.stack(list(scores.values())), 0)
        torch.testing.assert_close(ll[b], logp)
        want = torch.zeros(L, C, dtype=torch.float64, device=device)
        for path, s in scores.items():
            want[torch.arange(L, device=device), list(path)] += torch.exp(s - logp)
        torch.testing.assert_close(post[b, :L], want)
        arg = max(scores, key=lambda p: scores[p].item())
        assert tuple(tags[b, :L].tolist()) == arg
        torch.testing.assert_close(best[b], scores[arg])


def test_mask_and_lengths_agree_and_length_zero(device):
    model = _gaussian(3, 2, device)
    x = torch.randn(4, 5, 2, dtype=torch.float64, device=device)
    lengths = torch.tensor([5, 0, 2, 0], device=device)
    mask = torch.arange(5, device=device) < lengths[:, None]
    x_nan = torch.where(mask[..., None], x, math.nan)  # whatever sits in the padding is ignored
    ll = model(x_nan, lengths=lengths)
    torch.testing.assert_close(ll, model.log_likelihood(x, mask))
    assert ll[1].item() == 0.0 and ll[3].item() == 0.0
    post = model.posteriors(x_nan, mask)
    assert torch.all(post[1] == 0) and torch.isfinite(post).all()
    torch.testing.assert_close(post[mask].sum(-1), torch.ones(int(lengths.sum()), dtype=torch.float64, device=device))
    tags, scores = model.viterbi(x, mask)
    assert torch.all(tags[1] == -1) and scores[1].item() == 0.0
    # an empty time axis, and empty sequences in hmmlearn's lengths
    assert model.log_likelihood(x[:, :0]).tolist() == [0.0] * 4
    assert model.viterbi(x[:, :0])[0].shape == (4, 0) and model.posteriors(x[:, :0]).shape == (4, 0, 3)
    flat = x[0]
    torch.testing.assert_close(model.score(flat, [0, 3, 0, 2]), model.score(flat[:3]) + model.score(flat[3:]))
    assert model.predict_proba(flat, [5, 0]).shape == (5, 3)


# ---------------------------------------------------------------------------------------------- hmmlearn


def _hmmlearn_pair(kind: str, device):
    """(our model, hmmlearn's with the same parameters and init_params="", data X, lengths)."""
    hmmlearn = pytest.importorskip("hmmlearn.hmm")  # a test extra; the GPU image may lack it
    rng = np.random.default_rng(1)
    n = sum(LENGTHS)
    if kind == "categorical":
        ours = _categorical(3, 5, device, seed=1)
        ref = hmmlearn.CategoricalHMM(3, n_features=5, n_iter=1, init_params="")
        ref.emissionprob_ = _np(ours.emissionprob_)
        X = rng.integers(0, 5, size=(n, 1))
    else:
        ours = _gaussian(3, 2, device, seed=1)
        ref = hmmlearn.GaussianHMM(3, covariance_type="diag", n_iter=1, init_params="")
        ref.means_, ref.covars_ = _np(ours.means_), _np(ours.covars_)
        X = _np(ours.sample(n, random_state=2)[0])
    ref.startprob_, ref.transmat_ = _np(ours.startprob_), _np(ours.transmat_)
    return ours, ref, X, LENGTHS


def _joint_logprob(ref, X: np.ndarray, states: np.ndarray, lengths: list[int]) -> float:
    """log p(X, states) under hmmlearn's model, summed over the sequences."""
    log_em = ref._compute_log_likelihood(X)[np.arange(len(X)), states]
    with np.errstate(divide="ignore"):
        start, trans = np.log(ref.startprob_), np.log(ref.transmat_)
    total = 0.0
    for seq in np.split(np.arange(len(X)), np.cumsum(lengths)[:-1]):
        z = states[seq]
        total += start[z[0]] + log_em[seq].sum() + trans[z[:-1], z[1:]].sum()
    return total


@pytest.mark.parametrize("kind", ["categorical", "gaussian"])
def test_agrees_with_hmmlearn(device, kind):
    ours, ref, X, lengths = _hmmlearn_pair(kind, device)
    np.testing.assert_allclose(_np(ours.score(X, lengths)), ref.score(X, lengths), rtol=1e-10, atol=1e-5)
    logprob, states = ours.decode(X, lengths)
    ref_logprob, ref_states = ref.decode(X, lengths)
    np.testing.assert_allclose(_np(logprob), ref_logprob, rtol=1e-10, atol=1e-5)
    # categorical data has exactly tied best paths (the same factors in another order): each decoder may
    # pick another one, so check that ours scores hmmlearn's optimum under hmmlearn's parameters
    np.testing.assert_allclose(_joint_logprob(ref, X, _np(states), lengths), ref_logprob, rtol=1e-10, atol=1e-5)
    assert np.mean(_np(states) == ref_states) > 0.9
    torch.testing.assert_close(ours.predict(X, lengths), states)
    np.testing.assert_allclose(_np(ours.predict_proba(X, lengths)), ref.predict_proba(X, lengths), atol=1e-5)
    logprob, states = ours.decode(X, lengths, algorithm="map")
    ref_logprob, ref_states = ref.decode(X, lengths, algorithm="map")
    np.testing.assert_allclose(_np(logprob), ref_logprob, atol=1e-5)
    np.testing.assert_array_equal(_np(states), ref_states)


@pytest.mark.parametrize("kind", ["categorical", "gaussian"])
def test_one_em_step_agrees_with_hmmlearn(device, kind):
    ours, ref, X, lengths = _hmmlearn_pair(kind, device)
    ours.fit(X, lengths, n_iter=1)
    ref.fit(X, lengths)
    names = ["startprob_", "transmat_"] + (["emissionprob_"] if kind == "categorical" else ["means_"])
    for name in names:
        np.testing.assert_allclose(_np(getattr(ours, name)), getattr(ref, name), atol=1e-5, err_msg=name)
    if kind == "gaussian":
        np.testing.assert_allclose(_np(ours.covars_), ref._covars_, atol=1e-5)
    assert np.all(_np(ours.transmat_)[ref.transmat_ == 0] == 0)  # forbidden moves stay forbidden
    np.testing.assert_allclose(ours.monitor_.history, list(ref.monitor_.history), atol=1e-5)


# ---------------------------------------------------------------------------------------------- EM


@pytest.mark.parametrize("kind", ["categorical", "gaussian"])
def test_em_log_likelihood_is_monotone(device, kind):
    truth = _categorical(3, 6, device, seed=3) if kind == "categorical" else _gaussian(3, 2, device, seed=3)
    x, _ = truth.sample_batch(30, 40, generator=0)
    X = x.reshape(30 * 40, *x.shape[2:])
    model = HMM(3, kind, n_symbols=6, n_features=2, generator=torch.Generator().manual_seed(5))
    model = model.to(device=device, dtype=torch.float64)
    if kind == "gaussian":
        model.init_from_data(X, torch.Generator().manual_seed(5))
    model.fit(X, [40] * 30, n_iter=10, tol=-math.inf)
    history = model.monitor_.history
    assert model.monitor_.iter == 10 and len(history) == 10 and model.monitor_.converged
    assert all(b >= a - 1e-8 * abs(a) for a, b in itertools.pairwise(history)), history
    assert history[-1] > history[0]
    for p in model.parameters():
        assert torch.isfinite(p[p != -math.inf]).all()
    torch.testing.assert_close(model.transmat_.sum(1), torch.ones(3, dtype=torch.float64, device=device))
    # tol stops EM early, as hmmlearn's monitor
    model.fit(X, [40] * 30, n_iter=500, tol=1.0)
    assert model.monitor_.converged and model.monitor_.iter < 500


def test_em_keeps_zero_probabilities(device):
    model = _categorical(4, 3, device, seed=4)  # every row of transmat has a zero
    X, _ = model.sample(300, random_state=1)
    zero = model.transmat_ == 0
    model.fit(X, [100, 150, 50], n_iter=5)
    assert torch.all(model.transmat_[zero] == 0) and torch.isfinite(model.startprob_).all()
    assert not any(torch.isnan(p).any() for p in model.parameters())
    model(X.reshape(3, 100)).sum().backward()  # -inf parameters get zero gradient, never NaN
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_fit_reports_progress_and_verbose_lines():
    model = _categorical(2, 3, "cpu")
    X, _ = model.sample(50, random_state=0)
    quiet = io.StringIO()
    model.fit(X, n_iter=3, tol=-math.inf, stream=quiet)
    assert quiet.getvalue() == ""
    bar = io.StringIO()
    model.fit(X, n_iter=3, tol=-math.inf, progress=True, stream=bar)
    assert "3/3" in bar.getvalue() and "#" in bar.getvalue()
    lines = io.StringIO()
    model.fit(X, n_iter=3, tol=-math.inf, verbose=True, stream=lines)
    rows = [r.strip() for r in lines.getvalue().replace("\r", "\n").splitlines()]
    assert sum(r.split()[0] in ("1", "2", "3") for r in rows if r) == 3
    monitor = ConvergenceMonitor(tol=0.5, n_iter=10)
    monitor.report(-10.0)
    monitor.report(-9.8)
    assert monitor.converged and list(monitor.history) == [-10.0, -9.8] and monitor.iter == 2


def test_custom_log_emissions_fit_start_and_transitions(device):
    cat = _categorical(3, 4, device, seed=6)
    custom = HMM(3, "custom").to(device=device, dtype=torch.float64)
    custom.startprob_, custom.transmat_ = cat.startprob_, cat.transmat_
    X, _ = cat.sample(60, random_state=3)
    log_em = cat.emissionprob_.log().T[X[:, 0]]  # (n_samples, C)
    torch.testing.assert_close(custom.score(log_emissions=log_em, lengths=[20, 40]), cat.score(X, [20, 40]))
    padded = log_em.reshape(3, 20, 3)
    torch.testing.assert_close(custom(log_emissions=padded), cat(X.reshape(3, 20)))
    custom.fit(log_emissions=log_em, lengths=[20, 40], n_iter=1)
    cat.fit(X, [20, 40], n_iter=1)
    torch.testing.assert_close(custom.transmat_, cat.transmat_)
    torch.testing.assert_close(custom.startprob_, cat.startprob_)
    with pytest.raises(ValueError, match="log_emissions"):
        custom.score(X)


# ---------------------------------------------------------------------------------------------- gradients


def test_gradcheck_through_log_likelihood():
    model = _categorical(2, 3, "cpu", seed=7, zeros=False)
    x = torch.tensor([[0, 2, 1], [1, 1, 0]])
    lengths = torch.tensor([3, 2])
    names = [n for n, _ in model.named_parameters()]

    def f(*params):
        return torch.func.functional_call(model, dict(zip(names, params, strict=True)), (x,), {"lengths": lengths})

    inputs = tuple(p.detach().clone().requires_grad_() for p in model.parameters())
    assert torch.autograd.gradcheck(f, inputs)
    gauss = _gaussian(2, 2, "cpu", seed=7)
    xg = torch.randn(2, 3, 2, dtype=torch.float64)
    names_g = [n for n, _ in gauss.named_parameters()]

    def fg(*params):
        return torch.func.functional_call(gauss, dict(zip(names_g, params, strict=True)), (xg,), {"lengths": lengths})

    assert torch.autograd.gradcheck(fg, tuple(p.detach().clone().requires_grad_() for p in gauss.parameters()))


@pytest.mark.parametrize("kind", ["categorical", "gaussian"])
def test_gradient_training_increases_the_likelihood(device, kind):
    truth = _categorical(3, 5, device, seed=8) if kind == "categorical" else _gaussian(3, 2, device, seed=8)
    x, _ = truth.sample_batch(16, 20, generator=1)
    lengths = torch.randint(1, 21, (16,), generator=torch.Generator().manual_seed(2)).to(device)
    model = HMM(3, kind, n_symbols=5, n_features=2, generator=torch.Generator().manual_seed(9)).to(device)
    x = x if kind == "categorical" else x.float()
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    first = model(x, lengths=lengths).sum().item()
    for _ in range(20):
        opt.zero_grad()
        (-model(x, lengths=lengths).sum()).backward()
        opt.step()
    assert model(x, lengths=lengths).sum().item() > first
    torch.testing.assert_close(model.transmat_.sum(1), torch.ones(3, device=device))


# ---------------------------------------------------------------------------------------------- parameters


def test_properties_round_trip_numpy_arrays(device):
    rng = np.random.default_rng(10)
    start, trans, emis = _distributions(rng, 4, 6)
    model = HMM(4, n_symbols=6).to(device)
    model.startprob_, model.transmat_, model.emissionprob_ = start, trans, emis
    for name, want in [("startprob_", start), ("transmat_", trans), ("emissionprob_", emis)]:
        got = getattr(model, name)
        assert isinstance(got, torch.Tensor) and got.device.type == torch.device(device).type
        np.testing.assert_allclose(_np(got), want, atol=1e-6, err_msg=name)
    assert set(model.state_dict()) == {"log_startprob", "log_transmat", "emission.log_emissionprob"}
    gauss = HMM(2, "gaussian", n_features=3).to(device=device, dtype=torch.float64)
    means, covars = rng.normal(size=(2, 3)), rng.uniform(0.1, 3, size=(2, 3))
    gauss.means_ = means
    gauss.covars_ = np.stack([np.diag(c) for c in covars])  # hmmlearn's covars_ shape (C, D, D) works too
    np.testing.assert_allclose(_np(gauss.means_), means)
    np.testing.assert_allclose(_np(gauss.covars_), covars)
    gauss.covars_ = torch.as_tensor(covars * 2)
    np.testing.assert_allclose(_np(gauss.covars_), covars * 2)
    with pytest.raises(AttributeError):
        _ = gauss.emissionprob_


def test_bad_parameters_and_inputs_are_refused():
    model = HMM(3, n_symbols=4)
    gauss = HMM(3, "gaussian", n_features=2)
    with pytest.raises(ValueError, match=r"emissionprob_ has shape \(3, 5\); expected \(3, 4\)"):
        model.emissionprob_ = np.full((3, 5), 0.2)
    with pytest.raises(ValueError, match="transmat_ must sum to 1"):
        model.transmat_ = np.full((3, 3), 0.5)
    with pytest.raises(ValueError, match="startprob_ must hold finite non-negative"):
        model.startprob_ = np.array([1.5, -0.5, 0.0])
    with pytest.raises(ValueError, match=r"covars_ \(shape \(3, 2\)\) must be positive"):
        gauss.covars_ = np.zeros((3, 2))
    with pytest.raises(ValueError, match=r"X has symbols in \[0, 4\] \(shape \(3,\)\); n_symbols=4"):
        model.score(np.array([0, 4, 1]))
    with pytest.raises(ValueError, match=r"X has symbols in \[-1, 1\]"):
        model.score(np.array([[0], [-1], [1]]))
    with pytest.raises(ValueError, match="integer symbols"):
        model.score(np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"X has shape \(3, 2\); CategoricalEmission expects \(n_samples\)"):
        model.score(np.zeros((3, 2), dtype=int))
    with pytest.raises(ValueError, match="lengths sum to 4 but X has n_samples=3"):
        model.score(np.array([0, 1, 2]), lengths=[2, 2])
    with pytest.raises(ValueError, match=r"X has shape \(5, 3\); GaussianDiagEmission expects \(n_samples, 2\)"):
        gauss.fit(np.zeros((5, 3)))
    with pytest.raises(ValueError, match=r"X has shape \(2, 4, 3\); GaussianDiagEmission expects \(B, T, 2\)"):
        gauss.log_likelihood(torch.zeros(2, 4, 3))
    with pytest.raises(ValueError, match="holes"):
        model.log_likelihood(torch.zeros(2, 3, dtype=torch.long), torch.tensor([[1, 0, 1], [1, 1, 1]]))
    with pytest.raises(ValueError, match=r"lengths must lie in 0..3"):
        model.posteriors(torch.zeros(2, 3, dtype=torch.long), lengths=torch.tensor([4, 1]))
    with pytest.raises(ValueError, match=r"log_emissions has shape \(2, 3, 4\)"):
        model.log_likelihood(log_emissions=torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="exactly one"):
        model.log_likelihood(torch.zeros(2, 3, dtype=torch.long), log_emissions=torch.zeros(2, 3, 3))
    with pytest.raises(ValueError, match="n_symbols"):
        HMM(3)
    with pytest.raises(ValueError, match="covariance_type"):
        HMM(3, "gaussian", n_features=2, covariance_type="block")
    impossible = HMM(2, n_symbols=2)
    impossible.emissionprob_ = np.array([[1.0, 0.0], [1.0, 0.0]])
    with pytest.raises(ValueError, match="zero probability"):
        impossible.fit(np.array([0, 1, 0]))


# ---------------------------------------------------------------------------------------------- sampling


def _assert_follows_support(model: HMM, states: torch.Tensor) -> None:
    """Every sequence (rows of states, -1 padding) starts and moves only where probability is > 0."""
    start, trans = model.startprob_, model.transmat_
    for row in states.reshape(-1, states.shape[-1]).tolist():
        path = [s for s in row if s >= 0]
        if path:
            assert start[path[0]] > 0
            assert all(trans[a, b] > 0 for a, b in itertools.pairwise(path)), path


def test_samples_have_hmmlearn_shapes_and_follow_the_support(device):
    model = _categorical(4, 5, device, seed=11)
    model.startprob_ = np.array([0.5, 0.5, 0.0, 0.0])
    X, states = model.sample(400, random_state=0)
    assert X.shape == (400, 1) and states.shape == (400,) and X.dtype == torch.long
    assert int(X.min()) >= 0 and int(X.max()) < 5
    _assert_follows_support(model, states[None])
    X2, states2 = model.sample(400, random_state=0)
    assert torch.equal(X, X2) and torch.equal(states, states2)  # seeded
    x, z = model.sample_batch(20, 30, generator=1)
    assert x.shape == (20, 30) and z.shape == (20, 30)
    _assert_follows_support(model, z)
    assert model.sample(0)[0].shape == (0, 1)
    gauss = _gaussian(3, 2, device)
    X, states = gauss.sample(50, random_state=0)
    assert X.shape == (50, 2) and X.dtype == torch.float64 and states.shape == (50,)


def test_posterior_path_samples_follow_the_posteriors(device):
    model = _categorical(3, 4, device, seed=12)
    x, _ = model.sample_batch(2, 6, generator=3)
    lengths = torch.tensor([6, 4], device=device)
    paths = model.sample_paths(x, lengths=lengths, n=3000, generator=4)
    assert paths.shape == (3000, 2, 6) and torch.all(paths[:, 1, 4:] == -1)
    _assert_follows_support(model, paths[:200])
    post = model.posteriors(x, lengths=lengths)
    freq = torch.nn.functional.one_hot(paths.clamp_min(0), 3).double().mean(0)
    valid = torch.arange(6, device=device) < lengths[:, None]
    torch.testing.assert_close(freq[valid], post[valid], atol=0.05, rtol=0)


# ---------------------------------------------------------------------------------------------- scaling


@given(
    C=st.integers(1, 6),
    lengths=st.lists(st.integers(0, 9), min_size=1, max_size=5),
    spread=st.sampled_from([1.0, 30.0, 300.0]),
    seed=st.integers(0, 2**16),
)
def test_scaling_and_log_implementations_agree(device, C, lengths, spread, seed):
    """Scaled forward-backward (probability space, per-step normalisation) against the log-semiring
    chain on random HMMs, sequences of length 0 and 1, and log-emissions spread over hundreds of nats
    (beyond float32's range within one step: those sequences are flagged and recomputed on the log
    chain); float64, then float32."""
    g = torch.Generator().manual_seed(seed)
    B, T = len(lengths), max(lengths)
    L = torch.tensor(lengths)
    log_em = torch.randn(B, T, C, generator=g, dtype=torch.float64) * spread
    models = {}
    for impl in ("scaling", "log"):
        m = _categorical(C, 2, device, seed=seed % 97, zeros=False)  # zeros would route both to the log chain
        m.implementation = impl
        models[impl] = m
    assert models["scaling"]._scaling(B) and not models["log"]._scaling(B)
    for dtype, tol in ((torch.float64, 1e-9), (torch.float32, 1e-3)):
        le = log_em.to(device=device, dtype=dtype)
        res = {}
        for impl, m in models.items():
            m = m.to(dtype=dtype)
            res[impl] = m._expectations(m._padded(None, None, L.to(device), le))
        s, r = res["scaling"], res["log"]
        finite = torch.isfinite(r.log_likelihood)
        torch.testing.assert_close(s.log_likelihood, r.log_likelihood, rtol=tol, atol=tol)
        rows = finite.nonzero().flatten()
        torch.testing.assert_close(s.posteriors[rows], r.posteriors[rows], rtol=tol, atol=tol)
        if finite.all():
            torch.testing.assert_close(s.transitions, r.transitions, rtol=tol, atol=tol * max(1, T))
            torch.testing.assert_close(s.starts, r.starts, rtol=tol, atol=tol)


def test_scaling_flags_underflow_and_falls_back_to_the_log_chain():
    """A float32 sequence whose emissions favour each state by 200 nats in turn: unscaled mass of the
    other state underflows, so the scaled pass must flag it (the lockstep one leaves it to the log chain, the
    compiled one redoes it in log space itself), and the E-step must still be exact."""
    from semiring_ops.hmm.scaling import lockstep_forward_backward

    model = _categorical(2, 2, "cpu", seed=1, zeros=False).float()
    le = torch.tensor([[[0.0, -200.0], [-200.0, 0.0], [0.0, -200.0], [-3.0, -1.0]]])
    L = torch.tensor([4])
    r = lockstep_forward_backward(le, model.log_trans(), model.log_start(), L)
    assert r.suspect.tolist() == [True]
    model.implementation = "scaling"
    got = model._expectations(model._padded(None, None, L, le))
    model.implementation = "log"
    ref = model._expectations(model._padded(None, None, L, le))
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_scaling_score_and_fit_refuse_impossible_sequences(device):
    model = _categorical(3, 4, device, seed=2, zeros=False)
    model.implementation = "scaling"
    emis = model.emissionprob_.clone()
    emis[:, 3] = 0.0  # symbol 3 can never be emitted
    model.emissionprob_ = emis / emis.sum(1, keepdim=True)
    X = torch.tensor([[0], [1], [3], [2]], device=device)
    assert model.score(X, [2, 2]).item() == -math.inf
    with pytest.raises(ValueError, match="zero probability"):
        model.fit(X, [2, 2], n_iter=1)


# ---------------------------------------------------------------------------------------------- fit settings


def test_fit_refuses_zero_samples():
    model = HMM(2, n_symbols=3)
    with pytest.raises(ValueError, match=r"X has shape \(0,\): fit needs at least one sample"):
        model.fit(np.zeros(0, dtype=int))
    with pytest.raises(ValueError, match=r"X has shape \(0, 1\): fit needs at least one sample"):
        model.fit(np.zeros((0, 1), dtype=int), lengths=[0, 0])
    with pytest.raises(ValueError, match=r"log_emissions has shape \(0, 2\): fit needs at least one sample"):
        HMM(2, "custom").fit(log_emissions=torch.zeros(0, 2))


def test_fit_params_priors_and_monitor(device):
    model = _categorical(3, 4, device, seed=5, zeros=False)
    X, _ = model.sample(200, random_state=0)
    start, emis = model.startprob_.clone(), model.emissionprob_.clone()
    model.fit(X, n_iter=2, tol=-math.inf, params="t")
    assert torch.equal(model.startprob_, start) and torch.equal(model.emissionprob_, emis)
    model.startprob_prior = 1e9  # a Dirichlet prior this strong pins the start vector to uniform
    monitor = ConvergenceMonitor(tol=-math.inf, n_iter=100)
    model.fit(X, n_iter=1, params="s", monitor=monitor)
    assert model.monitor_ is monitor and monitor.iter == 1
    torch.testing.assert_close(model.startprob_, torch.full_like(start, 1 / 3), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match=r"startprob_prior has shape \(2,\); expected a scalar or an array"):
        model.startprob_prior = np.ones(2)
        model.fit(X, n_iter=1)


def test_auto_scales_on_the_cpu_at_any_batch_when_compiled(monkeypatch):
    """On the CPU "auto" runs the compiled scaled E-step (no per-step overhead) at any batch size; without it (the
    torch lockstep pass) only when a time step has enough cells (B C^2) to outweigh the per-step overhead;
    "scaling" and "log" are what they say."""
    from semiring_ops.hmm import model as model_module

    model = HMM(4, n_symbols=2)
    assert model._scaling(1) == (model_module.compiled_estep(model.log_startprob) is not None)
    monkeypatch.setattr(model_module, "compiled_estep", lambda _: None)
    assert not model._scaling(1) and model._scaling(256)
    model.implementation = "scaling"
    assert model._scaling(1)
    model.implementation = "log"
    assert not model._scaling(256)
