"""Gaussian-mixture emissions (GMMEmission) and hmmlearn's GMMHMM (semiring_ops.hmm.GMMHMM): log-densities against
a float64 brute force, one EM step against hmmlearn's for each covariance type (with and without priors), padded
batches against concatenated samples, the distributed statistics, gradients, sampling, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import multivariate_normal

from semiring_ops import HMM
from semiring_ops.hmm import GMMHMM
from semiring_ops.hmm.emissions.gaussian import COVARIANCE_TYPES
from semiring_ops.hmm.emissions.gmm import GMMEmission, mixture_covars_shape
from tests.dist_util import run_ranks


def _spd(rng: np.random.Generator, D: int) -> np.ndarray:
    a = rng.normal(size=(D, D))
    return a @ a.T + 0.5 * np.eye(D)


def _covars(rng: np.random.Generator, covariance_type: str, C: int, M: int, D: int) -> np.ndarray:
    """Random covariances of hmmlearn's GMMHMM shape."""
    return {
        "spherical": lambda: rng.uniform(0.3, 2.0, size=(C, M)),
        "diag": lambda: rng.uniform(0.3, 2.0, size=(C, M, D)),
        "full": lambda: np.array([[_spd(rng, D) for _ in range(M)] for _ in range(C)]),
        "tied": lambda: np.array([_spd(rng, D) for _ in range(C)]),
    }[covariance_type]()


def _matrix(covariance_type: str, covars: np.ndarray, c: int, m: int, D: int) -> np.ndarray:
    """The covariance matrix (D, D) of component m of state c."""
    if covariance_type == "spherical":
        return covars[c, m] * np.eye(D)
    if covariance_type == "diag":
        return np.diag(covars[c, m])
    return covars[c] if covariance_type == "tied" else covars[c, m]


def _parameters(covariance_type: str, C: int, M: int, D: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "weights_": rng.dirichlet(np.ones(M), size=C),
        "means_": rng.normal(size=(C, M, D)) * 2,
        "covars_": _covars(rng, covariance_type, C, M, D),
    }


def _emission(covariance_type: str, C: int, M: int, D: int, seed: int, device="cpu") -> GMMEmission:
    emission = GMMEmission(C, M, D, covariance_type).to(device=device, dtype=torch.float64)
    for name, value in _parameters(covariance_type, C, M, D, seed).items():
        setattr(emission, name, value)
    return emission


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
@pytest.mark.parametrize(("C", "M", "D"), [(1, 1, 1), (3, 2, 2), (2, 4, 3)])
def test_log_prob_matches_brute_force(device, covariance_type, C, M, D):
    emission = _emission(covariance_type, C, M, D, seed=C + M + D, device=device)
    p = _parameters(covariance_type, C, M, D, seed=C + M + D)
    x = np.random.default_rng(0).normal(size=(7, D)) * 2
    expected = np.zeros((len(x), C))
    for c in range(C):
        density = sum(
            p["weights_"][c, m]
            * multivariate_normal(p["means_"][c, m], _matrix(covariance_type, p["covars_"], c, m, D)).pdf(x)
            for m in range(M)
        )
        expected[:, c] = np.log(density)
    got = emission.log_prob(torch.from_numpy(x).to(device)).detach()
    np.testing.assert_allclose(got.cpu().numpy(), expected, rtol=1e-10, atol=1e-10)
    batched = emission.log_prob(torch.from_numpy(x).to(device).reshape(1, 7, D)).detach()  # any batch shape
    np.testing.assert_allclose(batched[0].cpu().numpy(), expected, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(emission.covars_.cpu().numpy(), p["covars_"], rtol=1e-12)


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
@pytest.mark.parametrize("priors", [False, True])
def test_one_em_step_matches_hmmlearn(covariance_type, priors):
    hmmlearn_hmm = pytest.importorskip("hmmlearn.hmm")
    C, M, D = 3, 2, 2
    rng = np.random.RandomState(0)
    X = np.concatenate([rng.normal(size=(30, D)) + 4 * k for k in range(C)])
    lengths = [25, 40, 25]
    start = {"startprob_": np.full(C, 1 / C), "transmat_": np.full((C, C), 1 / C)}
    start.update(_parameters(covariance_type, C, M, D, seed=1))
    kwargs = {}
    if priors:
        matrix = covariance_type in ("full", "tied")
        kwargs = {
            "weights_prior": 2.0,
            "means_prior": 1.0,
            "means_weight": 0.5,
            "covars_prior": 0.3 * np.eye(D) if matrix else 0.5,
            "covars_weight": 3.0 if matrix else 1.0,
        }
    fitted = []
    for module in (hmmlearn_hmm, GMMHMM):
        cls = module.GMMHMM if module is hmmlearn_hmm else module
        model = cls(C, n_mix=M, covariance_type=covariance_type, n_iter=1, init_params="", **kwargs)
        for name, value in start.items():
            setattr(model, name, value.copy())
        fitted.append(model.fit(X, lengths))
    ref, ours = fitted
    for name in ("startprob_", "transmat_", "weights_", "means_", "covars_"):
        np.testing.assert_allclose(getattr(ours, name), getattr(ref, name), rtol=1e-9, atol=1e-11, err_msg=name)
    assert ours.score(X, lengths) == pytest.approx(ref.score(X, lengths), rel=1e-11)
    assert ours.aic(X, lengths) == pytest.approx(ref.aic(X, lengths), rel=1e-11)


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_padded_batch_matches_concatenated(device, covariance_type):
    C, M, D = 2, 3, 2
    model = HMM(C, _emission(covariance_type, C, M, D, seed=5), generator=torch.Generator().manual_seed(0))
    model = model.to(device=device, dtype=torch.float64)
    lengths = [4, 7, 1]
    x = torch.randn(sum(lengths), D, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).to(device)
    padded = torch.zeros(3, 7, D, dtype=torch.float64, device=device)
    for b, piece in enumerate(x.split(lengths)):
        padded[b, : len(piece)] = piece
    per_sequence = model.log_likelihood(padded, lengths=torch.tensor(lengths, device=device))
    assert float(per_sequence.detach().sum()) == pytest.approx(float(model.score(x, lengths)), rel=1e-12)
    # the M-step: padded positions have zero posteriors, so padding adds nothing to the statistics
    post = model.posteriors(padded, lengths=torch.tensor(lengths, device=device))
    _, post_concatenated = model.score_samples(x, lengths)
    stats_padded = model.emission.sufficient_stats(padded.reshape(-1, D), post.reshape(-1, C))
    stats_concatenated = model.emission.sufficient_stats(x, post_concatenated)
    for a, b in zip(stats_padded, stats_concatenated, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_summed_shard_statistics_give_the_same_m_step(covariance_type):
    """The distributed fit adds each rank's sufficient_stats and runs m_step_from_stats on the sums."""
    C, M, D = 2, 2, 3
    whole, sharded = (_emission(covariance_type, C, M, D, seed=7) for _ in range(2))
    g = torch.Generator().manual_seed(2)
    x = torch.randn(40, D, dtype=torch.float64, generator=g)
    weights = torch.softmax(torch.randn(40, C, dtype=torch.float64, generator=g), -1)
    whole.m_step(x, weights)
    shards = [sharded.sufficient_stats(x[i::3], weights[i::3]) for i in range(3)]
    sharded.m_step_from_stats([sum(parts) for parts in zip(*shards, strict=True)])
    for name in ("weights_", "means_", "covars_"):
        torch.testing.assert_close(getattr(sharded, name), getattr(whole, name), rtol=1e-12, atol=1e-12)
    assert whole.agreement_fields() == {
        "n_features": 3.0,
        "n_mix": 2.0,
        "covariance_type": float(COVARIANCE_TYPES.index(covariance_type)),
    }


def _sharded_data() -> tuple[np.ndarray, list[int]]:
    rng = np.random.RandomState(0)
    return np.concatenate([rng.normal(size=(30, 2)) + 3 * (k % 3) for k in range(4)]), [30] * 4


def _started_gmmhmm(covariance_type: str) -> GMMHMM:
    model = GMMHMM(3, n_mix=2, covariance_type=covariance_type, n_iter=3, init_params="", tol=-1)
    model.startprob_, model.transmat_ = np.full(3, 1 / 3), np.full((3, 3), 1 / 3)
    for name, value in _parameters(covariance_type, 3, 2, 2, seed=1).items():
        setattr(model, name, value)
    return model


def _gmm_fit_rank(rank: int, world: int) -> list[list[np.ndarray]]:
    import torch.distributed as dist

    X, lengths = _sharded_data()
    half = len(X) // 2
    fitted = []
    for covariance_type in COVARIANCE_TYPES:
        model = _started_gmmhmm(covariance_type)
        model.fit(X[rank * half : (rank + 1) * half], lengths[:2], group=dist.group.WORLD)
        fitted.append([model.weights_, model.means_, model.covars_])
    return fitted


def test_distributed_fit_equals_one_process_fit():
    """GMMHMM.fit(group=) over 2 gloo ranks, each with half of the sequences, ends with the one-process model."""
    results = run_ranks(_gmm_fit_rank, 2, timeout=120)
    X, lengths = _sharded_data()
    for covariance_type, got in zip(COVARIANCE_TYPES, results[0], strict=True):
        ref = _started_gmmhmm(covariance_type).fit(X, lengths)
        for a, b in zip(got, (ref.weights_, ref.means_, ref.covars_), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12, err_msg=covariance_type)


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_component_without_posterior_mass_keeps_its_parameters(covariance_type):
    emission = _emission(covariance_type, 2, 2, 2, seed=3)
    before = {name: getattr(emission, name) for name in ("means_", "covars_")}
    x = torch.randn(10, 2, dtype=torch.float64) + 1e3  # far from every component but the fixed one
    weights = torch.zeros(10, 2, dtype=torch.float64)  # state 1 sees nothing
    weights[:, 0] = 1
    emission.m_step(x, weights, params="mc")
    torch.testing.assert_close(emission.means_[1], before["means_"][1])
    torch.testing.assert_close(emission.covars_[1], before["covars_"][1])
    assert bool(torch.isfinite(emission.covars_).all())


class _LogProb(torch.nn.Module):
    """An emission's log_prob as a module's forward (for torch.func.functional_call)."""

    def __init__(self, emission: GMMEmission) -> None:
        super().__init__()
        self.emission = emission

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.emission.log_prob(x)


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_log_prob_gradcheck(covariance_type):
    emission = _emission(covariance_type, 2, 2, 2, seed=11)
    x = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    names = [f"emission.{name}" for name, _ in emission.named_parameters()]
    values = [p.detach().clone().requires_grad_(True) for p in emission.parameters()]
    module = _LogProb(emission)

    def f(x: torch.Tensor, *values: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(module, dict(zip(names, values, strict=True)), (x,))

    assert torch.autograd.gradcheck(f, (x, *values))


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_samples_have_the_mixture_moments(device, covariance_type):
    emission = _emission(covariance_type, 2, 3, 2, seed=4, device=device)
    g = torch.Generator(device=device).manual_seed(0)
    x = emission.sample(torch.ones(200, 200, dtype=torch.long, device=device), g).reshape(-1, 2).cpu().numpy()
    w, mu = emission.weights_[1].cpu().numpy(), emission.means_[1].cpu().numpy()
    covs = [_matrix(covariance_type, emission.covars_.cpu().numpy(), 1, m, 2) for m in range(3)]
    mean = w @ mu
    cov = sum(w[m] * (covs[m] + np.outer(mu[m] - mean, mu[m] - mean)) for m in range(3))
    np.testing.assert_allclose(x.mean(0), mean, atol=0.05)
    np.testing.assert_allclose(np.cov(x.T), cov, atol=0.1, rtol=0.05)


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_generate_sample_from_state_draws_as_hmmlearn(covariance_type):
    hmmlearn_hmm = pytest.importorskip("hmmlearn.hmm")
    C, M, D = 2, 3, 2
    models = [
        hmmlearn_hmm.GMMHMM(C, n_mix=M, covariance_type=covariance_type),
        GMMHMM(C, M, covariance_type=covariance_type),
    ]
    for model in models:
        model.n_features = D
        for name, value in _parameters(covariance_type, C, M, D, seed=6).items():
            setattr(model, name, value)
    ref, ours = ([m._generate_sample_from_state(s, np.random.RandomState(3)) for s in (0, 1)] for m in models)
    np.testing.assert_array_equal(np.array(ours), np.array(ref))


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_init_is_hmmlearns(covariance_type):
    rng = np.random.RandomState(0)
    X = np.concatenate([rng.normal(size=(60, 2)) * 0.3 + [0, 0], rng.normal(size=(3, 2)) * 0.3 + [8, 8]])
    model = GMMHMM(2, n_mix=4, covariance_type=covariance_type, random_state=0, n_iter=0)
    model._init(X)
    assert model.weights_.shape == (2, 4) and np.allclose(model.weights_, 0.25)
    # one cluster of 60 points: k-means means inside it; the 3-point cluster: draws around the centres' mean
    assert model.means_.shape == (2, 4, 2)
    cv = np.cov(X.T) + 1e-3 * np.eye(2)
    expected = {
        "spherical": np.full((2, 4), np.diag(cv).mean()),
        "diag": np.broadcast_to(np.diag(cv), (2, 4, 2)),
        "full": np.broadcast_to(cv, (2, 4, 2, 2)),
        "tied": np.broadcast_to(cv, (2, 2, 2)),
    }[covariance_type]
    np.testing.assert_allclose(model.covars_, expected, rtol=1e-12)
    assert model.covars_prior.shape == mixture_covars_shape(covariance_type, 2, 4, 2)  # hmmlearn's broadcast priors
    model.n_iter = 3
    model.fit(X)
    assert np.isfinite(model.score(X))


def test_bad_input_raises_naming_the_argument():
    emission = GMMEmission(2, 3, 2, "full").double()
    with pytest.raises(ValueError, match=r"weights_ has shape \(2, 2\); expected \(2, 3\)"):
        emission.weights_ = np.full((2, 2), 0.5)
    with pytest.raises(ValueError, match="weights_ must sum to 1"):
        emission.weights_ = np.full((2, 3), 0.5)
    with pytest.raises(ValueError, match=r"means_ has shape \(2, 2\); expected .*\(2, 3, 2\)"):
        emission.means_ = np.zeros((2, 2))
    with pytest.raises(ValueError, match=r"covars_ has shape \(2, 2, 2\); covariance_type='full' .* \(2, 3, 2, 2\)"):
        emission.covars_ = np.stack([np.eye(2)] * 2)
    bad = np.broadcast_to(np.eye(2), (2, 3, 2, 2)).copy()
    bad[1, 2] = [[1.0, 2.0], [2.0, 1.0]]
    with pytest.raises(ValueError, match=r"covars_.*positive definite"):
        emission.covars_ = bad
    with pytest.raises(ValueError, match=r"X has shape \(5, 3\)"):
        emission.check(np.zeros((5, 3)), 1)
    with pytest.raises(ValueError, match="n_mix must be a positive int"):
        GMMEmission(2, 0, 2)
    with pytest.raises(ValueError, match="covariance_type must be one of"):
        GMMEmission(2, 1, 2, "bad")
    diag = GMMEmission(2, 1, 2, "diag")
    with pytest.raises(ValueError, match=r"covars_.*positive"):
        diag.covars_ = -np.ones((2, 1, 2))


def test_estimator_check_errors():
    model = GMMHMM(2, n_mix=2, covariance_type="diag")
    for name, value in _parameters("diag", 2, 2, 3, seed=0).items():
        setattr(model, name, value)
    model.startprob_, model.transmat_ = np.full(2, 0.5), np.full((2, 2), 0.5)
    model._check()
    model.covars_ = -model.covars_
    with pytest.raises(ValueError, match="covars_ of covariance_type='diag' must be non-negative"):
        model._check()
    model.covars_ = np.ones((2, 2))
    with pytest.raises(ValueError, match=r"covars_ has shape \(2, 2\); expected \(2, 2, 3\)"):
        model._check()
    model.covariance_type = "bad"
    with pytest.raises(ValueError, match="covariance_type must be one of"):
        model._check()
    model.covariance_type, model.covars_ = "diag", np.ones((2, 2, 3))
    with pytest.raises(ValueError, match=r"X has shape \(4, 2\); GMMHMM expects \(n_samples, 3\)"):
        model.score(np.zeros((4, 2)))
