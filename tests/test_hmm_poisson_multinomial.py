"""Poisson and multinomial emissions (semiring_ops.hmm.emissions) and hmmlearn's PoissonHMM / MultinomialHMM over
them: densities against scipy, EM against hmmlearn's numbers, padded batches, gradients, bad input, the
distributed fit, and hmmlearn's initial and sampling draws."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
from scipy import stats

from semiring_ops import HMM
from semiring_ops import hmm as ours_hmm
from semiring_ops.hmm import MultinomialHMM, PoissonHMM
from semiring_ops.hmm.emissions import MultinomialEmission, PoissonEmission
from tests.dist_util import run_ranks

C, D = 3, 4


def _poisson(seed: int = 0, device: str = "cpu", zero: bool = True) -> tuple[PoissonEmission, np.ndarray]:
    rng = np.random.default_rng(seed)
    lambdas = rng.gamma(2.0, 1.5, size=(C, D))
    if zero:
        lambdas[1, 2] = 0.0  # a zero rate allows only zero counts
    emission = PoissonEmission(C, D).to(device=device, dtype=torch.float64)
    emission.lambdas_ = lambdas
    return emission, lambdas


def _multinomial(seed: int = 0, device: str = "cpu", zero: bool = True) -> tuple[MultinomialEmission, np.ndarray]:
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.ones(D), size=C)
    if zero:
        probs[2, 0] = 0.0
        probs[2] /= probs[2].sum()
    emission = MultinomialEmission(C, D, n_trials=6).to(device=device, dtype=torch.float64)
    emission.emissionprob_ = probs
    return emission, probs


def _counts(rng: np.random.Generator, n: int) -> np.ndarray:
    x = rng.poisson(2.0, size=(n, D))
    x[:3] = 0  # all-zero rows and zero counts under zero rates / probabilities
    x[3, 2] = 0
    return x


# ---------------------------------------------------------------------------------------------- densities


def test_poisson_log_prob_matches_scipy(device):
    emission, lambdas = _poisson(device=device)
    x = _counts(np.random.default_rng(1), 40)
    got = emission.log_prob(torch.as_tensor(x, dtype=torch.float64, device=device)).detach().cpu().numpy()
    want = np.stack([stats.poisson.logpmf(x, lambdas[c]).sum(1) for c in range(C)], axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert np.isneginf(got[:, 1]).sum() == (x[:, 2] > 0).sum() > 0


def test_multinomial_log_prob_matches_scipy(device):
    emission, probs = _multinomial(device=device)
    x = _counts(np.random.default_rng(2), 40)  # rows of different totals: each scores with its own
    got = emission.log_prob(torch.as_tensor(x, dtype=torch.float64, device=device)).detach().cpu().numpy()
    want = np.stack([stats.multinomial.logpmf(x, x.sum(1), probs[c]) for c in range(C)], axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert np.isneginf(got[:, 2]).sum() == (x[:, 0] > 0).sum() > 0


def test_batched_log_prob_takes_any_batch_shape():
    emission, _ = _poisson()
    x = torch.as_tensor(_counts(np.random.default_rng(3), 24), dtype=torch.float64)
    flat = emission.log_prob(x)
    torch.testing.assert_close(emission.log_prob(x.reshape(2, 3, 4, D)).reshape(24, C), flat)


@pytest.mark.parametrize("family", ["poisson", "multinomial"])
def test_gradcheck_log_prob(family):
    emission, _ = (_poisson if family == "poisson" else _multinomial)(zero=False)
    name = "log_lambdas" if family == "poisson" else "log_emissionprob"
    x = torch.as_tensor(_counts(np.random.default_rng(4), 8), dtype=torch.float64)
    raw = getattr(emission, name).detach().clone().requires_grad_(True)

    wrapper = torch.nn.Module()
    wrapper.emission, wrapper.forward = emission, emission.log_prob

    def log_prob(p: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(wrapper, {f"emission.{name}": p}, (x,))

    assert torch.autograd.gradcheck(log_prob, (raw,))


def test_zero_rate_gives_finite_gradients():
    emission, _ = _poisson()
    x = torch.zeros(5, D, dtype=torch.float64)
    emission.log_prob(x).sum().backward()
    assert torch.isfinite(emission.log_lambdas.grad).all()


# ---------------------------------------------------------------------------------------------- sampling


def test_emission_samples_have_the_moments(device):
    g = torch.Generator(device=device).manual_seed(0)
    states = torch.full((20000,), 0, dtype=torch.long, device=device)
    poisson, lambdas = _poisson(device=device)
    x = poisson.sample(states, g)
    assert x.dtype == torch.int64 and x.shape == (20000, D)
    np.testing.assert_allclose(x.double().mean(0).cpu(), lambdas[0], rtol=0.05)
    multinomial, probs = _multinomial(device=device)
    x = multinomial.sample(states + 2, g)
    assert x.dtype == torch.int64 and bool((x.sum(1) == 6).all()) and bool((x[:, 0] == 0).all())
    np.testing.assert_allclose(x.double().mean(0).cpu(), 6 * probs[2], atol=0.05)


def test_generate_sample_from_state_is_hmmlearns_draws():
    hmm_ref = pytest.importorskip("hmmlearn.hmm")
    ref_p, ours_p = hmm_ref.PoissonHMM(C), PoissonHMM(C)
    ref_p.lambdas_ = ours_p.lambdas_ = _poisson()[1]
    ref_m, ours_m = hmm_ref.MultinomialHMM(C, n_trials=7), MultinomialHMM(C, n_trials=7)
    ref_m.emissionprob_ = ours_m.emissionprob_ = _multinomial()[1]
    for ref, ours in ((ref_p, ours_p), (ref_m, ours_m)):
        a, b = np.random.RandomState(3), np.random.RandomState(3)
        for state in [0, 2, 1, 1, 0, 2]:
            np.testing.assert_array_equal(
                ours._generate_sample_from_state(state, a), ref._generate_sample_from_state(state, b)
            )
        assert a.rand() == b.rand()  # the same number of draws


def test_estimator_samples_are_integer_counts():
    model = MultinomialHMM(2, n_trials=5)
    model.startprob_, model.transmat_ = [0.6, 0.4], [[0.8, 0.2], [0.2, 0.8]]
    model.emissionprob_ = [[0.5, 0.3, 0.1, 0.1], [0.1, 0.1, 0.4, 0.4]]
    X, states = model.sample(50, random_state=1)
    assert X.shape == (50, 4) and np.issubdtype(X.dtype, np.integer) and (X.sum(1) == 5).all()
    assert states.shape == (50,)
    model.n_trials = [1, 2]
    with pytest.raises(ValueError, match="n_trials"):
        model.sample(5)


# ---------------------------------------------------------------------------------------------- EM against hmmlearn


def _hmmlearn_pair(family: str):
    """hmmlearn's model and ours with the same parameters and priors, data drawn by hmmlearn, lengths."""
    hmm_ref = pytest.importorskip("hmmlearn.hmm")
    rng = np.random.default_rng(5)
    start, trans = rng.dirichlet(np.ones(C)), rng.dirichlet(np.ones(C) * 3, size=C)
    common = {"n_iter": 3, "tol": -np.inf, "init_params": "", "startprob_prior": 1 + rng.uniform(size=C)}
    common["transmat_prior"] = 1 + rng.uniform(size=(C, C))
    if family == "poisson":
        priors = {"lambdas_prior": rng.uniform(0.5, 2, size=(C, D)), "lambdas_weight": 0.7}
        models = [m.PoissonHMM(C, **common, **priors) for m in (hmm_ref, ours_hmm)]
        for m in models:
            m.lambdas_ = _poisson(zero=False)[1]
    else:
        models = [m.MultinomialHMM(C, n_trials=None, **common) for m in (hmm_ref, ours_hmm)]
        for m in models:
            m.emissionprob_ = _multinomial(zero=False)[1]
    for m in models:
        m.startprob_, m.transmat_ = start, trans
    if family == "poisson":
        X, _ = models[0].sample(240, random_state=np.random.RandomState(7))
    else:
        X = np.random.RandomState(7).multinomial(6, [0.4, 0.3, 0.2, 0.1], size=240)
        X[::3] *= 2  # samples of different totals
    return *models, X, [100, 60, 80]


@pytest.mark.parametrize("params", ["stl", "l", "st"])
def test_poisson_em_matches_hmmlearn(params):
    ref, ours, X, lengths = _hmmlearn_pair("poisson")
    ref.params = ours.params = params
    ref.fit(X, lengths)
    ours.fit(X, lengths)
    assert ours.monitor_.iter == ref.monitor_.iter == 3
    np.testing.assert_allclose(list(ours.monitor_.history), list(ref.monitor_.history), rtol=1e-10)
    for name in ("startprob_", "transmat_", "lambdas_"):
        np.testing.assert_allclose(getattr(ours, name), getattr(ref, name), rtol=1e-9, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("params", ["ste", "e"])
def test_multinomial_em_matches_hmmlearn(params):
    ref, ours, X, lengths = _hmmlearn_pair("multinomial")
    ref.params = ours.params = params
    ref.fit(X, lengths)
    ours.fit(X, lengths)
    np.testing.assert_array_equal(ours.n_trials, ref.n_trials)
    np.testing.assert_allclose(list(ours.monitor_.history), list(ref.monitor_.history), rtol=1e-10)
    for name in ("startprob_", "transmat_", "emissionprob_"):
        np.testing.assert_allclose(getattr(ours, name), getattr(ref, name), rtol=1e-9, atol=1e-12, err_msg=name)
    assert ours.score(X, lengths) == pytest.approx(ref.score(X, lengths), rel=1e-10)


@pytest.mark.parametrize("family", ["poisson", "multinomial"])
def test_initialisation_is_hmmlearns_draws(family):
    """The same random_state gives hmmlearn's initial start, transitions and emission parameters."""
    ref, ours, X, lengths = _hmmlearn_pair(family)
    for m in (ref, ours):
        for name in ("startprob_", "transmat_", "lambdas_", "emissionprob_"):
            if hasattr(m, name):
                delattr(m, name)
        m.random_state, m.init_params = 11, "ste" if family == "multinomial" else "stl"
        m._init(X, lengths)
    emission = "lambdas_" if family == "poisson" else "emissionprob_"
    for name in ("startprob_", "transmat_", emission):
        np.testing.assert_array_equal(getattr(ours, name), getattr(ref, name), err_msg=name)


def test_per_state_rate_prior_is_a_column():
    """A (C,) lambdas_prior / lambdas_weight is per state (hmmlearn would broadcast it against the features)."""
    x = torch.as_tensor(_counts(np.random.default_rng(6), 30), dtype=torch.float64)
    weights = torch.softmax(torch.randn(30, C, dtype=torch.float64, generator=torch.Generator().manual_seed(0)), -1)
    alpha, beta = np.array([0.5, 1.0, 2.0]), np.array([0.1, 0.2, 0.3])
    fitted = []
    for a, b in ((alpha, beta), (alpha[:, None], np.broadcast_to(beta[:, None], (C, D)))):
        emission = PoissonEmission(C, D, lambdas_prior=a, lambdas_weight=b).double()
        emission.m_step(x, weights)
        fitted.append(emission.lambdas_)
    torch.testing.assert_close(fitted[0], fitted[1], rtol=0, atol=0)
    n, s = weights.sum(0), weights.T @ x
    want = (alpha[:, None] + 30 * (s / n[:, None]).numpy()) / (beta[:, None] + 30)
    np.testing.assert_allclose(fitted[0], want, rtol=1e-12)


def test_state_without_posterior_mass_keeps_its_parameters():
    for emission, name in ((_poisson()[0], "lambdas_"), (_multinomial()[0], "emissionprob_")):
        before = getattr(emission, name).clone()
        x = torch.as_tensor(_counts(np.random.default_rng(6), 10), dtype=torch.float64)
        weights = torch.zeros(10, C, dtype=torch.float64)
        weights[:, 0] = 1.0
        emission.m_step(x, weights)
        np.testing.assert_allclose(getattr(emission, name)[1:], before[1:], rtol=1e-14, atol=0)
        assert not torch.equal(getattr(emission, name)[0], before[0])


# ---------------------------------------------------------------------------------------------- padded batches


@pytest.mark.parametrize("family", ["poisson", "multinomial"])
def test_em_iteration_on_padded_batch_equals_concatenated(device, family):
    rng = np.random.default_rng(8)
    lengths = [7, 3, 5]
    X = _counts(rng, sum(lengths))
    model = HMM(C, _family_emission(family), generator=torch.Generator().manual_seed(0)).double().to(device)
    padded = model.emission.check(X, 1).new_full((3, 7, D), -1.0)  # -1: not a count; check cleans it
    starts = np.cumsum([0, *lengths])
    for b, n in enumerate(lengths):
        padded[b, :n] = torch.as_tensor(X[starts[b] : starts[b + 1]])
    post = model.posteriors(padded, lengths=torch.tensor(lengths, device=device))  # 0 past each length
    other = HMM(C, _family_emission(family)).double().to(device)
    other.load_state_dict(model.state_dict())
    other.fit(X, lengths, n_iter=1, params=model.emission.param_letters)
    model.emission.m_step(padded.reshape(21, D), post.reshape(21, C))
    for a, b in zip(model.emission.parameters(), other.emission.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------- bad input


def test_bad_counts_are_refused_with_names_and_shapes():
    poisson, multinomial = _poisson()[0], _multinomial()[0]
    for emission in (poisson, multinomial):
        with pytest.raises(ValueError, match=r"X has shape \(5, 3\).*n_features=4"):
            emission.check(np.zeros((5, 3)), 1)
        with pytest.raises(ValueError, match=r"non-negative counts.*shape \(2, 4\)"):
            emission.check(np.array([[0, 1, 2, -1], [0, 0, 0, 0]]), 1)
        with pytest.raises(ValueError, match=r"integral counts.*shape \(1, 4\)"):
            emission.check(np.array([[0.5, 1, 2, 1]]), 1)
        with pytest.raises(ValueError, match="non-finite"):
            emission.check(np.array([[np.nan, 1, 2, 1]]), 1)
    with pytest.raises(ValueError, match=r"lambdas_ has shape \(2, 4\); expected \(3, 4\)"):
        poisson.lambdas_ = np.ones((2, 4))
    with pytest.raises(ValueError, match=r"lambdas_.*non-negative"):
        poisson.lambdas_ = -np.ones((3, 4))
    with pytest.raises(ValueError, match="emissionprob_ must sum to 1"):
        multinomial.emissionprob_ = np.ones((3, 4))
    with pytest.raises(ValueError, match="n_trials"):
        MultinomialEmission(2, 3, n_trials=2.5)
    with pytest.raises(ValueError, match="n_trials"):
        MultinomialEmission(2, 3).sample(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="n_features"):
        PoissonEmission(2, 0)


def test_estimators_refuse_bad_input():
    with pytest.raises(ValueError, match="positive mean and variance"):
        PoissonHMM(2).fit(np.ones((10, 2), dtype=int))
    with pytest.raises(ValueError, match="non-negative counts"):
        PoissonHMM(2).fit(np.array([[1, -1], [2, 3]]))
    model = PoissonHMM(2)
    model.startprob_, model.transmat_, model.lambdas_ = [0.5, 0.5], np.eye(2), -np.ones((2, 3))
    with pytest.raises(ValueError, match="lambdas_"):
        model.score(np.ones((4, 3), dtype=int))
    with pytest.raises(ValueError, match="add up to n_trials"):
        MultinomialHMM(2, n_trials=3).fit(np.array([[1, 2], [2, 2]]))
    with pytest.raises(ValueError, match="integer counts"):
        MultinomialHMM(2).fit(np.array([[1.0, 2.0], [2.0, 2.0]]))
    with pytest.raises(ValueError, match=r"n_trials has shape \(3,\)"):
        MultinomialHMM(2, n_trials=[3, 3, 3]).fit(np.array([[1, 2], [2, 1]]))
    model = MultinomialHMM(2)
    model.startprob_, model.transmat_, model.emissionprob_ = [0.5, 0.5], np.eye(2), [[0.5, 0.5], [0.2, 0.8]]
    with pytest.raises(ValueError, match="n_trials must be set"):
        model.score(np.array([[1, 2]]))


# ---------------------------------------------------------------------------------------------- distributed fit


def _fit_rank(rank: int, world: int, cases: list) -> list[dict]:
    out = []
    for family, X, lengths, shards in cases:
        model = HMM(C, _family_emission(family), generator=torch.Generator().manual_seed(rank)).double()
        starts = np.cumsum([0, *lengths])
        mine = shards[rank]
        X_r = np.concatenate([X[starts[i] : starts[i + 1]] for i in mine]) if mine else X[:0]
        model.fit(X_r, [lengths[i] for i in mine], n_iter=5, tol=-1.0, group=dist.group.WORLD)
        out.append({k: v.detach().numpy().copy() for k, v in model.state_dict().items()})
    return out


def _family_emission(family: str):
    return (
        PoissonEmission(C, D, lambdas_prior=0.5, lambdas_weight=0.3)
        if family == "poisson"
        else MultinomialEmission(C, D)
    )


def test_distributed_fit_equals_one_process_fit():
    rng = np.random.default_rng(9)
    lengths = [int(n) for n in rng.integers(5, 15, 8)]
    X = _counts(rng, sum(lengths))
    shards = [[0, 1, 2, 3, 4], [5, 6, 7]]
    cases = [(family, X, lengths, shards) for family in ("poisson", "multinomial")]
    results = run_ranks(_fit_rank, 2, cases, timeout=120)
    for i, (family, *_) in enumerate(cases):
        ref = HMM(C, _family_emission(family), generator=torch.Generator().manual_seed(0)).double()
        ref.fit(X, lengths, n_iter=5, tol=-1.0)
        for r in range(2):
            for k, v in ref.state_dict().items():
                np.testing.assert_allclose(results[r][i][k], v.numpy(), rtol=1e-10, atol=1e-12, err_msg=f"{family} {k}")
