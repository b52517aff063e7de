"""hmmlearn's ``CategoricalHMM`` and ``GaussianHMM``, drop-in: change one import line.

    from semiring_ops import hmm            # was: from hmmlearn import hmm

    model = hmm.GaussianHMM(n_components=3, covariance_type="full", n_iter=100, random_state=0)
    model.fit(X, lengths)
    log_prob, states = model.decode(X, lengths)

Same constructors, attributes (``startprob_``, ``transmat_``, ``emissionprob_``, ``means_``,
``covars_`` / ``_covars_``, ``n_features``, ``monitor_``, priors, ``params`` / ``init_params`` letters,
``random_state``, ...), calls and return types (numpy arrays, Python floats) as hmmlearn 0.3; the
forward-backward, Viterbi and EM run on :class:`semiring_ops.structures.HMM` in float64. docs/hmm.md lists
what differs.
"""

from __future__ import annotations

import numpy as np
import torch

from .structures.hmm import HMM, ConvergenceMonitor
from .structures.hmm_emissions import ArrayLike, CategoricalEmission
from .structures.hmm_emissions_gaussian import COVARIANCE_TYPES, GaussianEmission, gaussian_emission, validate_covars
from .structures.hmm_hmmlearn import HMMLearnBase, NotFittedError, check_random_state, torch_generator

__all__ = ["COVARIANCE_TYPES", "CategoricalHMM", "ConvergenceMonitor", "GaussianHMM", "NotFittedError"]


class CategoricalHMM(HMMLearnBase):
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


class GaussianHMM(HMMLearnBase):
    """HMM with Gaussian emissions (hmmlearn's ``GaussianHMM``), ``covariance_type`` "spherical", "diag",
    "full" or "tied".

    X: (n_samples, n_features) reals. Parameter letters: "s" startprob_, "t" transmat_, "m" means_
    (C, D), "c" covariances. ``covars_`` reads as full matrices (C, D, D) whatever the type and takes
    the type's compact form on write, kept as ``_covars_``: spherical (C,), diag (C, D), full (C, D, D),
    tied (D, D). Priors (hmm_emissions_gaussian.py): means_prior / means_weight (Normal), covars_prior /
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
        X = np.asarray(X)
        D = getattr(self, "n_features", None)
        expected = f"(n_samples, {D})" if D is not None else "(n_samples, n_features)"
        if X.ndim != 2 or len(X) == 0 or (D is not None and X.shape[1] != D):
            raise ValueError(f"X has shape {X.shape}; GaussianHMM expects {expected}, at least one sample")
        if not (np.issubdtype(X.dtype, np.floating) or np.issubdtype(X.dtype, np.integer)):
            raise ValueError(f"X must hold real numbers, got dtype {X.dtype} (shape {X.shape})")
        if not np.isfinite(X).all():
            raise ValueError(f"X (shape {X.shape}) has non-finite values")
        return X.astype(np.float64, copy=False)

    def _check_and_set_n_features(self, X: np.ndarray) -> None:
        D = X.shape[1]
        if getattr(self, "n_features", None) is not None and self.n_features != D:
            raise ValueError(f"X has shape {X.shape}; this GaussianHMM has n_features={self.n_features}")
        self.n_features = D

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
