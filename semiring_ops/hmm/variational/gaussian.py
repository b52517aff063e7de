"""hmmlearn's ``VariationalGaussianHMM``: variational Bayes EM with Gaussian emissions (four covariance types).

Each state's mean and precision have a Normal-Wishart prior and posterior: mean ~ N(means_*_, (beta_*_ Λ)⁻¹),
precision Λ ~ Wishart(dof_*_, inverse scale scale_*_) (for "diag" and "spherical" the scales are diagonal /
multiples of I, "tied" shares one Wishart between states). With W = scale⁻¹, the E-step's sub-normalised
log-density of x under state c (hmmlearn's, without the constant −D/2 log 2π, which shifts the ELBO only) is

    E_q[log N(x | mean_c, Λ_c⁻¹)] = ½ E[log |Λ_c|] − ½ (D / beta_c + dof_c (x − m_c)ᵀ W_c (x − m_c)).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from ..emissions.base import ArrayLike
from ..emissions.gaussian import COVARIANCE_TYPES, GaussianEmission, compiled_gaussian_log_prob, gaussian_emission
from ..estimators.base import check_random_state, torch_generator
from ..estimators.gaussian import GaussianHMM
from ..kmeans import kmeans
from ..utils import fill_covars
from .base import VariationalBaseHMM, as_tensor
from .kl import expected_log_det_wishart, kl_wishart, log_wishart_normaliser

__all__ = ["VariationalGaussianHMM"]


class _Wishart(NamedTuple):
    """The states' precision posteriors as tensors: dofs (C,), inverse scales S (C, D, D), S⁻¹ (C, D, D),
    log |S / 2| (C,) and E[log |Λ|] (C,); own_*: those of the one matrix for "tied" (()), else the same (C,)."""

    dof: Tensor
    scale: Tensor
    inverse: Tensor
    log_det_half: Tensor
    own_log_det_half: Tensor
    expected_log_det: Tensor
    own_expected_log_det: Tensor


_SCALE_DEFAULT = 1e-3  # hmmlearn's default scale prior: 1e-3 I (or its diagonal, spherical forms)
_COVAR_JITTER = 1e-3  # added to the data's covariance at initialisation, as hmmlearn
_SCALE_SHAPES = {
    "spherical": "n_components,",
    "diag": "n_components, n_features",
    "full": "n_components, n_features, n_features",
    "tied": "n_features, n_features",
}


class VariationalGaussianHMM(VariationalBaseHMM, GaussianHMM):
    """HMM with Gaussian emissions trained by variational Bayes EM (hmmlearn's ``VariationalGaussianHMM``;
    McGrory & Titterington 2009, Gruhl & Sick 2016), ``covariance_type`` "spherical", "diag", "full" or "tied".

    X: (n_samples, n_features) reals. Parameter letters "s", "t", "m", "c". Attributes (C states, D features),
    each with a ``*_prior_`` and a ``*_posterior_``: ``means_`` (C, D) and ``beta_`` (C,) (the means' Normal),
    ``dof_`` (C,) ("tied": a scalar) and ``scale_`` (spherical (C,), diag (C, D), full (C, D, D), tied (D, D))
    (the precisions' Wishart). The point estimates: ``means_`` = ``means_posterior_`` and ``covars_`` (full
    matrices) / ``_covars_`` (compact) = scale_posterior_ / dof_posterior_, which score / decode / sample use.

    Initialisation (hmmlearn's): k-means on X gives the posterior means and the cluster sizes, which become
    ``beta_posterior_`` and ``dof_posterior_`` (their sum for "tied"); the covariances start at the data's
    covariance + 1e-3 I (spherical: the mean of its entries) and ``scale_posterior_`` = covariance x dof.
    Priors given as None: means_prior the data's mean, beta_prior 1, dof_prior D, scale_prior 1e-3 I. k-means
    is ours (emissions' kmeans, seeded by one draw from ``random_state``), not scikit-learn's: its centres
    agree with scikit-learn's on well-separated data, not draw for draw.
    """

    _point_estimate_names = ("means_posterior_", "_covars_")

    def __init__(
        self,
        n_components: int = 1,
        covariance_type: str = "full",
        startprob_prior: ArrayLike | float | None = None,
        transmat_prior: ArrayLike | float | None = None,
        means_prior: ArrayLike | None = None,
        beta_prior: ArrayLike | None = None,
        dof_prior: ArrayLike | float | None = None,
        scale_prior: ArrayLike | None = None,
        algorithm: str = "viterbi",
        random_state: int | np.random.RandomState | None = None,
        n_iter: int = 100,
        tol: float = 1e-6,
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
        self.covariance_type = covariance_type
        self.means_prior, self.beta_prior = means_prior, beta_prior
        self.dof_prior, self.scale_prior = dof_prior, scale_prior

    @property
    def means_(self) -> np.ndarray:
        """(C, D) the posterior means (``means_posterior_``)."""
        if not hasattr(self, "means_posterior_"):
            raise AttributeError(f"this {type(self).__name__} has no means_posterior_ yet")
        return self.means_posterior_

    @property
    def _tied(self) -> bool:
        return self.covariance_type == "tied"

    def _scale_shape(self) -> tuple[int, ...]:
        C, D = self.n_components, self.n_features
        return {"spherical": (C,), "diag": (C, D), "full": (C, D, D), "tied": (D, D)}[self.covariance_type]

    def _get_n_fit_scalars_per_param(self) -> dict[str, int]:
        C, D = self.n_components, self.n_features
        covars = {"spherical": 2 * C, "diag": C + C * D, "full": C + C * D * (D + 1) // 2, "tied": 1 + D * (D + 1) // 2}
        return {"s": C - 1, "t": C * (C - 1), "m": C * D + C, "c": covars[self.covariance_type]}

    # ------------------------------------------------------------ initialisation and validation

    def _init_emission(self, X: np.ndarray) -> None:
        names_m = ("means_prior_", "means_posterior_", "beta_prior_", "beta_posterior_")
        names_c = ("dof_prior_", "dof_posterior_", "scale_prior_", "scale_posterior_")
        init_m = any(self._needs_init("m", name) for name in names_m)
        init_c = any(self._needs_init("c", name) for name in names_c)
        if not (init_m or init_c):
            return
        C, D = self.n_components, self.n_features
        x = torch.from_numpy(X)
        centres = kmeans(x, C, torch_generator(check_random_state(self.random_state)))
        counts = torch.bincount(torch.cdist(x, centres).argmin(-1), minlength=C).double().numpy()
        if init_m:
            self.means_prior_ = np.broadcast_to(self._prior_value(self.means_prior, X.mean(axis=0)), (C, D)).copy()
            self.means_posterior_ = centres.numpy().copy()
            self.beta_prior_ = np.broadcast_to(self._prior_value(self.beta_prior, 1.0), (C,)).astype(float)
            self.beta_posterior_ = counts.copy()
        if init_c:
            self.dof_prior_ = self._prior_value(self.dof_prior, float(D) if self._tied else np.full(C, float(D)))
            self.dof_posterior_ = counts.sum() if self._tied else counts.copy()
            cv = np.atleast_2d(np.cov(X.T)) + _COVAR_JITTER * np.eye(D)
            compact = {
                "spherical": np.full(C, cv.mean()),
                "diag": np.tile(np.diag(cv), (C, 1)),
                "full": np.tile(cv, (C, 1, 1)),
                "tied": cv,
            }[self.covariance_type]
            self._covars_ = compact
            dof = np.asarray(self.dof_posterior_, dtype=float)
            self.scale_posterior_ = compact * (dof if self._tied else dof.reshape((C,) + (1,) * (compact.ndim - 1)))
            eye = _SCALE_DEFAULT * np.eye(D)
            default = {
                "spherical": np.full(C, _SCALE_DEFAULT),
                "diag": np.full((C, D), _SCALE_DEFAULT),
                "full": np.tile(eye, (C, 1, 1)),
                "tied": eye,
            }[self.covariance_type]
            self.scale_prior_ = self._prior_value(self.scale_prior, default)

    def _check_emission(self) -> None:
        C = self.n_components
        if getattr(self, "n_features", None) is None and hasattr(self, "means_posterior_"):
            self.n_features = np.shape(self.means_posterior_)[-1]
        D = self.n_features
        for name in ("means_prior_", "means_posterior_"):
            self._require(name)
            self._check_array(name, (C, D), "n_components, n_features")
            setattr(self, name, np.asarray(getattr(self, name), dtype=float))
        for name in ("beta_prior_", "beta_posterior_"):
            self._check_positive(name, (C,), "n_components,")
        for name in ("dof_prior_", "dof_posterior_"):  # a Wishart needs dof > D - 1
            self._check_positive(name, () if self._tied else (C,), "a scalar" if self._tied else "n_components,", D - 1)
        for name in ("scale_prior_", "scale_posterior_"):
            self._check_positive_scale(name)

    def _check_positive_scale(self, name: str) -> None:
        """scale_*_ has the covariance type's compact shape and is positive (definite)."""
        self._require(name)
        self._check_array(name, self._scale_shape(), _SCALE_SHAPES[self.covariance_type])
        value = np.asarray(getattr(self, name), dtype=float)
        full = self._full(value)
        if not np.isfinite(value).all() or not np.all(np.linalg.eigvalsh((full + full.swapaxes(-1, -2)) / 2) > 0):
            raise ValueError(f"{name} must be finite and positive (definite), got {value.tolist()}")
        setattr(self, name, value)

    def _full(self, scale: np.ndarray) -> np.ndarray:
        """A compact scale -> (C, D, D) matrices (tied: the one matrix, repeated)."""
        return fill_covars(scale, self.covariance_type, self.n_components, self.n_features)

    def _wishart(self) -> _Wishart:
        """The posterior Wishart of each state ("tied": the one, repeated C times) with its inverse scales' inverses
        and log-determinants. An iteration's E-step computes it and its ELBO takes it over (``_wishart_now``): the
        posteriors do not change between the two."""
        C = self.n_components
        dof = as_tensor(np.broadcast_to(self.dof_posterior_, (C,)))
        if self._tied:  # one matrix: invert it once
            scale = as_tensor(self.scale_posterior_)
            inverse, log_det_half = torch.linalg.inv(scale), torch.linalg.slogdet(scale / 2)[1]
            expected = expected_log_det_wishart(dof[0], scale, log_det_half)
            D = scale.shape[-1]
            return _Wishart(
                dof, scale.expand(C, D, D), inverse.expand(C, D, D), log_det_half.expand(C), log_det_half,
                expected.expand(C), expected,
            )  # fmt: skip
        scale = as_tensor(self._full(self.scale_posterior_))
        log_det_half = torch.linalg.slogdet(scale / 2)[1]
        expected = expected_log_det_wishart(dof, scale, log_det_half)
        return _Wishart(dof, scale, torch.linalg.inv(scale), log_det_half, log_det_half, expected, expected)

    # ------------------------------------------------------------ variational EM

    def _subnorm_log_emissions(self, X: np.ndarray) -> Tensor:
        q = self._wishart_now = self._wishart()
        x, means = torch.from_numpy(X), as_tensor(self.means_posterior_)
        D = self.n_features
        offsets = 0.5 * (q.expected_log_det - D / as_tensor(self.beta_posterior_))  # (C,)
        compiled = compiled_gaussian_log_prob(x, means)
        if compiled is not None:  # one pass: F_c = √dof_c chol(W_c)ᵀ, so |F_c δ|² = dof_c δᵀ W_c δ
            return compiled(x, means, torch.linalg.cholesky(q.inverse).mT * q.dof.sqrt()[:, None, None], offsets)
        delta = x - means[:, None, :]  # (C, N, D)
        mahalanobis = ((delta @ q.inverse) * delta).sum(-1).T * q.dof  # (N, C): dof_c δᵀ W_c δ
        return offsets - 0.5 * mahalanobis

    def _emission_m_step(self, X: np.ndarray, posteriors: Tensor) -> None:
        if not ("m" in self.params or "c" in self.params):
            return
        x = torch.from_numpy(X)
        post = posteriors.sum(0).numpy()  # (C,)
        obs = (posteriors.T @ x).numpy()  # (C, D)
        beta0, m0 = self.beta_prior_, self.means_prior_
        if "m" in self.params:
            self.beta_posterior_ = beta0 + post
            self.means_posterior_ = (beta0[:, None] * m0 + obs) / self.beta_posterior_[:, None]
        if "c" not in self.params:
            return
        betaN, mN = self.beta_posterior_, self.means_posterior_
        if self.covariance_type in ("spherical", "diag"):
            second = (posteriors.T @ x.square()).numpy() + beta0[:, None] * m0**2 - betaN[:, None] * mN**2  # (C, D)
            spread = second.mean(axis=1) if self.covariance_type == "spherical" else second
        else:
            N, C, D = len(x), self.n_components, self.n_features
            outer = ((posteriors[:, :, None] * x[:, None, :]).reshape(N, C * D).T @ x).reshape(C, D, D).numpy()
            spread = outer + np.einsum("c,cd,ce->cde", beta0, m0, m0) - np.einsum("c,cd,ce->cde", betaN, mN, mN)
        if self._tied:
            self.dof_posterior_ = self.dof_prior_ + post.sum()
            self.scale_posterior_ = self.scale_prior_ + spread.sum(axis=0)
            self._covars_ = self.scale_posterior_ / self.dof_posterior_
            return
        self.dof_posterior_ = self.dof_prior_ + post
        self.scale_posterior_ = self.scale_prior_ + spread
        self._covars_ = self.scale_posterior_ / self.dof_posterior_.reshape((-1,) + (1,) * (spread.ndim - 1))

    def _emission_kl(self) -> Tensor:
        """Σ_c KL of the means' Normals (given the precision) + the Wisharts' (tied: once). The Normals share the
        precision dof_c W_c, so with beta_q, beta_p their scalings, in closed form
        KL_c = ½ (D log(beta_q / beta_p) + D beta_p / beta_q − D + beta_p dof_c δᵀ W_c δ), δ = the means' offset."""
        q = self.__dict__.pop("_wishart_now", None) or self._wishart()
        D = self.n_features
        # (C, D) numbers: numpy, a microsecond a call against torch's several
        beta_q, beta_p = np.asarray(self.beta_posterior_, dtype=float), np.asarray(self.beta_prior_, dtype=float)
        delta = np.asarray(self.means_posterior_, dtype=float) - self.means_prior_  # (C, D)
        mahalanobis = np.einsum("cd,cde,ce->c", delta, q.inverse.numpy(), delta) * q.dof.numpy()
        normal = 0.5 * float((D * np.log(beta_q / beta_p) + D * beta_p / beta_q - D + beta_p * mahalanobis).sum())
        if self._tied:
            scale_q, scale_p = q.scale[0], as_tensor(self.scale_prior_)
            dof_p = as_tensor(self.dof_prior_)
            wishart = kl_wishart(
                q.dof[0], scale_q, dof_p, scale_p, inverse_q=q.inverse[0], log_det_half_q=q.own_log_det_half,
                log_normaliser_p=self._prior_normaliser(dof_p, scale_p), expected_log_det_q=q.own_expected_log_det,
            )  # fmt: skip
        else:
            dof_p = as_tensor(np.broadcast_to(self.dof_prior_, (self.n_components,)))
            scale_p = as_tensor(self._full(self.scale_prior_))
            wishart = kl_wishart(
                q.dof, q.scale, dof_p, scale_p, inverse_q=q.inverse, log_det_half_q=q.log_det_half,
                log_normaliser_p=self._prior_normaliser(dof_p, scale_p), expected_log_det_q=q.expected_log_det,
            ).sum()  # fmt: skip
        return normal + wishart

    def _prior_normaliser(self, dof_p: Tensor, scale_p: Tensor) -> Tensor:
        """log_wishart_normaliser of the prior Wishart(s): fixed during a fit, so computed once per prior value (its
        slogdet and log-gammas are a tenth of an iteration on hmmlearn's one-sequence shapes)."""
        key = (dof_p.numpy().tobytes(), scale_p.numpy().tobytes())
        cached = self.__dict__.get("_prior_normaliser_cache")
        if cached is None or cached[0] != key:
            cached = self._prior_normaliser_cache = (key, log_wishart_normaliser(dof_p, scale_p))
        return cached[1]

    # ------------------------------------------------------------ the HMM of the point estimates

    def _emission(self) -> GaussianEmission:
        return gaussian_emission(self.covariance_type, self.n_components, self.n_features)
