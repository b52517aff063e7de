"""torch-struct's distribution classes under its names, on semiring_ops' structures.

A torch-struct script changes one import line (``from semiring_ops.distributions import TreeCRF``): the same
constructors (``log_potentials, lengths=None`` and each class's options) and log-potential layouts, and the
same members: ``partition``, ``marginals``, ``argmax`` / ``mode``, ``max``, ``entropy``, ``count``,
``log_prob(value)``, ``cross_entropy(other)``, ``kl(other)``, ``sample(sample_shape)``, ``kmax(k)`` (scores
(k, B)), ``topk(k)`` (parts (k, B, *event_shape)), ``enumerate_support()``; and ``HMM(transition, emission,
init, observations, lengths=None)``, torch-struct's HMM as a linear chain.

    dist = DependencyCRF(arc_scores, lengths)     # arc_scores (B, N, N): [head, modifier], the root on the diagonal
    loss = -dist.log_prob(gold_arcs).sum()        # gold_arcs: 0 / 1 in the same layout
    best = dist.argmax                            # 0 / 1 arcs of the best tree
    trees = dist.sample((16,))                    # (16, B, N, N): exact draws from the distribution

``entropy`` is a property, as in torch-struct, whose tensor may also be called, as torch.distributions does
(``dist.entropy`` and ``dist.entropy()`` give the same (B,) tensor).
"""

from __future__ import annotations

import math
from functools import cached_property
from typing import ClassVar

import torch
from torch import Tensor
from torch.distributions import Distribution

from .structures.alignment import Alignment
from .structures.base import ENUMERATION_LIMIT, Structure
from .structures.cky import CKYTree
from .structures.dependency import DependencyTree
from .structures.linear_chain import LinearChain
from .structures.nonprojective import NonProjectiveDependencyTree
from .structures.semimarkov import SemiMarkov

__all__ = [
    "ENUMERATION_LIMIT",
    "HMM",
    "AlignmentCRF",
    "DependencyCRF",
    "LinearChainCRF",
    "NonProjectiveDependencyCRF",
    "SemiMarkovCRF",
    "StructDistribution",
    "TreeCRF",
    "hmm_potentials",
]


class _CallableTensor(Tensor):
    """A tensor that returns itself (as a plain tensor) when called: a member that torch-struct reads as a
    property and torch.distributions calls as a method. Operations on it give plain tensors."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __call__(self) -> Tensor:
        return self.as_subclass(Tensor)


class StructDistribution(Distribution):
    """The Gibbs distribution p(z) ∝ exp(sum of z's parts' log-potentials) over a structure's objects.

    ``log_potentials``: (B, *event_shape) in the structure's layout; ``lengths``: (B,) integers or None."""

    arg_constraints: ClassVar[dict] = {}  # (torch.distributions' validation: the layouts are checked by the structures)
    has_enumerate_support = True

    def __init__(self, log_potentials: Tensor, lengths: Tensor | None = None) -> None:
        self.log_potentials, self.lengths = log_potentials, lengths
        super().__init__(log_potentials.shape[:1], log_potentials.shape[1:], validate_args=False)

    def _structure(self) -> Structure:
        raise NotImplementedError

    @cached_property
    def partition(self) -> Tensor:
        """log Z (B,)."""
        return self._structure().partition(self.log_potentials, self.lengths)

    @cached_property
    def marginals(self) -> Tensor:
        """Each part's probability (B, *event_shape)."""
        return self._structure().marginals(self.log_potentials, self.lengths)

    @cached_property
    def argmax(self) -> Tensor:
        """The best structure's parts, 0 / 1 (B, *event_shape)."""
        return self._structure().argmax(self.log_potentials, self.lengths)

    @property
    def mode(self) -> Tensor:
        return self.argmax

    @cached_property
    def max(self) -> Tensor:
        """The best structure's score (B,)."""
        return self._structure().max(self.log_potentials, self.lengths)

    @cached_property
    def entropy(self) -> Tensor:
        """H(p) (B,); ``dist.entropy()`` gives it too (module docstring)."""
        return self._structure().entropy(self.log_potentials, self.lengths).as_subclass(_CallableTensor)

    @cached_property
    def count(self) -> Tensor:
        """The number of structures whose parts are all allowed (log-potential > -inf) (B,)."""
        return self._structure().count(self.log_potentials, self.lengths)

    def log_prob(self, value: Tensor) -> Tensor:
        """log p(value) (*sample_shape, B) of 0 / 1 parts ``value`` (*sample_shape, B, *event_shape); -inf where
        ``value`` is not one of the structures, for the structures that check (dependency trees: ``support``)."""
        event = value.shape[value.dim() - len(self.event_shape) :]
        if tuple(event) != tuple(self.event_shape):
            raise ValueError(f"log_prob: value's event shape {tuple(event)} is not {tuple(self.event_shape)}")
        shape = torch.broadcast_shapes(value.shape, self.log_potentials.shape)  # (*sample_shape, B, *event)
        batch = shape[: len(shape) - len(self.event_shape)]
        flat = value.expand(shape).reshape(-1, *self.event_shape)
        structure = self._structure()
        pots = self.log_potentials.expand(shape).reshape(-1, *self.event_shape)
        out = structure.score(pots, flat).reshape(batch) - self.partition
        lengths = None if self.lengths is None else torch.as_tensor(self.lengths, device=flat.device)
        if lengths is not None:
            lengths = lengths.repeat(math.prod(batch[:-1]))
        member = structure.support(flat, lengths) if flat.shape[0] else None
        return out if member is None else out.masked_fill(~member.reshape(batch), float("-inf"))

    def cross_entropy(self, other: StructDistribution) -> Tensor:
        """H(p, q) = log Z_q - E_p[score_q] (B,), q = ``other``, the same structure and lengths."""
        return self._structure().cross_entropy(self.log_potentials, other.log_potentials, self.lengths)

    def kl(self, other: StructDistribution) -> Tensor:
        """KL(p || q) = H(p, q) - H(p) (B,)."""
        return self.cross_entropy(other) - self.entropy

    def sample(
        self, sample_shape: torch.Size | tuple[int, ...] = (), generator: torch.Generator | None = None
    ) -> Tensor:
        """Exact draws from the distribution, 0 / 1 parts (*sample_shape, B, *event_shape); an item without any
        structure gives all zeros. ``generator``: a torch.Generator on the potentials' device (None: torch's
        global generator). Not differentiable."""
        shape = torch.Size(sample_shape)
        drawn = self._draw(shape.numel(), generator)
        return drawn.reshape(*shape, *self.batch_shape, *self.event_shape)

    def _draw(self, n: int, generator: torch.Generator | None) -> Tensor:
        """(n, B, *event_shape) samples."""
        return self._structure().sample(self.log_potentials, n, self.lengths, generator)

    def kmax(self, k: int) -> Tensor:
        """The scores of the k best structures (k, B), best first; -inf past an item's number of structures."""
        return self._kbest(k)[0]

    def topk(self, k: int) -> Tensor:
        """The parts of the k best structures, 0 / 1 (k, B, *event_shape), in kmax's order; all zeros past an
        item's number of structures."""
        return self._kbest(k)[1]

    def _kbest(self, k: int) -> tuple[Tensor, Tensor]:
        """(scores (k, B), parts (k, B, *event_shape))."""
        return self._structure()._kbest(self.log_potentials, k, self.lengths)

    def enumerate_support(self, expand: bool = True) -> Tensor:
        """Every structure of every item, 0 / 1 parts (K, B, *event_shape), K the largest count in the batch,
        each item's best first (kmax's order); the rows past an item's own count are all zeros (``count``
        tells them). ``expand=False``: (K, 1, *event_shape), for a batch whose items have one support (the same
        lengths and the same forbidden parts). ValueError above ENUMERATION_LIMIT structures."""
        if not expand:
            same = self.lengths is None or bool((torch.as_tensor(self.lengths) == self.lengths[0]).all())
            forbidden = torch.isneginf(self.log_potentials)
            if not (same and bool((forbidden == forbidden[:1]).all())):
                raise ValueError(
                    f"{type(self).__name__}.enumerate_support(expand=False): the batch's items have different "
                    "supports (lengths or forbidden parts); use expand=True"
                )
        K = round(float(self.count.max())) if self.batch_shape.numel() else 0
        if K > ENUMERATION_LIMIT:
            raise ValueError(
                f"{type(self).__name__}.enumerate_support: an item has {K} structures, more than "
                f"ENUMERATION_LIMIT = {ENUMERATION_LIMIT}"
            )
        parts = self._kbest(K)[1] if K else self.log_potentials.new_zeros((0, *self.log_potentials.shape))
        return parts if expand else parts[:, :1]


class LinearChainCRF(StructDistribution):
    """Label sequences: log_potentials (B, N - 1, C, C), phi(n, z_{n+1}, z_n) (structures/linear_chain.py)."""

    def _structure(self) -> Structure:
        return LinearChain()


class SemiMarkovCRF(StructDistribution):
    """Segmentations: log_potentials (B, N - 1, K, C, C) (structures/semimarkov.py)."""

    def _structure(self) -> Structure:
        return SemiMarkov()


class DependencyCRF(StructDistribution):
    """Projective dependency trees: log_potentials (B, N, N) [head, modifier], the root on the diagonal
    (structures/dependency.py); ``multiroot`` (default True, as torch-struct)."""

    def __init__(self, log_potentials: Tensor, lengths: Tensor | None = None, args: dict | None = None,
                 multiroot: bool = True) -> None:  # fmt: skip
        self.multiroot = multiroot
        super().__init__(log_potentials, lengths)

    def _structure(self) -> Structure:
        return DependencyTree(self.multiroot)


class NonProjectiveDependencyCRF(DependencyCRF):
    """Dependency trees with crossing arcs (structures/nonprojective.py); ``multiroot`` default False, as
    torch-struct."""

    def __init__(self, log_potentials: Tensor, lengths: Tensor | None = None, args: dict | None = None,
                 multiroot: bool = False) -> None:  # fmt: skip
        super().__init__(log_potentials, lengths, args, multiroot)

    def _structure(self) -> Structure:
        return NonProjectiveDependencyTree(self.multiroot)


class TreeCRF(StructDistribution):
    """Binary span trees: log_potentials (B, N, N, NT) (structures/cky.py)."""

    def _structure(self) -> Structure:
        return CKYTree()


class AlignmentCRF(StructDistribution):
    """Monotone alignments: log_potentials (B, N, M, 3) (structures/alignment.py); ``local``, ``max_gap``."""

    def __init__(self, log_potentials: Tensor, local: bool = False, lengths: Tensor | None = None,
                 max_gap: int | None = None) -> None:  # fmt: skip
        self.local, self.max_gap = local, max_gap
        super().__init__(log_potentials, lengths)

    def _structure(self) -> Structure:
        return Alignment(self.local, self.max_gap)


def hmm_potentials(transition: Tensor, emission: Tensor, init: Tensor, observations: Tensor) -> Tensor:
    """torch-struct's ``LinearChain.hmm``: HMM log-probabilities as linear-chain log-potentials (B, N - 1, C, C).

    ``transition`` (C, C): [c, c'] log p(z_{n+1} = c | z_n = c'); ``emission`` (V, C): log p(x | z);
    ``init`` (C,): log p(z_0); ``observations`` (B, N) integers in [0, V), N >= 2. edge[b, n, c, c'] =
    transition[c, c'] + emission[x_{n+1}, c], plus init[c'] + emission[x_0, c'] at n = 0."""
    C = emission.shape[-1]
    if (
        emission.dim() != 2
        or transition.shape != (C, C)
        or init.shape != (C,)
        or observations.dim() != 2
        or observations.shape[1] < 2
    ):
        raise ValueError(
            f"HMM: transition (C, C), emission (V, C), init (C,), observations (B, N >= 2), got "
            f"{tuple(transition.shape)}, {tuple(emission.shape)}, {tuple(init.shape)}, {tuple(observations.shape)}"
        )
    emitted = emission[observations]  # (B, N, C)
    edge = transition.to(emission.dtype) + emitted[:, 1:, :, None]  # (B, N - 1, C, C)
    first = (init.to(emission.dtype) + emitted[:, 0])[:, None, None, :]  # (B, 1, 1, C): over c' at n = 0
    return torch.cat([edge[:, :1] + first, edge[:, 1:]], 1)


class HMM(LinearChainCRF):
    """torch-struct's HMM distribution: hidden-Markov smoothing with C hidden states, a linear-chain CRF on
    :func:`hmm_potentials` (``transition`` (C, C), ``emission`` (V, C), ``init`` (C,) log-probabilities,
    ``observations`` (B, N) integers, ``lengths`` (B,) or None)."""

    def __init__(
        self, transition: Tensor, emission: Tensor, init: Tensor, observations: Tensor, lengths: Tensor | None = None
    ) -> None:
        super().__init__(hmm_potentials(transition, emission, init, observations), lengths)
