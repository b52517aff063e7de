"""semiring_ops.hmm.base: BaseHMM subclassed through hmmlearn's hooks (beside our torch families), hmmlearn's
ConvergenceMonitor, DECODER_ALGORITHMS and utils, and sampling that gives hmmlearn's sequences for a seed."""

from __future__ import annotations

import io
import logging
import math
from collections import deque

import numpy as np
import pytest

from semiring_ops import hmm
from semiring_ops.hmm import HMM, utils
from semiring_ops.hmm.base import DECODER_ALGORITHMS, BaseHMM, ConvergenceMonitor

LENGTHS = [30, 1, 45, 24]


# ---------------------------------------------------------------------------------------------- a hook-based family


class _ExponentialHooks:
    """Exponential emissions (rate per state) written only against hmmlearn's hooks, in numpy: mixed into our
    BaseHMM and into hmmlearn's, the two must agree."""

    def _get_n_fit_scalars_per_param(self):
        C = self.n_components
        return {"s": C - 1, "t": C * (C - 1), "r": C}

    def _init(self, X, lengths=None):
        super()._init(X, lengths)
        if self._needs_init("r", "rates_"):
            self.rates_ = 1.0 / (X.mean() * np.linspace(0.5, 1.5, self.n_components))

    def _check(self):
        super()._check()
        self.rates_ = np.asarray(self.rates_, dtype=float)
        if self.rates_.shape != (self.n_components,):
            raise ValueError("rates_ must have shape (n_components,)")

    def _compute_log_likelihood(self, X):
        return np.log(self.rates_) - X * self.rates_

    def _generate_sample_from_state(self, state, random_state):
        return [random_state.exponential(1 / self.rates_[state])]

    def _initialize_sufficient_statistics(self):
        stats = super()._initialize_sufficient_statistics()
        stats["post"], stats["obs"] = np.zeros(self.n_components), np.zeros(self.n_components)
        return stats

    def _accumulate_sufficient_statistics(self, stats, X, lattice, posteriors, fwdlattice, bwdlattice):
        super()._accumulate_sufficient_statistics(stats, X, lattice, posteriors, fwdlattice, bwdlattice)
        self.calls.append(tuple((type(a), np.shape(a)) for a in (X, lattice, posteriors, fwdlattice, bwdlattice)))
        if "r" in self.params:
            stats["post"] += posteriors.sum(0)
            stats["obs"] += posteriors.T @ X[:, 0]

    def _do_mstep(self, stats):
        super()._do_mstep(stats)
        if "r" in self.params:
            self.rates_ = stats["post"] / stats["obs"]


class ExponentialHMM(_ExponentialHooks, BaseHMM):
    calls: list


def _exponential_data() -> np.ndarray:
    truth = ExponentialHMM(3, random_state=0)
    truth.startprob_, truth.transmat_ = np.array([0.5, 0.3, 0.2]), np.full((3, 3), 0.1) + 0.7 * np.eye(3)
    truth.rates_ = np.array([0.2, 1.0, 5.0])
    return truth.sample(sum(LENGTHS))[0]


@pytest.mark.parametrize("implementation", ["log", "scaling"])
def test_a_hook_based_subclass_fits_as_hmmlearns(implementation):
    """hmmlearn's hooks get hmmlearn's numpy arguments (one call per sequence), and fit, score, decode and
    sample agree with hmmlearn's BaseHMM running the same hooks."""
    base = pytest.importorskip("hmmlearn.base")

    class Reference(_ExponentialHooks, base.BaseHMM):
        calls: list

    X = _exponential_data()
    kwargs = dict(n_components=3, random_state=1, n_iter=8, tol=-np.inf, implementation=implementation)
    kwargs.update(params="str", init_params="str")  # hmmlearn counts free scalars of every letter in params
    ours, ref = ExponentialHMM(**kwargs), Reference(**kwargs)
    ours.calls, ref.calls = [], []
    ours.fit(X, LENGTHS), ref.fit(X, LENGTHS)
    assert ours.calls == ref.calls and len(ours.calls) == 8 * len(LENGTHS)
    for name in ("startprob_", "transmat_", "rates_"):
        np.testing.assert_allclose(getattr(ours, name), getattr(ref, name), rtol=1e-9, err_msg=name)
    assert isinstance(ours.monitor_.history, deque)
    np.testing.assert_allclose(list(ours.monitor_.history), list(ref.monitor_.history), rtol=1e-10)
    np.testing.assert_allclose(ours.score(X, LENGTHS), ref.score(X, LENGTHS), rtol=1e-10)
    np.testing.assert_allclose(ours.predict_proba(X, LENGTHS), ref.predict_proba(X, LENGTHS), atol=1e-10)
    for algorithm in sorted(DECODER_ALGORITHMS):
        log_prob, states = ours.decode(X, LENGTHS, algorithm=algorithm)
        ref_log_prob, ref_states = ref.decode(X, LENGTHS, algorithm=algorithm)
        np.testing.assert_allclose(log_prob, ref_log_prob, rtol=1e-10)
        np.testing.assert_array_equal(states, ref_states)
    ref.startprob_, ref.transmat_, ref.rates_ = ours.startprob_, ours.transmat_, ours.rates_  # equal to rounding
    for a, b in zip(ours.sample(40, random_state=5), ref.sample(40, random_state=5), strict=True):
        np.testing.assert_array_equal(a, b)
    assert ours.aic(X, LENGTHS) == pytest.approx(ref.aic(X, LENGTHS))


def test_hook_scored_models_run_on_the_torch_hmm(monkeypatch):
    """score / decode of a hook-scored class go through HMM with log_emissions= (no emission model)."""
    model = ExponentialHMM(3)
    model.startprob_, model.transmat_, model.rates_ = np.full(3, 1 / 3), np.full((3, 3), 1 / 3), np.array([1.0, 2, 3])
    seen = []
    original = HMM.score
    monkeypatch.setattr(HMM, "score", lambda self, *a, **k: seen.append((self.emission, k)) or original(self, *a, **k))
    X = np.array([[0.5], [0.1], [2.0]])
    expected = np.logaddexp.reduce(model._compute_log_likelihood(X) + np.log(1 / 3), axis=1).sum()
    assert model.score(X) == pytest.approx(expected)
    assert seen[0][0] is None and seen[0][1]["log_emissions"].shape == (3, 3)


def test_our_families_keep_the_torch_path_and_super_hooks_keep_full_em():
    """GaussianHMM is fitted by HMM.fit; a subclass overriding _do_mstep (calling super) goes through the hooks
    and still re-estimates means and covariances: the same model."""
    calls = []

    class Logged(hmm.GaussianHMM):
        def _do_mstep(self, stats):
            calls.append(sorted(stats))
            super()._do_mstep(stats)

    truth = hmm.GaussianHMM(2, "full")
    truth.startprob_, truth.transmat_ = np.array([0.6, 0.4]), np.array([[0.9, 0.1], [0.2, 0.8]])
    truth.means_, truth.covars_ = np.array([[0.0, 0.0], [4.0, 1.0]]), np.stack([np.eye(2), [[1.0, 0.5], [0.5, 1.0]]])
    X = truth.sample(200, random_state=0)[0]
    kwargs = dict(n_components=2, covariance_type="full", n_iter=5, tol=-np.inf, random_state=3)
    fast, hooked = hmm.GaussianHMM(**kwargs).fit(X, [120, 80]), Logged(**kwargs).fit(X, [120, 80])
    assert not fast._fitted_by_hooks() and hooked._fitted_by_hooks() and not hooked._scored_by_hooks()
    assert len(calls) == 5 and calls[0] == ["emission", "nobs", "start", "trans"]
    for name in ("startprob_", "transmat_", "means_", "covars_"):
        np.testing.assert_allclose(getattr(hooked, name), getattr(fast, name), rtol=1e-8, atol=1e-10, err_msg=name)
    np.testing.assert_allclose(list(hooked.monitor_.history), list(fast.monitor_.history), rtol=1e-10)
    assert hooked._compute_log_likelihood(X[:5]).shape == (5, 2)


def test_a_bare_base_samples_states_and_asks_for_the_likelihood():
    model = BaseHMM(2, random_state=0)
    assert model.get_params()["params"] == model.get_params()["init_params"] and model.n_iter == 10
    model.startprob_, model.transmat_ = [0.5, 0.5], [[0.9, 0.1], [0.1, 0.9]]
    X, states = model.sample(10)
    assert X.shape == (10, 0) and states.shape == (10,)
    with pytest.raises(NotImplementedError, match="must implement _compute_log_likelihood"):
        model.score(np.zeros((3, 1)))


# ---------------------------------------------------------------------------------------------- sampling parity


def _pair(kind: str, covariance_type: str = "diag"):
    learn = pytest.importorskip("hmmlearn.hmm")
    C = 3
    start, trans = np.array([0.5, 0.3, 0.2]), np.array([[0.8, 0.1, 0.1], [0.2, 0.7, 0.1], [0.1, 0.2, 0.7]])
    if kind == "categorical":
        models = hmm.CategoricalHMM(C, n_features=4), learn.CategoricalHMM(C, n_features=4)
        emission = {"emissionprob_": np.array([[0.7, 0.1, 0.1, 0.1], [0.1, 0.6, 0.2, 0.1], [0.05, 0.05, 0.2, 0.7]])}
    else:
        models = hmm.GaussianHMM(C, covariance_type), learn.GaussianHMM(C, covariance_type)
        full = np.array([[1.0, 0.3], [0.3, 0.5]])
        covars = {
            "spherical": np.array([0.5, 1.0, 2.0]),
            "diag": np.array([[0.5, 1.0], [1.0, 0.2], [2.0, 2.0]]),
            "full": np.stack([full * (1 + i) for i in range(C)]),
            "tied": full,
        }[covariance_type]
        emission = {"means_": np.array([[0.0, 0.0], [5.0, 0.0], [0.0, 5.0]]), "covars_": covars}
    for model in models:
        model.startprob_, model.transmat_ = start, trans
        for name, value in emission.items():
            setattr(model, name, value)
    return models


@pytest.mark.parametrize(
    ("kind", "covariance_type"),
    [("categorical", None), *(("gaussian", t) for t in ("spherical", "diag", "full", "tied"))],
)
def test_a_seed_gives_hmmlearns_samples(kind, covariance_type):
    ours, ref = _pair(kind, covariance_type)
    for seed in (0, 7):
        for a, b in zip(ours.sample(60, random_state=seed), ref.sample(60, random_state=seed), strict=True):
            np.testing.assert_array_equal(a, b)
            assert a.dtype == b.dtype and a.shape == b.shape
    # a shared RandomState continues where it was, currstate starts the path, self.random_state is the default
    mine, theirs = np.random.RandomState(3), np.random.RandomState(3)
    for _ in range(2):
        a, b = ours.sample(20, random_state=mine, currstate=2), ref.sample(20, random_state=theirs, currstate=2)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
    ours.random_state = ref.random_state = 11
    np.testing.assert_array_equal(ours.sample(15)[0], ref.sample(15)[0])


# ---------------------------------------------------------------------------------------------- monitor, utils


def test_monitor_is_hmmlearns(capsys, caplog):
    monitor = ConvergenceMonitor(tol=1e-3, n_iter=10, verbose=True)
    assert monitor._template == "{iter:>10d} {log_prob:>16.8f} {delta:>+16.8f}"
    for log_prob in (-3.0, -2.0, -2.5):
        with caplog.at_level(logging.WARNING):
            monitor.report(log_prob)
    out, err = capsys.readouterr()
    expected = [
        monitor._template.format(iter=1, log_prob=-3.0, delta=np.nan),
        monitor._template.format(iter=2, log_prob=-2.0, delta=1.0),
        monitor._template.format(iter=3, log_prob=-2.5, delta=-0.5),
    ]
    assert not out and err.splitlines() == expected
    assert [r.getMessage().startswith("EM is not converging") for r in caplog.records] == [True]
    assert list(monitor.history) == [-3.0, -2.0, -2.5] and monitor.iter == 3 and monitor.converged
    assert repr(monitor).startswith("ConvergenceMonitor(\n    history=[-3.0, -2.0, -2.5],\n    iter=3,\n")
    monitor._reset()
    assert monitor.iter == 0 and not monitor.history and not monitor.converged


def test_verbose_fit_prints_the_monitors_lines_above_the_bar(capsys):
    model = hmm.CategoricalHMM(2, n_features=3, n_iter=3, tol=-math.inf, verbose=True, random_state=0)
    model.fit(np.array([[0], [1], [2], [1], [0], [2]]))
    rows = [r for r in capsys.readouterr().err.replace("\r", "\n").splitlines() if r.strip()]
    lines = [r for r in rows if not r.startswith("EM [")]
    assert [int(r.split()[0]) for r in lines] == [1, 2, 3] and any(r.startswith("EM [") for r in rows)
    stream = io.StringIO()  # HMM.fit(stream=): the lines go there, above the bar
    HMM(2, n_symbols=3).double().fit(np.array([[0], [1], [2]]), n_iter=2, tol=-math.inf, verbose=True, stream=stream)
    assert sum(r.split()[0] in ("1", "2") for r in stream.getvalue().replace("\r", "\n").splitlines() if r) == 2
    assert capsys.readouterr().err == ""


def test_decoder_algorithms_and_utils_are_hmmlearns():
    learn = pytest.importorskip("hmmlearn.base")
    learn_utils = pytest.importorskip("hmmlearn.utils")
    assert DECODER_ALGORITHMS == learn.DECODER_ALGORITHMS
    rng = np.random.default_rng(0)
    a = rng.random((6, 4))
    a[2] = 0
    for axis in (None, 0, 1, -1):
        mine, theirs = a.copy(), a.copy()
        with np.errstate(invalid="ignore", divide="ignore"):
            utils.normalize(mine, axis), learn_utils.normalize(theirs, axis)
        np.testing.assert_array_equal(np.isnan(mine), np.isnan(theirs))
        np.testing.assert_allclose(mine, theirs, rtol=1e-15)
    logs = np.log(rng.random((5, 3)))
    logs[1, 0] = -np.inf
    for axis in (None, 0, 1):
        mine, theirs = logs.copy(), logs.copy()
        utils.log_normalize(mine, axis), learn_utils.log_normalize(theirs, axis)
        np.testing.assert_allclose(mine, theirs, rtol=1e-14)
    single = np.full((4, 1), -np.inf)
    utils.log_normalize(single, axis=1)
    assert (single == 0).all()
    covars = {"spherical": rng.random(3) + 1, "diag": rng.random((3, 2)) + 1, "tied": np.eye(2), "full": np.ones(1)}
    for covariance_type, value in covars.items():
        np.testing.assert_array_equal(
            utils.fill_covars(value, covariance_type, 3, 2), learn_utils.fill_covars(value, covariance_type, 3, 2)
        )
