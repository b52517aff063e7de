"""HMM emission models: the :class:`Emission` interface, categorical emissions, and the helpers that every
EM update shares (validated probability tables, Dirichlet MAP updates, prior arrays).

The Gaussian emission models (spherical, diagonal, full and tied covariances) are in
``hmm_emissions_gaussian.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn

__all__ = ["ArrayLike", "CategoricalEmission", "Emission"]

COUNT_SPREAD = 256  # copies of the symbol-count table on a GPU (CategoricalEmission.symbol_counts)
COUNT_SPREAD_CELLS = 1 << 22  # at most this many cells over all the copies

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


def _prior(value: ArrayLike | float, shape: tuple[int, ...], name: str, like: Tensor) -> Tensor:
    """A prior given as a scalar or an array broadcastable to `shape` -> tensor of `shape` as `like`."""
    t = _tensor(value).to(device=like.device, dtype=like.dtype)
    try:
        return torch.broadcast_to(t, shape)
    except RuntimeError:
        raise ValueError(
            f"{name} has shape {tuple(t.shape)}; expected a scalar or an array broadcastable to {shape}"
        ) from None


def _per_state(value: ArrayLike | float, n_states: int, ndim: int, name: str, like: Tensor) -> Tensor:
    """A per-state setting (a scalar or shape (C,)) -> (C, 1, ..., 1) with `ndim` dimensions, as `like`."""
    t = _tensor(value).to(device=like.device, dtype=like.dtype)
    if t.ndim == 0:
        t = t.expand(n_states)
    if tuple(t.shape) != (n_states,):
        raise ValueError(f"{name} has shape {tuple(t.shape)}; expected a scalar or shape ({n_states},)")
    return t.reshape(n_states, *([1] * (ndim - 1)))


def dirichlet_map(counts: Tensor, prior: ArrayLike | float, previous: Tensor, name: str, keep_zeros: bool) -> Tensor:
    """The M-step of a categorical distribution under a Dirichlet prior (hmmlearn's rule), in log space.

    counts (..., K) expected counts, prior (a scalar or broadcastable to counts: the Dirichlet's
    concentration), previous (..., K) the current log probabilities. Returns
    log normalise(max(prior - 1 + counts, 0)); with `keep_zeros`, probabilities that are 0 now stay 0
    (hmmlearn keeps forbidden starts and transitions); a row left with nothing keeps `previous`.
    """
    c = (_prior(prior, tuple(counts.shape), name, counts) - 1 + counts).clamp_min(0)
    if keep_zeros:
        c = torch.where(previous == -torch.inf, 0.0, c)
    return _normalised_log(c, previous)


# ---------------------------------------------------------------------------------------------- interface


class Emission(nn.Module):
    """An HMM's emission model over C states: the interface HMM is written against.

    Observations have shape ``(*batch, *event_shape)``; subclasses implement

        check(x, batch_ndim, valid)       coerce and validate observations, clean padded positions,
        log_prob(x)                       (*batch, *event_shape) -> (*batch, C) log p(x | state),
        m_step(x, weights, params=None)   EM update from x (N, *event_shape) and posteriors (N, C),
        sample(states, generator)         (*batch,) int64 states -> (*batch, *event_shape),
        reset_parameters(generator)       random parameters (drawn on the CPU),
    and may override ``init_from_data(x, generator, params=None)`` (defaults to reset_parameters).

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


# ---------------------------------------------------------------------------------------------- categorical


class CategoricalEmission(Emission):
    """Categorical emissions over V symbols (hmmlearn's CategoricalHMM).

    Parameter: ``log_emissionprob`` (C, V), unnormalised logs, normalised over symbols when used.
    Observations: int64 symbols, event_shape () (hmmlearn's (n_samples, 1) is accepted too).
    ``emissionprob_prior`` (a scalar or (C, V)): the Dirichlet prior of each row in the M-step
    (hmmlearn's; 1 adds no pseudo-counts). Parameter letter "e".
    """

    param_letters = "e"

    def __init__(self, n_states: int, n_symbols: int, emissionprob_prior: ArrayLike | float = 1.0) -> None:
        if n_symbols is None or n_symbols <= 0:
            raise ValueError(f"n_symbols must be a positive int, got {n_symbols}")
        super().__init__()
        self.n_states, self.n_symbols, self.event_shape = n_states, n_symbols, ()
        self.emissionprob_prior = emissionprob_prior
        self.log_emissionprob = nn.Parameter(torch.empty(n_states, n_symbols))
        self.reset_parameters()

    def extra_repr(self) -> str:
        return f"n_states={self.n_states}, n_symbols={self.n_symbols}"

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Uniform random rows, normalised (as hmmlearn's init)."""
        p = torch.rand(self.n_states, self.n_symbols, generator=generator, dtype=torch.float64)
        with torch.no_grad():
            self.log_emissionprob.copy_((p / p.sum(-1, keepdim=True)).log())

    @property
    def emissionprob_(self) -> Tensor:
        """(C, V) emission probabilities; write probabilities (tensor or numpy) to set them."""
        return self._log_table().detach().exp()

    @emissionprob_.setter
    def emissionprob_(self, value: ArrayLike) -> None:
        shape = (self.n_states, self.n_symbols)
        with torch.no_grad():
            self.log_emissionprob.copy_(_log_distribution(value, shape, "emissionprob_", self.log_emissionprob))

    def _log_table(self) -> Tensor:
        return torch.log_softmax(self.log_emissionprob, dim=-1)

    def check(self, x: ArrayLike, batch_ndim: int, valid: Tensor | None = None) -> Tensor:
        x = torch.as_tensor(x, device=self._device)
        if x.ndim == batch_ndim + 1 and x.shape[-1] == 1:
            x = x.squeeze(-1)
        self._check_shape(x, batch_ndim, "integer symbols (or a trailing dimension of 1)")
        if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
            raise ValueError(f"X must hold integer symbols, got dtype {x.dtype} (shape {tuple(x.shape)})")
        x = x.long() if valid is None else torch.where(valid, x.long(), 0)
        if x.numel() and bool(((x < 0) | (x >= self.n_symbols)).any()):
            raise ValueError(
                f"X has symbols in [{int(x.min())}, {int(x.max())}] (shape {tuple(x.shape)}); "
                f"n_symbols={self.n_symbols} allows 0..{self.n_symbols - 1}"
            )
        return x

    def log_prob(self, x: Tensor) -> Tensor:
        return self._log_table().T[x]

    def symbol_counts(self, x: Tensor, weights: Tensor) -> Tensor:
        """(C, n_symbols): counts[c, v] = sum of weights[n, c] over the samples n with x[n] = v, from symbols x (N,)
        and weights (N, C). On a GPU the atomic adds are spread over up to COUNT_SPREAD copies of the table (sample
        n into copy n mod copies), then summed: into one table, millions of samples land on a few hundred cells and
        the atomics serialise (4M samples x 50 states: 30 ms on an H100; spread: about 1 ms)."""
        V, C = self.n_symbols, weights.shape[1]
        copies = min(COUNT_SPREAD, max(1, COUNT_SPREAD_CELLS // max(1, V * C)), max(1, x.numel() // 1024))
        if weights.device.type != "cuda" or copies == 1:
            return weights.new_zeros(V, C).index_add_(0, x, weights).T.contiguous()
        slot = torch.arange(x.numel(), device=x.device) % copies * V + x
        table = weights.new_zeros(copies * V, C).index_add_(0, slot, weights)
        return table.view(copies, V, C).sum(0).T.contiguous()

    def m_step(self, x: Tensor, weights: Tensor, params: str | None = None) -> None:
        """emissionprob = normalise(max(prior - 1 + posterior-weighted symbol counts, 0)) per state."""
        if not self._updates(params):
            return
        counts = self.symbol_counts(x, weights)
        with torch.no_grad():
            table = dirichlet_map(counts, self.emissionprob_prior, self._log_table(), "emissionprob_prior", False)
            self.log_emissionprob.copy_(table)

    def sample(self, states: Tensor, generator: torch.Generator | None = None) -> Tensor:
        if states.numel() == 0:
            return states.clone()
        probs = self.emissionprob_[states.reshape(-1)]
        return torch.multinomial(probs, 1, generator=generator).reshape(states.shape)
