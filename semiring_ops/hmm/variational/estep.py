"""The variational E-step: forward-backward under sub-normalised parameters, on :class:`HMM`'s chain engine.

Variational Bayes replaces the start vector, the transition rows and the emission densities by
exp(E_q[log θ]) under their posteriors: nonnegative tables whose rows sum to less than 1. ``HMM`` keeps
normalised tables (log_softmax), so the row sums are moved out first, exactly:

* the start vector's log-sum, log Z_s, is one constant per sequence: added to its log-likelihood;
* transition row i's log-sum, log Z_i, multiplies every path by Z_i once per step that leaves state i:
  it is added to the log-emission of state i at every step but each sequence's last.

Each path's weight is then unchanged, so the posteriors and the expected transition counts are those of the
sub-normalised chain, and its log-"likelihood" (the E-step term of the ELBO) is the HMM's plus log Z_s per
sequence. One batched forward-backward (``HMM``'s scaled or log-chain kernels) runs all sequences at once.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from ..model import HMM, _Batch, _Layout, _sequence_lengths

__all__ = ["SubnormalisedEStep", "SubnormalisedExpectations", "subnormalised_expectations"]


class SubnormalisedExpectations(NamedTuple):
    """One variational E-step over concatenated sequences."""

    log_prob: float  # log of the sub-normalised "likelihood", summed over the sequences
    posteriors: Tensor  # (n_samples, C) state posteriors
    starts: Tensor  # (C,) posteriors of the first sample of each sequence, summed
    transitions: Tensor  # (C, C) expected transition counts [from, to], summed


class SubnormalisedEStep:
    """The variational E-step of one fit (see the module docstring): what depends only on the sequence lengths
    (the HMM it runs on, the padded layout, which samples leave their state) made once, then called once per
    iteration.

    n_states C; lengths (n_sequences,) ints summing to n_samples (checked).
    """

    def __init__(self, n_states: int, lengths: np.ndarray, n_samples: int) -> None:
        L = _sequence_lengths(n_samples, lengths, "cpu")
        self.model = HMM(n_states, None, generator=torch.Generator()).double()  # parameters overwritten per call
        self.layout = _Layout.of(L)
        self.n_sequences = int((L > 0).sum())
        leaves = torch.ones(int(L.sum()), 1, dtype=torch.float64)  # samples followed by a step of their sequence
        leaves[(torch.cumsum(L, 0) - 1)[L > 0]] = 0.0
        self.leaves = leaves  # (n_samples, 1)

    def __call__(self, log_start: Tensor, log_trans: Tensor, log_emissions: Tensor) -> SubnormalisedExpectations:
        """log_start (C,), log_trans (C, C) [from, to] and log_emissions (n_samples, C): float64 logs whose rows
        sum (in probability) to at most 1."""
        start_norm = torch.logsumexp(log_start, -1)
        row_norms = torch.logsumexp(log_trans, -1)  # (C,)
        model, layout = self.model, self.layout
        with torch.no_grad():
            model.log_startprob.copy_(log_start - start_norm)
            model.log_transmat.copy_(log_trans - row_norms[:, None])
        padded = layout.pad(log_emissions + self.leaves * row_norms)
        e = model._expectations(_Batch(None, padded, layout.lengths))
        log_prob = float(e.log_likelihood.sum() + start_norm * self.n_sequences)
        return SubnormalisedExpectations(log_prob, layout.unpad(e.posteriors), e.starts, e.transitions)


def subnormalised_expectations(
    log_start: Tensor, log_trans: Tensor, log_emissions: Tensor, lengths: np.ndarray
) -> SubnormalisedExpectations:
    """One sub-normalised forward-backward (:class:`SubnormalisedEStep` of these lengths, called once): log_start
    (C,), log_trans (C, C) [from, to], log_emissions (n_samples, C); lengths (n_sequences,)."""
    e_step = SubnormalisedEStep(log_start.shape[-1], lengths, len(log_emissions))
    return e_step(log_start, log_trans, log_emissions)
