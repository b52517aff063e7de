"""LinearChainCRF: a drop-in for pytorch-crf's CRF, on the chain engine (semiring_ops/structures/chain.py).

Parameters carry pytorch-crf's names and layout, so its state_dict loads unchanged:
    start_transitions (C,), end_transitions (C,), transitions (C, C) indexed [from, to].

Shapes (batch_first=False, as pytorch-crf): emissions (T, B, C), tags (T, B), mask (T, B);
with batch_first=True: (B, T, C), (B, T), (B, T). Masks are prefix masks (right padding), bool or
uint8; a sequence may have length 0. ``lengths=`` (B,) may be given instead of a mask.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor, nn

from ..build.backends import backend_for
from ..build.reference import gold_path_score
from ..semirings import LogSemiring
from .chain import chain_entropy, chain_sample, chain_topk, resolve_lengths
from .constraints import Constraints
from .factored import chain_log_likelihood_factored, chain_sum_factored, chain_viterbi_factored, factored_to_edges

__all__ = ["LinearChainCRF"]

REDUCTIONS = ("none", "sum", "mean", "token_mean")
_REDUCTION_CODES = {name: code for code, name in enumerate(REDUCTIONS)}  # crf_forward's (csrc/autograd/autograd.h)


def _is_integer(x: Tensor) -> bool:
    return not (x.is_floating_point() or x.is_complex() or x.dtype == torch.bool)


def _check_count(name: str, value: object, minimum: int) -> None:
    """An int argument (top_k, n) at least `minimum`: TypeError / ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")


class LinearChainCRF(nn.Module):
    """Linear-chain conditional random field over `num_tags` tags.

    Args:
        num_tags: number of tags C.
        batch_first: emissions are (B, T, C) rather than (T, B, C).
        constraints: legal starts / transitions / ends (see ``allowed_transitions``); illegal ones get
            score -inf in training and decoding alike, so no illegal path is ever produced.
        validate: check the mask (no holes), the lengths (0..T) and the tags (0..C-1 below each length) and
            raise ValueError naming the problem; on a GPU that costs one synchronisation per call. False
            (also settable later, ``crf.validate = False``) checks without synchronising: a bad sequence
            gets NaN as its log-likelihood, log Z and Viterbi score, tags -1 and NaN gradients in its own
            emissions, and adds nothing to the transitions' gradients; the rest of the batch is unaffected.
            This applies to forward / nll, log_partition, marginals and viterbi without top_k; score,
            top-k decoding, entropy, sample and decode always raise. Shapes and dtypes always raise.

    Every method checks its arguments' shapes and dtypes first, in the caller's layout, and names the argument,
    its shape and the shape expected: ValueError for a shape ("emissions must be 3-D (seq_length, batch_size,
    num_tags) with batch_first=False, got shape (5, 3)"), TypeError for a dtype.
    """

    def __init__(
        self, num_tags: int, batch_first: bool = False, constraints: Constraints | None = None, validate: bool = True
    ) -> None:
        if isinstance(num_tags, bool) or not isinstance(num_tags, numbers.Integral):
            raise TypeError(f"num_tags must be an int, got {num_tags!r}")
        if num_tags <= 0:  # pytorch-crf's wording
            raise ValueError(f"invalid number of tags: {num_tags} (num_tags must be positive)")
        num_tags = int(num_tags)
        super().__init__()
        self.num_tags = num_tags
        self.batch_first = batch_first
        self.validate = validate
        self.start_transitions = nn.Parameter(torch.empty(num_tags))
        self.end_transitions = nn.Parameter(torch.empty(num_tags))
        self.transitions = nn.Parameter(torch.empty(num_tags, num_tags))
        if constraints is not None:
            shapes = tuple(tuple(m.shape) for m in (constraints.start, constraints.transitions, constraints.end))
            want = ((num_tags,), (num_tags, num_tags), (num_tags,))
            if shapes != want:
                raise ValueError(
                    f"constraints must have start, transitions, end of shapes {want} for num_tags={num_tags}, "
                    f"got {shapes}"
                )
            self.register_buffer("allowed_start", constraints.start.bool(), persistent=False)
            self.register_buffer("allowed_transitions", constraints.transitions.bool(), persistent=False)
            self.register_buffer("allowed_end", constraints.end.bool(), persistent=False)
        self.constrained = constraints is not None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Uniform(-0.1, 0.1), as pytorch-crf."""
        for p in (self.start_transitions, self.end_transitions, self.transitions):
            nn.init.uniform_(p, -0.1, 0.1)

    def extra_repr(self) -> str:
        return f"num_tags={self.num_tags}, batch_first={self.batch_first}" + (
            "" if self.validate else ", validate=False"
        )

    # ------------------------------------------------------------ inputs

    def _batch_major(self, x: Tensor | None) -> Tensor | None:
        return x if (x is None or self.batch_first) else x.transpose(0, 1)

    def _check_inputs(
        self, emissions: Tensor, tags: Tensor | None, mask: Tensor | None, lengths: Tensor | None
    ) -> None:
        """Shapes and dtypes of a call's inputs, in the caller's layout: ValueError (shape) or TypeError (dtype)
        naming the argument, its shape and the shape expected. Every public method runs it (through
        ``_inputs``) before it reads anything."""
        steps = ("batch_size", "seq_length") if self.batch_first else ("seq_length", "batch_size")
        em_layout, seq_layout = f"({steps[0]}, {steps[1]}, num_tags)", f"({steps[0]}, {steps[1]})"
        layout = f"with batch_first={self.batch_first}"
        if not isinstance(emissions, Tensor):
            raise TypeError(f"emissions must be a Tensor {em_layout}, got {type(emissions).__name__}")
        shape = tuple(emissions.shape)
        if emissions.dim() != 3:
            raise ValueError(f"emissions must be 3-D {em_layout} {layout}, got shape {shape}")
        if shape[2] != self.num_tags:
            raise ValueError(
                f"emissions must have shape {em_layout} = {(*shape[:2], self.num_tags)} {layout} "
                f"(this CRF has num_tags={self.num_tags}), got shape {shape}"
            )
        if not emissions.is_floating_point():
            raise TypeError(f"emissions must be floating point, got {emissions.dtype}")
        for name, x in (("tags", tags), ("mask", mask)):
            if x is not None and tuple(x.shape) != shape[:2]:
                raise ValueError(
                    f"{name} must have shape {seq_layout} = {shape[:2]} {layout}, the first two dimensions of "
                    f"emissions (shape {shape}), got shape {tuple(x.shape)}"
                )
        if tags is not None and not _is_integer(tags):
            raise TypeError(f"tags must be an integer tensor, got {tags.dtype}")
        if mask is not None and lengths is not None:
            raise ValueError("give mask or lengths, not both")
        if lengths is not None:
            batch = (shape[0 if self.batch_first else 1],)
            if tuple(lengths.shape) != batch:
                raise ValueError(f"lengths must have shape (batch_size,) = {batch}, got shape {tuple(lengths.shape)}")
            if not _is_integer(lengths):
                raise TypeError(f"lengths must be an integer tensor, got {lengths.dtype}")

    def _inputs(
        self,
        emissions: Tensor,
        mask: Tensor | None,
        lengths: Tensor | None,
        tags: Tensor | None = None,
        raise_errors: bool = True,
    ) -> tuple[Tensor, Tensor | None, Tensor]:
        """A call's inputs checked (``_check_inputs``), then batch-major: emissions (B, T, C), tags (B, T) or None
        and lengths (B,) int64 from the mask or lengths, validated with the tags (mask holes, lengths in 0..T,
        tags in 0..C-1 below each length): in one device round trip, or without raise_errors in none, a bad
        sequence's length -1 (for the fused kernels only: see ``validate``)."""
        if isinstance(emissions, Tensor):  # lists are accepted for the others, as before
            mask, lengths, tags = (
                x if x is None or type(x) is Tensor else torch.as_tensor(x) for x in (mask, lengths, tags)
            )
        self._check_inputs(emissions, tags, mask, lengths)
        em, tags = self._batch_major(emissions), self._batch_major(tags)
        B, T, C = em.shape
        L = resolve_lengths(
            B, T, self._batch_major(mask), lengths, em.device, tags=tags, num_tags=C, raise_errors=raise_errors
        )
        return em, tags, L

    def _transition_scores(self) -> tuple[Tensor, Tensor, Tensor]:
        """start (C,), transitions (C, C), end (C,), with -inf where the constraints forbid."""
        start, trans, end = self.start_transitions, self.transitions, self.end_transitions
        if self.constrained:
            start = start.masked_fill(~self.allowed_start, -math.inf)
            trans = trans.masked_fill(~self.allowed_transitions, -math.inf)
            end = end.masked_fill(~self.allowed_end, -math.inf)
        return start, trans, end

    def _chain(self, emissions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """init (B, C), edges (B, T-1, C, C), final (B, C) from batch-major emissions (B, T, C)."""
        start, trans, end = self._transition_scores()
        return factored_to_edges(emissions, trans, start, end, LogSemiring)

    # ------------------------------------------------------------ scores

    def log_partition(self, emissions: Tensor, mask: Tensor | None = None, lengths: Tensor | None = None) -> Tensor:
        """log Z of each sequence -> (B,); 0 for a sequence of length 0."""
        em, _, L = self._inputs(emissions, mask, lengths, raise_errors=self.validate)
        return self._log_partition(em, L)

    def _log_partition(self, em: Tensor, L: Tensor) -> Tensor:
        start, trans, end = self._transition_scores()
        return chain_sum_factored(em, trans, start, end, L, "log", check_lengths=False)

    def score(
        self, emissions: Tensor, tags: Tensor, mask: Tensor | None = None, lengths: Tensor | None = None
    ) -> Tensor:
        """Unnormalised log-score of the given tag sequences -> (B,)."""
        em, tags, L = self._inputs(emissions, mask, lengths, tags)
        start, trans, end = self._transition_scores()
        return gold_path_score(em, trans, start, end, L, tags)

    def forward(
        self,
        emissions: Tensor,
        tags: Tensor,
        mask: Tensor | None = None,
        reduction: str = "sum",
        lengths: Tensor | None = None,
    ) -> Tensor:
        """Log-likelihood of `tags` (as pytorch-crf): reduction none (B,) | sum | mean | token_mean.

        One validation round trip (mask, lengths, tags; none with validate=False) and one fused kernel each
        way: the forward scan gives log Z and the gold path's score, the reverse scan the whole gradient
        (ops/chain_ops.py).
        """
        if reduction not in REDUCTIONS:  # pytorch-crf's wording first
            raise ValueError(f"invalid reduction: {reduction} (must be one of {', '.join(REDUCTIONS)})")
        if type(emissions) is Tensor and not (self.constrained or torch.compiler.is_compiling()):
            # the whole call in C++ (csrc/autograd/crf_forward.cpp), which declines (None) what it does not take
            one_call = backend_for(emissions.device).autograd_node("chain", "crf_forward")
            if one_call is not None:
                params = (self.transitions, self.start_transitions, self.end_transitions)
                out = one_call(
                    emissions,
                    tags,
                    mask,
                    lengths,
                    *params,
                    self.batch_first,
                    _REDUCTION_CODES[reduction],
                    self.validate,
                )
                if out is not None:
                    return out
        em, tags, L = self._inputs(emissions, mask, lengths, tags, raise_errors=self.validate)
        start, trans, end = self._transition_scores()
        llh = chain_log_likelihood_factored(em, trans, start, end, L, tags)
        if reduction == "none":
            return llh
        if reduction == "sum":
            return llh.sum()
        if reduction == "mean":
            return llh.mean()
        return llh.sum() / L.sum().clamp_min(1)

    def nll(
        self,
        emissions: Tensor,
        tags: Tensor,
        mask: Tensor | None = None,
        reduction: str = "sum",
        lengths: Tensor | None = None,
    ) -> Tensor:
        """The loss to minimise: minus the log-likelihood."""
        return -self.forward(emissions, tags, mask, reduction, lengths)

    def marginals(self, emissions: Tensor, mask: Tensor | None = None, lengths: Tensor | None = None) -> Tensor:
        """Posterior probability of each tag at each position -> (B, T, C) batch-major, 0 past the length.

        The gradient of log Z with respect to the emissions (forward-backward by autograd), itself differentiable
        when the emissions or the CRF's parameters need a gradient (structured attention, expected-count and
        posterior-regularisation losses): the fused kernels' second derivatives differentiate the PyTorch chain
        program, so a backward through the marginals costs that program's double backward.
        """
        em, _, L = self._inputs(emissions, mask, lengths, raise_errors=self.validate)
        differentiable = torch.is_grad_enabled() and (
            em.requires_grad or any(p.requires_grad for p in self.parameters())
        )
        if em.shape[1] == 0:
            return torch.zeros_like(em)
        if not em.requires_grad:
            em = em.detach().requires_grad_()
        with torch.enable_grad():
            (marg,) = torch.autograd.grad(self._log_partition(em, L).sum(), (em,), create_graph=differentiable)
        return marg

    # ------------------------------------------------------------ decoding

    def viterbi(
        self,
        emissions: Tensor,
        mask: Tensor | None = None,
        lengths: Tensor | None = None,
        top_k: int | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Best tag sequences as tensors, for export: (tags (B, T), scores (B,)), tags padded with -1;
        with top_k=k the k best: (tags (B, k, T), scores (B, k)), best first, -inf / -1 where a
        sequence has fewer than k paths."""
        return self._viterbi(emissions, mask, lengths, top_k, self.validate)

    def _viterbi(
        self, emissions: Tensor, mask: Tensor | None, lengths: Tensor | None, top_k: int | None, validate: bool
    ) -> tuple[Tensor, Tensor]:
        if top_k is not None:
            _check_count("top_k", top_k, 1)
        em, _, L = self._inputs(emissions, mask, lengths, raise_errors=validate or top_k is not None)
        B, T, _ = em.shape
        if top_k is not None:
            if T == 0:
                scores = em.new_full((B, top_k), -math.inf)
                scores[:, 0] = 0.0
                return em.new_empty((B, top_k, 0), dtype=torch.long), scores
            scores, tags = chain_topk(*self._chain(em), L, top_k)
            return tags, scores
        if T == 0:
            return em.new_empty((B, 0), dtype=torch.long), em.new_zeros(B)
        start, trans, end = self._transition_scores()
        score, tags = chain_viterbi_factored(em, trans, start, end, L, check_lengths=False)
        return tags, score

    def entropy(self, emissions: Tensor, mask: Tensor | None = None, lengths: Tensor | None = None) -> Tensor:
        """Entropy of the CRF's distribution over each sequence's tag paths -> (B,), differentiable."""
        em, _, L = self._inputs(emissions, mask, lengths)
        if em.shape[1] == 0:
            return em.new_zeros(em.shape[0])
        return chain_entropy(*self._chain(em), L)

    def sample(
        self,
        emissions: Tensor,
        mask: Tensor | None = None,
        n: int = 1,
        lengths: Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """n tag sequences per input drawn from the CRF -> (n, B, T) batch-major, -1 past the length."""
        _check_count("n", n, 0)
        em, _, L = self._inputs(emissions, mask, lengths)
        em = em.detach()
        if em.shape[1] == 0:
            return em.new_empty((n, em.shape[0], 0), dtype=torch.long)
        with torch.no_grad():
            return chain_sample(*self._chain(em), L, n=n, generator=generator)

    def decode(self, emissions: Tensor, mask: Tensor | None = None) -> list[list[int]]:
        """Best tag sequences as lists (as pytorch-crf's decode)."""
        # validated whatever self.validate says: decode synchronises anyway, and a list cannot hold a NaN score
        tags = self._viterbi(emissions, mask, None, None, True)[0].cpu()  # one copy to the host for the batch
        return [row[:n] for row, n in zip(tags.tolist(), (tags >= 0).sum(1).tolist(), strict=True)]
