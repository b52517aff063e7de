"""The structures layer: a structure states its dynamic program once, generic over a semiring, and gets the
rest from here (torch-struct's design, on this project's semiring kernels).

A structure subclasses :class:`Structure` and implements ``logpartition(potentials, lengths, semiring)``:
the semiring sum over every structure of each batch item of the semiring product of its parts' potentials,
shape (B,). Everything else follows from that one function:

- ``partition``: it under LogSemiring (log Z); ``max``: under MaxSemiring (the best score);
- ``marginals``: d log Z / d potentials (each part's probability), by autograd;
- ``argmax``: d max / d potentials, a 0 / 1 tensor of the best structure's parts (MaxSemiring's backward sends
  the gradient to the one selected term: ties to the lowest index);
- ``entropy``: log Z - sum(marginals x potentials), parts of potential -inf (probability 0) left out, or by
  the entropy semiring (``method="semiring"``); ``cross_entropy`` / ``kl`` of two potentials likewise;
- ``kmax`` / ``topk``: the k best structures' scores under KMaxSemiring(k), and their parts, d (i-th best
  score) / d potentials;
- ``sample``: exact draws from the Gibbs distribution, d log Z / d potentials under SampledSemiring (every
  log-sum-exp's backward draws one of its terms), the samples folded into the batch;
- ``score`` / ``log_prob`` of given parts (0 / 1 tensors in the potentials' layout).

A semiring whose values have leading dims (``lead`` > 0) takes ``S.convert(potentials)``: ``value`` below does
that for every semiring, and ``S.unconvert`` of the structure's total is what it reports.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from ..semirings import LogSemiring, MaxSemiring, Semiring, StdSemiring
from ..structure_semirings import (
    CrossEntropySemiring,
    EntropySemiring,
    KLDivergenceSemiring,
    KMaxSemiring,
    SampledSemiring,
)

__all__ = ["ENUMERATION_LIMIT", "SAMPLE_BLOCK_ELEMENTS", "Structure", "check_lengths"]

ENUMERATION_LIMIT = 10_000
"""``enumerate_support`` (and the non-projective tree's ``topk`` / ``kmax``, which rank every tree) refuse items
with more structures than this."""

SAMPLE_BLOCK_ELEMENTS = 1 << 20
"""``Structure.sample`` folds at most this many potentials' elements (samples x potentials) into one batch."""

Method = Literal["marginals", "semiring"]


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
        if not create:
            direct = self._fused_gradient(potentials, lengths, semiring)
            if direct is not None:
                return direct
        leaf = potentials if create else potentials.detach().requires_grad_()
        with torch.enable_grad():
            total = self.logpartition(leaf, lengths, semiring)
            if not total.requires_grad:  # no part at all (a structure of one position): nothing depends on them
                return torch.zeros_like(potentials)
            (grad,) = torch.autograd.grad(total.sum(), leaf, create_graph=create, allow_unused=True)
        return torch.zeros_like(potentials) if grad is None else grad

    def _fused_gradient(self, potentials: Tensor, lengths: Tensor | None, semiring: type[Semiring]) -> Tensor | None:
        """_grad's value by a fused kernel's forward and backward called in turn, with no autograd graph (the
        engine's bookkeeping costs more than the kernels at small sizes), for structures whose kernel reads the
        potentials as they are; None (the default): not here, autograd."""
        return None

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
        """(B,): log p(parts) = score - log Z; -inf where ``parts`` is not one of the structures (for the
        structures that check: ``support``)."""
        value = self.score(potentials, parts) - self.partition(potentials, lengths)
        member = self.support(parts, lengths)
        return value if member is None else value.masked_fill(~member, float("-inf"))

    def count(self, potentials: Tensor, lengths: Tensor | None = None) -> Tensor:
        """(B,): the number of structures whose parts are all allowed (potential > -inf), under the standard
        semiring (or as exp of log Z of 0 / -inf potentials where a structure sums in log space only)."""
        ones = torch.where(torch.isneginf(potentials), 0.0, 1.0).to(potentials.dtype)
        try:
            return self.logpartition(ones, lengths, StdSemiring)
        except NotImplementedError:  # (the matrix-tree theorem sums in log space only)
            return self.partition(ones.log(), lengths).exp()

    def support(self, parts: Tensor, lengths: Tensor | None = None) -> Tensor | None:
        """(B,) bool: whether each item's 0 / 1 ``parts`` are one of its structures; None where the structure does
        not check (log_prob then scores any parts)."""
        return None

    def value(self, potentials: Tensor, lengths: Tensor | None, semiring: type[Semiring]) -> Tensor:
        """What ``semiring`` reports of the structures: S.unconvert(logpartition(S.convert(potentials))), e.g.
        (B,) for log Z or the entropy, (k, B) for the k best scores. ``potentials``: what S.convert takes (the
        pair (p, q) for the cross-entropy and KL semirings)."""
        return semiring.unconvert(self.logpartition(semiring.convert(potentials), lengths, semiring))

    def _expected_score(self, p: Tensor, q: Tensor, lengths: Tensor | None) -> Tensor:
        """E_p[score under q] (B,): the sum of p's marginals x q's potentials; -inf where p gives probability to
        a part q forbids (-inf)."""
        marg = self.marginals(p, lengths)
        allowed = torch.isfinite(q)
        expected = torch.where(allowed, marg * q, torch.zeros_like(q)).flatten(1).sum(-1)
        lost = ((marg > 0) & ~allowed).flatten(1).any(-1)
        return torch.where(lost, torch.full_like(expected, -math.inf), expected)

    def entropy(self, potentials: Tensor, lengths: Tensor | None = None, method: Method = "marginals") -> Tensor:
        """(B,): the Gibbs distribution's entropy, log Z - E[score]; parts of potential -inf carry probability 0
        and contribute nothing. ``method="semiring"``: by EntropySemiring instead (one forward pass; 0, not
        NaN, for an item without any structure)."""
        if method == "semiring":
            return self.value(potentials, lengths, EntropySemiring)
        _check_method(method)
        return self.partition(potentials, lengths) - self._expected_score(potentials, potentials, lengths)

    def cross_entropy(
        self, p: Tensor, q: Tensor, lengths: Tensor | None = None, method: Method = "marginals"
    ) -> Tensor:
        """(B,): H(p, q) = log Z_q - E_p[score under q] of the Gibbs distributions of potentials ``p`` and ``q``
        (one layout and lengths); +inf where p gives probability to a part q forbids. ``method="semiring"``: by
        CrossEntropySemiring."""
        if method == "semiring":
            return self.value((p, q), lengths, CrossEntropySemiring)
        _check_method(method)
        expected = self._expected_score(p, q, lengths)
        return torch.where(torch.isneginf(expected), math.inf, self.partition(q, lengths) - expected)

    def kl(self, p: Tensor, q: Tensor, lengths: Tensor | None = None, method: Method = "marginals") -> Tensor:
        """(B,): KL(p || q) = H(p, q) - H(p). ``method="semiring"``: by KLDivergenceSemiring."""
        if method == "semiring":
            return self.value((p, q), lengths, KLDivergenceSemiring)
        return self.cross_entropy(p, q, lengths, method) - self.entropy(p, lengths, method)

    def kmax(self, potentials: Tensor, k: int, lengths: Tensor | None = None) -> Tensor:
        """(k, B): the scores of each item's k best structures, best first; -inf past the number of structures
        (those whose parts all have potential > -inf). Not differentiable."""
        with torch.no_grad():
            return self.value(potentials.detach(), lengths, KMaxSemiring(k))

    def topk(self, potentials: Tensor, k: int, lengths: Tensor | None = None) -> Tensor:
        """(k, B, *layout): the parts (0 / 1) of each item's k best structures, best first, in the order of
        ``kmax`` (ties: a deterministic order, the dynamic program's lower terms first); where an item has fewer
        than k structures, the rest are all zeros (their kmax score is -inf). Not differentiable."""
        return self._kbest(potentials, k, lengths)[1]

    def _kbest(self, potentials: Tensor, k: int, lengths: Tensor | None) -> tuple[Tensor, Tensor]:
        """(scores (k, B), parts (k, B, *layout)) of the k best structures.

        The parts of slot i are d (score i) / d potentials, 0 / 1 (each structure uses a part once). One
        backward pass serves as many slots as the dtype has mantissa bits (52 for float64): slot i's score is
        weighted by 2^i, so every part's gradient is an exact integer whose bit i is slot i's indicator."""
        leaf = potentials.detach().requires_grad_()
        with torch.enable_grad():
            scores = self.value(leaf, lengths, KMaxSemiring(k))
        found = torch.isfinite(scores.detach())  # (k, B): slots holding a structure
        live = int(found.any(1).sum())  # slots are sorted: those past ``live`` are empty for every item
        parts = torch.zeros((k, *potentials.shape), dtype=potentials.dtype, device=potentials.device)
        bits = round(-math.log2(torch.finfo(potentials.dtype).eps))
        for start in range(0, live if scores.requires_grad else 0, bits):
            stop = min(live, start + bits)
            weights = torch.zeros(k, dtype=scores.dtype, device=scores.device)
            weights[start:stop] = 2.0 ** torch.arange(stop - start, dtype=scores.dtype, device=scores.device)
            (grad,) = torch.autograd.grad((scores * weights[:, None]).sum(), leaf, retain_graph=True, allow_unused=True)
            if grad is not None:
                shifts = torch.arange(stop - start, device=grad.device).view(-1, *(1,) * grad.dim())
                parts[start:stop] = ((grad.round().long().unsqueeze(0) >> shifts) & 1).to(parts.dtype)
        mask = found.view(*found.shape, *(1,) * (potentials.dim() - 1))
        return scores.detach(), torch.where(mask, parts, torch.zeros_like(parts))

    def sample(
        self,
        potentials: Tensor,
        n: int,
        lengths: Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """(n, B, *layout): n independent exact draws (0 / 1 parts) from each item's Gibbs distribution
        p(z) = exp(score(z)) / Z, by SampledSemiring's backward; an item without any structure gives all zeros.
        ``generator``: a torch.Generator on the potentials' device (None: torch's global generator). The n
        samples are folded into the batch, at most SAMPLE_BLOCK_ELEMENTS potentials' elements at a time.
        Not differentiable."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"{type(self).__name__}.sample: n must be an int >= 0, got {n!r}")
        B, layout = potentials.shape[0], tuple(potentials.shape[1:])
        if lengths is not None:
            lengths = torch.as_tensor(lengths, device=potentials.device)
        per_block = max(1, SAMPLE_BLOCK_ELEMENTS // max(1, potentials.numel()))
        blocks = []
        for start in range(0, n, per_block):
            m = min(per_block, n - start)
            folded = potentials.detach().expand(m, *potentials.shape).reshape(m * B, *layout)
            draws = self._sample_block(folded, None if lengths is None else lengths.repeat(m), generator)
            blocks.append(draws.view(m, B, *layout))
        if not blocks:
            return potentials.new_zeros((0, *potentials.shape))
        return torch.cat(blocks, 0)

    def _sample_block(self, potentials: Tensor, lengths: Tensor | None, generator: torch.Generator | None) -> Tensor:
        """One draw (0 / 1 parts, the potentials' shape) per item of ``potentials`` (the samples folded into the
        batch): d log Z / d potentials under SampledSemiring."""
        leaf = potentials.detach().requires_grad_()
        with torch.enable_grad():
            total = self.logpartition(leaf, lengths, SampledSemiring.using(generator))
            grad = None
            if total.requires_grad:
                (grad,) = torch.autograd.grad(total.sum(), leaf, allow_unused=True)
        return torch.zeros_like(leaf) if grad is None else grad


def _check_method(method: str) -> None:
    if method not in ("marginals", "semiring"):
        raise ValueError(f"method must be 'marginals' or 'semiring', got {method!r}")
