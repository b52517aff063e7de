"""hmmlearn's ``GaussianHMM`` over :class:`HMM` with Gaussian emissions (four covariance types)."""

from __future__ import annotations

import numpy as np
import torch

from ..emissions.base import ArrayLike
from ..emissions.gaussian import COVARIANCE_TYPES, GaussianEmission, gaussian_emission, validate_covars
from ..model import HMM
from ..utils import fill_covars
from .base import BaseHMM, check_random_state, torch_generator

__all__ = ["GaussianHMM"]


class GaussianHMM(BaseHMM):
    """HMM with Gaussian emissions (hmmlearn's ``GaussianHMM``), ``covariance_type`` "spherical", "diag",
    "full" or "tied".

    X: (n_samples, n_features) reals. Parameter letters: "s" startprob_, "t" transmat_, "m" means_
    (C, D), "c" covariances. ``covars_`` reads as full matrices (C, D, D) whatever the type and takes
    the type's compact form on write, kept as ``_covars_``: spherical (C,), diag (C, D), full (C, D, D),
    tied (D, D). Priors (emissions/gaussian.py): means_prior / means_weight (Normal), covars_prior /
    covars_weight (inverse gamma, inverse Wishart); ``min_covar`` is added to the data's covariance at
    initialisation and floors spherical / diagonal variances.
    """

    _emission_letters = "mc"

    def __init__(
        self,
        n_components: int = 1,
        covariance_type: str = "diag",
        min_covar: float = 1e-3,
        startprob_prior: ArrayLike | float = 1.0,
        transmat_prior: ArrayLike | float = 1.0,
        means_prior: ArrayLike | float = 0,
        means_weight: ArrayLike | float = 0,
        covars_prior: ArrayLike | float = 1e-2,
        covars_weight: ArrayLike | float = 1,
        algorithm: str = "viterbi",
        random_state: int | np.random.RandomState | None = None,
        n_iter: int = 10,
        tol: float = 1e-2,
        verbose: bool = False,
        params: str = "stmc",
        init_params: str = "stmc",
        implementation: str = "log",
    ) -> None:
        if covariance_type not in COVARIANCE_TYPES:
            raise ValueError(f"covariance_type must be one of {COVARIANCE_TYPES}, got {covariance_type!r}")
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
        self.covariance_type, self.min_covar = covariance_type, min_covar
        self.means_prior, self.means_weight = means_prior, means_weight
        self.covars_prior, self.covars_weight = covars_prior, covars_weight

    @property
    def covars_(self) -> np.ndarray:
        """Full covariance matrices (n_components, n_features, n_features), whatever the type."""
        if not hasattr(self, "_covars_"):
            raise AttributeError(f"this {type(self).__name__} has no covars_ yet")
        D = getattr(self, "n_features", None)
        if D is None and hasattr(self, "means_"):
            D = np.shape(self.means_)[-1]
        cv = validate_covars(self._covars_, self.covariance_type, self.n_components, D).numpy()
        C = self.n_components
        if self.covariance_type == "spherical":
            if D is None:
                raise AttributeError("covars_ of a spherical model needs n_features (or means_) to be set")
            return cv[:, None, None] * np.eye(D)
        if self.covariance_type == "diag":
            return np.stack([np.diag(row) for row in cv])
        if self.covariance_type == "tied":
            return np.tile(cv, (C, 1, 1))
        return cv

    @covars_.setter
    def covars_(self, value: ArrayLike) -> None:
        # checked against n_features by _check, as hmmlearn (means_ may be about to change it)
        self._covars_ = validate_covars(value, self.covariance_type, self.n_components).numpy().copy()

    def _check_X(self, X: ArrayLike) -> np.ndarray:
        return self._real_samples(X)

    def _check(self) -> None:
        super()._check()
        self._require("means_", "_covars_")
        self.means_ = np.asarray(self.means_)
        if self.means_.ndim != 2 or len(self.means_) != self.n_components:
            raise ValueError(f"means_ has shape {self.means_.shape}; expected (n_components={self.n_components}, D)")
        self.n_features = self.means_.shape[1]
        validate_covars(self._covars_, self.covariance_type, self.n_components, self.n_features)

    def _get_n_fit_scalars_per_param(self) -> dict[str, int]:
        C, D = self.n_components, self.n_features
        covars = {"spherical": C, "diag": C * D, "full": C * D * (D + 1) // 2, "tied": D * (D + 1) // 2}
        return {"s": C - 1, "t": C * (C - 1), "m": C * D, "c": covars[self.covariance_type]}

    def _emission(self) -> GaussianEmission:
        return gaussian_emission(
            self.covariance_type,
            self.n_components,
            self.n_features,
            min_covar=self.min_covar,
            covars_prior=self.covars_prior,
            means_prior=self.means_prior,
            means_weight=self.means_weight,
            covars_weight=self.covars_weight,
        )

    def _init_emission(self, X: np.ndarray) -> None:
        """hmmlearn's: means by k-means ("m"), covariances from the data's covariance + min_covar ("c")."""
        letters = "".join(c for c, name in (("m", "means_"), ("c", "covars_")) if self._needs_init(c, name))
        if not letters:
            return
        emission = self._emission().double()
        generator = torch_generator(check_random_state(self.random_state))
        emission.init_from_data(torch.from_numpy(X), generator, params=letters)
        self._read_back_emission_from(emission, letters)

    def _set_emission_parameters(self, model: HMM) -> None:
        model.means_, model.covars_ = self.means_, self._covars_

    def _read_back_emission(self, model: HMM, letters: str) -> None:
        self._read_back_emission_from(model.emission, letters)

    def _read_back_emission_from(self, emission: GaussianEmission, letters: str) -> None:
        if "m" in letters:
            self.means_ = self._numpy(emission.means_)
        if "c" in letters:
            self._covars_ = self._numpy(emission.covars_)

    def _generate_sample_from_state(self, state: int, random_state: np.random.RandomState) -> np.ndarray:
        """One observation (n_features,) of `state`: ``random_state.multivariate_normal`` of its mean and full
        covariance (hmmlearn's draw)."""
        covars = fill_covars(self._covars_, self.covariance_type, self.n_components, self.n_features)
        return random_state.multivariate_normal(self.means_[state], covars[state])
