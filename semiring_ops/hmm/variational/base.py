"""hmmlearn's ``VariationalBaseHMM``: variational Bayes EM for HMMs, the part every emission family shares.

The start vector and each transition row have Dirichlet priors (``startprob_prior_`` (C,),
``transmat_prior_`` (C, C)) and Dirichlet posteriors (``startprob_posterior_``, ``transmat_posterior_``);
each family adds its emission parameters' priors and posteriors. One iteration of ``fit``:

* E-step: forward-backward under the sub-normalised parameters exp(E_q[log θ]) (estep.py, on HMM's
  engine), giving the state posteriors, expected start and transition counts and the sub-normalised
  log-likelihood;
* the evidence lower bound (ELBO) = that log-likelihood − KL(posteriors || priors) (kl.py), recorded by
  ``monitor_`` (so ``monitor_.history`` holds ELBOs, which never decrease, and ``tol`` applies to them);
* M-step: posterior = prior + expected counts for each parameter whose letter is in ``params``; the point
  estimates ``startprob_``, ``transmat_`` and the family's are the posteriors' means (normalised counts).

``score``, ``decode``, ``predict``, ``predict_proba`` and ``sample`` are those of an ordinary HMM with the point
estimates, as hmmlearn (BaseHMM's: on :class:`HMM`; ``sample`` with hmmlearn's numpy draws).

Initialisation (hmmlearn's, same numpy draws): a prior given as None is 1 / n_components (start and
transition rows); the start posterior is Dirichlet(1/C) scaled by the number of sequences, each transition
row Dirichlet(1/C) scaled by n_samples / C, drawn in that order from ``random_state``; then the family's.
"""

from __future__ import annotations

import numpy as np
import torch

from ..emissions.base import ArrayLike
from ..estimators.base import BaseHMM, check_random_state
from ..model import HMM
from .estep import SubnormalisedEStep, SubnormalisedExpectations
from .kl import expected_log_dirichlet, kl_dirichlet

__all__ = ["VariationalBaseHMM"]


def as_tensor(value: ArrayLike) -> torch.Tensor:
    """A float64 CPU tensor of an attribute (numpy array, list or scalar): a copy, made without a torch call
    (torch.from_numpy), since an iteration converts some twenty such attributes."""
    return torch.from_numpy(np.array(value, dtype=np.float64))


class VariationalBaseHMM(BaseHMM):
    """Variational Bayes HMM over an emission family (see the module docstring).

    A family subclasses this *and* its maximum-likelihood estimator (e.g. ``CategoricalHMM``), in that order,
    for the input checks and the HMM of the point estimates, and provides ``_init_emission`` (X),
    ``_check_emission``, ``_subnorm_log_emissions`` (X -> (n_samples, C) E_q[log p(x | state)]),
    ``_emission_m_step`` (X, posteriors), ``_emission_kl`` and ``_point_estimate_names``.
    """

    _point_estimate_names: tuple[str, ...] = ()  # attributes the HMM of the point estimates reads

    def __init__(
        self,
        n_components: int,
        startprob_prior: ArrayLike | float | None,
        transmat_prior: ArrayLike | float | None,
        algorithm: str,
        random_state: int | np.random.RandomState | None,
        n_iter: int,
        tol: float,
        verbose: bool,
        params: str,
        init_params: str,
        implementation: str,
    ) -> None:
        BaseHMM.__init__(
            self,
            n_components,
            startprob_prior,
            transmat_prior,
            algorithm,
            random_state,
            n_iter,
            tol,
            verbose,
            params,
            init_params,
            implementation,
        )

    # ------------------------------------------------------------ initialisation and validation

    def _prior_value(self, prior: ArrayLike | float | None, default: float) -> ArrayLike | float:
        return default if prior is None else prior

    def _init(self, X: np.ndarray, lengths: np.ndarray) -> None:
        """hmmlearn's initialisation before variational EM (module docstring), then the family's."""
        self._check_and_set_n_features(X)
        C = self.n_components
        random_state = check_random_state(self.random_state)
        if self._needs_init("s", "startprob_posterior_") or self._needs_init("s", "startprob_prior_"):
            self.startprob_prior_ = np.full(C, self._prior_value(self.startprob_prior, 1 / C), dtype=float)
            self.startprob_posterior_ = random_state.dirichlet(np.full(C, 1 / C)) * len(lengths)
        if self._needs_init("t", "transmat_posterior_") or self._needs_init("t", "transmat_prior_"):
            self.transmat_prior_ = np.full((C, C), self._prior_value(self.transmat_prior, 1 / C), dtype=float)
            self.transmat_posterior_ = random_state.dirichlet(np.full(C, 1 / C), size=C) * (len(X) / C)
        self._warn_if_degenerate(X)
        self._init_emission(X)

    def _check_positive(self, name: str, shape: tuple[int, ...], what: str, floor: float = 0.0) -> None:
        """Attribute `name` must exist with `shape` and hold finite values above `floor`; stored as float64 (a
        Python float when `shape` is ())."""
        self._require(name)
        self._check_array(name, shape, what)
        value = np.asarray(getattr(self, name), dtype=np.float64)
        if not (np.isfinite(value).all() and (value > floor).all()):
            raise ValueError(f"{name} must hold finite values above {floor}, got {value.tolist()}")
        setattr(self, name, value if value.ndim else float(value))

    def _check(self) -> None:
        """The priors and posteriors of start and transitions: shapes (C,) and (C, C), positive; then the family's."""
        C = self.n_components
        for name in ("startprob_prior_", "startprob_posterior_"):
            self._check_positive(name, (C,), "n_components,")
        for name in ("transmat_prior_", "transmat_posterior_"):
            self._check_positive(name, (C, C), "n_components, n_components")
        self._check_emission()

    def _model(self) -> HMM:
        """The HMM of the point estimates, which score, decode, predict and predict_proba run on."""
        self._require("startprob_", "transmat_", *self._point_estimate_names)
        return super()._model()

    # ------------------------------------------------------------ variational EM

    def fit(self, X: ArrayLike, lengths: ArrayLike | int | None = None) -> VariationalBaseHMM:
        """Initialise (``init_params``) and run up to ``n_iter`` iterations of variational EM on the concatenated
        sequences X (lengths: their lengths, None: one sequence), updating the posteriors of ``params``;
        ``monitor_`` records the ELBO before each M-step and stops at a gain below ``tol``. Returns self."""
        X = self._check_X(X)
        lengths = np.asarray([len(X)]) if lengths is None else self._lengths(lengths)
        self._init(X, lengths)
        self._check()
        self.monitor_._reset()
        e_step = SubnormalisedEStep(self.n_components, lengths, len(X))  # made once, run every iteration
        for _ in range(self.n_iter):
            e = self._e_step(X, e_step)
            lower_bound = e.log_prob - float(self._kl_divergence())
            self._m_step(X, e)
            self.monitor_.report(lower_bound)  # prints hmmlearn's line when verbose
            if self.monitor_.converged:
                break
        return self

    def _e_step(self, X: np.ndarray, e_step: SubnormalisedEStep) -> SubnormalisedExpectations:
        # start and transition rows share their length C: one (C + 1, C) batch
        rows = expected_log_dirichlet(as_tensor(np.vstack([self.startprob_posterior_, self.transmat_posterior_])))
        return e_step(rows[0], rows[1:], self._subnorm_log_emissions(X))

    def _kl_divergence(self) -> torch.Tensor:
        """KL(posteriors || priors) of every parameter: start, transition rows and the family's."""
        q = as_tensor(np.vstack([self.startprob_posterior_, self.transmat_posterior_]))  # start row, then transitions
        p = as_tensor(np.vstack([self.startprob_prior_, self.transmat_prior_]))
        return kl_dirichlet(q, p).sum() + self._emission_kl()

    def _m_step(self, X: np.ndarray, e: SubnormalisedExpectations) -> None:
        if "s" in self.params:
            self.startprob_posterior_ = self.startprob_prior_ + e.starts.numpy()
            self.startprob_ = self.startprob_posterior_ / self.startprob_posterior_.sum()
        if "t" in self.params:
            self.transmat_posterior_ = self.transmat_prior_ + e.transitions.numpy()
            self.transmat_ = self.transmat_posterior_ / self.transmat_posterior_.sum(axis=1, keepdims=True)
        self._emission_m_step(X, e.posteriors)

    # ------------------------------------------------------------ the family's part

    def _init_emission(self, X: np.ndarray) -> None:
        raise NotImplementedError

    def _check_emission(self) -> None:
        raise NotImplementedError

    def _subnorm_log_emissions(self, X: np.ndarray) -> torch.Tensor:
        raise NotImplementedError

    def _emission_m_step(self, X: np.ndarray, posteriors: torch.Tensor) -> None:
        raise NotImplementedError

    def _emission_kl(self) -> torch.Tensor:
        raise NotImplementedError
