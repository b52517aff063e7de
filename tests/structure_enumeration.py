"""Brute-force references for the structures' tests: every structure of a tiny item as a 0 / 1 tensor of its
parts (in the potentials' layout), and what the structures layer derives, computed from that list."""

from __future__ import annotations

import itertools

import torch


def expectations(potentials: list[torch.Tensor], structures: list[list[torch.Tensor]]) -> dict[str, torch.Tensor]:
    """For each batch item b (potentials[b], structures[b]: its parts tensors): log Z, the best score, the
    marginals, the best structure's parts, the entropy and the number of structures, stacked over b."""
    rows: dict[str, list[torch.Tensor]] = {k: [] for k in ("logz", "max", "marginals", "argmax", "entropy", "count")}
    for pot, parts_list in zip(potentials, structures, strict=True):
        if not parts_list:  # no structure at all: log Z = max = -inf, no part used; entropy NaN (undefined)
            none = torch.zeros_like(pot)
            for key, value in (("logz", -torch.inf), ("max", -torch.inf), ("entropy", torch.nan), ("count", 0.0)):
                rows[key].append(torch.tensor(value, dtype=torch.float64))
            rows["marginals"].append(none)
            rows["argmax"].append(none)
            continue
        parts = torch.stack(parts_list)
        scores = (parts * pot).flatten(1).sum(-1)
        logz = torch.logsumexp(scores, 0)
        p = (scores - logz).exp()
        rows["logz"].append(logz)
        rows["max"].append(scores.max())
        rows["marginals"].append((p[:, None] * parts.flatten(1)).sum(0).view_as(pot))
        rows["argmax"].append(parts[scores.argmax()])
        rows["entropy"].append(-(p * (scores - logz)).sum())
        rows["count"].append(torch.tensor(float(len(parts)), dtype=torch.float64))
    return {k: torch.stack(v) for k, v in rows.items()}


def segmentations(N: int, K: int, C: int, L: int) -> list[torch.Tensor]:
    """Every segmentation of a length-L item (structures/semimarkov.py) as parts (N - 1, K, C, C)."""
    if L == 1:  # one boundary and no segment: the empty product, once per label of position 0
        return [torch.zeros(N - 1, K, C, C, dtype=torch.float64) for _ in range(C)]
    out = []
    for r in range(L - 1):
        for cut in itertools.combinations(range(1, L - 1), r):
            ps = [0, *cut, L - 1]
            if any(not 1 <= q - p < K for p, q in itertools.pairwise(ps)):
                continue
            for labels in itertools.product(range(C), repeat=len(ps)):
                parts = torch.zeros(N - 1, K, C, C, dtype=torch.float64)
                for i, (p, q) in enumerate(itertools.pairwise(ps)):
                    parts[p, q - p, labels[i + 1], labels[i]] = 1
                out.append(parts)
    return out


def projective_trees(N: int, L: int, multiroot: bool) -> list[torch.Tensor]:
    """Every projective dependency tree of a length-L item (structures/dependency.py) as arcs (N, N): [h, m]
    head h of word m, [m, m] the root heading m."""
    out = []
    for heads in itertools.product(range(L + 1), repeat=L):  # heads[m]: 0 the root, h + 1 word h
        if any(heads[m] == m + 1 for m in range(L)) or (not multiroot and heads.count(0) != 1):
            continue
        if not all(_reaches_root(heads, m + 1) for m in range(L)):
            continue
        arcs = [tuple(sorted((heads[m], m + 1))) for m in range(L)]
        if any(a < c < b < d or c < a < d < b for (a, b), (c, d) in itertools.combinations(arcs, 2)):
            continue
        parts = torch.zeros(N, N, dtype=torch.float64)
        for m, h in enumerate(heads):
            parts[m if h == 0 else h - 1, m] = 1
        out.append(parts)
    return out


def _reaches_root(heads: tuple[int, ...], node: int) -> bool:
    seen = set()
    while node != 0:
        if node in seen:
            return False
        seen.add(node)
        node = heads[node - 1]
    return True


def binary_trees(N: int, NT: int, L: int) -> list[torch.Tensor]:
    """Every labelled full binary bracketing of a length-L item (structures/cky.py) as spans (N, N, NT)."""
    out = []
    for spans in _bracketings(0, L - 1):
        for labels in itertools.product(range(NT), repeat=len(spans)):
            parts = torch.zeros(N, N, NT, dtype=torch.float64)
            for (i, j), t in zip(spans, labels, strict=True):
                parts[i, j, t] = 1
            out.append(parts)
    return out


def _bracketings(i: int, j: int) -> list[list[tuple[int, int]]]:
    if i == j:
        return [[(i, i)]]
    return [[(i, j), *a, *b] for k in range(i, j) for a in _bracketings(i, k) for b in _bracketings(k + 1, j)]


def spanning_trees(N: int, L: int, multiroot: bool) -> list[torch.Tensor]:
    """Every dependency tree of a length-L item, crossing arcs allowed (structures/nonprojective.py), as arcs
    (N, N) in the layout of projective_trees."""
    out = []
    for heads in itertools.product(range(L + 1), repeat=L):
        if any(heads[m] == m + 1 for m in range(L)) or (not multiroot and heads.count(0) != 1):
            continue
        if all(_reaches_root(heads, m + 1) for m in range(L)):
            parts = torch.zeros(N, N, dtype=torch.float64)
            for m, h in enumerate(heads):
                parts[m if h == 0 else h - 1, m] = 1
            out.append(parts)
    return out


def alignments(N: int, M: int, L: int, local: bool, max_gap: int | None) -> list[torch.Tensor]:
    """Every alignment path (structures/alignment.py) of an item of first length L as parts (N, M, 3): global
    from (0, 0) to (L - 1, M - 1), local from any cell to any cell (rows < L); cells in the band only."""
    moves = {(0, 1): 0, (1, 1): 1, (1, 0): 2}

    def ok(i: int, j: int) -> bool:
        return i < L and j < M and (max_gap is None or abs(i - j) <= max_gap)

    def paths(i: int, j: int):  # paths from (i, j) (already entered), as lists of (i, j, op) after it
        yield []
        for (di, dj), op in moves.items():
            if ok(i + di, j + dj):
                for rest in paths(i + di, j + dj):
                    yield [(i + di, j + dj, op), *rest]

    starts = [(i, j) for i in range(L) for j in range(M) if ok(i, j)] if local else [(0, 0)]
    out = []
    for si, sj in starts:
        if not ok(si, sj):
            continue
        for rest in paths(si, sj):
            cells = [(si, sj, 1), *rest]
            if not local and cells[-1][:2] != (L - 1, M - 1):
                continue
            parts = torch.zeros(N, M, 3, dtype=torch.float64)
            for i, j, op in cells:
                parts[i, j, op] = 1
            out.append(parts)
    return out


def assert_derived(structure, potentials, lengths, want: dict[str, torch.Tensor], *, count: bool = True) -> None:
    """log Z, max, marginals, entropy, the count (standard semiring, unless ``count=False``) and the best
    structure's score against the enumeration's ``want``; entropy and the best score on items that have a
    structure. The argmax is 0 / 1."""
    from semiring_ops.semirings import StdSemiring

    torch.testing.assert_close(structure.partition(potentials, lengths), want["logz"])
    torch.testing.assert_close(structure.max(potentials, lengths), want["max"])
    torch.testing.assert_close(structure.marginals(potentials, lengths), want["marginals"])
    if count:
        ones = torch.ones_like(potentials)
        torch.testing.assert_close(structure.logpartition(ones, lengths, StdSemiring), want["count"])
    some = want["count"] > 0
    torch.testing.assert_close(structure.entropy(potentials, lengths)[some], want["entropy"][some])
    best = structure.argmax(potentials, lengths)
    assert set(best.unique().tolist()) <= {0.0, 1.0}
    torch.testing.assert_close(structure.score(potentials, best)[some], want["max"][some])


def assert_twice_differentiable(structures, potentials: torch.Tensor, lengths: torch.Tensor) -> None:
    """gradcheck and gradgradcheck of each structure's log Z (float64 potentials requiring grad)."""
    for s in structures:
        assert torch.autograd.gradcheck(lambda p, s=s: s.partition(p, lengths), (potentials,))
        assert torch.autograd.gradgradcheck(lambda p, s=s: s.partition(p, lengths), (potentials,))


def label_sequences(N: int, C: int, L: int) -> list[torch.Tensor]:
    """Every label sequence of a length-L item (structures/linear_chain.py) as parts (N - 1, C, C)."""
    out = []
    for labels in itertools.product(range(C), repeat=L):
        parts = torch.zeros(N - 1, C, C, dtype=torch.float64)
        for n in range(L - 1):
            parts[n, labels[n + 1], labels[n]] = 1
        out.append(parts)
    return out


def ctc_alignments(T: int, K: int, frames: int, labels: list[int]) -> list[torch.Tensor]:
    """Every CTC alignment (structures/ctc.py) of an item with target ``labels`` over its first ``frames`` of T
    frames, as parts (T, K): the state of each frame (states 2 s + 1 the labels, the even ones blanks)."""
    L = len(labels)
    ext = [None] * (2 * L + 1)
    ext[1::2] = labels
    out = []
    for path in itertools.product(range(2 * L + 1), repeat=frames):
        if path[0] > 1 or path[-1] < 2 * L - 1:
            continue
        ok = True
        for a, b in itertools.pairwise(path):
            step = b - a
            if not (step in (0, 1) or (step == 2 and b % 2 == 1 and ext[b] != ext[a])):
                ok = False
                break
        if ok:
            parts = torch.zeros(T, K, dtype=torch.float64)
            parts[torch.arange(frames), torch.tensor(path)] = 1.0
            out.append(parts)
    return out
