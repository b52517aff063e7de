"""Hidden Markov models on the factored chain engine (factored.py): hmmlearn's calls and EM, torch's batches.

A model is a start distribution, a row-stochastic transition matrix and an emission model, all kept in
log space as ``nn.Parameter`` s and normalised with ``log_softmax`` whenever they are used, so gradient
training keeps valid distributions:

    log_startprob   (C,)      unnormalised log start probabilities,
    log_transmat    (C, C)    unnormalised log transition probabilities, [from, to],
    emission        an :class:`Emission` (categorical, emissions/base.py; Gaussian with spherical,
                    diagonal, full or tied covariances, emissions/gaussian.py; your own), or none:
                    then every call takes ``log_emissions=`` (B, T, C) directly.

Two ways to call it:

* hmmlearn's, on concatenated samples X (n_samples, ...) with ``lengths`` (a list of ints summing to
  n_samples; None: one sequence): ``fit`` (Baum-Welch), ``score``, ``score_samples``, ``decode``,
  ``predict``, ``predict_proba``, ``sample``. Results are torch tensors on the model's device (not
  numpy arrays): on the CPU they go straight into ``np.testing`` / ``np.asarray``; elsewhere call
  ``.cpu()``. Scalars are 0-dim tensors (``float(score)`` gives a Python float).
* torch's, on padded batches X (B, T, ...) with ``mask=`` (B, T) or ``lengths=`` (B,):
  ``log_likelihood`` / ``forward`` (B,), differentiable, ``posteriors`` (B, T, C), ``viterbi``,
  ``sample_batch`` and ``sample_paths`` (posterior paths).

Concatenated samples are scattered into a padded batch by one vectorised index, so the math never
loops over sequences. The E-step is the scaled probability-space recursions (scaling.py) or autograd
of the log-likelihood (``chain_sum_factored``): its gradient is the state posteriors with respect to the
emissions, the expected transition counts with respect to the transition matrix and the expected start
counts with respect to the start vector. hmmlearn's estimator classes over this model are in
``semiring_ops.hmm`` (estimators/base.py).
"""

from __future__ import annotations

import contextlib
import io
import math
from typing import NamedTuple, TextIO

import numpy as np
import torch
from torch import Tensor, nn

from ..semirings import LogSemiring
from ..structures.chain import chain_sample, resolve_lengths
from ..structures.factored import chain_sum_factored, chain_viterbi_factored, factored_to_edges
from .emissions.base import ArrayLike, Emission, _log_distribution, _shape, dirichlet_map
from .emissions.categorical import CategoricalEmission
from .emissions.gaussian import (
    COVARIANCE_TYPES,
    GaussianDiagEmission,
    GaussianEmission,
    GaussianFullEmission,
    GaussianSphericalEmission,
    GaussianTiedEmission,
    gaussian_emission,
)
from .monitor import ConvergenceMonitor, _ProgressBar
from .scaling import compiled_estep, scaled_forward, scaled_forward_backward

__all__ = [
    "HMM",
    "CategoricalEmission",
    "ConvergenceMonitor",
    "Emission",
    "GaussianDiagEmission",
    "GaussianEmission",
    "GaussianFullEmission",
    "GaussianSphericalEmission",
    "GaussianTiedEmission",
]

# below this many cells per time step (batch x C x C) the scaled recursions' per-step Python overhead
# outweighs the log chain's one exp per cell, so "auto" takes the log chain (2-core CPU, float64)
_SCALING_MIN_CELLS = 2048


# ---------------------------------------------------------------------------------------------- inputs


def _as_generator(seed: int | torch.Generator | None, device: torch.device) -> torch.Generator | None:
    """An int seeds a fresh generator on `device`; a generator must already live there."""
    if seed is None or isinstance(seed, torch.Generator):
        return seed
    return torch.Generator(device=device).manual_seed(int(seed))


def _sequence_lengths(n_samples: int, lengths: ArrayLike | None, device) -> Tensor:
    """hmmlearn's `lengths` (ints summing to n_samples; None: one sequence) -> (B,) int64."""
    if lengths is None:
        return torch.tensor([n_samples], dtype=torch.long, device=device)
    L = torch.as_tensor(np.asarray(lengths) if not isinstance(lengths, Tensor) else lengths, device=device)
    if L.ndim != 1 or L.dtype.is_floating_point or L.dtype == torch.bool:
        raise ValueError(f"lengths must be a 1-D list of ints, got shape {tuple(L.shape)} {L.dtype}")
    if bool((L < 0).any()):
        raise ValueError(f"lengths must be non-negative, got {L.tolist()}")
    if int(L.sum()) != n_samples:
        raise ValueError(f"lengths sum to {int(L.sum())} but X has n_samples={n_samples}")
    return L.long()


class _Layout(NamedTuple):
    """Where each of n_samples concatenated samples sits in the padded (B, T) batch."""

    lengths: Tensor  # (B,)
    seq: Tensor  # (n_samples,) batch row of each sample
    pos: Tensor  # (n_samples,) time step of each sample

    @staticmethod
    def of(lengths: Tensor) -> _Layout:
        seq = torch.repeat_interleave(torch.arange(len(lengths), device=lengths.device), lengths)
        starts = torch.cumsum(lengths, 0) - lengths
        pos = torch.arange(len(seq), device=lengths.device) - starts[seq]
        return _Layout(lengths, seq, pos)

    @property
    def T(self) -> int:
        return int(self.lengths.max()) if len(self.lengths) else 0

    def pad(self, x: Tensor) -> Tensor:
        """(n_samples, ...) -> (B, T, ...), zeros past each length."""
        if len(self.lengths) == 1:  # one sequence: its samples are the row (a view)
            return x.unsqueeze(0)
        out = x.new_zeros((len(self.lengths), self.T, *x.shape[1:]))
        out[self.seq, self.pos] = x
        return out

    def unpad(self, x: Tensor) -> Tensor:
        """(B, T, ...) -> (n_samples, ...)."""
        if len(self.lengths) == 1:
            return x[0]
        return x[self.seq, self.pos]


def _valid(lengths: Tensor, T: int) -> Tensor:
    """(B, T) bool: position t < length."""
    return torch.arange(T, device=lengths.device)[None, :] < lengths[:, None]


# ---------------------------------------------------------------------------------------------- the model


class _Expectations(NamedTuple):
    """One E-step: per-sequence log-likelihoods and expected counts (autograd of log-likelihood)."""

    log_likelihood: Tensor  # (B,)
    posteriors: Tensor  # (B, T, C), 0 past each length
    transitions: Tensor  # (C, C) expected transition counts, summed over batch and time
    starts: Tensor  # (C,) expected start counts, summed over the batch


class _Batch(NamedTuple):
    """Inputs of one call, padded: observations (B, T, *event) or None, log-emissions (B, T, C), lengths."""

    x: Tensor | None
    log_emissions: Tensor
    lengths: Tensor
    full: bool = False  # known to have no padding (every length T): no mask to apply

    def rows(self, index: Tensor) -> _Batch:
        """The sequences ``index`` (their log-emissions and lengths; no observations)."""
        return _Batch(None, self.log_emissions[index], self.lengths[index])


def _emission_property(name: str) -> property:
    """An HMM attribute that forwards to the emission model's property of the same name."""

    def get(self: HMM) -> Tensor:
        return getattr(self._emission_with(name), name)

    def set_(self: HMM, value: ArrayLike) -> None:
        setattr(self._emission_with(name), name, value)

    return property(get, set_, doc=f"The emission model's ``{name}`` (see its class).")


class HMM(nn.Module):
    """Hidden Markov model over `n_states` states C.

    Args:
        n_states: number of hidden states C.
        emission: "categorical" (needs n_symbols), "gaussian" (needs n_features; covariance_type
            "diag"), an :class:`Emission` instance, or "custom" / None: no emission model, every call
            takes ``log_emissions=`` (B, T, C) (padded) or (n_samples, C) (concatenated) instead of X.
        n_symbols: V, the categorical alphabet size.
        n_features: D, the Gaussian dimension.
        covariance_type: "spherical", "diag", "full" or "tied" (emissions/gaussian.py).
        min_covar, covars_prior: Gaussian variance floor / initialisation term and hmmlearn's
            covariance prior (the other emission priors: construct the Emission yourself).
        startprob_prior, transmat_prior: Dirichlet priors of the start vector (a scalar or (C,)) and of
            each transition row (a scalar or (C, C)) in ``fit``'s M-step; 1 (default) adds nothing.
        generator: CPU generator for the random initial parameters.
        implementation: how ``fit``'s E-step, ``score``, ``posteriors`` and ``score_samples`` run
            forward-backward: "scaling" (probability space with per-step normalisation, a few matrix
            products per time step: scaling.py), "log" (the log-semiring chain kernels, one exp per
            cell), or "auto" (the default: on the CPU "scaling" when a time step has at least 2048 cells
            (B x C x C) and "log" below, where the scaled recursions' per-step overhead dominates; "log"
            on GPUs, where the fused chain kernel beats T small matrix products). ``log_likelihood`` /
            ``forward`` (training by gradient) and Viterbi always use the chain kernels.

    Properties ``startprob_`` (C,), ``transmat_`` (C, C) [from, to], and, from the emission model,
    ``emissionprob_`` (C, V), ``means_`` (C, D), ``covars_`` (hmmlearn's compact shapes: (C,), (C, D),
    (C, D, D) or (D, D) by covariance type), read probabilities as tensors and accept tensors or numpy
    arrays on write (hmmlearn's arrays set a model directly).
    """

    def __init__(
        self,
        n_states: int,
        emission: str | Emission | None = "categorical",
        *,
        n_symbols: int | None = None,
        n_features: int | None = None,
        covariance_type: str = "diag",
        min_covar: float = 1e-3,
        covars_prior: ArrayLike | float = 1e-2,
        startprob_prior: ArrayLike | float = 1.0,
        transmat_prior: ArrayLike | float = 1.0,
        generator: torch.Generator | None = None,
        implementation: str = "auto",
    ) -> None:
        if n_states <= 0:
            raise ValueError(f"n_states must be positive, got {n_states}")
        if implementation not in ("auto", "scaling", "log"):
            raise ValueError(f"implementation must be 'auto', 'scaling' or 'log', got {implementation!r}")
        self.implementation = implementation
        super().__init__()
        self.n_states = n_states
        if emission == "categorical":
            emission = CategoricalEmission(n_states, n_symbols)
        elif emission == "gaussian":
            if covariance_type not in COVARIANCE_TYPES:
                raise ValueError(f"covariance_type must be one of {COVARIANCE_TYPES}, got {covariance_type!r}")
            emission = gaussian_emission(
                covariance_type, n_states, n_features, min_covar=min_covar, covars_prior=covars_prior
            )
        elif emission in ("custom", None):
            emission = None
        elif not isinstance(emission, Emission):
            raise ValueError(f"emission must be 'categorical', 'gaussian', 'custom' or an Emission, got {emission!r}")
        if emission is not None and emission.n_states != n_states:
            raise ValueError(f"the emission model has {emission.n_states} states, this HMM has n_states={n_states}")
        self.emission = emission
        self.startprob_prior, self.transmat_prior = startprob_prior, transmat_prior
        self.log_startprob = nn.Parameter(torch.empty(n_states))
        self.log_transmat = nn.Parameter(torch.empty(n_states, n_states))
        self.monitor_: ConvergenceMonitor | None = None
        self.reset_parameters(generator)

    def extra_repr(self) -> str:
        return f"n_states={self.n_states}, implementation={self.implementation!r}"

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Random start and transition distributions (uniform draws, normalised) and emission parameters."""
        C = self.n_states
        p = torch.rand(C + 1, C, generator=generator, dtype=torch.float64)
        p = (p / p.sum(-1, keepdim=True)).log()
        with torch.no_grad():
            self.log_startprob.copy_(p[0])
            self.log_transmat.copy_(p[1:])
        if self.emission is not None:
            self.emission.reset_parameters(generator)

    def init_from_data(self, X: ArrayLike, generator: torch.Generator | None = None) -> HMM:
        """hmmlearn-style initialisation before EM: random start / transitions, emissions from the
        concatenated samples X (Gaussian: k-means means, covariances the data's + min_covar)."""
        x = self._require_emission().check(X, 1)
        self.reset_parameters(generator)
        self.emission.init_from_data(x, generator)
        return self

    # ------------------------------------------------------------ parameters

    @property
    def device(self) -> torch.device:
        return self.log_startprob.device

    def log_start(self) -> Tensor:
        """(C,) normalised log start probabilities (differentiable)."""
        return torch.log_softmax(self.log_startprob, dim=-1)

    def log_trans(self) -> Tensor:
        """(C, C) normalised log transition probabilities [from, to] (differentiable)."""
        return torch.log_softmax(self.log_transmat, dim=-1)

    @property
    def startprob_(self) -> Tensor:
        """(C,) start probabilities; write probabilities (tensor or numpy) to set them."""
        return self.log_start().detach().exp()

    @startprob_.setter
    def startprob_(self, value: ArrayLike) -> None:
        with torch.no_grad():
            self.log_startprob.copy_(_log_distribution(value, (self.n_states,), "startprob_", self.log_startprob))

    @property
    def transmat_(self) -> Tensor:
        """(C, C) row-stochastic transition matrix [from, to]; write (tensor or numpy) to set it."""
        return self.log_trans().detach().exp()

    @transmat_.setter
    def transmat_(self, value: ArrayLike) -> None:
        C = self.n_states
        with torch.no_grad():
            self.log_transmat.copy_(_log_distribution(value, (C, C), "transmat_", self.log_transmat))

    emissionprob_ = _emission_property("emissionprob_")
    means_ = _emission_property("means_")
    covars_ = _emission_property("covars_")

    def _require_emission(self) -> Emission:
        if self.emission is None:
            raise ValueError("this HMM has no emission model: pass log_emissions= instead of X")
        return self.emission

    def _emission_with(self, name: str) -> Emission:
        if self.emission is None or not hasattr(type(self.emission), name):
            raise AttributeError(f"{name} belongs to an emission model that has it; this HMM's is {self.emission!r}")
        return self.emission

    # ------------------------------------------------------------ inputs

    def _log_emissions(self, X: ArrayLike | None, log_emissions: ArrayLike | None, padded: bool) -> Tensor | None:
        """Validated log_emissions (B, T, C) when padded, else (n_samples, C); None when X is given."""
        if (X is None) == (log_emissions is None):
            raise ValueError("give X or log_emissions, exactly one")
        if log_emissions is None:
            return None
        e = torch.as_tensor(log_emissions, device=self.device)
        expected = "(B, T, C)" if padded else "(n_samples, C)"
        if e.ndim != (3 if padded else 2) or e.shape[-1] != self.n_states or not e.dtype.is_floating_point:
            raise ValueError(
                f"log_emissions has shape {tuple(e.shape)} {e.dtype}; expected floats {expected} with C={self.n_states}"
            )
        return e

    def _padded(
        self, X: ArrayLike | None, mask: ArrayLike | None, lengths: ArrayLike | None, log_emissions: ArrayLike | None
    ) -> _Batch:
        """torch-style inputs: X (B, T, *event) or log_emissions (B, T, C), with mask / lengths."""
        em = self._log_emissions(X, log_emissions, padded=True)
        if em is not None:
            L = resolve_lengths(em.shape[0], em.shape[1], mask, lengths, self.device)
            return _Batch(None, torch.where(_valid(L, em.shape[1])[..., None], em, 0.0), L)
        shape = _shape(X)
        if len(shape) < 2:
            raise ValueError(f"X has shape {shape}; expected a padded batch (B, T, ...)")
        L = resolve_lengths(shape[0], shape[1], mask, lengths, self.device)
        x = self._require_emission().check(X, 2, _valid(L, shape[1]))
        return self._with_emissions(x, L)

    def _concatenated(
        self, X: ArrayLike | None, lengths: ArrayLike | None, log_emissions: ArrayLike | None
    ) -> tuple[_Batch, _Layout]:
        """hmmlearn-style inputs: X (n_samples, *event) or log_emissions (n_samples, C), with lengths."""
        em = self._log_emissions(X, log_emissions, padded=False)
        if em is not None:
            layout = _Layout.of(_sequence_lengths(len(em), lengths, self.device))
            return _Batch(None, layout.pad(em), layout.lengths), layout
        x = self._require_emission().check(X, 1)
        layout = _Layout.of(_sequence_lengths(len(x), lengths, self.device))
        # one sequence fills its padded row (T is the longest length)
        return self._with_emissions(layout.pad(x), layout.lengths, len(layout.lengths) == 1), layout

    def _with_emissions(self, x: Tensor, L: Tensor, full: bool = False) -> _Batch:
        """The batch of observations x (B, T, ...) with lengths L (B,): log-emissions, zero past each length
        (unless ``full``: no position is past its length)."""
        em = self.emission.log_prob(x)
        if full:
            return _Batch(x, em, L, True)
        return _Batch(x, torch.where(_valid(L, x.shape[1])[..., None], em, 0.0), L)

    # ------------------------------------------------------------ inference on padded batches

    def _chain_sum(self, batch: _Batch) -> Tensor:
        return chain_sum_factored(batch.log_emissions, self.log_trans(), self.log_start(), None, batch.lengths)

    def _scaling(self, batch_size: int) -> bool:
        """Whether forward-backward of `batch_size` sequences runs in scaled probability space (see
        ``implementation``). The torch pass needs strictly positive start and transition probabilities; the
        compiled one (CPU) takes zeros too, doing such chains in log space itself (scaling.py)."""
        compiled = compiled_estep(self.log_startprob) is not None
        # compiled: no per-step overhead, so it wins at any size
        wide = batch_size * self.n_states**2 >= _SCALING_MIN_CELLS or compiled
        auto = self.implementation == "auto" and self.device.type == "cpu" and wide
        wanted = self.implementation == "scaling" or auto
        if not wanted:
            return False
        return compiled or bool((self.log_transmat > -math.inf).all() and (self.log_startprob > -math.inf).all())

    def _expectations(self, batch: _Batch) -> _Expectations:
        """E-step: scaled forward-backward, or autograd of the log-likelihood with respect to emissions,
        transitions and start."""
        if self._scaling(len(batch.lengths)):
            with torch.no_grad():
                r = scaled_forward_backward(batch.log_emissions, self.log_trans(), self.log_start(), batch.lengths)
            if not r.suspect.any():
                return _Expectations(*r[:4])
            # the sequences the scaled pass cannot vouch for, again on the exact log chain
            bad = r.suspect.nonzero().flatten()
            exact = self._log_expectations(batch.rows(bad))
            ll, post = r.log_likelihood.clone(), r.posteriors.clone()
            ll[bad], post[bad] = exact.log_likelihood, exact.posteriors
            return _Expectations(ll, post, r.transitions + exact.transitions, r.starts + exact.starts)
        return self._log_expectations(batch)

    def _log_expectations(self, batch: _Batch) -> _Expectations:
        """E-step by autograd of the log-chain log-likelihood wrt emissions, transitions and start."""
        leaves = [t.detach().requires_grad_() for t in (batch.log_emissions, self.log_trans(), self.log_start())]
        with torch.enable_grad():
            ll = chain_sum_factored(leaves[0], leaves[1], leaves[2], None, batch.lengths)
            if not ll.requires_grad:  # T == 0: nothing to differentiate
                return _Expectations(ll, *(torch.zeros_like(t) for t in leaves))
            grads = torch.autograd.grad(ll.sum(), leaves, allow_unused=True, materialize_grads=True)
        return _Expectations(ll.detach(), *grads)

    def _viterbi(self, batch: _Batch) -> tuple[Tensor, Tensor]:
        return chain_viterbi_factored(batch.log_emissions, self.log_trans(), self.log_start(), None, batch.lengths)

    def log_likelihood(
        self,
        X: ArrayLike | None = None,
        mask: ArrayLike | None = None,
        lengths: ArrayLike | None = None,
        *,
        log_emissions: ArrayLike | None = None,
    ) -> Tensor:
        """log p(X) of each padded sequence -> (B,), differentiable; 0 for length 0.

        X: (B, T) symbols or (B, T, D) features (or ``log_emissions`` (B, T, C)); mask (B, T) prefix
        mask or lengths (B,) (neither: all T).
        """
        return self._chain_sum(self._padded(X, mask, lengths, log_emissions))

    def forward(
        self,
        X: ArrayLike | None = None,
        mask: ArrayLike | None = None,
        lengths: ArrayLike | None = None,
        *,
        log_emissions: ArrayLike | None = None,
    ) -> Tensor:
        """Per-sequence log-likelihoods (B,): maximise ``model(X, mask).sum()`` to train by gradient."""
        return self.log_likelihood(X, mask, lengths, log_emissions=log_emissions)

    @torch.no_grad()
    def posteriors(
        self,
        X: ArrayLike | None = None,
        mask: ArrayLike | None = None,
        lengths: ArrayLike | None = None,
        *,
        log_emissions: ArrayLike | None = None,
    ) -> Tensor:
        """p(state at t | X) -> (B, T, C), 0 past each length (forward-backward by autograd)."""
        return self._expectations(self._padded(X, mask, lengths, log_emissions)).posteriors

    @torch.no_grad()
    def viterbi(
        self,
        X: ArrayLike | None = None,
        mask: ArrayLike | None = None,
        lengths: ArrayLike | None = None,
        *,
        log_emissions: ArrayLike | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Most likely state paths: (tags (B, T) int64, -1 past each length; log p(X, path) (B,))."""
        score, tags = self._viterbi(self._padded(X, mask, lengths, log_emissions))
        return tags, score

    @torch.no_grad()
    def sample_paths(
        self,
        X: ArrayLike | None = None,
        mask: ArrayLike | None = None,
        lengths: ArrayLike | None = None,
        *,
        n: int = 1,
        log_emissions: ArrayLike | None = None,
        generator: int | torch.Generator | None = None,
    ) -> Tensor:
        """n state paths per sequence from the posterior p(path | X) -> (n, B, T), -1 past each length."""
        batch = self._padded(X, mask, lengths, log_emissions)
        B, T, _ = batch.log_emissions.shape
        if T == 0:
            return torch.empty((n, B, 0), dtype=torch.long, device=self.device)
        chain = factored_to_edges(batch.log_emissions, self.log_trans(), self.log_start(), None, LogSemiring)
        return chain_sample(*chain, batch.lengths, n=n, generator=_as_generator(generator, self.device))

    @torch.no_grad()
    def sample_batch(
        self, batch_size: int, length: int, generator: int | torch.Generator | None = None
    ) -> tuple[Tensor, Tensor]:
        """Draw batch_size sequences of `length` steps from the model -> (X (B, T, *event), states (B, T))."""
        emission = self._require_emission()
        g = _as_generator(generator, self.device)
        start, trans = self.startprob_, self.transmat_
        states = torch.empty(batch_size, length, dtype=torch.long, device=self.device)
        if length and batch_size:
            states[:, 0] = torch.multinomial(start.expand(batch_size, -1), 1, generator=g).squeeze(1)
            for t in range(1, length):
                states[:, t] = torch.multinomial(trans[states[:, t - 1]], 1, generator=g).squeeze(1)
        return emission.sample(states, g), states

    # ------------------------------------------------------------ hmmlearn's calls on concatenated samples

    @torch.no_grad()
    def score(
        self, X: ArrayLike | None = None, lengths: ArrayLike | None = None, *, log_emissions: ArrayLike | None = None
    ) -> Tensor:
        """Total log-likelihood of the concatenated samples X (n_samples, ...) -> 0-dim tensor."""
        batch, _ = self._concatenated(X, lengths, log_emissions)
        if self._scaling(len(batch.lengths)):
            ll, suspect = scaled_forward(batch.log_emissions, self.log_trans(), self.log_start(), batch.lengths)
            if suspect.any():
                bad = suspect.nonzero().flatten()
                ll = ll.clone()
                ll[bad] = self._chain_sum(batch.rows(bad))
            return ll.sum()
        return self._chain_sum(batch).sum()

    @torch.no_grad()
    def score_samples(
        self, X: ArrayLike | None = None, lengths: ArrayLike | None = None, *, log_emissions: ArrayLike | None = None
    ) -> tuple[Tensor, Tensor]:
        """(total log-likelihood, posteriors (n_samples, C))."""
        batch, layout = self._concatenated(X, lengths, log_emissions)
        e = self._expectations(batch)
        return e.log_likelihood.sum(), layout.unpad(e.posteriors)

    def predict_proba(
        self, X: ArrayLike | None = None, lengths: ArrayLike | None = None, *, log_emissions: ArrayLike | None = None
    ) -> Tensor:
        """State posteriors (n_samples, C)."""
        return self.score_samples(X, lengths, log_emissions=log_emissions)[1]

    @torch.no_grad()
    def decode(
        self,
        X: ArrayLike | None = None,
        lengths: ArrayLike | None = None,
        algorithm: str = "viterbi",
        *,
        log_emissions: ArrayLike | None = None,
    ) -> tuple[Tensor, Tensor]:
        """(log-probability, states (n_samples,) int64), as hmmlearn: "viterbi" gives the best paths and
        the sum of their log p(X, path); "map" the most probable state at each sample and the sum of
        those posteriors' maxima."""
        if algorithm not in ("viterbi", "map"):
            raise ValueError(f"algorithm must be 'viterbi' or 'map', got {algorithm!r}")
        batch, layout = self._concatenated(X, lengths, log_emissions)
        if algorithm == "map":
            best, states = layout.unpad(self._expectations(batch).posteriors).max(-1)
            return best.sum(), states
        score, tags = self._viterbi(batch)
        return score.sum(), layout.unpad(tags)

    def predict(
        self, X: ArrayLike | None = None, lengths: ArrayLike | None = None, *, log_emissions: ArrayLike | None = None
    ) -> Tensor:
        """Viterbi states (n_samples,) int64."""
        return self.decode(X, lengths, log_emissions=log_emissions)[1]

    def sample(self, n_samples: int = 1, random_state: int | torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """One sequence of n_samples steps, as hmmlearn: (X (n_samples, 1) symbols or (n_samples, D),
        states (n_samples,)). random_state: an int seed or a torch.Generator on the model's device."""
        x, states = self.sample_batch(1, n_samples, random_state)
        return x[0].reshape(n_samples, *(self.emission.event_shape or (1,))), states[0]

    @torch.no_grad()
    def fit(
        self,
        X: ArrayLike | None = None,
        lengths: ArrayLike | None = None,
        n_iter: int = 100,
        tol: float = 1e-2,
        verbose: bool = False,
        progress: bool = False,
        *,
        log_emissions: ArrayLike | None = None,
        stream: TextIO | None = None,
        params: str | None = None,
        monitor: ConvergenceMonitor | None = None,
        group=None,
    ) -> HMM:
        """Baum-Welch EM from the current parameters on concatenated samples X (n_samples, ...).

        Each iteration computes the posteriors and expected counts (E-step, see ``implementation``) and
        re-estimates the parameters with hmmlearn's formulas and priors (M-step). ``monitor_`` records
        the log-likelihood of each E-step (non-decreasing) and stops after n_iter iterations or a gain
        below tol. verbose prints hmmlearn's per-iteration line (iteration, log-likelihood, gain: the
        monitor's report, above the bar); verbose or progress draws a progress bar; both on stderr (or `stream`).
        ``params``: hmmlearn's letters of the parameters to re-estimate, "s" start, "t" transitions and
        the emission model's (``Emission.param_letters``: "e" categorical, "m" / "c" Gaussian means /
        covariances); None: all; other letters are ignored. ``monitor``: a ConvergenceMonitor to report
        to (and stop by) instead of a new one from tol, n_iter and verbose (it is not reset).
        With ``log_emissions`` (n_samples, C) instead of X only start and transitions are re-estimated.
        ``group``: a torch.distributed process group (e.g. ``torch.distributed.group.WORLD``) whose ranks
        each call fit on their shard of the data: the E-step statistics and log-likelihood are summed
        across ranks (one all_reduce per iteration), starting from rank 0's parameters, so every rank
        ends with the model of a one-process fit on the union of the shards (distributed.py);
        verbose / progress print on rank 0 only. None (default) or a group of one rank: local fit.
        """
        if group is not None:
            from .distributed import group_size

            if group_size(group)[1] > 1:
                return self._fit_distributed(
                    X, lengths, n_iter, tol, verbose, progress, log_emissions, stream, params, monitor, group
                )
        batch, _ = self._concatenated(X, lengths, log_emissions)
        if int(batch.lengths.sum()) == 0:
            name, shape = ("X", _shape(X)) if X is not None else ("log_emissions", _shape(log_emissions))
            raise ValueError(f"{name} has shape {shape}: fit needs at least one sample")
        if params is not None and not isinstance(params, str):
            raise ValueError(f"params must be a string of parameter letters, got {params!r}")
        if monitor is None:
            monitor = ConvergenceMonitor(tol, n_iter, verbose)
        self.monitor_ = monitor
        bar = _ProgressBar(n_iter, stream) if (verbose or progress) else None
        try:
            for it in range(n_iter):
                if it and batch.x is not None:  # the emissions under the re-estimated parameters
                    batch = self._with_emissions(batch.x, batch.lengths, batch.full)
                stats = self._expectations(batch)
                log_prob = float(stats.log_likelihood.sum())
                if not math.isfinite(log_prob):
                    bad = torch.nonzero(~torch.isfinite(stats.log_likelihood)).flatten().tolist()
                    raise ValueError(f"X has zero probability under the model (sequences {bad[:10]})")
                self._m_step(stats, batch, params)
                if self._iteration_done(monitor, bar, log_prob):
                    break
        finally:
            if bar is not None:
                bar.close()
        return self

    def _fit_distributed(
        self, X, lengths, n_iter, tol, verbose, progress, log_emissions, stream, params, monitor, group
    ):
        """fit over the ranks of `group` (size > 1), each with its shard of the data (distributed.py)."""
        import torch.distributed as dist

        from . import distributed as hd

        rank, _ = hd.group_size(group)
        error: BaseException | None = None
        batch = None
        try:
            if params is not None and not isinstance(params, str):
                raise ValueError(f"params must be a string of parameter letters, got {params!r}")
            batch, _ = self._concatenated(X, lengths, log_emissions)
            if self.emission is not None and type(self.emission).sufficient_stats is Emission.sufficient_stats:
                raise NotImplementedError(
                    f"distributed HMM.fit needs an emission model with sufficient_stats and m_step_from_stats; "
                    f"{type(self.emission).__name__} has none"
                )
        except (ValueError, NotImplementedError) as e:
            error = e
        n_iter = monitor.n_iter if monitor is not None else n_iter
        dtypes = {torch.float16: 16, torch.bfloat16: 17, torch.float32: 32, torch.float64: 64}
        fields = {
            "n_states": self.n_states,
            "n_iter": n_iter,
            "tol": monitor.tol if monitor is not None else tol,
            "params": -1
            if not isinstance(params, str)
            else sum(1 << i for i, c in enumerate("stemcwl") if c in params),
            "dtype": dtypes.get(self.log_startprob.dtype, 0),
            "X or log_emissions": float(X is None),
            **hd.emission_fields(self.emission),
        }
        n_local = int(batch.lengths.sum()) if batch is not None else 0
        total = hd.check_agreement(fields, error, n_local, group, self.device)
        if total == 0:
            name, shape = ("X", _shape(X)) if X is not None else ("log_emissions", _shape(log_emissions))
            raise ValueError(f"{name} has shape {shape} on every rank of the group: fit needs at least one sample")
        hd.broadcast_parameters(self, group)  # every rank starts from rank 0's model
        update_emissions = batch.x is not None and (params is None or bool(self.emission._updates(params)))
        if monitor is None:
            monitor = ConvergenceMonitor(tol, n_iter, verbose)
        self.monitor_ = monitor
        bar = _ProgressBar(n_iter, stream) if (verbose or progress) and rank == 0 else None
        C = self.n_states
        try:
            for _ in range(n_iter):
                if batch.x is not None:  # the emissions under the current (rank 0's, then re-estimated) parameters
                    batch = self._with_emissions(batch.x, batch.lengths, batch.full)
                if n_local:
                    stats = self._expectations(batch)
                else:  # no data here: zero statistics, but this rank still takes part in the collectives
                    em = batch.log_emissions
                    stats = _Expectations(
                        em.new_zeros(len(batch.lengths)), torch.zeros_like(em), em.new_zeros(C, C), em.new_zeros(C)
                    )
                parts = [stats.log_likelihood.sum().reshape(1), stats.starts, stats.transitions]
                if update_emissions:
                    B, T = batch.x.shape[:2]
                    x = batch.x.reshape(B * T, *batch.x.shape[2:])
                    parts += hd.emission_stats(self.emission, x, stats.posteriors.reshape(B * T, C))
                flat = torch.cat([p.reshape(-1).to(self.log_startprob.dtype) for p in parts])
                dist.all_reduce(flat, group=group)
                summed = [
                    s.reshape(p.shape) for s, p in zip(flat.split([p.numel() for p in parts]), parts, strict=True)
                ]
                log_prob = float(summed[0])
                if not math.isfinite(log_prob):
                    bad = torch.nonzero(~torch.isfinite(stats.log_likelihood)).flatten().tolist()
                    raise ValueError(
                        f"X has zero probability under the model (on some rank; this rank's sequences {bad[:10]})"
                    )
                chain = _Expectations(summed[0], None, summed[2], summed[1])
                self._m_step(chain, _Batch(None, batch.log_emissions, batch.lengths), params)
                if update_emissions:
                    hd.emission_m_step(self.emission, summed[3:], params)
                if self._iteration_done(monitor, bar, log_prob, quiet=rank != 0):
                    break
        finally:
            if bar is not None:
                bar.close()
        return self

    def _iteration_done(
        self, monitor: ConvergenceMonitor, bar: _ProgressBar | None, log_prob: float, quiet: bool = False
    ) -> bool:
        """The end of an EM iteration (both fits): the monitor's report (hmmlearn's line on stderr when the
        monitor is verbose, printed above the bar when one is drawn; dropped when ``quiet``, as on the ranks
        other than 0 of a distributed fit) and the bar; whether EM has converged."""
        if bar is not None:
            with bar.above():
                monitor.report(log_prob)
            bar.update(monitor.iter, log_prob, final=monitor.converged)
        elif quiet:
            with contextlib.redirect_stderr(io.StringIO()):
                monitor.report(log_prob)
        else:
            monitor.report(log_prob)
        return monitor.converged

    def _m_step(self, stats: _Expectations, batch: _Batch, params: str | None = None) -> None:
        """hmmlearn's M-step (run under no_grad) of the parameters `params` names (None: all): start and
        transitions are the expected counts under their Dirichlet priors, normalised; probabilities that
        are 0 stay 0; a row with nothing keeps its values (hmmlearn leaves zeros there)."""
        if params is None or "s" in params:
            start = dirichlet_map(stats.starts, self.startprob_prior, self.log_start(), "startprob_prior", True)
            self.log_startprob.copy_(start)
        if params is None or "t" in params:
            trans = dirichlet_map(stats.transitions, self.transmat_prior, self.log_trans(), "transmat_prior", True)
            self.log_transmat.copy_(trans)
        if batch.x is not None and (params is None or self.emission._updates(params)):
            B, T = batch.x.shape[:2]
            x = batch.x.reshape(B * T, *batch.x.shape[2:])
            weights = stats.posteriors.reshape(B * T, self.n_states)
            # emission models written against the two-argument m_step update everything
            self.emission.m_step(x, weights) if params is None else self.emission.m_step(x, weights, params)
