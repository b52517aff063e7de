"""hmmlearn's ``MultinomialHMM`` over :class:`HMM` with multinomial emissions."""

from __future__ import annotations

import numpy as np

from ..emissions.base import ArrayLike
from ..emissions.multinomial import MultinomialEmission, check_n_trials
from ..model import HMM
from .base import BaseHMM, check_random_state

__all__ = ["MultinomialHMM"]


class MultinomialHMM(BaseHMM):
    """HMM with multinomial emissions: counts of ``n_features`` outcomes in ``n_trials`` trials (hmmlearn's
    ``MultinomialHMM``; its categorical special case is :class:`CategoricalHMM`).

    X: non-negative integer counts (n_samples, n_features). ``n_trials``: an int, or an array of each sample's
    total; None is set from the first data (each row's total), and data must then add up to it. Scores use each
    sample's own total; sampling needs a single value. Parameter letters: "s" startprob_, "t" transmat_,
    "e" emissionprob_ (C, n_features), updated to the normalised posterior-weighted counts.
    """

    _emission_letters = "e"

    def __init__(
        self,
        n_components: int = 1,
        n_trials: ArrayLike | int | None = None,
        startprob_prior: ArrayLike | float = 1.0,
        transmat_prior: ArrayLike | float = 1.0,
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
        self.n_trials = n_trials

    def _check_X(self, X: ArrayLike) -> np.ndarray:
        X = np.asarray(X)
        D = getattr(self, "n_features", None)
        expected = f"(n_samples, {D})" if D is not None else "(n_samples, n_features)"
        if X.ndim != 2 or len(X) == 0:
            raise ValueError(f"X has shape {X.shape}; {type(self).__name__} expects counts {expected}, at least one")
        return X

    def _check_and_set_n_features(self, X: ArrayLike) -> None:
        """X (n_samples, n_features) must hold non-negative integer counts adding up to n_trials in each row;
        sets n_features, and n_trials (each row's total) when it is None."""
        X = self._check_X(X)
        if getattr(self, "n_features", None) is not None and self.n_features != X.shape[1]:
            raise ValueError(f"X has shape {X.shape}; this {type(self).__name__} has n_features={self.n_features}")
        self.n_features = X.shape[1]
        if not np.issubdtype(X.dtype, np.integer) or X.min() < 0:
            raise ValueError(f"X must hold non-negative integer counts, got dtype {X.dtype}, minimum {X.min()}")
        totals = X.sum(axis=1)
        if self.n_trials is None:
            self.n_trials = totals
            return
        n_trials = np.asarray(self.n_trials)
        if n_trials.size != 1 and n_trials.shape != totals.shape:
            raise ValueError(
                f"n_trials has shape {n_trials.shape}; expected one value or one per sample {totals.shape}"
            )
        if not (totals == n_trials).all():
            raise ValueError(f"the counts of each sample (X's rows, shape {X.shape}) must add up to n_trials")

    def _check(self) -> None:
        super()._check()
        self._require("emissionprob_")
        self.emissionprob_ = np.atleast_2d(self.emissionprob_)
        if getattr(self, "n_features", None) is None:
            self.n_features = self.emissionprob_.shape[1]
        self._check_array("emissionprob_", (self.n_components, self.n_features), "n_components, n_features")
        self._check_sum_1("emissionprob_")
        if self.n_trials is None:
            raise ValueError("n_trials must be set (an int, or each sample's total), or fit to data first")

    def _get_n_fit_scalars_per_param(self) -> dict[str, int]:
        C, D = self.n_components, self.n_features
        return {"s": C - 1, "t": C * (C - 1), "e": C * (D - 1)}

    def _init_emission(self, X: np.ndarray) -> None:
        # as hmmlearn: random_state becomes a RandomState here, rows uniform draws normalised
        self.random_state = check_random_state(self.random_state)
        if self._needs_init("e", "emissionprob_"):
            p = self.random_state.rand(self.n_components, self.n_features)
            self.emissionprob_ = p / p.sum(axis=1, keepdims=True)

    def _single_n_trials(self) -> int | None:
        """n_trials as one int, None when it is not a single value (or not set)."""
        try:
            return check_n_trials(self.n_trials)
        except ValueError:
            return None

    def _emission(self) -> MultinomialEmission:
        return MultinomialEmission(self.n_components, self.n_features, self._single_n_trials())

    def _set_emission_parameters(self, model: HMM) -> None:
        model.emissionprob_ = self.emissionprob_

    def _read_back_emission(self, model: HMM, letters: str) -> None:
        if "e" in letters:
            self.emissionprob_ = self._numpy(model.emissionprob_)

    def _generate_sample_from_state(self, state: int, random_state: np.random.RandomState) -> np.ndarray:
        """Counts (n_features,) of `state` in n_trials trials, one numpy multinomial draw (hmmlearn's draws)."""
        n_trials = self._single_n_trials()
        if n_trials is None:
            raise ValueError(f"sampling needs a single n_trials, got {self.n_trials!r}")
        return random_state.multinomial(n_trials, self.emissionprob_[state])
