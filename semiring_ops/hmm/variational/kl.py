"""The conjugate families of the variational HMMs: expectations under them and their KL divergences (torch).

Every function is batched over leading dimensions and meant for float64 tensors.

* Dirichlet(α) over the last dimension (K): ``expected_log_dirichlet`` is E[log θ] = ψ(α) − ψ(Σα), whose
  exponential is the sub-normalised parameter the variational E-step uses; ``kl_dirichlet``.
* Multivariate normal N(mean, covar) (D): ``kl_normal``.
* Wishart over precisions Λ (D x D) with ``dof`` ν and an *inverse* scale matrix S (hmmlearn's ``scale_*_``
  attributes: E[Λ] = ν S⁻¹): ``expected_log_det_wishart`` (E[log |Λ|]), ``log_wishart_normaliser`` and
  ``kl_wishart``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "expected_log_det_wishart",
    "expected_log_dirichlet",
    "kl_dirichlet",
    "kl_normal",
    "kl_wishart",
    "log_wishart_normaliser",
]


def expected_log_dirichlet(alpha: Tensor) -> Tensor:
    """E[log θ] for θ ~ Dirichlet(alpha) over the last dimension: alpha (..., K) -> (..., K)."""
    return torch.special.digamma(alpha) - torch.special.digamma(alpha.sum(-1, keepdim=True))


def kl_dirichlet(q: Tensor, p: Tensor) -> Tensor:
    """KL(Dirichlet(q) || Dirichlet(p)) over the last dimension: q, p (..., K) -> (...)."""
    lgamma = torch.special.gammaln
    normalisers = lgamma(q.sum(-1)) - lgamma(p.sum(-1)) - (lgamma(q) - lgamma(p)).sum(-1)
    return normalisers + ((q - p) * expected_log_dirichlet(q)).sum(-1)


def kl_normal(mean_q: Tensor, covar_q: Tensor, mean_p: Tensor, covar_p: Tensor) -> Tensor:
    """KL(N(mean_q, covar_q) || N(mean_p, covar_p)): means (..., D), covariances (..., D, D) -> (...)."""
    D = mean_q.shape[-1]
    precision_p = torch.linalg.inv(covar_p)
    diff = (mean_q - mean_p).unsqueeze(-1)
    trace = torch.einsum("...ij,...ji->...", precision_p, covar_q)
    mahalanobis = (diff.mT @ precision_p @ diff)[..., 0, 0]
    return 0.5 * (torch.linalg.slogdet(covar_p)[1] - torch.linalg.slogdet(covar_q)[1] + trace + mahalanobis - D)


def _half_dofs(dof: Tensor, D: int) -> Tensor:
    """(ν − i) / 2 for i = 0..D−1: dof (...) -> (..., D)."""
    return (dof.unsqueeze(-1) - torch.arange(D, dtype=dof.dtype, device=dof.device)) / 2


def expected_log_det_wishart(dof: Tensor, scale: Tensor, log_det_half: Tensor | None = None) -> Tensor:
    """E[log |Λ|] for Λ ~ Wishart(dof, inverse scale `scale`): dof (...), scale (..., D, D) -> (...).
    ``log_det_half``: log |scale / 2| (...) if known (it is then not recomputed)."""
    D = scale.shape[-1]
    if log_det_half is None:
        log_det_half = torch.linalg.slogdet(scale / 2)[1]
    return torch.special.digamma(_half_dofs(dof, D)).sum(-1) - log_det_half


def log_wishart_normaliser(dof: Tensor, scale: Tensor, log_det_half: Tensor | None = None) -> Tensor:
    """log of the Wishart normalising constant (ν D/2 log 2 + ν/2 log |S⁻¹| + log Γ_D(ν/2)) -> (...).
    ``log_det_half``: log |scale / 2| if known."""
    D = scale.shape[-1]
    if log_det_half is None:
        log_det_half = torch.linalg.slogdet(scale / 2)[1]
    log_gamma_D = D * (D - 1) / 4 * math.log(math.pi) + torch.special.gammaln(_half_dofs(dof, D)).sum(-1)
    return log_gamma_D - dof / 2 * log_det_half


def kl_wishart(
    dof_q: Tensor,
    scale_q: Tensor,
    dof_p: Tensor,
    scale_p: Tensor,
    *,
    inverse_q: Tensor | None = None,
    log_det_half_q: Tensor | None = None,
    log_normaliser_p: Tensor | None = None,
    expected_log_det_q: Tensor | None = None,
) -> Tensor:
    """KL(Wishart(dof_q, S_q) || Wishart(dof_p, S_p)) with inverse scales S: dofs (...), S (..., D, D) -> (...).
    What is known already is not recomputed: ``inverse_q`` S_q⁻¹, ``log_det_half_q`` log |S_q / 2|,
    ``log_normaliser_p`` log_wishart_normaliser(dof_p, S_p) and ``expected_log_det_q`` E_q[log |Λ|]."""
    D = scale_q.shape[-1]
    if log_det_half_q is None:
        log_det_half_q = torch.linalg.slogdet(scale_q / 2)[1]
    if inverse_q is None:
        inverse_q = torch.linalg.inv(scale_q)
    if log_normaliser_p is None:
        log_normaliser_p = log_wishart_normaliser(dof_p, scale_p)
    if expected_log_det_q is None:
        expected_log_det_q = expected_log_det_wishart(dof_q, scale_q, log_det_half_q)
    trace = (scale_p * inverse_q.mT).sum((-2, -1))  # tr(S_p S_q⁻¹)
    return (
        (dof_q - dof_p) / 2 * expected_log_det_q
        - D * dof_q / 2
        + dof_q / 2 * trace
        + log_normaliser_p
        - log_wishart_normaliser(dof_q, scale_q, log_det_half_q)
    )
