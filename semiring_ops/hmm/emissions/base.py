"""The :class:`Emission` interface an HMM is written against, and the helpers every EM update shares
(validated probability tables, Dirichlet MAP updates, prior arrays).

One file per emission family beside it: categorical.py, gaussian.py (spherical, diagonal, full and tied
covariances).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from ..compiled import compiled_op

__all__ = ["ArrayLike", "Emission", "dirichlet_map"]

ArrayLike = Tensor | np.ndarray | Sequence


# ---------------------------------------------------------------------------------------------- helpers


def _shape(x: ArrayLike) -> tuple[int, ...]:
    return tuple(x.shape) if hasattr(x, "shape") else tuple(np.shape(x))


def _tensor(value: ArrayLike | float) -> Tensor:
    """A detached tensor of a tensor, numpy array, list or scalar (no device or dtype change; read-only
    numpy arrays, such as broadcast views, are copied)."""
    if isinstance(value, Tensor):
        return value.detach()
    a = np.asarray(value)
    return torch.as_tensor(a if a.flags.writeable else a.copy())


def _log_distribution(value: ArrayLike, shape: tuple[int, ...], name: str, like: Tensor) -> Tensor:
    """Validated probabilities (rows over the last dimension sum to 1) -> their logs, as `like`."""
    p = _tensor(value).to(device=like.device, dtype=torch.float64)
    if tuple(p.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(p.shape)}; expected {shape}")
    if not bool(torch.isfinite(p).all()) or bool((p < 0).any()):
        raise ValueError(f"{name} must hold finite non-negative probabilities")
    sums = p.sum(-1)
    if not torch.allclose(sums, torch.ones_like(sums), rtol=1e-5, atol=1e-8):
        raise ValueError(f"{name} must sum to 1 along its last dimension, got sums {sums.tolist()}")
    return p.log().to(like.dtype)


def _normalised_log(counts: Tensor, previous: Tensor) -> Tensor:
    """log(counts / row sums) over the last dimension; rows with no counts keep `previous` (log)."""
    total = counts.sum(-1, keepdim=True)
    return torch.where(total > 0, counts.log() - total.log(), previous)


_SETTINGS: dict[tuple, Tensor] = {}  # converted priors and weights, by value (see _setting)
_SETTINGS_MAX = 256


def _setting(value: ArrayLike | float, kind: tuple, like: Tensor, convert) -> Tensor:
    """convert(value) -> a tensor as `like`, remembered for a scalar or a small numpy array (by its bytes), so
    that an EM iteration does not convert the same hmmlearn prior again (each conversion is several torch
    calls, and a one-sequence iteration is made of such calls). Tensors are converted each time: they can
    change in place. The cached tensors are shared: callers never write into them."""
    if isinstance(value, (int, float, np.number)):
        key = (kind, float(value), like.dtype, like.device)
    elif isinstance(value, np.ndarray) and value.dtype.kind in "biuf" and value.size <= 4096:
        key = (kind, value.shape, value.dtype.str, value.tobytes(), like.dtype, like.device)
    else:
        return convert(value)
    cached = _SETTINGS.get(key)
    if cached is None:
        if len(_SETTINGS) >= _SETTINGS_MAX:
            _SETTINGS.clear()
        cached = _SETTINGS[key] = convert(value)
    return cached


def _prior(value: ArrayLike | float, shape: tuple[int, ...], name: str, like: Tensor) -> Tensor:
    """A prior given as a scalar or an array broadcastable to `shape` -> tensor of `shape` as `like`."""

    def convert(v: ArrayLike | float) -> Tensor:
        t = _tensor(v).to(device=like.device, dtype=like.dtype)
        try:
            return torch.broadcast_to(t, shape)
        except RuntimeError:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)}; expected a scalar or an array broadcastable to {shape}"
            ) from None

    return _setting(value, ("prior", shape, name), like, convert)


def _per_state(value: ArrayLike | float, n_states: int, ndim: int, name: str, like: Tensor) -> Tensor:
    """A per-state setting (a scalar or shape (C,)) -> (C, 1, ..., 1) with `ndim` dimensions, as `like`."""

    def convert(v: ArrayLike | float) -> Tensor:
        t = _tensor(v).to(device=like.device, dtype=like.dtype)
        if t.ndim == 0:
            t = t.expand(n_states)
        if tuple(t.shape) != (n_states,):
            raise ValueError(f"{name} has shape {tuple(t.shape)}; expected a scalar or shape ({n_states},)")
        return t.reshape(n_states, *([1] * (ndim - 1)))

    return _setting(value, ("per_state", n_states, ndim, name), like, convert)


def dirichlet_map(counts: Tensor, prior: ArrayLike | float, previous: Tensor, name: str, keep_zeros: bool) -> Tensor:
    """The M-step of a categorical distribution under a Dirichlet prior (hmmlearn's rule), in log space.

    counts (..., K) expected counts, prior (a scalar or broadcastable to counts: the Dirichlet's
    concentration), previous (..., K) the current log probabilities. Returns
    log normalise(max(prior - 1 + counts, 0)); with `keep_zeros`, probabilities that are 0 now stay 0
    (hmmlearn keeps forbidden starts and transitions); a row left with nothing keeps `previous`.
    On the CPU without a gradient this is one compiled call (csrc/cpu/hmm_mstep_cpu.cpp), else these torch calls.
    """
    shape = tuple(counts.shape)
    compiled = _compiled_dirichlet_map(counts, previous)
    if compiled is not None:
        minus_one = _setting(
            prior, ("dirichlet-1", shape, name), counts, lambda v: (_prior(v, shape, name, counts) - 1).contiguous()
        )
        return compiled(counts, minus_one, previous, keep_zeros)
    c = (_prior(prior, shape, name, counts) - 1 + counts).clamp_min(0)
    if keep_zeros:
        c = torch.where(previous == -torch.inf, 0.0, c)
    return _normalised_log(c, previous)


def _compiled_dirichlet_map(counts: Tensor, previous: Tensor):
    """The compiled dirichlet_map for these tensors (CPU, float32 / float64, one shape, no gradient wanted), or
    None."""
    return compiled_op("hmm_dirichlet_map", counts, previous) if previous.shape == counts.shape else None


# ---------------------------------------------------------------------------------------------- interface


class Emission(nn.Module):
    """An HMM's emission model over C states: the interface HMM is written against.

    Observations have shape ``(*batch, *event_shape)``; subclasses implement

        check(x, batch_ndim, valid)       coerce and validate observations, clean padded positions,
        log_prob(x)                       (*batch, *event_shape) -> (*batch, C) log p(x | state),
        m_step(x, weights, params=None)   EM update from x (N, *event_shape) and posteriors (N, C),
        sample(states, generator)         (*batch,) int64 states -> (*batch, *event_shape),
        reset_parameters(generator)       random parameters (drawn on the CPU),
    and may override ``init_from_data(x, generator, params=None)`` (defaults to reset_parameters); the
    distributed fit needs ``sufficient_stats``, ``m_step_from_stats`` and ``agreement_fields`` (below).

    ``param_letters`` names the parameters that ``m_step`` / ``init_from_data`` update, one letter each
    (hmmlearn's ``params`` letters: "e" categorical, "m" and "c" Gaussian); ``params`` selects a subset
    (None: all).
    """

    n_states: int
    event_shape: tuple[int, ...]
    param_letters: str = ""

    def check(self, x: ArrayLike, batch_ndim: int, valid: Tensor | None = None) -> Tensor:
        raise NotImplementedError

    def log_prob(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def m_step(self, x: Tensor, weights: Tensor, params: str | None = None) -> None:
        raise NotImplementedError

    def sample(self, states: Tensor, generator: torch.Generator | None = None) -> Tensor:
        raise NotImplementedError

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        raise NotImplementedError

    def init_from_data(self, x: Tensor, generator: torch.Generator | None = None, params: str | None = None) -> None:
        """Data-driven initialisation from observations x (N, *event_shape); default: random."""
        self.reset_parameters(generator)

    # The distributed fit (distributed.py) sums each rank's statistics and runs the M-step on the sums; a family
    # that implements these two takes part (m_step is then typically m_step_from_stats(sufficient_stats(...))).

    def sufficient_stats(self, x: Tensor, weights: Tensor) -> list[Tensor]:
        """What the M-step needs of observations x (N, *event_shape) with posteriors weights (N, C), as sums over
        the samples, so that ranks holding shards of the data can add theirs up."""
        raise NotImplementedError(f"{type(self).__name__} has no sufficient_stats: no distributed fit")

    def m_step_from_stats(self, stats: list[Tensor], params: str | None = None) -> None:
        """The M-step from :meth:`sufficient_stats` summed over samples (and ranks)."""
        raise NotImplementedError(f"{type(self).__name__} has no m_step_from_stats: no distributed fit")

    def agreement_fields(self) -> dict[str, float]:
        """Settings every rank of a distributed fit must share (besides the class), as numbers."""
        return {}

    def _check_shape(self, x: Tensor, batch_ndim: int, what: str) -> None:
        if x.ndim != batch_ndim + len(self.event_shape) or tuple(x.shape[batch_ndim:]) != self.event_shape:
            batch = "(n_samples" if batch_ndim == 1 else "(B, T"
            expected = batch + "".join(f", {d}" for d in self.event_shape) + ")"
            raise ValueError(f"X has shape {tuple(x.shape)}; {type(self).__name__} expects {expected} {what}")

    def _updates(self, params: str | None) -> str:
        """The letters of `params` (None: all) that this emission model owns."""
        return self.param_letters if params is None else "".join(c for c in self.param_letters if c in params)

    @property
    def _device(self) -> torch.device:
        return next(self.parameters()).device
