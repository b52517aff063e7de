"""torch-struct's structured-prediction semirings as :class:`~semiring_ops.semirings.Semiring` subclasses.

Each runs every structure of ``semiring_ops.structures`` unchanged, through the semirings' contract for values
with leading dimensions (``lead``, ``convert``, ``unconvert``, ``zeros``, ``ones``, ``mask``, ``dot``): a value
is (*lead sizes, *shape), the structures index it from the right, and ``S.convert(potentials)`` is what they
take (``Structure`` does it for its callers). None has a compiled kernel; ``matmul`` is the generic PyTorch
product of :func:`generic_matmul`.

=================================  ======  =========================================  ==============================
semiring                           lead    a value                                    ``unconvert`` (B,) / (k, B)
=================================  ======  =========================================  ==============================
``KMaxSemiring(k)``                (k,)    the k best scores, sorted descending        the k best scores (k, B)
``EntropySemiring``                (2,)    (log-sum-exp, entropy)                       the entropy
``CrossEntropySemiring``           (3,)    (log Z_p, log Z_q, cross-entropy H(p, q))    H(p, q)
``KLDivergenceSemiring``           (3,)    (log Z_p, log Z_q, KL(p || q))               KL(p || q)
``SampledSemiring``                none    log-sum-exp; its backward draws a sample    log Z
=================================  ======  =========================================  ==============================

Their gradients: d (the i-th best score) / d potentials marks the parts of the i-th best structure (0 / 1);
d log Z / d potentials under ``SampledSemiring`` marks the parts of one structure drawn from the Gibbs
distribution (forward filtering, backward sampling: every log-sum-exp draws one of its terms in proportion
to its weight). The semiring's zero (every term -inf) gives the zero back and a zero gradient, never NaN.

Values are log-space: -inf is a part or structure of probability 0. ``MultiSampledSemiring`` (torch-struct's
16 samples packed in the bits of one gradient) is not provided: ``Structure.sample`` folds samples into the
batch instead.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import Tensor

from .semirings import LogSemiring, Semiring

__all__ = [
    "CrossEntropySemiring",
    "EntropySemiring",
    "KLDivergenceSemiring",
    "KMaxSemiring",
    "SampledSemiring",
    "categorical_one_hot",
    "generic_matmul",
]

MATMUL_BLOCK_ELEMENTS = 1 << 22
"""generic_matmul's block size: the most elements one block's semiring product holds (rows of ``a`` per block
follow from it; at least one row)."""


class LeadSemiring(Semiring):
    """Base of the semirings here: values (*lead sizes, *shape) with ``lead`` = 0 or 1 leading dim of ``size``
    entries, no compiled kernel, matmul by :func:`generic_matmul`. Subclasses set ``size`` and implement plus /
    times / sum (over a dim counted in the whole value: negative, or at least ``lead``) and the constants."""

    kernel_id = None
    size: ClassVar[int] = 1
    peak: ClassVar[int] = 1
    """How many lead slices one ``times`` holds at its peak (KMax(k): k * k candidate sums before the top k)."""

    @classmethod
    def matmul(cls, a: Tensor, b: Tensor) -> Tensor:
        """(*lead, ..., n, j) (x) (*lead, ..., j, m) -> (*lead, ..., n, m): :func:`generic_matmul`."""
        return generic_matmul(cls, a, b)

    @classmethod
    def identity(cls, n: int, *, dtype: torch.dtype | None = None, device=None) -> Tensor:
        """(*lead, n, n): ``ones`` on the diagonal, ``zeros`` elsewhere."""
        like = torch.empty((), dtype=dtype, device=device)
        eye = torch.eye(n, dtype=torch.bool, device=device)
        return torch.where(eye, cls.ones((n, n), like=like), cls.zeros((n, n), like=like))

    @classmethod
    def _dim(cls, x: Tensor, dim: int) -> int:
        """``dim`` of a value ``x`` as a non-negative index, which must not be a lead dim."""
        d = dim + x.dim() if dim < 0 else dim
        if not cls.lead <= d < x.dim():
            raise ValueError(f"{cls.__name__}.sum: dim {dim} of a value of {x.dim()} dims ({cls.lead} lead)")
        return d


def _aligned(a: Tensor, b: Tensor, lead: int) -> tuple[Tensor, Tensor]:
    """a, b with as many dims each (singletons inserted after the lead dims of the shorter one), so that
    broadcasting pairs lead dims with lead dims and aligns the rest from the right."""
    while a.dim() < b.dim():
        a = a.unsqueeze(lead)
    while b.dim() < a.dim():
        b = b.unsqueeze(lead)
    return a, b


def generic_matmul(semiring: type[Semiring], a: Tensor, b: Tensor) -> Tensor:
    """The semiring product (*lead, ..., n, j) (x) (*lead, ..., j, m) -> (*lead, ..., n, m) by the semiring's
    own ``times`` and ``sum`` (torch.matmul's broadcasting of the batch dims), computed over blocks of a's rows
    so that one block's product holds at most about ``MATMUL_BLOCK_ELEMENTS`` elements."""
    S, lead = semiring, semiring.lead
    if a.dim() - lead < 2 or b.dim() - lead < 2 or a.shape[-1] != b.shape[-2]:
        raise ValueError(f"{S.__name__}.matmul: (..., n, j) x (..., j, m), got {tuple(a.shape)} x {tuple(b.shape)}")
    a, b = _aligned(a, b, lead)
    a, b = a.unsqueeze(-1), b.unsqueeze(-3)  # (*lead, ..., n, j, 1), (*lead, ..., 1, j, m)
    n = a.shape[-3]
    row = math.prod(torch.broadcast_shapes(a.shape[lead:-3], b.shape[lead:-3])) * b.shape[-2] * b.shape[-1]
    peak = getattr(S, "peak", 1) * math.prod(a.shape[:lead])
    rows = max(1, MATMUL_BLOCK_ELEMENTS // max(1, row * peak))
    blocks = [S.sum(S.times(a[..., r : r + rows, :, :], b), -2) for r in range(0, n, rows)]
    return blocks[0] if len(blocks) == 1 else torch.cat(blocks, -2)


def _keep_finite_grad(x: Tensor) -> Tensor:
    """x, with no gradient through its -inf entries (a value of probability 0 passes none back)."""
    return torch.where(torch.isneginf(x), x.detach(), x)


class _KMax(LeadSemiring):
    """The k-max semiring (module docstring); ``KMaxSemiring(k)`` makes the class for one k."""

    k: ClassVar[int] = 1
    lead = 1
    zero = -math.inf
    one = 0.0

    @classmethod
    def convert(cls, potentials: Tensor) -> Tensor:
        """(*shape) -> (k, *shape): the potentials first, -inf (no structure) after."""
        rest = potentials.new_full((cls.k - 1, *potentials.shape), -math.inf)
        return torch.cat([potentials.unsqueeze(0), rest], 0)

    @classmethod
    def unconvert(cls, value: Tensor) -> Tensor:
        """(k, B): the k best scores, best first (-inf past the number of structures)."""
        return value

    @classmethod
    def zeros(cls, shape: tuple[int, ...], like: Tensor) -> Tensor:
        """(k, *shape) of -inf: no structure."""
        return torch.full((cls.k, *shape), -math.inf, dtype=like.dtype, device=like.device)

    @classmethod
    def ones(cls, shape: tuple[int, ...], like: Tensor) -> Tensor:
        """(k, *shape): one structure of score 0, then -inf."""
        out = cls.zeros(shape, like)
        out[0] = 0.0
        return out

    @classmethod
    def _top(cls, candidates: Tensor) -> Tensor:
        """(c, *shape) candidate scores -> (k, *shape): the k largest, descending; ties in candidate order (a
        stable sort, so deterministic); -inf where fewer than k are finite, with no gradient."""
        k, c = cls.k, candidates.shape[0]
        if c < k:
            candidates = torch.cat([candidates, candidates.new_full((k - c, *candidates.shape[1:]), -math.inf)], 0)
        order = torch.sort(candidates.detach(), dim=0, descending=True, stable=True).indices[:k]
        return _keep_finite_grad(candidates.gather(0, order))

    @classmethod
    def plus(cls, x: Tensor, y: Tensor) -> Tensor:
        """The k best of the 2k scores of x and y (k, *shape)."""
        x, y = torch.broadcast_tensors(*_aligned(x, y, 1))
        return cls._top(torch.cat([x, y], 0))

    @classmethod
    def times(cls, x: Tensor, y: Tensor) -> Tensor:
        """The k best of the pairwise sums x[i] + y[j] (k, *shape); only pairs with (i + 1)(j + 1) <= k can be
        among them (both lists are sorted), so about k ln k are formed, not k^2."""
        x, y = _aligned(x, y, 1)
        i, j = _pairs(cls.k, x.device)
        return cls._top(x[i] + y[j])

    @classmethod
    def sum(cls, x: Tensor, dim: int = -1) -> Tensor:
        """The k best over the n entries' k scores each along ``dim`` (*lead, ..., n, ...) -> (k, ...); ties to
        the lower entry first."""
        d = cls._dim(x, dim)
        candidates = x.movedim(d, 0)  # (n, k, ...): entry-major, so ties go to the lower entry
        return cls._top(candidates.flatten(0, 1))


@functools.cache
def _pairs_cpu(k: int) -> tuple[Tensor, Tensor]:
    """The pairs (i, j) with (i + 1)(j + 1) <= k, in (i, j) order (so a stable sort keeps the k x k table's
    order of ties): about k ln k of them."""
    counts = k // torch.arange(1, k + 1)  # j < k // (i + 1) for each i
    i = torch.arange(k).repeat_interleave(counts)
    starts = (counts.cumsum(0) - counts).repeat_interleave(counts)
    return i, torch.arange(i.numel()) - starts


@functools.cache
def _pairs(k: int, device: torch.device) -> tuple[Tensor, Tensor]:
    i, j = _pairs_cpu(k)
    return i.to(device), j.to(device)


@functools.cache
def _kmax_class(k: int) -> type[Semiring]:
    return type(
        f"KMaxSemiring{k}",
        (_KMax,),
        {"k": k, "size": k, "peak": len(_pairs_cpu(k)[0]), "name": f"kmax{k}", "__doc__": _KMax.__doc__},
    )


def KMaxSemiring(k: int) -> type[Semiring]:
    """The k-max semiring for one k (the same class for the same k): values (k, *shape), the k best scores of
    the structures summed so far, sorted descending (-inf: fewer than k structures); plus merges two lists,
    times adds them pairwise (the k best sums), sum takes the k best over a dim. Potentials convert to
    (potentials, -inf, ..., -inf); the derivative of slot i of a structure's total is the 0 / 1 indicator of
    the i-th best structure's parts (zero where the slot is -inf)."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"KMaxSemiring: k must be an int >= 1, got {k!r}")
    return _kmax_class(k)


def _log_softmax_parts(logits: Tensor, dim: int) -> tuple[Tensor, Tensor, Tensor]:
    """(log-sum-exp over ``dim``, log-softmax, softmax), NaN-free where every term is -inf: the log-sum-exp is
    then -inf, and the log-softmax of -inf terms is reported as 0 (their softmax is 0), with zero gradients."""
    part = LogSemiring.sum(logits, dim)
    safe = torch.where(torch.isneginf(part), torch.zeros_like(part), part).unsqueeze(dim)
    shifted = logits - safe
    live = ~torch.isneginf(shifted)
    log_p = torch.where(live, shifted, torch.zeros_like(shifted))
    return part, log_p, torch.where(live, log_p.exp(), torch.zeros_like(log_p))


class EntropySemiring(LeadSemiring):
    """The entropy expectation semiring (torch-struct's; Li and Eisner 2009): values (2, *shape), (log-sum-exp,
    entropy) of the structures summed so far; potentials convert to (potentials, 0). times adds both entries;
    the sum over a dim mixes its terms with weights p_i = softmax(log-sum-exps): (logsumexp, sum_i p_i (H_i -
    log p_i)). ``unconvert`` gives the entropy of the Gibbs distribution (B,) (0 where there is no
    structure)."""

    name = "entropy"
    lead = 1
    size = 2
    zero = -math.inf
    one = 0.0

    @classmethod
    def convert(cls, potentials: Tensor) -> Tensor:
        return torch.stack([potentials, torch.zeros_like(potentials)])

    @classmethod
    def unconvert(cls, value: Tensor) -> Tensor:
        return value[1]

    @classmethod
    def zeros(cls, shape: tuple[int, ...], like: Tensor) -> Tensor:
        z = torch.zeros(shape, dtype=like.dtype, device=like.device)
        return torch.stack([torch.full_like(z, -math.inf), z])

    @classmethod
    def ones(cls, shape: tuple[int, ...], like: Tensor) -> Tensor:
        return torch.zeros((2, *shape), dtype=like.dtype, device=like.device)

    @staticmethod
    def times(x: Tensor, y: Tensor) -> Tensor:
        """(x0 + y0, x1 + y1), the entropy 0 where the log-sum-exp is -inf (the zero absorbs)."""
        x, y = _aligned(x, y, 1)
        out = x + y
        none = torch.isneginf(out[0])
        return torch.stack([out[0], torch.where(none, torch.zeros_like(out[1]), out[1])])

    @classmethod
    def plus(cls, x: Tensor, y: Tensor) -> Tensor:
        x, y = torch.broadcast_tensors(*_aligned(x, y, 1))
        return cls.sum(torch.stack([x, y], -1), -1)

    @classmethod
    def sum(cls, x: Tensor, dim: int = -1) -> Tensor:
        d = cls._dim(x, dim) - 1  # the dim in each entry
        part, log_p, p = _log_softmax_parts(x[0], d)
        return torch.stack([part, torch.sum(p * (x[1] - log_p), d)])


class _PairSemiring(LeadSemiring):
    """Values (3, *shape): (log-sum-exp under p, log-sum-exp under q, an expectation under p); potentials
    convert from the pair (p's, q's) to (p, q, 0)."""

    lead = 1
    size = 3
    zero = -math.inf
    one = 0.0
    kl: ClassVar[bool] = False

    @classmethod
    def convert(cls, potentials: Sequence[Tensor] | Tensor) -> Tensor:
        """The pair (p's potentials, q's potentials) of one shape (a sequence of two, or a (2, *shape) tensor)
        -> (3, *shape)."""
        p, q = potentials
        if p.shape != q.shape:
            raise ValueError(f"{cls.__name__}.convert: p's and q's potentials differ: {p.shape} vs {q.shape}")
        return torch.stack([p, q, torch.zeros_like(p)])

    @classmethod
    def unconvert(cls, value: Tensor) -> Tensor:
        return value[2]

    @classmethod
    def zeros(cls, shape: tuple[int, ...], like: Tensor) -> Tensor:
        z = torch.zeros(shape, dtype=like.dtype, device=like.device)
        inf = torch.full_like(z, -math.inf)
        return torch.stack([inf, inf, z])

    @classmethod
    def ones(cls, shape: tuple[int, ...], like: Tensor) -> Tensor:
        return torch.zeros((3, *shape), dtype=like.dtype, device=like.device)

    @staticmethod
    def times(x: Tensor, y: Tensor) -> Tensor:
        """Entry-wise sums; the expectation 0 where p allows nothing (the zero absorbs), +inf where p allows
        something and q nothing."""
        x, y = _aligned(x, y, 1)
        out = x + y
        expectation = torch.where(torch.isneginf(out[1]), torch.full_like(out[2], math.inf), out[2])
        expectation = torch.where(torch.isneginf(out[0]), torch.zeros_like(out[2]), expectation)
        return torch.stack([out[0], out[1], expectation])

    @classmethod
    def plus(cls, x: Tensor, y: Tensor) -> Tensor:
        x, y = torch.broadcast_tensors(*_aligned(x, y, 1))
        return cls.sum(torch.stack([x, y], -1), -1)

    @classmethod
    def sum(cls, x: Tensor, dim: int = -1) -> Tensor:
        d = cls._dim(x, dim) - 1
        part_p, log_p, p = _log_softmax_parts(x[0], d)
        part_q, log_q, _ = _log_softmax_parts(x[1], d)
        term = x[2] - log_q + log_p if cls.kl else x[2] - log_q
        # a term that p reaches and q does not: +inf (log q = -inf, reported as 0 by _log_softmax_parts)
        term = torch.where(torch.isneginf(x[1]) & (p > 0), torch.full_like(term, math.inf), term)
        return torch.stack([part_p, part_q, torch.sum(torch.where(p > 0, p * term, torch.zeros_like(p)), d)])


class CrossEntropySemiring(_PairSemiring):
    """The cross-entropy expectation semiring (torch-struct's): values (3, *shape) = (log Z_p, log Z_q, H(p,
    q)) of the structures summed so far; sum over a dim: (logsumexp_p, logsumexp_q, sum_i p_i (H_i - log q_i)).
    ``convert`` takes the pair of potentials (p, q); ``unconvert`` gives H(p, q) = -E_p[log q(z)] (B,), +inf
    where p gives weight to a structure q does not allow."""

    name = "cross-entropy"


class KLDivergenceSemiring(_PairSemiring):
    """The KL-divergence expectation semiring (torch-struct's): values (3, *shape) = (log Z_p, log Z_q, KL(p ||
    q)) of the structures summed so far; sum over a dim: (logsumexp_p, logsumexp_q, sum_i p_i (KL_i + log p_i -
    log q_i)). ``convert`` takes the pair of potentials (p, q); ``unconvert`` gives KL(p || q) (B,)."""

    name = "kl"
    kl = True


def categorical_one_hot(weights: Tensor, dim: int, generator: torch.Generator | None = None) -> Tensor:
    """One draw along ``dim`` of each slice of non-negative ``weights``, in proportion to them, as a one-hot of
    weights' shape and dtype; slices of zero total give all zeros. ``generator``: a torch.Generator on weights'
    device, or None for the global one."""
    d = dim + weights.dim() if dim < 0 else dim
    n = weights.shape[d]
    if n == 0:
        return torch.zeros_like(weights)
    cdf = weights.cumsum(d)
    total = cdf.narrow(d, n - 1, 1)
    u = torch.rand(total.shape, generator=generator, dtype=weights.dtype, device=weights.device)
    # the first index whose cumulative weight exceeds u * total (< total): never a zero-weight term
    index = (cdf <= u * total).sum(d, keepdim=True).clamp(max=n - 1)
    one_hot = torch.zeros_like(weights).scatter_(d, index, 1.0)
    return one_hot * (total > 0).to(weights.dtype)


class _SampledLogSumExp(torch.autograd.Function):
    """logsumexp forward; backward: the incoming gradient sent to one term, drawn in proportion to exp(term)."""

    @staticmethod
    def forward(ctx, x: Tensor, dim: int, generator: torch.Generator | None) -> Tensor:
        out = torch.logsumexp(x, dim=dim)
        ctx.dim, ctx.generator = dim, generator
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, out = ctx.saved_tensors
        d = ctx.dim + x.dim() if ctx.dim < 0 else ctx.dim
        out_d = out.unsqueeze(d)
        safe = torch.where(torch.isneginf(out_d), torch.zeros_like(out_d), out_d)
        draw = categorical_one_hot((x - safe).exp(), d, ctx.generator)
        return grad.unsqueeze(d) * draw, None, None


class SampledSemiring(LeadSemiring):
    """The sampling semiring (torch-struct's): (logsumexp, +) forward, so a structure's total is log Z (B,); in
    the backward every logsumexp sends its gradient to one of its terms, drawn in proportion to exp(term), so
    d log Z / d potentials is the 0 / 1 indicator of one structure drawn from the Gibbs distribution (exact:
    forward filtering, backward sampling). Draws use ``generator`` (``SampledSemiring.using(g)``: a subclass
    bound to the torch.Generator g) or, when None, torch's global generator. No lead dims."""

    name = "sampled"
    zero = -math.inf
    one = 0.0
    generator: ClassVar[torch.Generator | None] = None

    @classmethod
    def using(cls, generator: torch.Generator | None) -> type[SampledSemiring]:
        """This semiring drawing from ``generator`` (None: the global generator, i.e. ``SampledSemiring``)."""
        if generator is None:
            return SampledSemiring
        return type("SampledSemiring", (SampledSemiring,), {"generator": generator, "__doc__": cls.__doc__})

    @staticmethod
    def times(x: Tensor, y: Tensor) -> Tensor:
        return x + y

    @classmethod
    def plus(cls, x: Tensor, y: Tensor) -> Tensor:
        x, y = torch.broadcast_tensors(x, y)
        return cls.sum(torch.stack([x, y], -1), -1)

    @classmethod
    def sum(cls, x: Tensor, dim: int = -1) -> Tensor:
        return _SampledLogSumExp.apply(x, dim, cls.generator)
