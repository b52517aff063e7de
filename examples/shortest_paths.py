"""Demo: semiring matrix products on a shipped road network (examples/data/towns.csv).

* min-plus:  all-pairs shortest distances by repeated squaring of the distance matrix, with the
  route recovered from the argmin of each product; checked against Floyd-Warshall.
* log:       the "soft" distance -T log sum_walks exp(-length / T) over all walks of 1..H hops, a
  smooth relaxation of the shortest path (it tends to it as T -> 0) that gradients flow through;
  its gradient with respect to the road lengths is each road's expected use.

Runs on CPU, or on the GPU when one is present. Usage: python examples/shortest_paths.py
"""

from __future__ import annotations

import itertools
import math
import time
from pathlib import Path

import torch

import semiring_ops as so
from semiring_ops.info import kernel_summary

DATA = Path(__file__).parent / "data" / "towns.csv"


def load_graph(device: torch.device) -> torch.Tensor:
    """(n, n) edge lengths in km, +inf where no road, 0 on the diagonal."""
    rows = [line.split(",") for line in DATA.read_text().splitlines() if line and line[0].isdigit()]
    n = 1 + max(max(int(s), int(t)) for s, t, _ in rows)
    w = torch.full((n, n), math.inf, dtype=torch.float64)
    for s, t, km in rows:
        w[int(s), int(t)] = w[int(t), int(s)] = float(km)
    w.fill_diagonal_(0.0)
    return w.to(device)


def all_pairs_shortest(w: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Min-plus squaring: D_{2h} = D_h (min,+) D_h; keeps each step's argmin for route recovery."""
    d, hops, via = w, 1, []
    while hops < w.shape[0]:
        d, arg = so.minbmm(d, d, return_argmax=True)
        via.append(arg)
        hops *= 2
    return d, via


def floyd_warshall(w: torch.Tensor) -> torch.Tensor:
    d = w.clone()
    for k in range(d.shape[0]):
        d = torch.minimum(d, d[:, k : k + 1] + d[k : k + 1, :])
    return d


def route(via: list[torch.Tensor], i: int, j: int) -> list[int]:
    """Expands the argmins of the squarings back into a list of towns."""

    def expand(level: int, s: int, t: int) -> list[int]:
        if level < 0:
            return [s, t] if s != t else [s]
        k = int(via[level][s, t])
        left, right = expand(level - 1, s, k), expand(level - 1, k, t)
        return left + right[1:]

    return expand(len(via) - 1, i, j)


def main() -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    w = load_graph(device)
    n = w.shape[0]
    print(f"road network: {n} towns, {int(torch.isfinite(w).sum().item() - n) // 2} roads, on {device}")

    so.minbmm(w, w)  # the first call may compile the kernels (once; cached afterwards)
    t0 = time.perf_counter()
    dist, via = all_pairs_shortest(w)
    t_minplus = time.perf_counter() - t0
    exact = floyd_warshall(w)
    assert torch.equal(torch.isinf(dist), torch.isinf(exact))
    err = (dist - exact)[torch.isfinite(exact)].abs().max().item()
    print(
        f"min-plus all-pairs shortest paths: {len(via)} squarings, {t_minplus * 1e3:.1f} ms, "
        f"max difference to Floyd-Warshall {err:.2e} km"
    )
    far = torch.where(torch.isfinite(dist), dist, -1).argmax()
    i, j = divmod(int(far), n)
    path = route(via, i, j)
    length = sum(w[a, b].item() for a, b in itertools.pairwise(path))
    print(f"longest shortest route: town {i} -> town {j}, {dist[i, j].item():.1f} km via {path}")
    assert abs(length - dist[i, j].item()) < 1e-6

    temperature, hops = 2.0, 24
    lengths = torch.where(torch.isinf(w), 1e4, w).requires_grad_()  # no road: a 10,000 km detour
    no_stay = torch.zeros_like(w).fill_diagonal_(1e4)
    scores = -(lengths + no_stay) / temperature  # log-weights of single hops, no self-loops
    walk, total = scores, scores
    for _ in range(hops - 1):
        walk = so.logbmm(walk, scores)  # log-sum over walks of one more hop
        total = torch.logaddexp(total, walk)
    soft = -temperature * total[i, j]
    soft.backward()
    use = lengths.grad.triu(1) + lengths.grad.tril(-1).T
    top = torch.topk(use.flatten(), 5)
    print(
        f"soft distance (T={temperature}, walks of {hops} hops) {i} -> {j}: {soft.item():.1f} km "
        f"(hard: {dist[i, j].item():.1f} km; the gap is the log-count of near-shortest walks)"
    )
    print("most used roads:", ", ".join(f"{int(k) // n}-{int(k) % n} ({v:.2f})" for v, k in zip(*top, strict=False)))
    print(f"kernels: {kernel_summary()}")


if __name__ == "__main__":
    main()
