"""Poisson emissions in D count features (hmmlearn's PoissonHMM), and the count helpers the multinomial family
shares (validated counts, Σ_d x_d log p_cd − log x_d! with 0 log 0 = 0).

The M-step is hmmlearn 0.3's MAP update under a Gamma(α, β) prior on each rate (α ``lambdas_prior``,
β ``lambdas_weight``), with n_c = Σ_t γ_t(c), S_c = Σ_t γ_t(c) x_t and N = Σ_c n_c the number of samples:

    λ_c = (α + N S_c / n_c) / (β + N)

(hmmlearn's formula: N is the total mass over all states, not n_c; with α = β = 0, the default, it is the
posterior-weighted mean S_c / n_c). α and β are scalars, per state (C,), or arrays broadcastable to λ's
(C, D) (hmmlearn broadcasts a (C,) array against the features instead, or fails: the same numbers for
scalars and (C, D)). A state with no posterior mass keeps its rates.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from .base import ArrayLike, Emission, _per_state, _prior, _tensor

__all__ = ["PoissonEmission", "check_counts", "log_count_terms", "moment_matched_gamma"]


# ---------------------------------------------------------------------------------------------- count helpers


def check_counts(x: Tensor, dtype: torch.dtype, name: str = "X") -> Tensor:
    """Counts (any real or integer dtype) -> `dtype`; ValueError unless finite, non-negative and integral."""
    if x.dtype.is_complex or x.dtype == torch.bool:
        raise ValueError(f"{name} must hold counts, got dtype {x.dtype} (shape {tuple(x.shape)})")
    if x.dtype.is_floating_point and not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} (shape {tuple(x.shape)}) has non-finite values")
    if x.numel() and bool((x < 0).any()):
        raise ValueError(
            f"{name} must hold non-negative counts, got a minimum of {x.min().item()} (shape {tuple(x.shape)})"
        )
    if x.dtype.is_floating_point and bool((x != x.round()).any()):
        raise ValueError(f"{name} must hold integral counts (shape {tuple(x.shape)})")
    return x.to(dtype)


def log_count_terms(x: Tensor, log_p: Tensor) -> Tensor:
    """Σ_d (x_d log p_cd − log x_d!) -> (*batch, C), for counts x (*batch, D) and log p (C, D) (log rates or log
    probabilities); 0 log 0 = 0, so a zero rate or probability allows only zero counts. Differentiable in log_p."""
    zero = log_p == -torch.inf
    terms = x @ torch.where(zero, 0.0, log_p).T - torch.lgamma(x + 1).sum(-1, keepdim=True)
    if bool(zero.any()):
        impossible = (x > 0).to(x.dtype) @ zero.to(x.dtype).T
        terms = torch.where(impossible > 0, -torch.inf, terms)
    return terms


def moment_matched_gamma(mean: float, var: float) -> tuple[float, float]:
    """(shape, scale) of the Gamma distribution with this mean and variance (hmmlearn's initial rates)."""
    if not (np.isfinite(mean) and np.isfinite(var) and mean > 0 and var > 0):
        raise ValueError(
            f"initialising Poisson rates by moments needs data of positive mean and variance, got mean {mean}, "
            f"variance {var}"
        )
    return mean**2 / var, var / mean


# ---------------------------------------------------------------------------------------------- the family


class PoissonEmission(Emission):
    """Independent Poisson counts in D features per state (hmmlearn's PoissonHMM).

    Parameter: ``log_lambdas`` (C, D), the log rates (-inf: rate 0). Observations: non-negative integral counts
    (any real or integer dtype), event_shape (D,). ``lambdas_prior`` α and ``lambdas_weight`` β: the Gamma
    prior of the M-step (module docstring). Parameter letter "l".
    """

    param_letters = "l"

    def __init__(
        self,
        n_states: int,
        n_features: int,
        lambdas_prior: ArrayLike | float = 0.0,
        lambdas_weight: ArrayLike | float = 0.0,
    ) -> None:
        if n_features is None or n_features <= 0:
            raise ValueError(f"n_features must be a positive int, got {n_features}")
        super().__init__()
        self.n_states, self.n_features, self.event_shape = n_states, n_features, (n_features,)
        self.lambdas_prior, self.lambdas_weight = lambdas_prior, lambdas_weight
        self.log_lambdas = nn.Parameter(torch.empty(n_states, n_features))
        self.reset_parameters()

    def extra_repr(self) -> str:
        return f"n_states={self.n_states}, n_features={self.n_features}"

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Rates drawn from an Exponential(1) (Gamma(1, 1))."""
        u = torch.rand(self.n_states, self.n_features, generator=generator, dtype=torch.float64)
        with torch.no_grad():
            self.log_lambdas.copy_((-torch.log1p(-u)).log())

    def init_from_data(self, x: Tensor, generator: torch.Generator | None = None, params: str | None = None) -> None:
        """hmmlearn's rule: rates drawn from the Gamma matching the mean and variance of all of x (N, D)."""
        if not self._updates(params):
            return
        shape, scale = moment_matched_gamma(float(x.mean()), float(x.var(correction=0)))
        seed = int(torch.randint(0, 2**62, (), generator=generator))
        rates = np.random.default_rng(seed).gamma(shape, scale, size=(self.n_states, self.n_features))
        self.lambdas_ = rates

    @property
    def lambdas_(self) -> Tensor:
        """(C, D) rates; write non-negative rates (tensor or numpy) to set them."""
        return self.log_lambdas.detach().exp()

    @lambdas_.setter
    def lambdas_(self, value: ArrayLike) -> None:
        shape = (self.n_states, self.n_features)
        lam = _tensor(value).to(device=self.log_lambdas.device, dtype=torch.float64)
        if tuple(lam.shape) != shape:
            raise ValueError(f"lambdas_ has shape {tuple(lam.shape)}; expected {shape} (n_components, n_features)")
        if not bool(torch.isfinite(lam).all()) or bool((lam < 0).any()):
            raise ValueError(f"lambdas_ (shape {shape}) must hold finite non-negative rates")
        with torch.no_grad():
            self.log_lambdas.copy_(lam.log())

    def check(self, x: ArrayLike, batch_ndim: int, valid: Tensor | None = None) -> Tensor:
        x = torch.as_tensor(x, device=self._device)
        self._check_shape(x, batch_ndim, f"counts (n_features={self.n_features})")
        if valid is not None:
            x = torch.where(valid[..., None], x, 0)
        return check_counts(x, self.log_lambdas.dtype)

    def log_prob(self, x: Tensor) -> Tensor:
        return log_count_terms(x, self.log_lambdas) - self.log_lambdas.exp().sum(-1)

    def m_step(self, x: Tensor, weights: Tensor, params: str | None = None) -> None:
        """hmmlearn's MAP update of the rates (module docstring)."""
        if self._updates(params):
            self.m_step_from_stats(self.sufficient_stats(x, weights), params)

    def sufficient_stats(self, x: Tensor, weights: Tensor) -> list[Tensor]:
        """[n = Σγ (C,), S = Σγ x (C, D)]."""
        return [weights.sum(0), weights.T @ x]

    def m_step_from_stats(self, stats: list[Tensor], params: str | None = None) -> None:
        if not self._updates(params):
            return
        post, obs = stats
        lam = self.log_lambdas.detach()
        alpha = self._rate_prior(self.lambdas_prior, "lambdas_prior")
        beta = self._rate_prior(self.lambdas_weight, "lambdas_weight")
        total = post.sum()
        mean = obs / post[:, None]
        new = ((alpha + total * mean) / (beta + total)).log()
        with torch.no_grad():
            self.log_lambdas.copy_(torch.where(post[:, None] > 0, new, lam))

    def _rate_prior(self, value: ArrayLike | float, name: str) -> Tensor:
        """A prior of the rates (a scalar, per state (C,), or broadcastable to (C, D)) -> (C, D)."""
        lam, C, t = self.log_lambdas.detach(), self.n_states, _tensor(value)
        if t.ndim == 1 and len(t) == C:
            value = _per_state(t, C, 2, name, lam)
        return _prior(value, (C, self.n_features), name, lam)

    def agreement_fields(self) -> dict[str, float]:
        return {"n_features": float(self.n_features)}

    def sample(self, states: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """int64 counts (*states.shape, D)."""
        rates = self.lambdas_[states.reshape(-1)].to(states.device)
        return torch.poisson(rates, generator=generator).long().reshape(*states.shape, self.n_features)
