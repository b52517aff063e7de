"""k-means for initialising Gaussian HMM means (what hmmlearn does with scikit-learn's KMeans).

k-means++ seeding (each new centre drawn with probability proportional to the squared distance to the
nearest centre so far), then Lloyd iterations until the centres move less than ``tol`` times the data's
mean variance; the best of ``n_init`` runs (lowest within-cluster sum of squares) wins. A cluster that
empties takes the point farthest from its centre.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["kmeans"]


def _seed(x: Tensor, k: int, generator: torch.Generator | None) -> Tensor:
    """k-means++ seeding: (k, D) centres chosen among the rows of x (N, D)."""
    N = len(x)
    first = int(torch.randint(N, (1,), generator=generator))
    centres = [x[first]]
    d2 = (x - x[first]).square().sum(-1)
    for _ in range(1, k):
        total = d2.sum()
        if total > 0:
            i = int(torch.multinomial((d2 / total).cpu(), 1, generator=generator))
        else:  # every point sits on a centre already: any point will do
            i = int(torch.randint(N, (1,), generator=generator))
        centres.append(x[i])
        d2 = torch.minimum(d2, (x - x[i]).square().sum(-1))
    return torch.stack(centres)


def _lloyd(x: Tensor, centres: Tensor, max_iter: int, tol: float) -> tuple[Tensor, float]:
    """Lloyd iterations from `centres` -> (centres (k, D), inertia)."""
    k = len(centres)
    for _ in range(max_iter):
        d2 = torch.cdist(x, centres).square()
        labels = d2.argmin(-1)
        counts = torch.bincount(labels, minlength=k).to(x.dtype)
        sums = x.new_zeros(centres.shape).index_add_(0, labels, x)
        new = sums / counts.clamp_min(1)[:, None]
        empty = (counts == 0).nonzero().flatten()
        if len(empty):  # relocate empty clusters to the points worst served by their centres
            far = d2.gather(1, labels[:, None])[:, 0].topk(len(empty)).indices
            new[empty] = x[far]
        shift = (new - centres).square().sum()
        centres = new
        if shift <= tol:
            break
    inertia = float(torch.cdist(x, centres).square().min(-1).values.sum())
    return centres, inertia


def kmeans(
    x: Tensor,
    k: int,
    generator: torch.Generator | None = None,
    n_init: int = 10,
    max_iter: int = 300,
    tol: float = 1e-4,
) -> Tensor:
    """Cluster the rows of x (N, D) into k clusters -> centres (k, D), in x's dtype and device.

    Raises ValueError when x has fewer than k rows. `generator` (CPU) makes the seeding reproducible.
    """
    if x.ndim != 2:
        raise ValueError(f"x has shape {tuple(x.shape)}; expected (N, D)")
    if len(x) < k:
        raise ValueError(f"x has shape {tuple(x.shape)}: k-means with k={k} clusters needs at least {k} samples")
    tol = tol * float(x.var(0, correction=0).mean()) if len(x) > 1 else 0.0
    best, best_inertia = None, float("inf")
    for _ in range(n_init):
        centres, inertia = _lloyd(x, _seed(x, k, generator), max_iter, tol)
        if inertia < best_inertia:
            best, best_inertia = centres, inertia
    return best if best is not None else centres
