"""hmmlearn's ``VariationalCategoricalHMM``: variational Bayes EM with categorical emissions."""

from __future__ import annotations

import numpy as np
import torch

from ..emissions.base import ArrayLike
from ..emissions.categorical import CategoricalEmission
from ..estimators.base import check_random_state
from ..estimators.categorical import CategoricalHMM
from .base import VariationalBaseHMM, as_tensor
from .kl import expected_log_dirichlet, kl_dirichlet

__all__ = ["VariationalCategoricalHMM"]


class VariationalCategoricalHMM(VariationalBaseHMM, CategoricalHMM):
    """HMM with categorical emissions over ``n_features`` symbols, trained by variational Bayes EM
    (hmmlearn's ``VariationalCategoricalHMM``; Beal's thesis, 2003).

    X: integer symbols (n_samples, 1) (or (n_samples,)). Parameter letters "s", "t", "e". Besides the start
    and transition ones (variational/base.py), attributes ``emissionprob_prior_`` / ``emissionprob_posterior_``
    (C, n_features): each state's Dirichlet prior and posterior over the symbols, and ``emissionprob_`` (C,
    n_features), the posterior mean, which ``score`` / ``decode`` / ``sample`` use. ``emissionprob_prior``
    None: 1 / n_features. The emission posterior starts as Dirichlet(prior) rows scaled by n_samples / C,
    drawn from a fresh ``check_random_state(random_state)`` (so an int seed restarts its stream, as hmmlearn).
    """

    _point_estimate_names = ("emissionprob_",)

    def __init__(
        self,
        n_components: int = 1,
        startprob_prior: ArrayLike | float | None = None,
        transmat_prior: ArrayLike | float | None = None,
        emissionprob_prior: ArrayLike | float | None = None,
        n_features: int | None = None,
        algorithm: str = "viterbi",
        random_state: int | np.random.RandomState | None = None,
        n_iter: int = 100,
        tol: float = 1e-6,
        verbose: bool = False,
        params: str = "ste",
        init_params: str = "ste",
        implementation: str = "log",
    ) -> None:
        super().__init__(
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
        self.emissionprob_prior = emissionprob_prior
        self.n_features = n_features

    def _init_emission(self, X: np.ndarray) -> None:
        if not self._needs_init("e", "emissionprob_posterior_"):
            return
        C, V = self.n_components, self.n_features
        prior = np.broadcast_to(np.asarray(self._prior_value(self.emissionprob_prior, 1 / V), dtype=float), (C, V))
        random_state = check_random_state(self.random_state)
        self.emissionprob_prior_ = prior.copy()
        # row by row: the same draws as one dirichlet(row, size=C) call when the rows are equal
        self.emissionprob_posterior_ = np.stack([random_state.dirichlet(row) for row in prior]) * (len(X) / C)

    def _check_emission(self) -> None:
        self._require("emissionprob_prior_", "emissionprob_posterior_")
        prior = np.atleast_2d(self.emissionprob_prior_)
        posterior = np.atleast_2d(self.emissionprob_posterior_)
        if prior.shape != posterior.shape:
            raise ValueError(
                f"emissionprob_prior_ has shape {prior.shape} and emissionprob_posterior_ {posterior.shape}; "
                "both must be (n_components, n_features)"
            )
        if self.n_features is None:
            self.n_features = posterior.shape[1]
        shape = (self.n_components, self.n_features)
        self.emissionprob_prior_, self.emissionprob_posterior_ = prior, posterior
        self._check_positive("emissionprob_prior_", shape, "n_components, n_features")
        self._check_positive("emissionprob_posterior_", shape, "n_components, n_features")

    def _subnorm_log_emissions(self, X: np.ndarray) -> torch.Tensor:
        log_table = expected_log_dirichlet(as_tensor(self.emissionprob_posterior_))  # (C, V)
        return log_table[:, torch.from_numpy(X[:, 0].astype(np.int64))].T

    def _emission_m_step(self, X: np.ndarray, posteriors: torch.Tensor) -> None:
        if "e" not in self.params:
            return
        symbols = torch.from_numpy(X[:, 0].astype(np.int64))
        counts = posteriors.new_zeros(self.n_features, self.n_components).index_add_(0, symbols, posteriors)
        self.emissionprob_posterior_ = self.emissionprob_prior_ + counts.T.numpy()
        self.emissionprob_ = self.emissionprob_posterior_ / self.emissionprob_posterior_.sum(axis=1, keepdims=True)

    def _emission_kl(self) -> torch.Tensor:
        return kl_dirichlet(as_tensor(self.emissionprob_posterior_), as_tensor(self.emissionprob_prior_)).sum()

    def _emission(self) -> CategoricalEmission:
        return CategoricalEmission(self.n_components, self.n_features)
