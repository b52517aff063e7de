"""k-means for initialising Gaussian HMM means (what hmmlearn does with scikit-learn's KMeans).

k-means++ seeding (each new centre drawn with probability proportional to the squared distance to the
nearest centre so far), then Lloyd iterations until the centres move less than ``tol`` times the data's
mean variance; the best of ``n_init`` runs (lowest within-cluster sum of squares) wins. A cluster that
empties takes the point farthest from its centre. The runs' Lloyd iterations go together, as one batch of
distances (RUN_CELLS at most at a time): a small data set then costs one set of torch calls per iteration, not
n_init of them.
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


def _lloyd(x: Tensor, centres: Tensor, max_iter: int, tol: float) -> tuple[Tensor, Tensor]:
    """Lloyd iterations of R runs at once from `centres` (R, k, D) -> (centres (R, k, D), inertia (R,)). A run stops
    (keeps its centres) once they move by at most `tol`; the others go on, so each run ends as it would alone."""
    R, k, D = centres.shape
    xs = x.expand(R, *x.shape)
    x2 = x.square().sum(-1)[:, None]  # (N, 1)
    offsets = torch.arange(R, device=x.device)[:, None] * k
    active = torch.ones(R, dtype=torch.bool, device=x.device)
    for _ in range(max_iter):
        d2 = _squared_distances(x, x2, centres)  # (N, R, k)
        labels = d2.argmin(-1).T  # (R, N)
        slots = (labels + offsets).reshape(-1)
        counts = torch.bincount(slots, minlength=R * k).view(R, k).to(x.dtype)
        sums = x.new_zeros(R * k, D).index_add_(0, slots, xs.reshape(-1, D)).view(R, k, D)
        new = sums / counts.clamp_min(1)[..., None]
        empty = counts == 0
        if bool(empty.any()):  # relocate empty clusters to the points worst served by their centres
            for r in empty.any(1).nonzero().flatten().tolist():
                holes = empty[r].nonzero().flatten()
                far = d2[:, r].gather(1, labels[r][:, None])[:, 0].topk(len(holes)).indices
                new[r, holes] = x[far]
        new = torch.where(active[:, None, None], new, centres)
        shift = (new - centres).square().sum((1, 2))
        centres = new
        active &= shift > tol
        if not bool(active.any()):
            break
    labels = _squared_distances(x, x2, centres).argmin(-1).T
    nearest = centres.gather(1, labels[..., None].expand(R, len(x), D))  # (R, N, D)
    inertia = (xs - nearest).square().sum((1, 2))  # exact differences: the runs are compared by this
    return centres, inertia


def _squared_distances(x: Tensor, x2: Tensor, centres: Tensor) -> Tensor:
    """|x - c|² = |x|² + |c|² - 2 x·c for x (N, D) (x2 = |x|² (N, 1)) and the centres (R, k, D) of R runs, as one
    (N, D) x (D, R k) product (torch.cdist of x expanded over the runs was ~15x slower) -> (N, R, k), contiguous
    (an argmin over k of a permuted view is ~4x slower)."""
    R, k, D = centres.shape
    flat = centres.reshape(R * k, D)
    d2 = torch.addmm(flat.square().sum(-1)[None, :], x, flat.T, alpha=-2).add_(x2)  # (N, R k)
    return d2.view(len(x), R, k)


RUN_CELLS = 1 << 24  # at most this many (run, sample, centre) distances at once: runs go in groups below it


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
    seeds = torch.stack([_seed(x, k, generator) for _ in range(n_init)])  # the generator's draws, run by run
    group = max(1, RUN_CELLS // (len(x) * k))
    results = [_lloyd(x, seeds[r : r + group], max_iter, tol) for r in range(0, n_init, group)]
    centres = torch.cat([c for c, _ in results])
    inertia = torch.cat([i for _, i in results])
    return centres[int(inertia.argmin())]  # the first of equal ones, as run by run
