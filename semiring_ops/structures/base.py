"""The structures layer: a structure states its dynamic program once, generic over a semiring, and gets the
rest from here (torch-struct's design, on this project's semiring kernels).

A structure subclasses :class:`Structure` and implements ``logpartition(potentials, lengths, semiring)``:
the semiring sum over every structure of each batch item of the semiring product of its parts' potentials,
shape (B,). Everything else follows from that one function:

- ``partition``: it under LogSemiring (log Z); ``max``: under MaxSemiring (the best score);
- ``marginals``: d log Z / d potentials (each part's probability), by autograd;
- ``argmax``: d max / d potentials, a 0 / 1 tensor of the best structure's parts (MaxSemiring's backward sends
  the gradient to the one selected term: ties to the lowest index);
- ``entropy``: log Z - sum(marginals x potentials), parts of potential -inf (probability 0) left out;
- ``score`` / ``log_prob`` of given parts (0 / 1 tensors in the potentials' layout).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..semirings import LogSemiring, MaxSemiring, Semiring

__all__ = ["Structure", "check_lengths"]


def check_lengths(lengths: Tensor | None, B: int, N: int, device: torch.device, what: str) -> Tensor:
    """``lengths`` as (B,) int64 on ``device``, each in [1, N] (None: every item N long), or ValueError
    naming the structure (``what``)."""
    if lengths is None:
        return torch.full((B,), N, dtype=torch.int64, device=device)
    lengths = torch.as_tensor(lengths, device=device)
    if lengths.shape != (B,) or lengths.dtype.is_floating_point:
        raise ValueError(f"{what}: lengths must be (B,) = ({B},) integers, got {tuple(lengths.shape)}")
    if B and (int(lengths.min()) < 1 or int(lengths.max()) > N):
        raise ValueError(f"{what}: lengths must be in [1, N = {N}], got {lengths.tolist()}")
    return lengths.long()


class Structure:
    """Base of the structures (module docstring). Subclasses set ``name`` and implement ``logpartition``."""

    name = "structure"

    def logpartition(self, potentials: Tensor, lengths: Tensor | None, semiring: type[Semiring]) -> Tensor:
        """(B,): the semiring sum over the structures of each batch item of their potentials' semiring product."""
        raise NotImplementedError

    def partition(self, potentials: Tensor, lengths: Tensor | None = None) -> Tensor:
        """log Z (B,): the log-sum-exp over structures of their summed potentials."""
        return self.logpartition(potentials, lengths, LogSemiring)

    def max(self, potentials: Tensor, lengths: Tensor | None = None) -> Tensor:
        """The best structure's score (B,)."""
        return self.logpartition(potentials, lengths, MaxSemiring)

    def _grad(self, potentials: Tensor, lengths: Tensor | None, semiring: type[Semiring]) -> Tensor:
        """d sum_b logpartition_b / d potentials, differentiable again when grad mode is on and the potentials
        require it (a loss on marginals trains through them)."""
        create = torch.is_grad_enabled() and potentials.requires_grad
        leaf = potentials if create else potentials.detach().requires_grad_()
        with torch.enable_grad():
            total = self.logpartition(leaf, lengths, semiring)
            if not total.requires_grad:  # no part at all (a structure of one position): nothing depends on them
                return torch.zeros_like(potentials)
            (grad,) = torch.autograd.grad(total.sum(), leaf, create_graph=create, allow_unused=True)
        return torch.zeros_like(potentials) if grad is None else grad

    def marginals(self, potentials: Tensor, lengths: Tensor | None = None) -> Tensor:
        """Each part's probability under the Gibbs distribution, in the potentials' layout."""
        return self._grad(potentials, lengths, LogSemiring)

    def argmax(self, potentials: Tensor, lengths: Tensor | None = None) -> Tensor:
        """The best structure's parts: 0 / 1 in the potentials' layout (ties: the lowest index)."""
        with torch.no_grad():
            return self._grad(potentials, lengths, MaxSemiring)

    def score(self, potentials: Tensor, parts: Tensor) -> Tensor:
        """(B,): the summed potentials of the parts marked 1 in ``parts`` (potentials' layout)."""
        on = parts != 0
        return torch.where(on, potentials * parts, torch.zeros_like(potentials)).flatten(1).sum(-1)

    def log_prob(self, potentials: Tensor, parts: Tensor, lengths: Tensor | None = None) -> Tensor:
        """(B,): log p(parts) = score - log Z."""
        return self.score(potentials, parts) - self.partition(potentials, lengths)

    def entropy(self, potentials: Tensor, lengths: Tensor | None = None) -> Tensor:
        """(B,): the Gibbs distribution's entropy, log Z - E[score]; parts of potential -inf carry probability 0
        and contribute nothing."""
        log_z = self.partition(potentials, lengths)
        marg = self.marginals(potentials, lengths)
        finite = torch.isfinite(potentials)
        expected = torch.where(finite, marg * potentials, torch.zeros_like(potentials)).flatten(1).sum(-1)
        return log_z - expected
