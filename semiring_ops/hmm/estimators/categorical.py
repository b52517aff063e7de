"""hmmlearn's ``CategoricalHMM`` over :class:`HMM` with categorical emissions."""

from __future__ import annotations

import numpy as np

from ..emissions.base import ArrayLike
from ..emissions.categorical import CategoricalEmission
from ..model import HMM
from .base import BaseHMM, check_random_state

__all__ = ["CategoricalHMM"]


class CategoricalHMM(BaseHMM):
    """HMM with categorical emissions over ``n_features`` symbols (hmmlearn's ``CategoricalHMM``).

    X: integer symbols (n_samples, 1) (or (n_samples,)); ``n_features`` None is set from the data
    (largest symbol + 1) or from ``emissionprob_``. Parameter letters: "s" startprob_, "t" transmat_,
    "e" emissionprob_ (C, n_features). ``emissionprob_prior``: the Dirichlet prior of each row (a scalar
    or (C, n_features)).
    """

    _emission_letters = "e"

    def __init__(
        self,
        n_components: int = 1,
        startprob_prior: ArrayLike | float = 1.0,
        transmat_prior: ArrayLike | float = 1.0,
        *,
        emissionprob_prior: ArrayLike | float = 1.0,
        n_features: int | None = None,
        algorithm: str = "viterbi",
        random_state: int | np.random.RandomState | None = None,
        n_iter: int = 10,
        tol: float = 1e-2,
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

    def _check_X(self, X: ArrayLike) -> np.ndarray:
        X = np.asarray(X)
        if X.ndim == 1:
            X = X[:, None]
        if X.ndim != 2 or X.shape[1] != 1 or len(X) == 0:
            raise ValueError(f"X has shape {np.shape(X)}; CategoricalHMM expects integer symbols (n_samples, 1)")
        return X

    def _check_and_set_n_features(self, X: ArrayLike) -> None:
        """X must hold non-negative integer symbols below n_features; n_features None: max(X) + 1."""
        X = np.asarray(X)
        if not np.issubdtype(X.dtype, np.integer):
            raise ValueError(f"X must hold integer symbols, got dtype {X.dtype} (shape {X.shape})")
        if X.size and X.min() < 0:
            raise ValueError(f"X must hold non-negative symbols, got a minimum of {X.min()} (shape {X.shape})")
        if self.n_features is None:
            self.n_features = int(X.max()) + 1 if X.size else None
        elif X.size and X.max() >= self.n_features:
            raise ValueError(
                f"X has a symbol {X.max()} (shape {X.shape}); n_features={self.n_features} allows "
                f"0..{self.n_features - 1}"
            )

    def _check(self) -> None:
        super()._check()
        self._require("emissionprob_")
        self.emissionprob_ = np.atleast_2d(self.emissionprob_)
        if self.n_features is None:
            self.n_features = self.emissionprob_.shape[1]
        self._check_array("emissionprob_", (self.n_components, self.n_features), "n_components, n_features")
        self._check_sum_1("emissionprob_")

    def _get_n_fit_scalars_per_param(self) -> dict[str, int]:
        C, V = self.n_components, self.n_features
        return {"s": C - 1, "t": C * (C - 1), "e": C * (V - 1)}

    def _init_emission(self, X: np.ndarray) -> None:
        # as hmmlearn: random_state becomes a RandomState here, rows uniform draws normalised
        self.random_state = check_random_state(self.random_state)
        if self._needs_init("e", "emissionprob_"):
            p = self.random_state.rand(self.n_components, self.n_features)
            self.emissionprob_ = p / p.sum(axis=1, keepdims=True)

    def _emission(self) -> CategoricalEmission:
        return CategoricalEmission(self.n_components, self.n_features, self.emissionprob_prior)

    def _set_emission_parameters(self, model: HMM) -> None:
        model.emissionprob_ = self.emissionprob_

    def _read_back_emission(self, model: HMM, letters: str) -> None:
        if "e" in letters:
            self.emissionprob_ = self._numpy(model.emissionprob_)

    def _generate_sample_from_state(self, state: int, random_state: np.random.RandomState) -> list[int]:
        """One symbol [v] of `state`, by inverse CDF of one uniform from `random_state` (hmmlearn's draw)."""
        return [int(np.argmax(np.cumsum(self.emissionprob_[state]) > random_state.rand()))]
