"""Gaussian HMM emissions in D features, one class per covariance type (hmmlearn's ``covariance_type``):

    "spherical"  GaussianSphericalEmission  one variance per state           covars_ (C,)
    "diag"       GaussianDiagEmission       a diagonal covariance per state  covars_ (C, D)
    "full"       GaussianFullEmission       a full covariance per state      covars_ (C, D, D)
    "tied"       GaussianTiedEmission       one full covariance, all states  covars_ (D, D)

(``covars_`` in hmmlearn's compact ``_covars_`` shapes.) Every class has ``means`` (C, D) and an
unconstrained covariance parameter, so gradient training keeps valid covariances: log variances, or the
Cholesky factor L of each covariance (covars = L Lᵀ) with its diagonal stored as logs.

The M-step is hmmlearn 0.3's MAP update under its priors (parameter letters "m" means, "c" covariances),
with n_c = Σ_t γ_t(c), S_c = Σ_t γ_t(c) x_t, and the new means μ (or the current ones when only "c" is
updated):

    means      μ_c = (means_weight · means_prior + S_c) / (means_weight + n_c)
    diag       σ²_c = (covars_prior + means_weight (μ_c − means_prior)² + Σγx² − 2 μ_c S_c + μ_c² n_c)
                      / max(max(covars_weight − 1, 0) + n_c, 1e-5)
    spherical  the diag variances averaged over features
    full       Σ_c = (covars_prior + means_weight d dᵀ + Σγ x xᵀ − S_c μ_cᵀ − μ_c S_cᵀ + n_c μ_c μ_cᵀ)
                     / (max(covars_weight − D, 0) + n_c),   d = μ_c − means_prior
    tied       Σ = (covars_prior + Σ_c [numerator of full]) / (max(covars_weight − D, 0) + Σ_c n_c)

Priors are scalars or arrays of the parameter's shape: means_prior (C, D); covars_prior (C, D) diag,
(C,) spherical, (C, D, D) full, (D, D) tied; means_weight and covars_weight scalars or (C,) per state
(tied: a scalar). A state with no posterior mass keeps its parameters. Spherical and diagonal variances
are floored at ``min_covar`` after each update (hmmlearn uses min_covar at initialisation only); a full
covariance that is not positive definite gets hmmlearn's 1e-7 on its diagonal (hmmlearn adds it when it
evaluates the density), and raises ValueError if it still is not.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..compiled import compiled_op
from ..kmeans import kmeans
from .base import ArrayLike, Emission, _per_state, _prior, _tensor

__all__ = [
    "COVARIANCE_TYPES",
    "GaussianDiagEmission",
    "GaussianEmission",
    "GaussianFullEmission",
    "GaussianSphericalEmission",
    "GaussianTiedEmission",
    "compiled_gaussian_log_prob",
    "gaussian_emission",
    "validate_covars",
]

COVARIANCE_TYPES = ("spherical", "diag", "full", "tied")

_JITTER = 1e-7  # hmmlearn's retry for a covariance whose Cholesky factorisation fails


# ---------------------------------------------------------------------------------------------- validation


def _expected_covars_shape(covariance_type: str, C: int, D: int | str) -> tuple:
    return {"spherical": (C,), "diag": (C, D), "full": (C, D, D), "tied": (D, D)}[covariance_type]


def _symmetric_positive_definite(v: Tensor, name: str) -> None:
    """Raise unless every matrix of v (..., D, D) is symmetric (hmmlearn's allclose) and positive definite."""
    if not torch.allclose(v, v.transpose(-1, -2), rtol=1e-5, atol=1e-8):
        raise ValueError(f"{name} (shape {tuple(v.shape)}) must be symmetric")
    info = torch.linalg.cholesky_ex(v).info
    if bool((info > 0).any()):
        which = "" if v.ndim == 2 else f" (state {int((info > 0).nonzero()[0, 0])})"
        raise ValueError(f"{name} (shape {tuple(v.shape)}) must be positive definite{which}")


def _compact(v: Tensor, covariance_type: str, C: int) -> Tensor:
    """hmmlearn's other accepted forms of covariances -> the compact shape of the type (others unchanged)."""
    square = v.ndim == 3 and v.shape[0] == C and v.shape[1] == v.shape[2]
    if covariance_type == "spherical":
        if v.numel() == C:
            return v.reshape(C)
        if v.ndim == 2 and v.shape[0] == C and bool((v == v[:, :1]).all()):
            return v[:, 0]  # hmmlearn's tiled (C, D)
        if square and torch.equal(v, v[:, :1, :1] * torch.eye(v.shape[1], dtype=v.dtype)):
            return v[:, 0, 0]
    elif covariance_type == "diag" and square and torch.equal(v, torch.diag_embed(v.diagonal(dim1=1, dim2=2))):
        return v.diagonal(dim1=1, dim2=2)
    elif covariance_type == "tied" and square and bool((v == v[:1]).all()):
        return v[0]
    return v


def validate_covars(
    value: ArrayLike, covariance_type: str, n_states: int, n_features: int | None = None, name: str = "covars_"
) -> Tensor:
    """Covariances in any of hmmlearn's accepted forms -> float64 in the compact shape of the type.

    spherical: (C,) (or any shape of C values, hmmlearn's tiled (C, D), or C multiples of the identity
    (C, D, D)); diag: (C, D) or diagonal (C, D, D); full: (C, D, D); tied: (D, D) or C equal (C, D, D).
    Values must be finite and positive (matrices symmetric positive definite). n_features None: any D.
    """
    if covariance_type not in COVARIANCE_TYPES:
        raise ValueError(f"covariance_type must be one of {COVARIANCE_TYPES}, got {covariance_type!r}")
    v = _tensor(value).to(device="cpu", dtype=torch.float64)  # small: validated on the CPU
    shape, C = tuple(v.shape), n_states
    if not bool(torch.isfinite(v).all()):
        raise ValueError(f"{name} (shape {shape}) must be finite")
    v = _compact(v, covariance_type, C)
    D = n_features if n_features is not None else (v.shape[-1] if v.ndim else -1)
    if tuple(v.shape) != _expected_covars_shape(covariance_type, C, D):
        want = _expected_covars_shape(covariance_type, C, n_features if n_features is not None else "n_features")
        raise ValueError(
            f"{name} has shape {shape}; covariance_type={covariance_type!r} expects ({', '.join(map(str, want))}"
            + ("," if len(want) == 1 else "")
            + ")"
        )
    if covariance_type in ("spherical", "diag"):
        if bool((v <= 0).any()):
            raise ValueError(f"{name} (shape {shape}) must be positive for covariance_type={covariance_type!r}")
    else:
        _symmetric_positive_definite(v, name)
    return v


# ---------------------------------------------------------------------------------------------- Cholesky factors


def _cholesky(cv: Tensor, name: str) -> Tensor:
    """Lower Cholesky factors of cv (..., D, D); where one fails, of cv + 1e-7 I (hmmlearn's retry)."""
    L, info = torch.linalg.cholesky_ex(cv)
    if bool((info > 0).any()):
        eye = torch.eye(cv.shape[-1], dtype=cv.dtype, device=cv.device)
        L2, info2 = torch.linalg.cholesky_ex(cv + _JITTER * eye)
        failed = (info > 0)[..., None, None]
        if bool(((info > 0) & (info2 > 0)).any()):
            raise ValueError(f"{name} must be symmetric, positive-definite (even with {_JITTER} on its diagonal)")
        L = torch.where(failed, L2, L)
    return L


def _factor_to_raw(L: Tensor) -> Tensor:
    """Cholesky factor -> the stored parameter: strictly lower part as is, the diagonal as logs."""
    return L.tril(-1) + torch.diag_embed(L.diagonal(dim1=-2, dim2=-1).log())


def _raw_to_factor(raw: Tensor) -> Tensor:
    return raw.tril(-1) + torch.diag_embed(raw.diagonal(dim1=-2, dim2=-1).exp())


# ---------------------------------------------------------------------------------------------- the family


_COMPILED_MAX_FEATURES = 32  # hmm_gaussian_log_prob's limit; past a few dozen, torch's batched solves win anyway


def compiled_gaussian_log_prob(x: Tensor, *parameters: Tensor):
    """The compiled Gaussian log-density (csrc/cpu/hmm_emissions_cpu.cpp: ``f(x (N, D), means (C, D), factors (C, D) or
    (C, D, D), offsets (C,)) -> (N, C)``, offsets[c] − ½ |F_c (x − means_c)|²) for observations x (..., D) and the
    parameters it derives from, or None, when torch computes the density instead: off the CPU, other dtypes, more
    than 32 features, a gradient wanted (the compiled op has no backward), or the hmm family not built here."""
    if x.shape[-1] > _COMPILED_MAX_FEATURES:
        return None
    return compiled_op("hmm_gaussian_log_prob", x, *parameters)


class GaussianEmission(Emission):
    """Gaussian emissions in D features: ``means`` (C, D) plus a covariance parameter (subclasses).

    Observations: floats, event_shape (D,). Priors and min_covar as in the module docstring;
    ``init_from_data`` is hmmlearn's: k-means means ("m"), the data's covariance + min_covar I ("c").
    """

    param_letters = "mc"
    covariance_type: str

    def __init__(
        self,
        n_states: int,
        n_features: int,
        min_covar: float = 1e-3,
        covars_prior: ArrayLike | float = 1e-2,
        *,
        means_prior: ArrayLike | float = 0.0,
        means_weight: ArrayLike | float = 0.0,
        covars_weight: ArrayLike | float = 1.0,
    ) -> None:
        if n_features is None or n_features <= 0:
            raise ValueError(f"n_features must be a positive int, got {n_features}")
        super().__init__()
        self.n_states, self.n_features, self.event_shape = n_states, n_features, (n_features,)
        self.min_covar, self.covars_prior, self.covars_weight = min_covar, covars_prior, covars_weight
        self.means_prior, self.means_weight = means_prior, means_weight
        self.means = nn.Parameter(torch.empty(n_states, n_features))
        self._build_covariance()
        self.reset_parameters()

    def extra_repr(self) -> str:
        return f"n_states={self.n_states}, n_features={self.n_features}, min_covar={self.min_covar}"

    # -------------------------------------------------------- subclass hooks

    def _build_covariance(self) -> None:
        """Register the covariance parameter."""
        raise NotImplementedError

    def _set_covars(self, covars: Tensor, seen: Tensor | None = None) -> None:
        """Store covariances of the compact shape (states where `seen` (C,) is False keep theirs)."""
        raise NotImplementedError

    def _noise(self, z: Tensor, states: Tensor) -> Tensor:
        """Standard normal z (*batch, D) -> covariance-scaled noise for `states` (*batch,)."""
        raise NotImplementedError

    def _covars_m_step(self, second: Tensor, post: Tensor, obs: Tensor, means: Tensor) -> Tensor:
        """The new compact covariances from the second moments, n (C,), S (C, D), means (C, D)."""
        raise NotImplementedError

    def _from_data_covariance(self, cv: Tensor) -> Tensor:
        """The compact covariances hmmlearn initialises from the data's covariance cv (D, D)."""
        raise NotImplementedError

    def _get_covars(self) -> Tensor:
        """The covariances in the compact shape of the type (detached)."""
        raise NotImplementedError

    @property
    def covars_(self) -> Tensor:
        """Covariances in hmmlearn's compact ``_covars_`` shape: spherical (C,), diag (C, D), full
        (C, D, D), tied (D, D); write any form :func:`validate_covars` accepts (tensor or numpy)."""
        return self._get_covars()

    @covars_.setter
    def covars_(self, value: ArrayLike) -> None:
        with torch.no_grad():
            self._set_covars(self._validated(value))

    def _validated(self, value: ArrayLike) -> Tensor:
        v = validate_covars(value, self.covariance_type, self.n_states, self.n_features)
        return v.to(device=self.means.device, dtype=self.means.dtype)

    # -------------------------------------------------------- shared

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Standard normal means, unit covariances."""
        eye = torch.eye(self.n_features, dtype=torch.float64)
        with torch.no_grad():
            self.means.copy_(torch.randn(self.means.shape, generator=generator, dtype=torch.float64))
            self._set_covars(self._from_data_covariance(eye).to(self.means))

    def init_from_data(self, x: Tensor, generator: torch.Generator | None = None, params: str | None = None) -> None:
        """hmmlearn's initialisation from observations x (N, D): "m" means by k-means (k-means++ seeding,
        best of 10), "c" covariances from the data's covariance (N − 1 normalised) + min_covar I."""
        N, D = len(x), self.n_features
        letters = self._updates(params)
        C = self.n_states
        if N == 0 or ("m" in letters and len(x) < C):
            need = f"{C} samples (k-means for {C} means)" if N else "one sample"
            raise ValueError(f"X has shape {tuple(x.shape)}: initialising from data needs at least {need}")
        with torch.no_grad():
            if "m" in letters:
                self.means.copy_(kmeans(x, self.n_states, generator))
            if "c" in letters:
                cv = torch.cov(x.T, correction=1 if N > 1 else 0).reshape(D, D)
                cv = cv + self.min_covar * torch.eye(D, dtype=cv.dtype, device=cv.device)
                self._set_covars(self._from_data_covariance(cv))

    @property
    def means_(self) -> Tensor:
        """(C, D) means; write (tensor or numpy) to set them."""
        return self.means.detach().clone()

    @means_.setter
    def means_(self, value: ArrayLike) -> None:
        m = _tensor(value)
        if tuple(m.shape) != (self.n_states, self.n_features) or not bool(torch.isfinite(m).all()):
            raise ValueError(f"means_ must be finite of shape {(self.n_states, self.n_features)}, got {tuple(m.shape)}")
        with torch.no_grad():
            self.means.copy_(m)

    def check(self, x: ArrayLike, batch_ndim: int, valid: Tensor | None = None) -> Tensor:
        x = torch.as_tensor(x, device=self._device)
        self._check_shape(x, batch_ndim, f"(n_features={self.n_features})")
        if x.dtype.is_complex or x.dtype == torch.bool:
            raise ValueError(f"X must hold real numbers, got dtype {x.dtype} (shape {tuple(x.shape)})")
        x = x.to(self.means.dtype)
        if valid is not None:
            x = torch.where(valid[..., None], x, 0.0)
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"X (shape {tuple(x.shape)}) has non-finite values")
        return x

    def m_step(self, x: Tensor, weights: Tensor, params: str | None = None) -> None:
        """hmmlearn's MAP update of the means ("m") and covariances ("c"); see the module docstring."""
        if self._updates(params):
            self.m_step_from_stats(self.sufficient_stats(x, weights), params)

    def agreement_fields(self) -> dict[str, float]:
        kind = float(COVARIANCE_TYPES.index(self.covariance_type))
        return {"n_features": float(self.n_features), "covariance_type": kind}

    def sufficient_stats(self, x: Tensor, weights: Tensor) -> list[Tensor]:
        """What the M-step needs of observations x (N, D) with posteriors weights (N, C), sums over the
        samples (so ranks holding shards of the data add theirs up, distributed.py): n = Σγ (C,),
        S = Σγ x (C, D) and the second moments (Σγ x² (C, D) for diagonal types, Σγ x xᵀ (C, D, D) for
        full ones)."""
        return [weights.sum(0), weights.T @ x, self._second_moment(x, weights)]

    def _second_moment(self, x: Tensor, weights: Tensor) -> Tensor:
        raise NotImplementedError

    def m_step_from_stats(self, stats: list[Tensor], params: str | None = None) -> None:
        """The M-step from :meth:`sufficient_stats` (n, S, second moments)."""
        post, obs, second = stats
        letters = self._updates(params)
        if not letters:
            return
        C, D = self.n_states, self.n_features
        seen = post > 0  # states with no posterior mass keep their parameters
        means = self.means.detach()
        if "m" in letters:
            w = _per_state(self.means_weight, C, 2, "means_weight", means)
            prior = _prior(self.means_prior, (C, D), "means_prior", means)
            means = torch.where(seen[:, None], (w * prior + obs) / (w + post[:, None]), means)
        with torch.no_grad():
            if "c" in letters:
                self._set_covars(self._covars_m_step(second, post, obs, means), seen)
            self.means.copy_(means)

    def _mean_offsets(self, means: Tensor) -> tuple[Tensor, Tensor]:
        """(means_weight per state (C, 1), means − means_prior (C, D)) for the covariance updates."""
        C, D = self.n_states, self.n_features
        w = _per_state(self.means_weight, C, 2, "means_weight", means)
        return w, means - _prior(self.means_prior, (C, D), "means_prior", means)

    def sample(self, states: Tensor, generator: torch.Generator | None = None) -> Tensor:
        z = torch.randn(
            (*states.shape, self.n_features), generator=generator, dtype=self.means.dtype, device=states.device
        )
        return self.means_[states] + self._noise(z, states)


class GaussianDiagEmission(GaussianEmission):
    """Diagonal covariances (hmmlearn's "diag"): ``log_covars`` (C, D), the log variances; covars_ (C, D)
    (writes also take hmmlearn's (C, D, D) diagonal matrices)."""

    covariance_type = "diag"

    def _build_covariance(self) -> None:
        self.log_covars = nn.Parameter(torch.empty(self.n_states, self.n_features))

    def _get_covars(self) -> Tensor:
        return self.log_covars.detach().exp()

    def _set_covars(self, covars: Tensor, seen: Tensor | None = None) -> None:
        log = covars.log().reshape(self.log_covars.shape)
        if seen is not None:
            log = torch.where(seen[:, None], log, self.log_covars)
        self.log_covars.copy_(log)

    def _variance_prior(self, like: Tensor) -> Tensor:
        return _prior(self.covars_prior, (self.n_states, self.n_features), "covars_prior", like)

    def _second_moment(self, x: Tensor, weights: Tensor) -> Tensor:
        return weights.T @ x.square()  # (C, D)

    def _covars_m_step(self, second: Tensor, post: Tensor, obs: Tensor, means: Tensor) -> Tensor:
        w, d = self._mean_offsets(means)
        numerator = w * d.square() + second - 2 * means * obs + means.square() * post[:, None]
        cw = _per_state(self.covars_weight, self.n_states, 2, "covars_weight", means)
        covars = (self._variance_prior(means) + numerator) / ((cw - 1).clamp_min(0) + post[:, None]).clamp_min(1e-5)
        return covars.clamp_min(self.min_covar)

    def _from_data_covariance(self, cv: Tensor) -> Tensor:
        return cv.diagonal().expand(self.n_states, -1)

    def _noise(self, z: Tensor, states: Tensor) -> Tensor:
        return z * torch.exp(0.5 * self.log_covars.detach())[states]

    def log_prob(self, x: Tensor) -> Tensor:
        log_var = self.log_covars.expand(self.n_states, self.n_features)
        compiled = compiled_gaussian_log_prob(x, self.means, self.log_covars)
        if compiled is not None:  # one pass, F_c = diag(exp(-log_var / 2))
            offsets = -0.5 * (self.n_features * math.log(2 * math.pi) + log_var.sum(-1))
            flat = x.reshape(-1, self.n_features)
            return compiled(flat, self.means, torch.exp(-0.5 * log_var), offsets).reshape(*x.shape[:-1], self.n_states)
        diff = x.unsqueeze(-2) - self.means  # (..., C, D)
        return -0.5 * (
            self.n_features * math.log(2 * math.pi) + log_var.sum(-1) + (diff.square() * torch.exp(-log_var)).sum(-1)
        )


class GaussianSphericalEmission(GaussianDiagEmission):
    """One variance per state (hmmlearn's "spherical"): ``log_covars`` (C, 1); covars_ (C,). The M-step
    averages the diagonal update over the features; covars_prior is a scalar or (C,) per state."""

    covariance_type = "spherical"

    def _build_covariance(self) -> None:
        self.log_covars = nn.Parameter(torch.empty(self.n_states, 1))

    def _get_covars(self) -> Tensor:
        return self.log_covars.detach().exp()[:, 0]

    def _variance_prior(self, like: Tensor) -> Tensor:
        return _per_state(self.covars_prior, self.n_states, 2, "covars_prior", like)

    def _covars_m_step(self, second: Tensor, post: Tensor, obs: Tensor, means: Tensor) -> Tensor:
        return super()._covars_m_step(second, post, obs, means).mean(-1)

    def _from_data_covariance(self, cv: Tensor) -> Tensor:
        return cv.diagonal().mean().expand(self.n_states)


class _GaussianCholeskyEmission(GaussianEmission):
    """Full covariance matrices, stored as Cholesky factors with log diagonals (``covars_factor``)."""

    def _factor(self) -> Tensor:
        return _raw_to_factor(self.covars_factor)

    def _set_covars(self, covars: Tensor, seen: Tensor | None = None) -> None:
        # on the CPU, a check is cheaper than the covariances it would otherwise rebuild (on a GPU it would sync)
        every_state = seen is not None and seen.device.type == "cpu" and bool(seen.all())
        if seen is not None and self.covars_factor.ndim == 3 and not every_state:
            covars = torch.where(seen[:, None, None], covars, self.covars_)
        elif seen is not None and not bool(seen.any()):
            return
        self.covars_factor.copy_(_factor_to_raw(_cholesky(covars, "covars_")))

    def _get_covars(self) -> Tensor:
        L = self._factor().detach()
        return L @ L.transpose(-1, -2)

    def _second_moment(self, x: Tensor, weights: Tensor) -> Tensor:
        N, C, D = len(x), self.n_states, self.n_features
        return ((weights[:, :, None] * x[:, None, :]).reshape(N, C * D).T @ x).reshape(C, D, D)  # Σγ x xᵀ

    def _scatter(self, xx: Tensor, post: Tensor, obs: Tensor, means: Tensor) -> Tensor:
        """Numerator of the full update per state (C, D, D): w d dᵀ + Σγ x xᵀ − S μᵀ − μ Sᵀ + n μ μᵀ."""
        w, d = self._mean_offsets(means)
        sm = obs[:, :, None] * means[:, None, :]
        mm = means[:, :, None] * means[:, None, :]
        return w[..., None] * d[:, :, None] * d[:, None, :] + xx - sm - sm.transpose(1, 2) + post[:, None, None] * mm

    def _log_prob_factor(self, x: Tensor, L: Tensor) -> Tensor:
        """log N(x | means_c, L_c L_cᵀ) -> (*batch, C) for x (*batch, D), L (C, D, D) or (D, D)."""
        C, D = self.n_states, self.n_features
        diff = x.unsqueeze(-2) - self.means  # (*batch, C, D)
        batch = diff.shape[:-2]
        if L.ndim == 3:
            z = torch.linalg.solve_triangular(L, diff.reshape(-1, C, D).permute(1, 2, 0), upper=False)  # (C, D, N)
            maha = z.square().sum(1).T
        else:
            z = torch.linalg.solve_triangular(L, diff.reshape(-1, D).T, upper=False)  # (D, N * C)
            maha = z.square().sum(0).reshape(-1, C)
        log_det = 2 * L.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        return -0.5 * (D * math.log(2 * math.pi) + log_det + maha.reshape(*batch, C))

    def log_prob(self, x: Tensor) -> Tensor:
        L = self._factor()
        compiled = compiled_gaussian_log_prob(x, self.means, self.covars_factor)
        if compiled is None:
            return self._log_prob_factor(x, L)
        C, D = self.n_states, self.n_features  # one pass, F_c = L_c⁻¹
        eye = torch.eye(D, dtype=L.dtype, device=L.device)
        whitening = torch.linalg.solve_triangular(L, eye, upper=False).expand(C, D, D)
        offsets = -0.5 * (D * math.log(2 * math.pi) + 2 * L.diagonal(dim1=-2, dim2=-1).log().sum(-1))
        out = compiled(x.reshape(-1, D), self.means, whitening, offsets.expand(C))
        return out.reshape(*x.shape[:-1], C)


class GaussianFullEmission(_GaussianCholeskyEmission):
    """A full covariance matrix per state (hmmlearn's "full"): ``covars_factor`` (C, D, D), the Cholesky
    factors L (covars = L Lᵀ) with log diagonals; covars_ (C, D, D)."""

    covariance_type = "full"

    def _build_covariance(self) -> None:
        self.covars_factor = nn.Parameter(torch.empty(self.n_states, self.n_features, self.n_features))

    def _covars_m_step(self, second: Tensor, post: Tensor, obs: Tensor, means: Tensor) -> Tensor:
        C, D = self.n_states, self.n_features
        prior = _prior(self.covars_prior, (C, D, D), "covars_prior", means)
        cw = _per_state(self.covars_weight, C, 3, "covars_weight", means)
        return (prior + self._scatter(second, post, obs, means)) / ((cw - D).clamp_min(0) + post[:, None, None])

    def _from_data_covariance(self, cv: Tensor) -> Tensor:
        return cv.expand(self.n_states, -1, -1)

    def _noise(self, z: Tensor, states: Tensor) -> Tensor:
        return (self._factor().detach()[states] @ z[..., None])[..., 0]


class GaussianTiedEmission(_GaussianCholeskyEmission):
    """One full covariance matrix shared by every state (hmmlearn's "tied"): ``covars_factor`` (D, D),
    its Cholesky factor with a log diagonal; covars_ (D, D); covars_weight is a scalar."""

    covariance_type = "tied"

    def _build_covariance(self) -> None:
        self.covars_factor = nn.Parameter(torch.empty(self.n_features, self.n_features))

    def _covars_m_step(self, second: Tensor, post: Tensor, obs: Tensor, means: Tensor) -> Tensor:
        D = self.n_features
        prior = _prior(self.covars_prior, (D, D), "covars_prior", means)
        cw = _prior(self.covars_weight, (), "covars_weight", means)
        scatter = self._scatter(second, post, obs, means).sum(0)
        return (prior + scatter) / ((cw - D).clamp_min(0) + post.sum())

    def _from_data_covariance(self, cv: Tensor) -> Tensor:
        return cv

    def _noise(self, z: Tensor, states: Tensor) -> Tensor:
        return z @ self._factor().detach().T


_CLASSES = {
    "spherical": GaussianSphericalEmission,
    "diag": GaussianDiagEmission,
    "full": GaussianFullEmission,
    "tied": GaussianTiedEmission,
}


def gaussian_emission(covariance_type: str, n_states: int, n_features: int, **kwargs) -> GaussianEmission:
    """The Gaussian emission model of hmmlearn's `covariance_type` (keyword arguments: the class's)."""
    if covariance_type not in _CLASSES:
        raise ValueError(f"covariance_type must be one of {COVARIANCE_TYPES}, got {covariance_type!r}")
    return _CLASSES[covariance_type](n_states, n_features, **kwargs)
