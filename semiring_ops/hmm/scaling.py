"""Forward-backward for HMMs in probability space with per-step scaling (Rabiner's "scaling" algorithm,
hmmlearn's ``implementation="scaling"``): every step is a (B, C) x (C, C) matrix product, no exp or log
per cell, so an EM iteration costs a few GEMMs per time step instead of one exp per (b, t, i, j) of the
log-semiring chain.

For a padded batch with log-emissions le (B, T, C), log-transitions (C, C) [from, to], log-start (C,)
and lengths (B,):

    e_t = exp(le_t - m_t)        m_t = max_c le_t[c] (per row, so e_t <= 1 and its largest entry is 1)
    a_0 = pi * e_0,  a_t = (alpha_{t-1} A) * e_t,  c_t = sum_c a_t,  alpha_t = a_t / c_t
    log p(x_b) = sum_{t < L_b} log c_t + m_t
    beta_{L_b - 1} = 1,  beta_t = ((e_{t+1} * beta_{t+1}) A^T) / c_{t+1}
    gamma_t = alpha_t * beta_t                                (posteriors; rows sum to 1)
    xi = A * sum_{b, 1 <= t < L_b} alpha_{t-1}^T ((e_t * beta_t) / c_t)   (expected transition counts)

Steps past a sequence's length carry alpha unchanged with c = 1 and keep beta = 1, so the batch runs in
lockstep.

Where it is exact, and where not. Every quantity is a sum of non-negative terms kept relative to its
row's largest, so the only loss is underflow: a state whose forward (or backward) mass falls below the
dtype's smallest normal number relative to the row (2^-126 in float32, ~87 nats; 2^-1022 in float64) is
dropped, and a later step that favours that state again by as much cannot bring it back: the result
would be finite and wrong. The pass therefore marks a sequence ``suspect`` when any of its (row-relative)
emission, forward or backward values drops below tiny * 2^20 while not exactly zero by structure, when
its log-emissions contain -inf, or when its likelihood comes out zero; the caller (HMM) recomputes the
suspect sequences with the log-semiring chain, which has no such limit. Transition and start
probabilities must be strictly positive for this path (zeros are structure this check cannot tell from
underflow); the caller uses the log chain otherwise.

On the CPU the same pass runs compiled (csrc/cpu/hmm_scaled_cpu.cpp, the ``hmm`` kernel family): one C++ loop per
sequence over its own length, sequences in parallel, the same results; and a sequence it flags is done again there
in log space (the log chain's recursions), so only one whose likelihood is not finite stays suspect. The lockstep
torch version below serves other devices, and the CPU when the family cannot be built.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .compiled import compiled_op

__all__ = [
    "ScaledForwardBackward",
    "compiled_estep",
    "lockstep_forward_backward",
    "scaled_forward",
    "scaled_forward_backward",
]


class ScaledForwardBackward(NamedTuple):
    log_likelihood: Tensor  # (B,)
    posteriors: Tensor  # (B, T, C), 0 past each length
    transitions: Tensor  # (C, C) expected transition counts, summed over the sequences not suspect
    starts: Tensor  # (C,) expected start counts, summed over the sequences not suspect
    suspect: Tensor  # (B,) bool: recompute these with the log chain (see the module docstring)


def compiled_estep(log_emissions: Tensor):
    """The compiled scaled E-step for these log-emissions (CPU float32 / float64), or None (then the torch one)."""
    return compiled_op("hmm_scaled_estep", log_emissions, gradient_free=False)


def _tiny(dtype: torch.dtype) -> float:
    """Row-relative values below this may have lost mass to underflow (tiny * 2^20)."""
    return torch.finfo(dtype).tiny * 2.0**20


def _scaled_emissions(log_emissions: Tensor, valid: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(e (B, T, C) with each valid row's largest entry 1, m (B, T) the row shifts (0 past lengths),
    suspect (B,): a -inf log-emission, or one whose e underflowed)."""
    m = log_emissions.amax(-1)
    m = torch.where(torch.isfinite(m) & valid, m, torch.zeros_like(m))
    e = torch.exp(log_emissions - m[..., None])
    low = (e < _tiny(e.dtype)) | ~torch.isfinite(log_emissions)
    return e, m, (low & valid[..., None]).flatten(1).any(1)


def _forward(e: Tensor, A: Tensor, pi: Tensor, valid: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(alpha (B, T, C) normalised per step, log c (B, T) 0 past lengths, suspect (B,))."""
    B, T, C = e.shape
    alpha = e.new_empty(B, T, C)
    log_c = e.new_zeros(B, T)
    low = torch.zeros(B, dtype=torch.bool, device=e.device)
    tiny = _tiny(e.dtype)
    a = pi * e[:, 0]
    for t in range(T):
        if t:
            a = torch.mm(alpha[:, t - 1], A).mul_(e[:, t])
        c = a.sum(-1, keepdim=True)
        step = valid[:, t, None]
        alpha[:, t] = torch.where(step, a / c, alpha[:, t - 1] if t else a)
        log_c[:, t] = torch.where(step[:, 0], c[:, 0].log(), log_c.new_zeros(()))
        low |= (alpha[:, t] < tiny).any(-1) & step[:, 0]
    return alpha, log_c, low


def scaled_forward(
    log_emissions: Tensor, log_trans: Tensor, log_start: Tensor, lengths: Tensor
) -> tuple[Tensor, Tensor]:
    """(log p(x_b) (B,) by the scaled forward pass (0 for length 0), suspect (B,))."""
    compiled = compiled_estep(log_emissions)
    if compiled is not None:  # the whole E-step: a C++ pass, far cheaper than the lockstep forward alone
        ll, _, _, _, suspect = compiled(log_emissions, log_trans, log_start, lengths.cpu())
        return ll, suspect
    B, T, _ = log_emissions.shape
    if T == 0:
        return log_emissions.new_zeros(B), torch.zeros(B, dtype=torch.bool, device=log_emissions.device)
    valid = torch.arange(T, device=lengths.device)[None, :] < lengths[:, None]
    e, m, low_e = _scaled_emissions(log_emissions, valid)
    _, log_c, low_a = _forward(e, log_trans.exp(), log_start.exp(), valid)
    ll = (log_c + m).sum(-1)
    return ll, low_e | low_a | ~torch.isfinite(ll)


def scaled_forward_backward(
    log_emissions: Tensor, log_trans: Tensor, log_start: Tensor, lengths: Tensor
) -> ScaledForwardBackward:
    """The E-step of Baum-Welch: log-likelihoods, posteriors and expected transition / start counts (compiled on the
    CPU, else :func:`lockstep_forward_backward`)."""
    compiled = compiled_estep(log_emissions)
    if compiled is not None:
        return ScaledForwardBackward(*compiled(log_emissions, log_trans, log_start, lengths.cpu()))
    return lockstep_forward_backward(log_emissions, log_trans, log_start, lengths)


def lockstep_forward_backward(
    log_emissions: Tensor, log_trans: Tensor, log_start: Tensor, lengths: Tensor
) -> ScaledForwardBackward:
    """The E-step in torch ops, the padded batch stepped in lockstep: one (B, C) x (C, C) product per time step."""
    B, T, C = log_emissions.shape
    if T == 0:
        z = log_emissions.new_zeros
        return ScaledForwardBackward(z(B), z(B, 0, C), z(C, C), z(C), torch.zeros(B, dtype=torch.bool))
    valid = torch.arange(T, device=lengths.device)[None, :] < lengths[:, None]
    e, m, low_e = _scaled_emissions(log_emissions, valid)
    A = log_trans.exp()
    alpha, log_c, low_a = _forward(e, A, log_start.exp(), valid)
    inv_c = torch.exp(-log_c)  # 1 past lengths
    # w_t = e_t * beta_t / c_t, zero past lengths (no transition into a padded step)
    w = torch.zeros_like(e)
    beta = torch.zeros_like(e)
    b = e.new_ones(B, C)
    low_b = torch.zeros_like(low_a)
    tiny = _tiny(e.dtype)
    At = A.t()
    for t in range(T - 1, -1, -1):
        if t < T - 1:
            nxt = torch.mm(w[:, t + 1], At)
            b = torch.where(valid[:, t + 1, None], nxt, b.new_ones(()))
            low_b |= (b < tiny * b.amax(-1, keepdim=True)).any(-1)
        beta[:, t] = b
        w[:, t] = torch.where(valid[:, t, None], e[:, t] * b * inv_c[:, t, None], w.new_zeros(()))
    ll = (log_c + m).sum(-1)
    suspect = low_e | low_a | low_b | ~torch.isfinite(ll)
    posteriors = torch.where(valid[..., None], alpha * beta, alpha.new_zeros(()))
    keep = (~suspect)[:, None]  # by selection, not a product: a suspect sequence's values may be NaN
    if T > 1:
        prev = torch.where(keep[:, :, None], alpha[:, :-1], 0.0).reshape(-1, C)
        nxt_w = torch.where(keep[:, :, None], w[:, 1:], 0.0).reshape(-1, C)
        transitions = torch.mm(prev.t(), nxt_w).mul_(A)
    else:
        transitions = A.new_zeros(C, C)
    starts = torch.where(keep, posteriors[:, 0], 0.0).sum(0)
    return ScaledForwardBackward(ll, posteriors, transitions, starts, suspect)
