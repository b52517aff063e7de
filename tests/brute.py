"""float64 brute-force references that materialise every (i, k, j) term: for small test sizes only."""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor


def layout_view(x: Tensor, how: str) -> Tensor:
    """The same values as x, laid out as a non-contiguous view: "transposed" (the last two dims swapped in
    memory), "strided" (every other element of a NaN-filled buffer), "offset" (data one element past a
    16-byte boundary); "contiguous" returns x."""
    if how == "transposed":
        return x.transpose(-1, -2).contiguous().transpose(-1, -2)
    if how == "strided":
        big = torch.full((*x.shape[:-1], 2 * x.shape[-1]), math.nan, dtype=x.dtype, device=x.device)
        big[..., ::2] = x
        return big[..., ::2]
    if how == "offset":
        flat = torch.full((x.numel() + 1,), math.nan, dtype=x.dtype, device=x.device)
        view = flat[1:].view(x.shape)
        view.copy_(x)
        return view
    assert how == "contiguous", how
    return x


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
