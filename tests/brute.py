"""float64 brute-force references that materialise every (i, k, j) term: for small test sizes only."""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor


def cells(a: Tensor, b: Tensor) -> Tensor:
    """(..., n, k, m) terms a_ik (x) b_kj for the additive semirings, in float64, batch broadcast."""
    return a.double().unsqueeze(-1) + b.double().unsqueeze(-3)


def bmm(a: Tensor, b: Tensor, semiring: str) -> Tensor:
    if semiring == "std":
        return (a.double().unsqueeze(-1) * b.double().unsqueeze(-3)).sum(-2)
    c = cells(a, b)
    if c.shape[-2] == 0:
        return c.new_full(c.shape[:-2] + c.shape[-1:], -math.inf if semiring in ("log", "max") else math.inf)
    if semiring == "log":
        return torch.logsumexp(c, dim=-2)
    return c.amax(dim=-2) if semiring == "max" else c.amin(dim=-2)


def arg(a: Tensor, b: Tensor, semiring: str, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """torch.max / torch.min over k of the terms computed in `dtype` (the kernel's accumulation
    dtype), so ties and rounding match exactly: (values, first index)."""
    c = a.to(dtype).unsqueeze(-1) + b.to(dtype).unsqueeze(-3)
    return c.max(dim=-2) if semiring == "max" else c.min(dim=-2)


def chain_path_scores(init, edges, final, length):
    """{path: score} for one chain (tensors of one batch entry), every path of `length` tags."""
    C = init.shape[-1]
    scores = {}
    for path in itertools.product(range(C), repeat=length):
        s = init[path[0]]
        for t in range(1, length):
            s = s + edges[t - 1, path[t - 1], path[t]]
        if final is not None:
            s = s + final[path[-1]]
        scores[path] = s
    return scores
