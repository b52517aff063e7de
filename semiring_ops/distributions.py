"""torch-struct's distribution classes under its names, on semiring_ops' structures (issue 18, in progress).

A torch-struct script changes one import line (``from semiring_ops.distributions import TreeCRF``): the same
constructors (``log_potentials, lengths=None`` and each class's options) and log-potential layouts, and the
members built so far: ``partition``, ``marginals``, ``argmax`` / ``mode``, ``max``, ``entropy``, ``count``,
``log_prob(value)``, ``cross_entropy(other)``, ``kl(other)``. Not yet: ``sample``, ``topk`` / ``kmax``,
``enumerate_support`` (they raise NotImplementedError saying so).

    dist = DependencyCRF(arc_scores, lengths)     # arc_scores (B, N, N): [head, modifier], the root on the diagonal
    loss = -dist.log_prob(gold_arcs).sum()        # gold_arcs: 0 / 1 in the same layout
    best = dist.argmax                            # 0 / 1 arcs of the best tree
"""

from __future__ import annotations

from functools import cached_property
from typing import ClassVar

import torch
from torch import Tensor
from torch.distributions import Distribution

from .semirings import StdSemiring
from .structures.alignment import Alignment
from .structures.base import Structure
from .structures.cky import CKYTree
from .structures.dependency import DependencyTree
from .structures.linear_chain import LinearChain
from .structures.nonprojective import NonProjectiveDependencyTree
from .structures.semimarkov import SemiMarkov

__all__ = [
    "AlignmentCRF",
    "DependencyCRF",
    "LinearChainCRF",
    "NonProjectiveDependencyCRF",
    "SemiMarkovCRF",
    "StructDistribution",
    "TreeCRF",
]


class StructDistribution(Distribution):
    """The Gibbs distribution p(z) ∝ exp(sum of z's parts' log-potentials) over a structure's objects.

    ``log_potentials``: (B, *event_shape) in the structure's layout; ``lengths``: (B,) integers or None."""

    arg_constraints: ClassVar[dict] = {}  # (torch.distributions' validation: the layouts are checked by the structures)
    has_enumerate_support = False

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

    def entropy(self) -> Tensor:
        """H(p) (B,)."""
        return self._structure().entropy(self.log_potentials, self.lengths)

    @cached_property
    def count(self) -> Tensor:
        """The number of structures whose parts are all allowed (log-potential > -inf) (B,)."""
        ones = torch.where(torch.isneginf(self.log_potentials), 0.0, 1.0).to(self.log_potentials.dtype)
        try:
            return self._structure().logpartition(ones, self.lengths, StdSemiring)
        except NotImplementedError:  # (the matrix-tree theorem sums in log space only)
            return self._structure().partition(ones.log(), self.lengths).exp()

    def log_prob(self, value: Tensor) -> Tensor:
        """log p(value) (*sample_shape, B) of 0 / 1 parts ``value`` (*sample_shape, B, *event_shape)."""
        event = value.shape[value.dim() - len(self.event_shape) :]
        if tuple(event) != tuple(self.event_shape):
            raise ValueError(f"log_prob: value's event shape {tuple(event)} is not {tuple(self.event_shape)}")
        on = value != 0
        terms = torch.where(on, self.log_potentials * value, torch.zeros((), dtype=self.log_potentials.dtype))
        return terms.flatten(value.dim() - len(self.event_shape)).sum(-1) - self.partition

    def cross_entropy(self, other: StructDistribution) -> Tensor:
        """H(p, q) = log Z_q - E_p[score_q] (B,), q = ``other``, the same structure and lengths."""
        finite = torch.isfinite(other.log_potentials)
        expected = torch.where(finite, self.marginals * other.log_potentials, 0.0).flatten(1).sum(-1)
        return other.partition - expected

    def kl(self, other: StructDistribution) -> Tensor:
        """KL(p || q) = H(p, q) - H(p) (B,)."""
        return self.cross_entropy(other) - self.entropy()

    def sample(self, sample_shape: torch.Size = torch.Size()) -> Tensor:  # noqa: B008
        raise NotImplementedError(f"{type(self).__name__}.sample: not built yet (issue 18)")

    def topk(self, k: int) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__}.topk: not built yet (issue 18)")

    kmax = topk

    def enumerate_support(self, expand: bool = True) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__}.enumerate_support: not built yet (issue 18)")


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
