"""Gaussian emission models of every covariance type (spherical, diag, full, tied): log-densities against a
float64 brute-force reference, the M-step against hmmlearn's own, covariance validation, sampling,
gradients, k-means initialisation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from semiring_ops import HMM
from semiring_ops.hmm.emissions.gaussian import COVARIANCE_TYPES, gaussian_emission, validate_covars
from semiring_ops.hmm.kmeans import kmeans


def _spd(rng: np.random.Generator, D: int) -> np.ndarray:
    a = rng.normal(size=(D, D))
    return a @ a.T + 0.5 * np.eye(D)


def _covars(rng: np.random.Generator, covariance_type: str, C: int, D: int) -> np.ndarray:
    """Random covariances in the type's compact shape."""
    return {
        "spherical": lambda: rng.uniform(0.3, 2.0, size=C),
        "diag": lambda: rng.uniform(0.3, 2.0, size=(C, D)),
        "full": lambda: np.stack([_spd(rng, D) for _ in range(C)]),
        "tied": lambda: _spd(rng, D),
    }[covariance_type]()


def _full_matrices(covariance_type: str, covars: np.ndarray, C: int, D: int) -> np.ndarray:
    """The compact covariances as (C, D, D) matrices."""
    if covariance_type == "spherical":
        return covars[:, None, None] * np.eye(D)
    if covariance_type == "diag":
        return np.stack([np.diag(c) for c in covars])
    return np.broadcast_to(covars, (C, D, D))


def _brute_log_density(x: np.ndarray, means: np.ndarray, covs: np.ndarray) -> np.ndarray:
    """log N(x_n | means_c, covs_c) (N, C) by the textbook formula: slogdet and a linear solve."""
    D = x.shape[1]
    out = np.empty((len(x), len(means)))
    for c, (mu, cov) in enumerate(zip(means, covs, strict=True)):
        d = x - mu
        maha = np.einsum("nd,nd->n", d, np.linalg.solve(cov, d.T).T)
        out[:, c] = -0.5 * (D * math.log(2 * math.pi) + np.linalg.slogdet(cov)[1] + maha)
    return out


def _emission(covariance_type: str, C: int, D: int, seed: int, device="cpu"):
    rng = np.random.default_rng(seed)
    emission = gaussian_emission(covariance_type, C, D).to(device=device, dtype=torch.float64)
    emission.means_ = rng.normal(size=(C, D)) * 2
    emission.covars_ = _covars(rng, covariance_type, C, D)
    return emission, rng


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
@given(C=st.integers(1, 4), D=st.integers(1, 4), N=st.integers(0, 6), seed=st.integers(0, 2**16))
def test_log_prob_matches_brute_force(device, covariance_type, C, D, N, seed):
    emission, rng = _emission(covariance_type, C, D, seed, device)
    x = rng.normal(size=(N, D)) * 3
    got = emission.log_prob(torch.from_numpy(x).to(device)).detach().cpu()
    assert got.shape == (N, C) and got.dtype == torch.float64
    covs = _full_matrices(covariance_type, emission.covars_.cpu().numpy(), C, D)
    want = _brute_log_density(x, emission.means_.cpu().numpy(), covs)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10)
    # batched (B, T, D) observations give the same values
    batched = emission.log_prob(torch.from_numpy(x).to(device).reshape(1, N, D)).detach().cpu()
    np.testing.assert_allclose(batched[0].numpy(), got.numpy(), rtol=1e-12)


def test_log_prob_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    emission, rng = _emission("full", 3, 4, seed=1)
    x = rng.normal(size=(20, 4))
    means, covs = emission.means_.numpy(), emission.covars_.numpy()
    ref = np.stack([stats.multivariate_normal(m, c).logpdf(x) for m, c in zip(means, covs, strict=True)], axis=1)
    np.testing.assert_allclose(emission.log_prob(torch.from_numpy(x)).detach().numpy(), ref, rtol=1e-10)


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_covars_round_trip_and_compact_shapes(covariance_type):
    C, D = 3, 2
    emission, rng = _emission(covariance_type, C, D, seed=2)
    want = {"spherical": (C,), "diag": (C, D), "full": (C, D, D), "tied": (D, D)}[covariance_type]
    covars = _covars(rng, covariance_type, C, D)
    emission.covars_ = covars
    assert tuple(emission.covars_.shape) == want
    np.testing.assert_allclose(emission.covars_.numpy(), covars, rtol=1e-12)
    # hmmlearn's full (C, D, D) matrices are accepted for every type
    emission.covars_ = _full_matrices(covariance_type, covars, C, D)
    np.testing.assert_allclose(emission.covars_.numpy(), covars, rtol=1e-12)
    model = HMM(C, "gaussian", n_features=D, covariance_type=covariance_type)
    assert type(model.emission) is type(emission)


def test_bad_covariances_are_refused_with_shapes():
    with pytest.raises(ValueError, match=r"covars_ has shape \(3, 2\); covariance_type='full' expects \(3, 2, 2\)"):
        validate_covars(np.ones((3, 2)), "full", 3, 2)
    with pytest.raises(ValueError, match=r"covars_ has shape \(2, 2\); covariance_type='tied' expects \(3, 3\)"):
        validate_covars(np.eye(2), "tied", 3, 3)
    with pytest.raises(ValueError, match=r"covars_ has shape \(4,\); covariance_type='spherical' expects \(3,\)"):
        validate_covars(np.ones(4), "spherical", 3)
    with pytest.raises(ValueError, match=r"covars_ has shape \(3,\); covariance_type='diag' expects \(3, n_features\)"):
        validate_covars(np.ones(3), "diag", 3)
    with pytest.raises(ValueError, match=r"must be symmetric"):
        validate_covars(np.array([[1.0, 0.5], [0.0, 1.0]]), "tied", 3)
    with pytest.raises(ValueError, match=r"positive definite \(state 1\)"):
        validate_covars(np.stack([np.eye(2), np.array([[1.0, 2.0], [2.0, 1.0]])]), "full", 2)
    with pytest.raises(ValueError, match=r"must be positive for covariance_type='spherical'"):
        validate_covars(np.array([1.0, 0.0]), "spherical", 2)
    with pytest.raises(ValueError, match="must be finite"):
        validate_covars(np.array([[1.0, np.nan]]), "diag", 1)
    with pytest.raises(ValueError, match="covariance_type must be one of"):
        validate_covars(np.ones(2), "block", 2)
    with pytest.raises(ValueError, match=r"covars_prior has shape \(2,\); expected a scalar or an array broadcastable"):
        emission = gaussian_emission("full", 3, 3, covars_prior=np.ones(2)).double()
        emission.m_step(torch.randn(5, 3, dtype=torch.float64), torch.full((5, 3), 1 / 3, dtype=torch.float64))


@pytest.mark.parametrize("covariance_type", ["full", "tied"])
def test_singular_covariance_gets_hmmlearns_jitter(covariance_type):
    """A covariance update that is only positive semi-definite (fewer points than features) is stored with
    1e-7 on its diagonal, as hmmlearn evaluates it; one that is far from definite raises ValueError."""
    emission = gaussian_emission(covariance_type, 1, 3, covars_prior=0.0).double()
    x = torch.tensor([[1.0, 2.0, 3.0], [2.0, 3.0, 5.0]], dtype=torch.float64)  # rank-1 scatter around the mean
    emission.m_step(x, torch.ones(2, 1, dtype=torch.float64))
    cov = emission.covars_.reshape(3, 3)
    d = x - x.mean(0)
    np.testing.assert_allclose(cov.numpy(), (d.T @ d / 2).numpy() + 1e-7 * np.eye(3), atol=1e-12)
    assert torch.isfinite(emission.log_prob(x)).all()
    with pytest.raises(ValueError, match="positive-definite"):
        emission._set_covars(-torch.eye(3, dtype=torch.float64).expand(emission.covars_factor.shape))


# ---------------------------------------------------------------------------------------------- M-step


def _hmmlearn_models(covariance_type: str, params: str):
    """hmmlearn's GaussianHMM and ours (semiring_ops.hmm) with the same parameters, priors and data."""
    hmmlearn = pytest.importorskip("hmmlearn.hmm")
    from semiring_ops import hmm

    C, D = 3, 2
    rng = np.random.default_rng(5)
    start, trans = rng.dirichlet(np.ones(C)), rng.dirichlet(np.ones(C) * 3, size=C)
    means, covars = rng.normal(size=(C, D)) * 3, _covars(rng, covariance_type, C, D)
    priors = {
        "startprob_prior": 1.0 + rng.uniform(size=C),
        "transmat_prior": 1.0 + rng.uniform(size=(C, C)),
        "means_prior": rng.normal(size=(C, D)),
        "means_weight": 0.5,
        "covars_prior": {"spherical": 0.2, "diag": rng.uniform(0.1, 0.3, size=(C, D))}.get(
            covariance_type, 0.3 * _full_matrices(covariance_type, _covars(rng, covariance_type, C, D), C, D)[0]
        ),
        "covars_weight": 1.5 + (D if covariance_type in ("full", "tied") else 0),
    }
    if covariance_type == "full":
        priors["covars_prior"] = np.broadcast_to(priors["covars_prior"], (C, D, D)).copy()
    models = []
    for module in (hmmlearn, hmm):
        m = module.GaussianHMM(C, covariance_type, n_iter=3, tol=-np.inf, params=params, init_params="", **priors)
        m.startprob_, m.transmat_, m.means_, m.covars_ = start, trans, means, covars
        models.append(m)
    X, _ = models[0].sample(240, random_state=np.random.RandomState(7))
    return *models, X, [100, 60, 80]


@pytest.mark.parametrize("params", ["stmc", "stm"])
@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_m_step_matches_hmmlearn(covariance_type, params):
    """Three EM iterations from the same parameters, with non-trivial priors of every kind, give
    hmmlearn's parameters and log-likelihoods."""
    ref, ours, X, lengths = _hmmlearn_models(covariance_type, params)
    ref.fit(X, lengths)
    ours.fit(X, lengths)
    assert ours.monitor_.iter == ref.monitor_.iter == 3
    np.testing.assert_allclose(list(ours.monitor_.history), list(ref.monitor_.history), rtol=1e-10)
    for name in ("startprob_", "transmat_", "means_", "_covars_"):
        want = np.asarray(getattr(ref, name))
        if name == "_covars_" and covariance_type == "spherical":
            want = want[:, 0] if want.ndim == 2 else want  # hmmlearn tiles spherical variances over features
        np.testing.assert_allclose(getattr(ours, name), want, rtol=1e-8, atol=1e-12, err_msg=name)
    if covariance_type != "spherical":  # hmmlearn's spherical covars_ getter mis-shapes its tiled variances
        np.testing.assert_allclose(ours.covars_, ref.covars_, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_state_without_posterior_mass_keeps_its_parameters(device, covariance_type):
    emission, _ = _emission(covariance_type, 3, 2, seed=3, device=device)
    before = (emission.means_.clone(), emission.covars_.clone())
    x = torch.randn(10, 2, dtype=torch.float64, device=device)
    weights = torch.zeros(10, 3, dtype=torch.float64, device=device)
    weights[:, 0] = 1.0  # states 1 and 2 see nothing
    emission.m_step(x, weights)
    torch.testing.assert_close(emission.means_[1:], before[0][1:])
    if covariance_type in ("spherical", "diag", "full"):
        torch.testing.assert_close(emission.covars_[1:], before[1][1:])
    torch.testing.assert_close(emission.means_[0], x.mean(0))


# ---------------------------------------------------------------------------------------------- sampling, gradients


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_samples_have_the_covariance(device, covariance_type):
    emission, _ = _emission(covariance_type, 2, 3, seed=4, device=device)
    g = torch.Generator(device=device).manual_seed(0)
    states = torch.ones(200, 200, dtype=torch.long, device=device)
    x = emission.sample(states, g).reshape(-1, 3).cpu().numpy()
    cov = _full_matrices(covariance_type, emission.covars_.cpu().numpy(), 2, 3)[1]
    np.testing.assert_allclose(x.mean(0), emission.means_[1].cpu().numpy(), atol=0.15 * np.sqrt(cov.max()))
    np.testing.assert_allclose(np.cov(x.T), cov, atol=0.06 * np.abs(cov).max())


@pytest.mark.parametrize("covariance_type", ["full", "tied", "spherical"])
def test_gradients_through_the_new_covariance_parameters(covariance_type):
    model = HMM(2, "gaussian", n_features=2, covariance_type=covariance_type).double()
    x = torch.randn(2, 4, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    names = [n for n, _ in model.named_parameters()]

    def f(*params):
        return torch.func.functional_call(model, dict(zip(names, params, strict=True)), (x,))

    assert torch.autograd.gradcheck(f, tuple(p.detach().clone().requires_grad_() for p in model.parameters()))


# ---------------------------------------------------------------------------------------------- initialisation


def test_kmeans_finds_separated_clusters_and_refuses_too_few_points():
    g = torch.Generator().manual_seed(0)
    centres = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]], dtype=torch.float64)
    x = (centres[torch.arange(300) % 3] + torch.randn(300, 2, generator=g, dtype=torch.float64)).contiguous()
    got = kmeans(x, 3, torch.Generator().manual_seed(1))
    nearest = torch.cdist(centres, got).argmin(1)  # the found centre next to each true one
    assert sorted(nearest.tolist()) == [0, 1, 2]
    torch.testing.assert_close(got[nearest], centres, atol=0.5, rtol=0)
    with pytest.raises(ValueError, match=r"x has shape \(2, 2\): k-means with k=3 clusters needs at least 3"):
        kmeans(x[:2], 3)


def test_kmeans_lloyd_matches_a_plain_lloyd_run_by_run():
    """The batched Lloyd iterations (one product for all runs' distances) end each run where a plain Lloyd loop
    (torch.cdist, one run at a time, same stopping rule) does, and report its inertia."""
    from semiring_ops.hmm.kmeans import _lloyd

    g = torch.Generator().manual_seed(3)
    x = torch.randn(500, 3, generator=g, dtype=torch.float64) + torch.randint(0, 4, (500, 1), generator=g) * 3.0
    seeds = x[torch.randint(500, (4, 5), generator=g)]  # 4 runs of 5 centres
    got, inertia = _lloyd(x, seeds, max_iter=100, tol=1e-10)
    for r in range(4):
        c = seeds[r].clone()
        for _ in range(100):
            labels = torch.cdist(x, c).argmin(1)
            new = torch.stack([x[labels == j].mean(0) if (labels == j).any() else c[j] for j in range(5)])
            moved = float((new - c).square().sum())
            c = new
            if moved <= 1e-10:
                break
        torch.testing.assert_close(got[r], c, rtol=1e-9, atol=1e-9)
        want = torch.cdist(x, c).square().min(1).values.sum()
        torch.testing.assert_close(inertia[r], want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_init_from_data_is_hmmlearns_rule(covariance_type):
    x = torch.randn(50, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2)) * torch.tensor([1, 2, 3])
    emission = gaussian_emission(covariance_type, 2, 3, min_covar=0.01).double()
    emission.init_from_data(x, torch.Generator().manual_seed(0))
    cv = np.cov(x.numpy().T) + 0.01 * np.eye(3)
    want = {"spherical": np.full(2, np.trace(cv) / 3), "diag": np.tile(np.diag(cv), (2, 1)), "tied": cv}
    np.testing.assert_allclose(emission.covars_.numpy(), want.get(covariance_type, np.stack([cv, cv])), rtol=1e-10)
    before = emission.covars_.clone()
    emission.init_from_data(x * 2, torch.Generator().manual_seed(0), params="m")  # means only
    torch.testing.assert_close(emission.covars_, before)
    with pytest.raises(ValueError, match=r"X has shape \(0, 3\): initialising from data needs at least one sample"):
        emission.init_from_data(x[:0])
    with pytest.raises(ValueError, match=r"X has shape \(1, 3\): initialising from data needs at least 2 samples"):
        emission.init_from_data(x[:1])
    emission.init_from_data(x[:1], params="c")  # one sample is enough for the covariances


@pytest.mark.parametrize("n_symbols", [3, 20, 5000])
def test_symbol_counts_equal_a_plain_index_add(device, n_symbols):
    """CategoricalEmission.symbol_counts (on a GPU: the atomics spread over copies of the table) against one
    float64 index_add; sizes from below one copy's worth of samples to many copies, symbols unused included."""
    g = torch.Generator().manual_seed(n_symbols)
    model = HMM(7, "categorical", n_symbols=n_symbols).to(device)
    for n in (0, 5, 1500, 300_001):
        x = torch.randint(0, max(1, n_symbols - 1), (n,), generator=g)  # the last symbol never occurs
        w = torch.rand(n, 7, generator=g)
        want = torch.zeros(7, n_symbols, dtype=torch.float64).index_add_(1, x, w.double().T)
        got = model.emission.symbol_counts(x.to(device), w.to(device))
        assert got.shape == (7, n_symbols) and got.is_contiguous()
        torch.testing.assert_close(got.double().cpu(), want, rtol=1e-4, atol=1e-3)  # float32 sums of 1e5 terms
