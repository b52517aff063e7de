"""Gaussian-mixture HMM emissions (hmmlearn's GMMHMM): per state a mixture of M Gaussians in D features.

Parameters (C states, M = n_mix components per state):

    log_weights   (C, M)        unnormalised log mixture weights (log_softmax over M when used)
    means         (C, M, D)     component means
    log_covars    (C, M, D)     "diag": log variances;  (C, M, 1) "spherical": one log variance per component
    covars_factor (C, M, D, D)  "full": Cholesky factors (log diagonal) of each component's covariance
                  (C, D, D)     "tied": one covariance per state, shared by its M components

``covars_`` reads and writes hmmlearn's GMMHMM shapes: spherical (C, M), diag (C, M, D), full (C, M, D, D),
tied (C, D, D) (GMMHMM's "tied" ties the components of a state, not the states, unlike GaussianHMM's).

log p(x | c) = logsumexp_m (log w_cm + log N(x | μ_cm, Σ_cm)), differentiable in every parameter.

The M-step is hmmlearn 0.3's (parameter letters "w" weights, "m" means, "c" covariances). With the
per-component posteriors γ_t(c, m) = γ_t(c) · softmax_m(log w_cm + log N(x_t | μ_cm, Σ_cm)),
n_cm = Σ_t γ_t(c, m), S_cm = Σ_t γ_t(c, m) x_t, the current means μ⁰, the new means μ (μ⁰ when "m" is not
updated), d = μ − means_prior, λ = means_weight, and the scatter around the current means
W_cm = Σ_t γ_t(c, m) (x_t − μ⁰_cm)(x_t − μ⁰_cm)ᵀ (its diagonal for "diag", its trace for "spherical"):

    weights    w_c = normalise(max(weights_prior − 1 + n_c, 0))          (Dirichlet MAP, as dirichlet_map)
    means      μ_cm = (λ_cm means_prior_cm + S_cm) / (λ_cm + n_cm)
    full       Σ_cm = (covars_priorᵀ + λ d dᵀ + W_cm) / (n_cm + covars_weight + D + 2)
    diag       σ²_cm = (λ d² + 2 covars_weight + diag W_cm) / (n_cm + 1 + 2 (covars_prior + 1))
    spherical  σ²_cm = (λ |d|² + 2 covars_weight + tr W_cm) / (D (n_cm + 1) + 2 (covars_prior + 1))
    tied       Σ_c = (covars_priorᵀ + Σ_m λ d dᵀ + Σ_m W_cm) / (n_c + M + covars_weight + D + 1)

(diag / spherical: covars_prior and covars_weight are the inverse gamma's α and β; full / tied: the inverse
Wishart's Ψ and ν). Priors are scalars or arrays broadcastable to hmmlearn's shapes: weights_prior,
means_weight (C, M); means_prior (C, M, D); covars_prior (C, M) spherical, (C, M, D) diag, (C, M, D, D)
full, (C, D, D) tied; covars_weight (C, M) spherical / full, (C, M, D) diag, (C,) tied. None (the
default) takes hmmlearn's (:func:`default_covars_priors`), which make the covariance update the plain
weighted scatter. As GaussianEmission: a component with no posterior mass (or a non-positive
denominator) keeps its parameters; spherical / diagonal variances are floored at ``min_covar``; a full
covariance that is not positive definite gets 1e-7 on its diagonal (hmmlearn's retry) or raises ValueError.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..kmeans import kmeans
from .base import ArrayLike, Emission, _log_distribution, _prior, _tensor, dirichlet_map
from .gaussian import COVARIANCE_TYPES, GaussianEmission, _cholesky, _factor_to_raw, _raw_to_factor, validate_covars

__all__ = ["GMMEmission", "default_covars_priors", "mixture_covars_shape", "validate_mixture_covars"]


def default_covars_priors(covariance_type: str, n_mix: int, n_features: int) -> tuple[float, float]:
    """hmmlearn's GMMHMM defaults (covars_prior, covars_weight) of a covariance type: the priors that make
    the covariance M-step the weighted scatter divided by the posterior mass (spherical: almost)."""
    M, D = n_mix, n_features
    return {
        "spherical": (-(M + 2.0) / 2.0, 0.0),
        "diag": (-1.5, 0.0),
        "full": (0.0, -(1.0 + D + 1.0)),
        "tied": (0.0, -(M + D + 1.0)),
    }[covariance_type]


def mixture_covars_shape(covariance_type: str, n_states: int, n_mix: int, n_features: int | str) -> tuple:
    """hmmlearn's GMMHMM ``covars_`` shape of a covariance type."""
    C, M, D = n_states, n_mix, n_features
    return {"spherical": (C, M), "diag": (C, M, D), "full": (C, M, D, D), "tied": (C, D, D)}[covariance_type]


def validate_mixture_covars(
    value: ArrayLike, covariance_type: str, n_states: int, n_mix: int, n_features: int, name: str = "covars_"
) -> Tensor:
    """GMM covariances of hmmlearn's shape (:func:`mixture_covars_shape`) -> float64 (CPU), checked as
    :func:`validate_covars` checks Gaussian ones: finite, positive variances, symmetric positive definite
    matrices."""
    if covariance_type not in COVARIANCE_TYPES:
        raise ValueError(f"covariance_type must be one of {COVARIANCE_TYPES}, got {covariance_type!r}")
    v = _tensor(value).to(device="cpu", dtype=torch.float64)
    expected = mixture_covars_shape(covariance_type, n_states, n_mix, n_features)
    if tuple(v.shape) != expected:
        raise ValueError(
            f"{name} has shape {tuple(v.shape)}; covariance_type={covariance_type!r} with n_components={n_states}, "
            f"n_mix={n_mix}, n_features={n_features} expects {expected}"
        )
    # the Gaussian checks, over the C * M components (tied: over the C states' matrices)
    gaussian_type = "full" if covariance_type == "tied" else covariance_type
    flat = v.reshape(-1, *v.shape[1 if covariance_type == "tied" else 2 :])
    validate_covars(flat, gaussian_type, len(flat), n_features, name=f"{name} (shape {expected})")
    return v


class GMMEmission(Emission):
    """Gaussian-mixture emissions (hmmlearn's GMMHMM): per state a mixture of ``n_mix`` Gaussians in
    ``n_features`` dimensions, ``covariance_type`` "spherical", "diag", "full" or "tied" (module docstring).

    Observations: floats, event_shape (D,). Views ``weights_`` (C, M), ``means_`` (C, M, D), ``covars_``
    (hmmlearn's shapes) read detached tensors and take tensors or numpy arrays. Parameter letters
    "w", "m", "c"; ``init_from_data`` is hmmlearn's (k-means into C clusters, then k-means of each
    cluster into M components).
    """

    param_letters = "mcw"

    def __init__(
        self,
        n_states: int,
        n_mix: int,
        n_features: int,
        covariance_type: str = "diag",
        min_covar: float = 1e-3,
        *,
        weights_prior: ArrayLike | float = 1.0,
        means_prior: ArrayLike | float = 0.0,
        means_weight: ArrayLike | float = 0.0,
        covars_prior: ArrayLike | float | None = None,
        covars_weight: ArrayLike | float | None = None,
    ) -> None:
        for name, value in (("n_states", n_states), ("n_mix", n_mix), ("n_features", n_features)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if covariance_type not in COVARIANCE_TYPES:
            raise ValueError(f"covariance_type must be one of {COVARIANCE_TYPES}, got {covariance_type!r}")
        super().__init__()
        self.n_states, self.n_mix, self.n_features, self.event_shape = n_states, n_mix, n_features, (n_features,)
        self.covariance_type, self.min_covar = covariance_type, min_covar
        prior, weight = default_covars_priors(covariance_type, n_mix, n_features)
        self.weights_prior, self.means_prior, self.means_weight = weights_prior, means_prior, means_weight
        self.covars_prior = prior if covars_prior is None else covars_prior
        self.covars_weight = weight if covars_weight is None else covars_weight
        C, M, D = n_states, n_mix, n_features
        self.log_weights = nn.Parameter(torch.empty(C, M))
        self.means = nn.Parameter(torch.empty(C, M, D))
        if covariance_type in ("spherical", "diag"):
            self.log_covars = nn.Parameter(torch.empty(C, M, 1 if covariance_type == "spherical" else D))
        else:
            self.covars_factor = nn.Parameter(torch.empty(*((C, M) if covariance_type == "full" else (C,)), D, D))
        self.reset_parameters()

    def extra_repr(self) -> str:
        return (
            f"n_states={self.n_states}, n_mix={self.n_mix}, n_features={self.n_features}, "
            f"covariance_type={self.covariance_type!r}, min_covar={self.min_covar}"
        )

    # -------------------------------------------------------- views

    @property
    def weights_(self) -> Tensor:
        """(C, M) mixture weights; write probabilities (rows summing to 1) to set them."""
        return torch.softmax(self.log_weights.detach(), -1)

    @weights_.setter
    def weights_(self, value: ArrayLike) -> None:
        shape = (self.n_states, self.n_mix)
        with torch.no_grad():
            self.log_weights.copy_(_log_distribution(value, shape, "weights_", self.log_weights))

    @property
    def means_(self) -> Tensor:
        """(C, M, D) component means."""
        return self.means.detach().clone()

    @means_.setter
    def means_(self, value: ArrayLike) -> None:
        m, shape = _tensor(value), tuple(self.means.shape)
        if tuple(m.shape) != shape or not bool(torch.isfinite(m).all()):
            raise ValueError(
                f"means_ has shape {tuple(m.shape)}; expected finite values of shape (n_components, n_mix, "
                f"n_features) = {shape}"
            )
        with torch.no_grad():
            self.means.copy_(m)

    @property
    def covars_(self) -> Tensor:
        """Covariances in hmmlearn's GMMHMM shape (:func:`mixture_covars_shape`)."""
        if self.covariance_type == "spherical":
            return self.log_covars.detach().exp()[..., 0]
        if self.covariance_type == "diag":
            return self.log_covars.detach().exp()
        L = _raw_to_factor(self.covars_factor.detach())
        return L @ L.transpose(-1, -2)

    @covars_.setter
    def covars_(self, value: ArrayLike) -> None:
        C, M, D = self.n_states, self.n_mix, self.n_features
        v = validate_mixture_covars(value, self.covariance_type, C, M, D).to(self.means)
        with torch.no_grad():
            self._store_covars(v)

    def _store_covars(self, covars: Tensor) -> None:
        if self.covariance_type in ("spherical", "diag"):
            self.log_covars.copy_(covars.log().reshape(self.log_covars.shape))
        else:
            self.covars_factor.copy_(_factor_to_raw(_cholesky(covars, "covars_")))

    # -------------------------------------------------------- densities

    def check(self, x: ArrayLike, batch_ndim: int, valid: Tensor | None = None) -> Tensor:
        # the same observations as the Gaussian family: real (*batch, D), finite, in the means' dtype
        return GaussianEmission.check(self, x, batch_ndim, valid)  # type: ignore[arg-type]

    def component_log_prob(self, x: Tensor) -> Tensor:
        """log N(x | μ_cm, Σ_cm) of each component (without its weight): x (*batch, D) -> (*batch, C, M)."""
        C, M, D = self.n_states, self.n_mix, self.n_features
        diff = x[..., None, None, :] - self.means  # (*batch, C, M, D)
        batch = diff.shape[:-3]
        if self.covariance_type in ("spherical", "diag"):
            log_var = self.log_covars.expand(C, M, D)
            maha = (diff.square() * torch.exp(-log_var)).sum(-1)
            log_det = log_var.sum(-1)
        else:
            L = _raw_to_factor(self.covars_factor)
            d = diff.reshape(-1, C, M, D)
            if self.covariance_type == "full":  # (C, M, D, D) against (C, M, D, N)
                z = torch.linalg.solve_triangular(L, d.permute(1, 2, 3, 0), upper=False)
                maha = z.square().sum(-2).permute(2, 0, 1)
            else:  # tied: (C, D, D) against (C, D, M * N)
                rhs = d.permute(1, 3, 2, 0).reshape(C, D, -1)
                z = torch.linalg.solve_triangular(L, rhs, upper=False)
                maha = z.square().sum(1).reshape(C, M, -1).permute(2, 0, 1)
            maha = maha.reshape(*batch, C, M)
            log_det = 2 * L.diagonal(dim1=-2, dim2=-1).log().sum(-1)
            if self.covariance_type == "tied":
                log_det = log_det[:, None]
        return -0.5 * (D * math.log(2 * math.pi) + log_det + maha)

    def _joint_log_prob(self, x: Tensor) -> Tensor:
        """log w_cm + log N(x | μ_cm, Σ_cm): x (*batch, D) -> (*batch, C, M)."""
        return torch.log_softmax(self.log_weights, -1) + self.component_log_prob(x)

    def log_prob(self, x: Tensor) -> Tensor:
        return torch.logsumexp(self._joint_log_prob(x), -1)

    def responsibilities(self, x: Tensor, weights: Tensor) -> Tensor:
        """Per-component posteriors γ_t(c) · p(m | x_t, c): x (N, D), weights γ (N, C) -> (N, C, M)
        (0 where the state's mixture density underflows to 0)."""
        joint = self._joint_log_prob(x)
        r = torch.exp(joint - torch.logsumexp(joint, -1, keepdim=True))
        return torch.where(torch.isfinite(r), r, 0.0) * weights[..., None]

    # -------------------------------------------------------- EM

    def sufficient_stats(self, x: Tensor, weights: Tensor) -> list[Tensor]:
        """Sums over the samples x (N, D) with state posteriors weights (N, C): n (C, M), S = Σγ x (C, M, D)
        and the second moments: Σγ x² (C, M, D) spherical / diag, Σγ x xᵀ (C, M, D, D) full, per state
        Σ_t γ_t(c) x xᵀ (C, D, D) tied (per-component posteriors, see the module docstring)."""
        C, M, D, N = self.n_states, self.n_mix, self.n_features, len(x)
        with torch.no_grad():
            r = self.responsibilities(x, weights).reshape(N, C * M)
            n, obs = r.sum(0).reshape(C, M), (r.T @ x).reshape(C, M, D)
            if self.covariance_type in ("spherical", "diag"):
                second = (r.T @ x.square()).reshape(C, M, D)
            elif self.covariance_type == "full":  # Σγ x xᵀ per component
                second = ((r[:, :, None] * x[:, None, :]).reshape(N, C * M * D).T @ x).reshape(C, M, D, D)
            else:  # tied: Σ_t γ_t(c) x xᵀ per state (the components' posteriors sum to the state's)
                g = r.reshape(N, C, M).sum(-1)
                second = ((g[:, :, None] * x[:, None, :]).reshape(N, C * D).T @ x).reshape(C, D, D)
        return [n, obs, second]

    def m_step(self, x: Tensor, weights: Tensor, params: str | None = None) -> None:
        """hmmlearn's MAP update of "w", "m", "c" (module docstring) from observations x (N, D) and state
        posteriors weights (N, C)."""
        if self._updates(params):
            self.m_step_from_stats(self.sufficient_stats(x, weights), params)

    def m_step_from_stats(self, stats: list[Tensor], params: str | None = None) -> None:
        """The M-step from :meth:`sufficient_stats` (n, S, second moments), summed over samples and ranks."""
        letters = self._updates(params)
        if not letters:
            return
        n, obs, second = stats
        C, M, D = self.n_states, self.n_mix, self.n_features
        with torch.no_grad():
            old = self.means.detach()
            scatter = self._scatter(second, n, obs, old)  # computed before the means move, as hmmlearn's
            means = old
            if "m" in letters:
                lam = _prior(self.means_weight, (C, M), "means_weight", old)[..., None]
                prior = _prior(self.means_prior, (C, M, D), "means_prior", old)
                means = torch.where((n > 0)[..., None], (lam * prior + obs) / (lam + n[..., None]), old)
            if "c" in letters:
                self._store_covars(self._covars_update(scatter, n, means))
            if "w" in letters:
                log_w = torch.log_softmax(self.log_weights, -1)
                self.log_weights.copy_(dirichlet_map(n, self.weights_prior, log_w, "weights_prior", False))
            self.means.copy_(means)

    def _scatter(self, second: Tensor, n: Tensor, obs: Tensor, mu: Tensor) -> Tensor:
        """W = Σγ (x − μ)(x − μ)ᵀ around the current means μ (C, M, D) from the raw moments: (C, M, D)
        diagonals for spherical / diag, (C, M, D, D) full, (C, D, D) summed over components for tied."""
        if self.covariance_type in ("spherical", "diag"):
            return second - 2 * mu * obs + n[..., None] * mu.square()
        sm = obs[..., :, None] * mu[..., None, :]
        cross = sm + sm.transpose(-1, -2) - n[..., None, None] * mu[..., :, None] * mu[..., None, :]
        return second - (cross if self.covariance_type == "full" else cross.sum(1))

    def _covars_update(self, scatter: Tensor, n: Tensor, means: Tensor) -> Tensor:
        """hmmlearn's covariance MAP update (module docstring) in hmmlearn's shape; components (tied: states)
        with no posterior mass or a non-positive denominator keep their covariances."""
        C, M, D, t = self.n_states, self.n_mix, self.n_features, self.covariance_type
        like = means
        lam = _prior(self.means_weight, (C, M), "means_weight", like)
        d = means - _prior(self.means_prior, (C, M, D), "means_prior", like)
        prior_shape = mixture_covars_shape(t, C, M, D)
        weight_shape = {"spherical": (C, M), "diag": (C, M, D), "full": (C, M), "tied": (C,)}[t]
        prior = _prior(self.covars_prior, prior_shape, "covars_prior", like)
        weight = _prior(self.covars_weight, weight_shape, "covars_weight", like)
        if t == "diag":
            num = lam[..., None] * d.square() + 2 * weight + scatter
            den, mass = n[..., None] + 1 + 2 * (prior + 1), n[..., None]
        elif t == "spherical":
            num = lam * d.square().sum(-1) + 2 * weight + scatter.sum(-1)
            den, mass = D * (n + 1) + 2 * (prior + 1), n
        else:
            dd = lam[..., None, None] * d[..., :, None] * d[..., None, :]
            if t == "full":
                num = prior.transpose(-1, -2) + dd + scatter
                den, mass = n + weight + D + 2, n
            else:
                num = prior.transpose(-1, -2) + dd.sum(1) + scatter
                den, mass = n.sum(-1) + M + weight + D + 1, n.sum(-1)
            den, mass = den[..., None, None], mass[..., None, None]
        ok = (mass > 0) & (den > 0)
        covars = num / torch.where(ok, den, 1.0)
        if t in ("spherical", "diag"):
            covars = covars.clamp_min(self.min_covar)
        return torch.where(ok, covars, self.covars_)

    # -------------------------------------------------------- initialisation and sampling

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Uniform weights, standard normal means, unit covariances."""
        C, M, D = self.n_states, self.n_mix, self.n_features
        with torch.no_grad():
            self.log_weights.fill_(-math.log(M))
            self.means.copy_(torch.randn((C, M, D), generator=generator, dtype=torch.float64))
            self._store_covars(self._from_data_covariance(torch.eye(D, dtype=torch.float64)).to(self.means))

    def _from_data_covariance(self, cv: Tensor) -> Tensor:
        """hmmlearn's initial covariances of every component from the data's covariance cv (D, D)."""
        C, M, D = self.n_states, self.n_mix, self.n_features
        return {
            "spherical": lambda: cv.diagonal().mean().expand(C, M),  # as GaussianEmission (hmmlearn: every entry)
            "diag": lambda: cv.diagonal().expand(C, M, D),
            "full": lambda: cv.expand(C, M, D, D),
            "tied": lambda: cv.expand(C, D, D),
        }[self.covariance_type]().clone()

    def init_from_data(self, x: Tensor, generator: torch.Generator | None = None, params: str | None = None) -> None:
        """hmmlearn's initialisation from observations x (N, D): "w" uniform weights; "m" k-means of x into
        C clusters, then each cluster's points into M (a cluster with fewer than M points: M draws from
        N(mean of the C centres, cv)); "c" every component's covariance from cv, the data's covariance
        (N − 1 normalised) + min_covar I."""
        letters = self._updates(params)
        C, M, D, N = self.n_states, self.n_mix, self.n_features, len(x)
        if N == 0 or ("m" in letters and N < C):
            need = f"{C} samples (k-means for {C} states)" if N else "one sample"
            raise ValueError(f"X has shape {tuple(x.shape)}: initialising from data needs at least {need}")
        cv = torch.cov(x.T, correction=1 if N > 1 else 0).reshape(D, D)
        cv = cv + self.min_covar * torch.eye(D, dtype=cv.dtype, device=cv.device)
        with torch.no_grad():
            if "w" in letters:
                self.log_weights.fill_(-math.log(M))
            if "m" in letters:
                self.means.copy_(self._kmeans_means(x, cv, generator))
            if "c" in letters:
                self._store_covars(self._from_data_covariance(cv))

    def _kmeans_means(self, x: Tensor, cv: Tensor, generator: torch.Generator | None) -> Tensor:
        C, M = self.n_states, self.n_mix
        centres = kmeans(x, C, generator)
        labels = torch.cdist(x, centres).argmin(-1)
        means = []
        for c in range(C):
            cluster = x[labels == c]
            if len(cluster) >= M:
                means.append(kmeans(cluster, M, generator))
            else:  # too few points for M components: draws around the centre of the clusters
                z = torch.randn((M, self.n_features), generator=generator, dtype=x.dtype).to(x.device)
                means.append(centres.mean(0) + z @ torch.linalg.cholesky(cv).T)
        return torch.stack(means)

    def sample(self, states: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """One observation per state of `states` (*batch,): a component by its weight, then its Gaussian."""
        flat = states.reshape(-1)
        D = self.n_features
        if flat.numel() == 0:
            return self.means.new_empty((*states.shape, D))
        comp = torch.multinomial(self.weights_[flat], 1, generator=generator)[:, 0]
        z = torch.randn((len(flat), D), generator=generator, dtype=self.means.dtype, device=flat.device)
        if self.covariance_type in ("spherical", "diag"):
            noise = z * torch.exp(0.5 * self.log_covars.detach())[flat, comp]
        else:
            L = _raw_to_factor(self.covars_factor.detach())
            L = L[flat, comp] if self.covariance_type == "full" else L[flat]
            noise = (L @ z[..., None])[..., 0]
        return (self.means.detach()[flat, comp] + noise).reshape(*states.shape, D)

    def agreement_fields(self) -> dict[str, float]:
        kind = float(COVARIANCE_TYPES.index(self.covariance_type))
        return {"n_features": float(self.n_features), "n_mix": float(self.n_mix), "covariance_type": kind}
