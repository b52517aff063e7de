"""semiring_ops.vhmm, hmmlearn's variational HMMs: the sub-normalised E-step against enumeration, the ELBO's
monotone increase, one iteration's posteriors and ELBO against hmmlearn's, the KL helpers against float64 numeric
checks (scipy), and bad input."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
import torch

from semiring_ops import hmm, vhmm
from semiring_ops.hmm.emissions.gaussian import COVARIANCE_TYPES
from semiring_ops.hmm.variational.estep import subnormalised_expectations
from semiring_ops.hmm.variational.kl import (
    expected_log_det_wishart,
    expected_log_dirichlet,
    kl_dirichlet,
    kl_normal,
    kl_wishart,
)

LENGTHS = [60, 1, 45, 34]


def _categorical_data() -> np.ndarray:
    truth = hmm.CategoricalHMM(3, n_features=4, random_state=0)
    truth.startprob_ = np.array([0.6, 0.3, 0.1])
    truth.transmat_ = np.array([[0.8, 0.1, 0.1], [0.2, 0.7, 0.1], [0.1, 0.2, 0.7]])
    truth.emissionprob_ = np.array([[0.7, 0.1, 0.1, 0.1], [0.1, 0.6, 0.2, 0.1], [0.05, 0.05, 0.2, 0.7]])
    return truth.sample(sum(LENGTHS))[0]


def _gaussian_data() -> np.ndarray:
    truth = hmm.GaussianHMM(3, "full", random_state=1)
    truth.startprob_ = np.full(3, 1 / 3)
    truth.transmat_ = np.full((3, 3), 0.1) + 0.7 * np.eye(3)
    truth.means_ = np.array([[0.0, 0.0], [5.0, 0.0], [0.0, 5.0]])
    truth.covars_ = np.stack([np.array([[1.0, 0.3], [0.3, 0.5]]) * (1 + i) for i in range(3)])
    return truth.sample(sum(LENGTHS))[0]


def _model(kind: str, **kwargs):
    if kind == "categorical":
        return vhmm.VariationalCategoricalHMM(4, **kwargs)
    return vhmm.VariationalGaussianHMM(3, covariance_type=kind, **kwargs)


def _data(kind: str) -> np.ndarray:
    return _categorical_data() if kind == "categorical" else _gaussian_data()


KINDS = ("categorical", *COVARIANCE_TYPES)


# ---------------------------------------------------------------------------------------------- the E-step


def test_subnormalised_expectations_match_enumeration():
    """Posteriors, start / transition counts and the sub-normalised log-likelihood, against summing every path."""
    g = torch.Generator().manual_seed(0)
    C, lengths = 2, np.array([3, 1, 2])
    log_start = torch.rand(C, generator=g, dtype=torch.float64).log() - 0.3
    log_trans = torch.rand(C, C, generator=g, dtype=torch.float64).log() - 0.2
    log_em = torch.randn(int(lengths.sum()), C, generator=g, dtype=torch.float64)
    e = subnormalised_expectations(log_start, log_trans, log_em, lengths)

    log_prob, offset, post = 0.0, 0, torch.zeros_like(log_em)
    starts, trans = torch.zeros(C, dtype=torch.float64), torch.zeros(C, C, dtype=torch.float64)
    for T in lengths:
        paths = list(itertools.product(range(C), repeat=int(T)))
        weights = []
        for path in paths:
            w = log_start[path[0]] + sum(log_em[offset + t, s] for t, s in enumerate(path))
            w = w + sum(log_trans[a, b] for a, b in itertools.pairwise(path))
            weights.append(w)
        weights = torch.stack(weights)
        total = torch.logsumexp(weights, 0)
        log_prob += float(total)
        for path, w in zip(paths, (weights - total).exp(), strict=True):
            starts[path[0]] += w
            for t, s in enumerate(path):
                post[offset + t, s] += w
            for a, b in itertools.pairwise(path):
                trans[a, b] += w
        offset += int(T)
    assert e.log_prob == pytest.approx(log_prob, rel=1e-12)
    torch.testing.assert_close(e.posteriors, post)
    torch.testing.assert_close(e.starts, starts)
    torch.testing.assert_close(e.transitions, trans)


# ---------------------------------------------------------------------------------------------- variational EM


@pytest.mark.parametrize("kind", KINDS)
def test_elbo_increases_monotonically(kind):
    X = _data(kind)
    model = _model(kind, n_iter=25, tol=-np.inf, random_state=2).fit(X, LENGTHS)
    history = np.asarray(model.monitor_.history)
    assert len(history) == 25 and np.isfinite(history).all()
    assert (np.diff(history) >= -1e-9 * np.abs(history[1:])).all(), np.diff(history)
    assert history[-1] > history[0]


@pytest.mark.parametrize("kind", KINDS)
def test_one_iteration_matches_hmmlearn(kind):
    """From hmmlearn's initial priors and posteriors, one iteration gives hmmlearn's posteriors, point estimates,
    ELBO and scores."""
    hmmlearn_vhmm = pytest.importorskip("hmmlearn.vhmm")
    X = _data(kind)
    if kind == "categorical":
        theirs = hmmlearn_vhmm.VariationalCategoricalHMM(4, n_iter=0, random_state=5)
    else:
        theirs = hmmlearn_vhmm.VariationalGaussianHMM(3, covariance_type=kind, n_iter=0, random_state=5)
    theirs.fit(X, LENGTHS)  # initialisation only
    ours = _model(kind, n_iter=1, init_params="")
    names = sorted(k for k in vars(theirs) if k.endswith(("_prior_", "_posterior_")))
    for name in names:
        setattr(ours, name, copy.deepcopy(getattr(theirs, name)))
    theirs.n_iter = theirs.monitor_.n_iter = 1
    theirs.init_params = ""
    theirs.fit(X, LENGTHS)
    ours.fit(X, LENGTHS)
    point = ["startprob_", "transmat_", "emissionprob_" if kind == "categorical" else "_covars_"]
    for name in names + point:
        np.testing.assert_allclose(getattr(ours, name), getattr(theirs, name), rtol=1e-9, atol=1e-10, err_msg=name)
    assert ours.monitor_.history[-1] == pytest.approx(theirs.monitor_.history[-1], rel=1e-10)
    assert ours.score(X, LENGTHS) == pytest.approx(theirs.score(X, LENGTHS), rel=1e-10)
    np.testing.assert_array_equal(ours.predict(X, LENGTHS), theirs.predict(X, LENGTHS))


def test_gaussian_init_matches_hmmlearn_on_separated_data():
    """k-means is ours, not scikit-learn's: on well-separated clusters the initial posteriors agree anyway."""
    hmmlearn_vhmm = pytest.importorskip("hmmlearn.vhmm")
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.normal(m, 0.3, (50, 2)) for m in (-6.0, 0.0, 6.0)])
    theirs = hmmlearn_vhmm.VariationalGaussianHMM(3, "diag", n_iter=0, random_state=0).fit(X)
    ours = vhmm.VariationalGaussianHMM(3, "diag", n_iter=0, random_state=0).fit(X)
    order_t, order_o = np.argsort(theirs.means_posterior_[:, 0]), np.argsort(ours.means_posterior_[:, 0])
    np.testing.assert_allclose(ours.means_posterior_[order_o], theirs.means_posterior_[order_t], rtol=1e-9)
    for name in ("beta_posterior_", "dof_posterior_", "scale_posterior_"):
        np.testing.assert_allclose(getattr(ours, name)[order_o], getattr(theirs, name)[order_t], rtol=1e-9)
    np.testing.assert_allclose(ours.startprob_posterior_, theirs.startprob_posterior_)  # same numpy draws
    np.testing.assert_allclose(ours.transmat_posterior_, theirs.transmat_posterior_)


def test_point_estimates_and_attributes():
    X = _gaussian_data()
    model = vhmm.VariationalGaussianHMM(3, "tied", n_iter=5, random_state=0).fit(X, LENGTHS)
    assert model.means_ is model.means_posterior_
    np.testing.assert_allclose(model._covars_, model.scale_posterior_ / model.dof_posterior_)
    assert model.covars_.shape == (3, 2, 2) and np.ndim(model.dof_posterior_) == 0
    np.testing.assert_allclose(model.transmat_, model.transmat_posterior_ / model.transmat_posterior_.sum(1)[:, None])
    samples, states = model.sample(20, random_state=0)
    assert samples.shape == (20, 2) and states.shape == (20,)
    assert "covariance_type='tied'" in repr(model) and model.get_params()["n_iter"] == 5


# ---------------------------------------------------------------------------------------------- KL helpers


def _t(x) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x, dtype=np.float64))


def test_kl_dirichlet_against_quadrature_and_monte_carlo():
    from scipy import integrate, stats

    q, p = np.array([2.5, 0.7]), np.array([1.2, 3.0])  # Beta: one dimension, quadrature
    ratio = lambda x: stats.beta.pdf(x, *q) * (stats.beta.logpdf(x, *q) - stats.beta.logpdf(x, *p))  # noqa: E731
    expected = integrate.quad(ratio, 0, 1, limit=200)[0]
    assert float(kl_dirichlet(_t(q), _t(p))) == pytest.approx(expected, rel=1e-7)

    q, p = np.array([3.0, 1.5, 2.0, 0.8]), np.array([1.0, 1.0, 2.5, 0.5])
    draws = stats.dirichlet.rvs(q, size=200_000, random_state=np.random.default_rng(0))
    log_ratio = stats.dirichlet.logpdf(draws.T, q) - stats.dirichlet.logpdf(draws.T, p)
    tolerance = 5 * log_ratio.std() / np.sqrt(len(log_ratio))
    assert float(kl_dirichlet(_t(q), _t(p))) == pytest.approx(log_ratio.mean(), abs=tolerance)
    np.testing.assert_allclose(expected_log_dirichlet(_t(q)).numpy(), np.log(draws).mean(0), atol=5e-3)
    batched = kl_dirichlet(_t([q, p]), _t([p, q]))
    assert batched.shape == (2,) and float(batched[0]) == pytest.approx(float(kl_dirichlet(_t(q), _t(p))))


def test_kl_normal_against_quadrature_and_monte_carlo():
    from scipy import integrate, stats

    q, p = stats.norm(0.3, 0.8), stats.norm(-0.5, 1.7)
    expected = integrate.quad(lambda x: q.pdf(x) * (q.logpdf(x) - p.logpdf(x)), -20, 20, limit=200)[0]
    value = kl_normal(_t([0.3]), _t([[0.64]]), _t([-0.5]), _t([[1.7**2]]))
    assert float(value) == pytest.approx(expected, rel=1e-9)

    rng = np.random.default_rng(1)
    A, B = rng.normal(size=(3, 3)), rng.normal(size=(3, 3))
    cq, cp = A @ A.T + np.eye(3), B @ B.T + 2 * np.eye(3)
    mq, mp = rng.normal(size=3), rng.normal(size=3)
    draws = stats.multivariate_normal.rvs(mq, cq, size=400_000, random_state=rng)
    log_ratio = stats.multivariate_normal.logpdf(draws, mq, cq) - stats.multivariate_normal.logpdf(draws, mp, cp)
    tolerance = 5 * log_ratio.std() / np.sqrt(len(log_ratio))
    assert float(kl_normal(_t(mq), _t(cq), _t(mp), _t(cp))) == pytest.approx(log_ratio.mean(), abs=tolerance)


@pytest.mark.parametrize("kind", COVARIANCE_TYPES)
def test_emission_kl_equals_the_general_normal_and_wishart_kls(kind):
    """VariationalGaussianHMM's emission KL (the Normals' KL in closed form, the posterior's inverse and log-det
    shared with the E-step) against kl_normal / kl_wishart of the full matrices, after a few iterations."""
    model = _model(kind, n_iter=3, random_state=0).fit(_gaussian_data(), LENGTHS)
    C = model.n_components
    dof = _t(np.broadcast_to(model.dof_posterior_, (C,)))
    scale = _t(model._full(model.scale_posterior_))
    precision = torch.linalg.inv(scale) * dof[:, None, None]
    beta_q, beta_p = _t(model.beta_posterior_), _t(model.beta_prior_)
    normal = kl_normal(
        _t(model.means_posterior_),
        torch.linalg.inv(beta_q[:, None, None] * precision),
        _t(model.means_prior_),
        torch.linalg.inv(beta_p[:, None, None] * precision),
    ).sum()
    if kind == "tied":
        wishart = kl_wishart(
            _t(model.dof_posterior_), _t(model.scale_posterior_), _t(model.dof_prior_), _t(model.scale_prior_)
        )
    else:
        prior_dof = _t(np.broadcast_to(model.dof_prior_, (C,)))
        wishart = kl_wishart(dof, scale, prior_dof, _t(model._full(model.scale_prior_))).sum()
    assert float(model._emission_kl()) == pytest.approx(float(normal + wishart), rel=1e-10, abs=1e-10)
    model._subnorm_log_emissions(_gaussian_data())  # the E-step leaves its Wishart for the ELBO: same value
    assert float(model._emission_kl()) == pytest.approx(float(normal + wishart), rel=1e-10, abs=1e-10)


def test_kl_wishart_against_quadrature_and_monte_carlo():
    """Wishart(dof, inverse scale S) is scipy's wishart(df=dof, scale=S⁻¹); with D = 1 a Gamma(dof/2, 2/S)."""
    from scipy import integrate, stats

    (dq, sq), (dp, sp) = (5.5, 2.0), (3.0, 0.7)
    q, p = stats.gamma(dq / 2, scale=2 / sq), stats.gamma(dp / 2, scale=2 / sp)
    expected = integrate.quad(lambda x: q.pdf(x) * (q.logpdf(x) - p.logpdf(x)), 0, np.inf, limit=200)[0]
    assert float(kl_wishart(_t(dq), _t([[sq]]), _t(dp), _t([[sp]]))) == pytest.approx(expected, rel=1e-8)

    rng = np.random.default_rng(2)
    Sq, Sp = np.array([[2.0, 0.4], [0.4, 1.0]]), np.array([[0.5, -0.1], [-0.1, 0.8]])
    dq, dp = 6.0, 3.5
    wq, wp = stats.wishart(dq, np.linalg.inv(Sq)), stats.wishart(dp, np.linalg.inv(Sp))
    draws = wq.rvs(size=100_000, random_state=rng)
    some = draws[:10_000].transpose(1, 2, 0)  # scipy's wishart.logpdf is slow: 10^4 draws
    log_ratio = wq.logpdf(some) - wp.logpdf(some)
    tolerance = 5 * log_ratio.std() / np.sqrt(len(log_ratio))
    assert float(kl_wishart(_t(dq), _t(Sq), _t(dp), _t(Sp))) == pytest.approx(log_ratio.mean(), abs=tolerance)
    log_dets = np.linalg.slogdet(draws)[1]
    tolerance = 5 * log_dets.std() / np.sqrt(len(log_dets))
    assert float(expected_log_det_wishart(_t(dq), _t(Sq))) == pytest.approx(log_dets.mean(), abs=tolerance)
    assert float(kl_wishart(_t(dq), _t(Sq), _t(dq), _t(Sq))) == pytest.approx(0, abs=1e-12)


# ---------------------------------------------------------------------------------------------- bad input


def test_bad_categorical_input():
    X = _categorical_data()
    with pytest.raises(ValueError, match="integer"):
        vhmm.VariationalCategoricalHMM(3).fit(X.astype(float), LENGTHS)
    with pytest.raises(ValueError, match="n_features=2"):
        vhmm.VariationalCategoricalHMM(3, n_features=2).fit(X, LENGTHS)
    with pytest.raises(ValueError, match="lengths"):
        vhmm.VariationalCategoricalHMM(3, n_iter=1).fit(X, [10, 10])
    model = vhmm.VariationalCategoricalHMM(3, n_iter=1, init_params="")
    model.emissionprob_prior_ = np.full((3, 4), 0.25)
    model.emissionprob_posterior_ = np.full((3, 4), -1.0)
    with pytest.raises(ValueError, match="emissionprob_posterior_ must hold finite values above 0"):
        model.fit(X, LENGTHS)
    model.emissionprob_posterior_ = np.full((3, 5), 1.0)
    with pytest.raises(ValueError, match="emissionprob_prior_ has shape"):
        model.fit(X, LENGTHS)
    with pytest.raises(hmm.NotFittedError):
        vhmm.VariationalCategoricalHMM(3).score(X, LENGTHS)


def test_bad_gaussian_input():
    X = _gaussian_data()
    with pytest.raises(ValueError, match="covariance_type"):
        vhmm.VariationalGaussianHMM(3, covariance_type="diagonal")
    with pytest.raises(ValueError, match="non-finite"):
        vhmm.VariationalGaussianHMM(3).fit(np.where(np.arange(len(X))[:, None] == 3, np.nan, X), LENGTHS)
    fitted = vhmm.VariationalGaussianHMM(3, "full", n_iter=1, random_state=0).fit(X, LENGTHS)

    def refit(**attributes):
        model = copy.deepcopy(fitted)
        model.init_params = ""
        for name, value in attributes.items():
            setattr(model, name, value)
        return model.fit(X, LENGTHS)

    with pytest.raises(ValueError, match="dof_posterior_ must hold finite values above 1"):
        refit(dof_posterior_=np.full(3, 0.5))  # a 2-D Wishart needs dof > 1
    with pytest.raises(ValueError, match="scale_prior_ has shape"):
        refit(scale_prior_=np.ones((3, 2)))
    with pytest.raises(ValueError, match="positive"):
        refit(scale_posterior_=np.tile(np.array([[1.0, 2.0], [2.0, 1.0]]), (3, 1, 1)))
    with pytest.raises(ValueError, match="beta_prior_"):
        refit(beta_prior_=np.zeros(3))
    with pytest.raises(ValueError, match="means_prior_ has shape"):
        refit(means_prior_=np.zeros((3, 3)))
    tied = vhmm.VariationalGaussianHMM(3, "tied", n_iter=1, random_state=0).fit(X, LENGTHS)
    tied.init_params = ""
    tied.dof_prior_ = np.array([2.0])
    with pytest.raises(ValueError, match="dof_prior_ has shape"):
        tied.fit(X, LENGTHS)
