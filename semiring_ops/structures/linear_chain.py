"""Linear chains in torch-struct's LinearChain layout, on the chain engine (structures/chain.py).

Potentials ``edge`` (B, N - 1, C, C): edge[b, n, c, c'] scores label c at position n + 1 after label c' at
position n. A structure of an item of length L is a label sequence z_0 .. z_{L-1}; its score is the semiring
product of edge[b, n, z_{n+1}, z_n]. The semi-Markov structure with segments of length 1, computed by
``chain_sum`` (one semiring matrix product per step, or a parallel scan), whose fused kernels serve the
LinearChainCRF module.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..semirings import Semiring
from .base import Structure, check_lengths
from .chain import chain_sum

__all__ = ["LinearChain"]


class LinearChain(Structure):
    """Label sequences (module docstring), generic over the semiring."""

    name = "linear chain"

    def logpartition(self, edge: Tensor, lengths: Tensor | None, semiring: type[Semiring]) -> Tensor:
        if not isinstance(edge, Tensor) or edge.dim() != 4 or edge.shape[2] != edge.shape[3]:
            got = tuple(edge.shape) if isinstance(edge, Tensor) else type(edge).__name__
            raise ValueError(f"LinearChain: edge must be (B, N - 1, C, C), got {got}")
        B, N1, C, _ = edge.shape
        lengths = check_lengths(lengths, B, N1 + 1, edge.device, "LinearChain")
        start = torch.full((B, C), semiring.one, dtype=edge.dtype, device=edge.device)
        return chain_sum(start, edge.transpose(-1, -2), None, lengths, semiring)  # the engine's [from, to]
