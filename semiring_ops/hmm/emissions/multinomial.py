"""Multinomial emissions: counts of D outcomes in n trials (hmmlearn's MultinomialHMM).

    log p(x | c) = log n! + Σ_d (x_d log p_cd − log x_d!),   n = Σ_d x_d,

with each sample's own total n (as hmmlearn, so samples of different totals score); ``n_trials`` is only
needed to sample. The table of probabilities, its setter and its M-step are the categorical family's (a
categorical emission is the multinomial of one trial): emissionprob = normalise(prior − 1 + Σ_t γ_t(c) x_t)
per state, hmmlearn's normalised expected counts with the default prior 1.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .base import ArrayLike, _tensor
from .categorical import CategoricalEmission
from .poisson import check_counts, log_count_terms

__all__ = ["MultinomialEmission", "check_n_trials"]


def check_n_trials(n_trials: ArrayLike | int | None) -> int | None:
    """A single number of trials (a non-negative int, or an array holding one value) or None -> int or None."""
    if n_trials is None:
        return None
    values = torch.unique(_tensor(n_trials).reshape(-1))
    if values.numel() != 1 or values.dtype.is_complex or values.dtype == torch.bool:
        raise ValueError(f"n_trials must be a single number of trials, got {n_trials!r}")
    value = values.item()
    if value < 0 or value != int(value):
        raise ValueError(f"n_trials must be a non-negative int, got {n_trials!r}")
    return int(value)


class MultinomialEmission(CategoricalEmission):
    """Multinomial counts of D outcomes per state (hmmlearn's MultinomialHMM).

    Parameter: ``log_emissionprob`` (C, D), unnormalised logs (CategoricalEmission's). Observations:
    non-negative integral counts (any real or integer dtype), event_shape (D,). ``n_trials``: the number of
    trials of a sample, needed by :meth:`sample` only (None: sampling raises). ``emissionprob_prior``: the
    Dirichlet prior of each row in the M-step (1, the default, is hmmlearn's plain update). Parameter letter "e".
    """

    def __init__(
        self,
        n_states: int,
        n_features: int,
        n_trials: int | None = None,
        emissionprob_prior: ArrayLike | float = 1.0,
    ) -> None:
        if n_features is None or n_features <= 0:
            raise ValueError(f"n_features must be a positive int, got {n_features}")
        super().__init__(n_states, n_features, emissionprob_prior)
        self.n_features, self.event_shape = n_features, (n_features,)
        self.n_trials = check_n_trials(n_trials)

    def extra_repr(self) -> str:
        return f"n_states={self.n_states}, n_features={self.n_features}, n_trials={self.n_trials}"

    def check(self, x: ArrayLike, batch_ndim: int, valid: Tensor | None = None) -> Tensor:
        x = torch.as_tensor(x, device=self._device)
        self._check_shape(x, batch_ndim, f"counts (n_features={self.n_features})")
        if valid is not None:
            x = torch.where(valid[..., None], x, 0)
        return check_counts(x, self.log_emissionprob.dtype)

    def log_prob(self, x: Tensor) -> Tensor:
        return torch.lgamma(x.sum(-1, keepdim=True) + 1) + log_count_terms(x, self._log_table())

    def sufficient_stats(self, x: Tensor, weights: Tensor) -> list[Tensor]:
        """[the posterior-weighted counts Σγ x (C, D)]."""
        return [weights.T @ x]

    def agreement_fields(self) -> dict[str, float]:
        return {"n_features": float(self.n_features)}

    def sample(self, states: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """int64 counts (*states.shape, D) of n_trials trials each, drawn outcome by outcome (binomials of the
        trials left, at the outcome's share of the probability left)."""
        if self.n_trials is None:
            raise ValueError("MultinomialEmission needs n_trials (a single number of trials) to sample")
        probs = self.emissionprob_[states.reshape(-1)].to(states.device)
        left = torch.full(probs.shape[:1], float(self.n_trials), dtype=probs.dtype, device=probs.device)
        mass = torch.ones_like(left)
        counts = torch.zeros_like(probs)
        for d in range(self.n_features - 1):
            share = torch.where(mass > 0, probs[:, d] / mass, 0.0).clamp(0, 1)
            counts[:, d] = torch.binomial(left, share, generator=generator)
            left, mass = left - counts[:, d], mass - probs[:, d]
        counts[:, -1] = left
        return counts.long().reshape(*states.shape, self.n_features)
