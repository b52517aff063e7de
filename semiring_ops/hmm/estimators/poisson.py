"""hmmlearn's ``PoissonHMM`` over :class:`HMM` with Poisson emissions."""

from __future__ import annotations

import numpy as np
import torch

from ..emissions.base import ArrayLike
from ..emissions.poisson import PoissonEmission, check_counts, moment_matched_gamma
from ..model import HMM
from .base import BaseHMM, check_random_state

__all__ = ["PoissonHMM"]


class PoissonHMM(BaseHMM):
    """HMM with independent Poisson counts in ``n_features`` features (hmmlearn's ``PoissonHMM``).

    X: non-negative integral counts (n_samples, n_features); ``n_features`` is set by the first data (or
    ``lambdas_``). Parameter letters: "s" startprob_, "t" transmat_, "l" lambdas_ (C, n_features), the rates.
    ``lambdas_prior`` α and ``lambdas_weight`` β: hmmlearn's Gamma prior of the rates' M-step,
    λ = (α + N ȳ_c) / (β + N) (emissions/poisson.py): scalars, per state (C,), or broadcastable to (C, n_features).
    Initial rates: hmmlearn's draws from the Gamma of X's mean and variance (``random_state``).
    """

    _emission_letters = "l"

    def __init__(
        self,
        n_components: int = 1,
        startprob_prior: ArrayLike | float = 1.0,
        transmat_prior: ArrayLike | float = 1.0,
        lambdas_prior: ArrayLike | float = 0.0,
        lambdas_weight: ArrayLike | float = 0.0,
        algorithm: str = "viterbi",
        random_state: int | np.random.RandomState | None = None,
        n_iter: int = 10,
        tol: float = 1e-2,
        verbose: bool = False,
        params: str = "stl",
        init_params: str = "stl",
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
        self.lambdas_prior, self.lambdas_weight = lambdas_prior, lambdas_weight

    def _check_X(self, X: ArrayLike) -> np.ndarray:
        X = self._samples(X, "counts ")
        check_counts(torch.as_tensor(X), torch.float64)
        return X

    def _check(self) -> None:
        super()._check()
        self._require("lambdas_")
        self.lambdas_ = np.atleast_2d(self.lambdas_)
        if getattr(self, "n_features", None) is None:
            self.n_features = self.lambdas_.shape[1]
        self._check_array("lambdas_", (self.n_components, self.n_features), "n_components, n_features")
        if not np.isfinite(self.lambdas_).all() or (self.lambdas_ < 0).any():
            raise ValueError(f"lambdas_ (shape {self.lambdas_.shape}) must hold finite non-negative rates")

    def _get_n_fit_scalars_per_param(self) -> dict[str, int]:
        C, D = self.n_components, self.n_features
        return {"s": C - 1, "t": C * (C - 1), "l": C * D}

    def _init_emission(self, X: np.ndarray) -> None:
        # as hmmlearn: random_state becomes a RandomState here; rates ~ Gamma matching X's mean and variance
        self.random_state = check_random_state(self.random_state)
        if self._needs_init("l", "lambdas_"):
            shape, scale = moment_matched_gamma(float(X.mean()), float(X.var()))
            self.lambdas_ = self.random_state.gamma(shape, scale, size=(self.n_components, self.n_features))

    def _emission(self) -> PoissonEmission:
        return PoissonEmission(self.n_components, self.n_features, self.lambdas_prior, self.lambdas_weight)

    def _set_emission_parameters(self, model: HMM) -> None:
        model.emission.lambdas_ = self.lambdas_

    def _read_back_emission(self, model: HMM, letters: str) -> None:
        if "l" in letters:
            self.lambdas_ = self._numpy(model.emission.lambdas_)

    def _generate_sample_from_state(self, state: int, random_state: np.random.RandomState) -> np.ndarray:
        """Counts (n_features,) of `state`, one numpy Poisson draw per feature (hmmlearn's draws)."""
        return random_state.poisson(self.lambdas_[state])
