"""semiring_ops.hmm, hmmlearn's CategoricalHMM / GaussianHMM drop-in: agreement with hmmlearn from the same
seed, return types, params / init_params letters, the estimator protocol, and bad input."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from semiring_ops import hmm
from semiring_ops.hmm.emissions.gaussian import COVARIANCE_TYPES

LENGTHS = [40, 1, 25, 34]


def _categorical_data(seed: int = 0) -> np.ndarray:
    truth = hmm.CategoricalHMM(3, n_features=4, random_state=seed)
    truth.startprob_ = np.array([0.6, 0.3, 0.1])
    truth.transmat_ = np.array([[0.8, 0.1, 0.1], [0.2, 0.7, 0.1], [0.1, 0.2, 0.7]])
    truth.emissionprob_ = np.array([[0.7, 0.1, 0.1, 0.1], [0.1, 0.6, 0.2, 0.1], [0.05, 0.05, 0.2, 0.7]])
    return truth.sample(sum(LENGTHS))[0]


def _gaussian_model(covariance_type: str, n_components: int = 3, **kwargs) -> hmm.GaussianHMM:
    model = hmm.GaussianHMM(n_components, covariance_type, **kwargs)
    rng = np.random.default_rng(3)
    model.startprob_ = np.full(n_components, 1 / n_components)
    model.transmat_ = np.full((n_components, n_components), 0.1) + 0.7 * np.eye(n_components)
    model.transmat_ /= model.transmat_.sum(1, keepdims=True)
    model.means_ = np.array([[0.0, 0.0], [6.0, 0.0], [0.0, 6.0]])[:n_components]
    full = np.array([[1.0, 0.3], [0.3, 0.5]])
    model.covars_ = {
        "spherical": rng.uniform(0.5, 1.0, n_components),
        "diag": rng.uniform(0.5, 1.0, (n_components, 2)),
        "full": np.stack([full * (1 + i) for i in range(n_components)]),
        "tied": full,
    }[covariance_type]
    return model


# ---------------------------------------------------------------------------------------------- hmmlearn


@pytest.mark.parametrize("implementation", ["log", "scaling"])
def test_categorical_from_the_same_seed_is_hmmlearns_model(implementation):
    """Same random_state: hmmlearn's initial draws, then the same EM, scores and decodings."""
    hmmlearn = pytest.importorskip("hmmlearn.hmm")
    X = _categorical_data()
    kwargs = dict(n_components=3, random_state=7, n_iter=6, tol=-np.inf, implementation=implementation)
    ours, ref = hmm.CategoricalHMM(**kwargs).fit(X, LENGTHS), hmmlearn.CategoricalHMM(**kwargs).fit(X, LENGTHS)
    assert ours.n_features == ref.n_features == 4
    for name in ("startprob_", "transmat_", "emissionprob_"):
        np.testing.assert_allclose(getattr(ours, name), getattr(ref, name), rtol=1e-9, atol=1e-13, err_msg=name)
    np.testing.assert_allclose(list(ours.monitor_.history), list(ref.monitor_.history), rtol=1e-10)
    np.testing.assert_allclose(ours.score(X, LENGTHS), ref.score(X, LENGTHS), rtol=1e-10)
    np.testing.assert_allclose(ours.predict_proba(X, LENGTHS), ref.predict_proba(X, LENGTHS), atol=1e-10)
    for algorithm in ("viterbi", "map"):
        log_prob, states = ours.decode(X, LENGTHS, algorithm=algorithm)
        ref_log_prob, ref_states = ref.decode(X, LENGTHS, algorithm=algorithm)
        np.testing.assert_allclose(log_prob, ref_log_prob, rtol=1e-10)
        assert np.mean(states == ref_states) > 0.95  # exactly tied paths may be broken either way


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_gaussian_from_the_same_seed_is_hmmlearns_model(covariance_type):
    """init_params="st": hmmlearn's Dirichlet draws for start and transitions, then the same EM."""
    hmmlearn = pytest.importorskip("hmmlearn.hmm")
    X, _ = _gaussian_model(covariance_type).sample(sum(LENGTHS), random_state=1)
    models = []
    for module in (hmm, hmmlearn):
        model = _gaussian_model(covariance_type)  # means and covariances set; start / transitions drawn
        ref = module.GaussianHMM(3, covariance_type, random_state=5, n_iter=4, tol=-np.inf, init_params="st")
        ref.means_, ref.covars_ = model.means_, model._covars_
        models.append(ref.fit(X, LENGTHS))
    ours, ref = models
    for name in ("startprob_", "transmat_", "means_"):
        np.testing.assert_allclose(getattr(ours, name), getattr(ref, name), rtol=1e-8, err_msg=name)
    ref_covars = ref._covars_[:, 0] if covariance_type == "spherical" else ref._covars_  # hmmlearn tiles these
    np.testing.assert_allclose(ours._covars_, ref_covars, rtol=1e-8)
    np.testing.assert_allclose(ours.score(X, LENGTHS), ref.score(X, LENGTHS), rtol=1e-10)


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_gaussian_initialisation_follows_hmmlearn(covariance_type):
    """k-means means (the same clusters as scikit-learn's on separated data) and the data's covariance +
    min_covar (spherical: its mean variance; hmmlearn averages every entry of the matrix)."""
    hmmlearn = pytest.importorskip("hmmlearn.hmm")
    X, _ = _gaussian_model("diag").sample(300, random_state=2)
    ours, ref = (m.GaussianHMM(3, covariance_type, random_state=0, n_iter=0) for m in (hmm, hmmlearn))
    ours.fit(X), ref.fit(X)
    np.testing.assert_allclose(np.sort(ours.means_, axis=0), np.sort(ref.means_, axis=0), atol=1e-8)
    cv = np.cov(X.T) + 1e-3 * np.eye(2)
    want = {"spherical": np.full(3, np.trace(cv) / 2), "diag": np.tile(np.diag(cv), (3, 1)), "tied": cv}
    np.testing.assert_allclose(ours._covars_, want.get(covariance_type, np.stack([cv] * 3)), rtol=1e-10)
    if covariance_type != "spherical":
        np.testing.assert_allclose(ours._covars_, ref._covars_, rtol=1e-10)
    np.testing.assert_allclose(ours.startprob_, ref.startprob_, rtol=1e-12)


# ---------------------------------------------------------------------------------------------- interface


def test_results_are_numpy_and_python_floats():
    model = _gaussian_model("full")
    X, states = model.sample(30, random_state=0)
    assert isinstance(X, np.ndarray) and X.shape == (30, 2) and X.dtype == np.float64
    assert isinstance(states, np.ndarray) and states.shape == (30,) and np.issubdtype(states.dtype, np.integer)
    assert isinstance(model.score(X), float)
    log_prob, posteriors = model.score_samples(X)
    assert isinstance(log_prob, float) and posteriors.shape == (30, 3)
    np.testing.assert_allclose(posteriors.sum(1), 1.0)
    log_prob, path = model.decode(X, algorithm="map")
    assert isinstance(log_prob, float) and path.shape == (30,)
    assert model.covars_.shape == (3, 2, 2) and model._covars_.flags.writeable
    assert np.isclose(model.aic(X), -2 * model.score(X) + 2 * (2 + 6 + 6 + 9))
    assert np.isclose(model.bic(X), -2 * model.score(X) + (2 + 6 + 6 + 9) * np.log(30))
    pi = model.get_stationary_distribution()
    np.testing.assert_allclose(pi @ model.transmat_, pi, atol=1e-12)
    symbols, _ = hmm.CategoricalHMM(2, n_features=3, random_state=0).fit(np.array([[0], [2], [1], [2]])).sample(5)
    assert symbols.shape == (5, 1) and np.issubdtype(symbols.dtype, np.integer)


def test_samples_are_seeded_and_start_at_currstate():
    model = _gaussian_model("tied")
    a, sa = model.sample(20, random_state=3)
    b, sb = model.sample(20, random_state=np.random.RandomState(3))
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(sa, sb)
    _, states = model.sample(50, random_state=0, currstate=2)
    assert states[0] == 2
    with pytest.raises(ValueError, match=r"currstate must lie in 0..2, got 3"):
        model.sample(5, currstate=3)


def test_params_letters_select_what_em_updates(caplog):
    X = _categorical_data()
    model = hmm.CategoricalHMM(3, params="e", init_params="", n_iter=3, random_state=0)
    model.startprob_ = start = np.array([0.5, 0.25, 0.25])
    model.transmat_ = trans = np.full((3, 3), 1 / 3)
    model.emissionprob_ = emis = np.full((3, 4), 0.25) + np.array([[0.05, -0.05, 0, 0], [0, 0.05, -0.05, 0], [0] * 4])
    model.fit(X, LENGTHS)
    assert model.startprob_ is start and model.transmat_ is trans  # untouched, not even rounded
    assert not np.allclose(model.emissionprob_, emis)
    with caplog.at_level(logging.WARNING):
        hmm.CategoricalHMM(3, init_params="s", n_iter=1, random_state=0).set_params().fit(X, LENGTHS)
        assert not any("overwritten" in r.getMessage() for r in caplog.records)  # nothing was set yet
        model.init_params = "st"
        model.fit(X, LENGTHS)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("startprob_ is set, but it will be overwritten" in m for m in messages) == 1
    assert sum("transmat_ is set, but it will be overwritten" in m for m in messages) == 1


def test_custom_monitor_decides_convergence():
    class StopAtOnce(hmm.ConvergenceMonitor):
        @property
        def converged(self) -> bool:
            return self.iter >= 2

    model = hmm.CategoricalHMM(3, n_iter=50, random_state=0)
    model.monitor_ = StopAtOnce(model.monitor_.tol, model.monitor_.n_iter, model.monitor_.verbose)
    model.fit(_categorical_data(), LENGTHS)
    assert model.monitor_.iter == 2 and len(model.monitor_.history) == 2


def test_estimator_protocol():
    model = hmm.GaussianHMM(2, "full", n_iter=5, random_state=0)
    params = model.get_params()
    assert params["covariance_type"] == "full" and params["n_iter"] == 5 and "n_features" not in params
    assert model.set_params(tol=0.5, params="mc") is model and model.tol == 0.5
    shown = "covariance_type='full', n_components=2, n_iter=5, params='mc', random_state=0, tol=0.5"
    assert repr(model) == f"GaussianHMM({shown})"
    with pytest.raises(ValueError, match="invalid parameter 'n_mix'"):
        model.set_params(n_mix=2)
    base = pytest.importorskip("sklearn.base")
    clone = base.clone(model)
    assert clone.get_params() == model.get_params() and not hasattr(clone, "startprob_")


def test_n_iter_zero_only_initialises():
    X, _ = _gaussian_model("diag").sample(60, random_state=0)
    model = hmm.GaussianHMM(3, "diag", n_iter=0, random_state=0).fit(X)
    assert model.monitor_.iter == 0 and model.means_.shape == (3, 2) and model.n_features == 2


# ---------------------------------------------------------------------------------------------- bad input


def test_bad_parameters_name_the_argument_and_shapes():
    model = hmm.CategoricalHMM(2, n_features=3)
    with pytest.raises(hmm.NotFittedError, match="no startprob_"):
        model.score([[0]])
    model.startprob_, model.transmat_ = np.array([0.5, 0.3, 0.2]), np.full((2, 2), 0.5)
    model.emissionprob_ = np.full((2, 3), 1 / 3)
    with pytest.raises(ValueError, match=r"startprob_ has shape \(3,\); expected \(2,\)"):
        model.score([[0]])
    model.startprob_ = np.array([0.6, 0.6])
    with pytest.raises(ValueError, match=r"startprob_ must sum to 1"):
        model.score([[0]])
    model.startprob_ = np.array([0.5, 0.5])
    model.emissionprob_ = np.full((2, 4), 0.25)
    with pytest.raises(ValueError, match=r"emissionprob_ has shape \(2, 4\); expected \(2, 3\)"):
        model.score([[0]])
    model.emissionprob_ = np.full((2, 3), 1 / 3)
    model.transmat_ = np.full((3, 3), 1 / 3)
    with pytest.raises(ValueError, match=r"transmat_ has shape \(3, 3\); expected \(2, 2\)"):
        model.score([[0]])
    model.transmat_ = np.full((2, 2), 0.5)
    with pytest.raises(ValueError, match=r"X has shape \(4, 2\); CategoricalHMM expects integer symbols"):
        model.score(np.zeros((4, 2), dtype=int))
    with pytest.raises(ValueError, match=r"X has shape \(0, 1\)"):
        model.fit(np.zeros((0, 1), dtype=int))
    with pytest.raises(ValueError, match=r"X must hold integer symbols, got dtype float64"):
        model.fit([[0.0], [1.0]])
    with pytest.raises(ValueError, match=r"X has a symbol 3 \(shape \(2, 1\)\); n_features=3 allows 0..2"):
        model.fit([[0], [3]])
    with pytest.raises(ValueError, match=r"lengths sum to 3 but X has n_samples=2"):
        model.score([[0], [1]], [1, 2])
    with pytest.raises(ValueError, match="algorithm must be one of"):
        model.decode([[0]], algorithm="beam")
    with pytest.raises(ValueError, match="random_state must be None, an int or a numpy RandomState, got 'x'"):
        hmm.CategoricalHMM(2, random_state="x").fit([[0], [1]])
    for bad in (dict(algorithm="beam"), dict(implementation="fast"), dict(n_components=0)):
        with pytest.raises(ValueError):
            hmm.CategoricalHMM(**{"n_components": 2, **bad})


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_bad_gaussian_parameters_name_the_argument_and_shapes(covariance_type):
    model = _gaussian_model(covariance_type)
    X, _ = model.sample(10, random_state=0)
    with pytest.raises(ValueError, match=r"X has shape \(10, 3\); GaussianHMM expects \(n_samples, 2\)"):
        model.score(np.hstack([X, X[:, :1]]))
    with pytest.raises(ValueError, match=r"X \(shape \(2, 2\)\) has non-finite values"):
        model.score([[0.0, np.nan], [1.0, 1.0]])
    wrong = {"spherical": np.ones(4), "diag": np.ones((3, 3)), "full": np.ones((3, 2)), "tied": np.eye(3)}
    message = rf"covars_ has shape \(.*\); covariance_type='{covariance_type}' expects \(.*\)"
    with pytest.raises(ValueError, match=message):
        model._covars_ = wrong[covariance_type]
        model.score(X)
    model = _gaussian_model(covariance_type)
    model.means_ = np.zeros((2, 2))
    with pytest.raises(ValueError, match=r"means_ has shape \(2, 2\); expected \(n_components=3, D\)"):
        model.score(X)
    with pytest.raises(ValueError, match="covariance_type must be one of"):
        hmm.GaussianHMM(2, "block")
