"""hmmlearn's ``GMMHMM`` over :class:`HMM` with Gaussian-mixture emissions (emissions/gmm.py)."""

from __future__ import annotations

import logging

import numpy as np
import torch

from ..emissions.base import ArrayLike
from ..emissions.gaussian import COVARIANCE_TYPES
from ..emissions.gmm import GMMEmission, default_covars_priors, mixture_covars_shape
from ..model import HMM
from .base import BaseHMM, check_random_state, torch_generator

__all__ = ["GMMHMM"]

_log = logging.getLogger("semiring_ops.hmm")


class GMMHMM(BaseHMM):
    """HMM with Gaussian-mixture emissions (hmmlearn's ``GMMHMM``): per state ``n_mix`` Gaussians of
    ``covariance_type`` "spherical", "diag", "full" or "tied" (the components of a state share one matrix).

    X: (n_samples, n_features) reals. Parameter letters: "s" startprob_, "t" transmat_, "w" weights_
    (C, n_mix), "m" means_ (C, n_mix, D), "c" covars_: spherical (C, n_mix), diag (C, n_mix, D), full
    (C, n_mix, D, D), tied (C, D, D). Priors as hmmlearn's (emissions/gmm.py): weights_prior (Dirichlet),
    means_prior / means_weight (Normal), covars_prior / covars_weight (inverse gamma or inverse Wishart;
    None: hmmlearn's defaults of the type); like hmmlearn, ``_check`` replaces the priors by arrays of
    their full shapes. ``min_covar`` is added to the data's covariance at initialisation and floors
    spherical / diagonal variances.
    """

    _emission_letters = "mcw"

    def __init__(
        self,
        n_components: int = 1,
        n_mix: int = 1,
        min_covar: float = 1e-3,
        startprob_prior: ArrayLike | float = 1.0,
        transmat_prior: ArrayLike | float = 1.0,
        weights_prior: ArrayLike | float = 1.0,
        means_prior: ArrayLike | float = 0.0,
        means_weight: ArrayLike | float = 0.0,
        covars_prior: ArrayLike | float | None = None,
        covars_weight: ArrayLike | float | None = None,
        algorithm: str = "viterbi",
        covariance_type: str = "diag",
        random_state: int | np.random.RandomState | None = None,
        n_iter: int = 10,
        tol: float = 1e-2,
        verbose: bool = False,
        params: str = "stmcw",
        init_params: str = "stmcw",
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
        self.covariance_type, self.min_covar, self.n_mix = covariance_type, min_covar, n_mix
        self.weights_prior, self.means_prior, self.means_weight = weights_prior, means_prior, means_weight
        self.covars_prior, self.covars_weight = covars_prior, covars_weight

    # ------------------------------------------------------------ priors (hmmlearn's attributes)

    def _fix_priors(self) -> None:
        """hmmlearn's: the covariance priors' defaults (None), then every prior broadcast to its full shape."""
        C, M, D, t = self.n_components, self.n_mix, self.n_features, self.covariance_type
        prior, weight = default_covars_priors(t, M, D)
        if self.covars_prior is None:
            self.covars_prior = prior
        if self.covars_weight is None:
            self.covars_weight = weight
        shapes = {
            "weights_prior": (C, M),
            "means_prior": (C, M, D),
            "means_weight": (C, M),
            "covars_prior": mixture_covars_shape(t, C, M, D),
            "covars_weight": {"spherical": (C, M), "diag": (C, M, D), "full": (C, M), "tied": (C,)}[t],
        }
        for name, shape in shapes.items():
            try:
                setattr(self, name, np.broadcast_to(getattr(self, name), shape).copy())
            except ValueError:
                raise ValueError(
                    f"{name} has shape {np.shape(getattr(self, name))}; expected a scalar or an array "
                    f"broadcastable to {shape}"
                ) from None

    # ------------------------------------------------------------ validation

    def _check_X(self, X: ArrayLike) -> np.ndarray:
        return self._real_samples(X)

    def _check(self) -> None:
        """hmmlearn's checks: shapes of weights_ (C, n_mix), means_ (C, n_mix, D), covars_ (by type); weights
        summing to 1; variances non-negative; matrices symmetric with no negative eigenvalue."""
        super()._check()
        self._require("weights_", "means_", "covars_")
        if getattr(self, "n_features", None) is None:
            self.n_features = np.shape(self.means_)[-1]
        if self.covariance_type not in COVARIANCE_TYPES:
            raise ValueError(f"covariance_type must be one of {COVARIANCE_TYPES}, got {self.covariance_type!r}")
        self._fix_priors()
        C, M, D = self.n_components, self.n_mix, self.n_features
        self._check_array("weights_", (C, M), "n_components, n_mix")
        self._check_sum_1("weights_")
        self._check_array("means_", (C, M, D), "n_components, n_mix, n_features")
        shape = mixture_covars_shape(self.covariance_type, C, M, D)
        self._check_array("covars_", shape, f"covariance_type={self.covariance_type!r}")
        covars = self.covars_
        if self.covariance_type in ("spherical", "diag"):
            if (covars < 0).any():
                raise ValueError(f"covars_ of covariance_type={self.covariance_type!r} must be non-negative")
            if (covars == 0).any():
                _log.warning("Degenerate mixture covariance")
            return
        matrices = covars.reshape(-1, D, D)
        for i, matrix in enumerate(matrices):
            where = f"state {i}" if self.covariance_type == "tied" else f"state {i // M}, component {i % M}"
            if not np.allclose(matrix, matrix.T):
                raise ValueError(f"covars_ ({where}) must be symmetric")
            smallest = np.linalg.eigvalsh(matrix).min()
            if smallest < 0:
                raise ValueError(f"covars_ ({where}) must be positive definite")
            if smallest == 0:
                _log.warning("covars_ (%s) has a null eigenvalue", where)

    def _get_n_fit_scalars_per_param(self) -> dict[str, int]:
        C, M, D = self.n_components, self.n_mix, self.n_features
        covars = {"spherical": C * M, "diag": C * M * D, "full": C * M * D * (D + 1) // 2, "tied": C * D * (D + 1) // 2}
        # "w": hmmlearn counts n_mix - 1 (not per state); kept so that aic / bic give its numbers
        return {"s": C - 1, "t": C * (C - 1), "m": C * M * D, "c": covars[self.covariance_type], "w": M - 1}

    # ------------------------------------------------------------ the emission model

    def _emission(self) -> GMMEmission:
        return GMMEmission(
            self.n_components,
            self.n_mix,
            self.n_features,
            self.covariance_type,
            self.min_covar,
            weights_prior=self.weights_prior,
            means_prior=self.means_prior,
            means_weight=self.means_weight,
            covars_prior=self.covars_prior,
            covars_weight=self.covars_weight,
        )

    def _init_emission(self, X: np.ndarray) -> None:
        """hmmlearn's: uniform weights ("w"), k-means means per state and component ("m"), every component's
        covariance from the data's covariance + min_covar ("c")."""
        self._fix_priors()
        names = (("w", "weights_"), ("m", "means_"), ("c", "covars_"))
        letters = "".join(c for c, name in names if self._needs_init(c, name))
        if not letters:
            return
        emission = self._emission().double()
        generator = torch_generator(check_random_state(self.random_state))
        emission.init_from_data(torch.from_numpy(X), generator, params=letters)
        self._read_back_emission_from(emission, letters)

    def _set_emission_parameters(self, model: HMM) -> None:
        emission = model.emission
        emission.weights_, emission.means_, emission.covars_ = self.weights_, self.means_, self.covars_

    def _read_back_emission(self, model: HMM, letters: str) -> None:
        self._read_back_emission_from(model.emission, letters)

    def _read_back_emission_from(self, emission: GMMEmission, letters: str) -> None:
        if "w" in letters:
            self.weights_ = self._numpy(emission.weights_)
        if "m" in letters:
            self.means_ = self._numpy(emission.means_)
        if "c" in letters:
            self.covars_ = self._numpy(emission.covars_)

    # ------------------------------------------------------------ sampling (numpy, hmmlearn's draws)

    def _generate_sample_from_state(self, state: int, random_state: np.random.RandomState) -> np.ndarray:
        """One observation of `state` drawn as hmmlearn draws it: the component by ``random_state.choice``
        with the state's weights, then ``random_state.multivariate_normal`` with its mean and covariance."""
        component = random_state.choice(self.n_mix, p=self.weights_[state])
        D = self.n_features
        if self.covariance_type == "tied":
            cov = self.covars_[state]
        elif self.covariance_type == "full":
            cov = self.covars_[state, component]
        elif self.covariance_type == "diag":
            cov = np.diag(self.covars_[state, component])
        else:
            cov = self.covars_[state, component] * np.eye(D)
        return random_state.multivariate_normal(self.means_[state, component], cov)
