"""The winners of a selection on the matrix-unit route evaluated again as written (semiring_ops/lazy/winners.py),
and the route's precisions (gemm_route.product_mode).

On the CPU the route's float32 BLAS matrices are the torch form's, so the winners are not evaluated again there
(gemm_route.WINNERS_AGAIN); these tests add the CPU to that set to run the same code as CUDA's 3xTF32 selections,
against float64 references: the values must be the formula's as written (better than any GEMM form on near
neighbours, where |x|^2 + |y|^2 - 2 x.y cancels), the order torch.topk's (ties by the lower index, NaN and inf as
the plain kernel orders them), every selecting reduction.
"""

from __future__ import annotations

import pytest
import torch
from conftest import CUDA, counted_calls

from semiring_ops.lazy import Vi, Vj, gemm_route, winners

DEVICES = ["cpu", CUDA]


@pytest.fixture
def again(monkeypatch, compiled):
    """The route forced on, the winners evaluated again on the CPU too; their evaluations counted."""
    monkeypatch.setenv("SEMIRING_OPS_LAZY_GEMM", "on")
    monkeypatch.setattr(gemm_route, "WINNERS_AGAIN", {("cpu", torch.float32), ("cuda", torch.float32)})
    return counted_calls(monkeypatch, winners, "evaluate_winners")


def unit_neighbours(m: int, n: int, d: int, device: str, seed: int, spread: float = 0.2):
    """(x (m, d), y (n, d)) unit-norm embeddings in clusters of 100, x near points of y: cosine ~0.96 to the 10
    nearest, where a squared distance is ~1/30 of |x|^2 + |y|^2."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(max(1, n // 100), d, generator=g)
    centres /= centres.norm(dim=1, keepdim=True)
    y = centres.repeat_interleave(100, 0)[:n] + spread * torch.randn(n, d, generator=g) / d**0.5
    y /= y.norm(dim=1, keepdim=True)
    x = y[torch.randint(0, n, (m,), generator=g)] + 0.05 * torch.randn(m, d, generator=g) / d**0.5
    x /= x.norm(dim=1, keepdim=True)
    return x.to(device), y.to(device)


def sqdist64(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((x.double()[:, None, :] - y.double()[None, :, :]) ** 2).sum(-1)


@pytest.mark.parametrize("device", DEVICES)
def test_near_neighbours_values_are_the_formulas_as_written(again, device, monkeypatch):
    """k-NN of unit-norm near neighbours: the GEMM form is off by ~1e-6 relative on the CPU (2e-4 with CUDA's 3xTF32
    at this D); evaluated again the values are float32's own rounding of the written formula."""
    x, y = unit_neighbours(300, 2000, 96, device, seed=1)
    ref, ref_idx = sqdist64(x, y).topk(8, dim=1, largest=False)
    vals, idx = ((Vi(x) - Vj(y)) ** 2).sum(-1).Kmin_argKmin(8, dim=1)
    rel = ((vals.double() - ref).abs() / ref).cpu()
    assert rel.max() <= 1e-6 and rel.median() <= 1.5e-7, (rel.median(), rel.max())
    assert (idx == ref_idx).float().mean() >= 0.99
    assert again["n"] > 0
    monkeypatch.setattr(gemm_route, "WINNERS_AGAIN", set())  # the GEMM form alone: the check above can fail
    before = ((Vi(x) - Vj(y)) ** 2).sum(-1).Kmin(8, dim=1)
    assert ((before.double() - ref).abs() / ref).median() > 2 * rel.median()


SELECTIONS = {
    "Kmin": lambda f, g: f.Kmin(4, dim=1),
    "argKmin": lambda f, g: f.argKmin(4, dim=1),
    "Kmin_argKmin": lambda f, g: f.Kmin_argKmin(4, dim=1),
    "Kmax_argKmax_dot": lambda f, g: g.Kmax_argKmax(4, dim=1),
    "min": lambda f, g: f.min(1),
    "argmin": lambda f, g: f.argmin(1),
    "min_argmin": lambda f, g: f.min_argmin(1),
    "max_argmax_dot": lambda f, g: g.max_argmax(1),
    "min_over_i": lambda f, g: f.min_argmin(0),
    "vector_Kmax": lambda f, g: f.concat(g).Kmax_argKmax(3, dim=1),
}


def _reference(name: str, x: torch.Tensor, y: torch.Tensor):
    """(values, indices or None) of SELECTIONS[name] in float64 (torch.topk's order: ties by the lower index)."""
    d, dots = sqdist64(x, y), x.double() @ y.double().t()
    k = {"Kmin": 4, "argKmin": 4, "Kmin_argKmin": 4, "Kmax_argKmax_dot": 4, "vector_Kmax": 3}.get(name, 1)
    if name == "min_over_i":
        d = d.t()
    if name == "vector_Kmax":
        both = torch.stack([d, dots], -1)
        idx = torch.sort(both, dim=1, descending=True, stable=True).indices[:, :k]
        return both.gather(1, idx), idx
    largest = name.endswith("_dot")
    f = dots if largest else d
    idx = torch.sort(f, dim=1, descending=largest, stable=True).indices[:, :k]
    return f.gather(1, idx), idx


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(SELECTIONS))
def test_every_selection_matches_float64(again, device, name):
    x, y = unit_neighbours(257, 700, 40, device, seed=hash(name) % 1000, spread=0.5)
    got = SELECTIONS[name](((Vi(x) - Vj(y)) ** 2).sum(-1), Vi(x) | Vj(y))
    ref_vals, ref_idx = _reference(name, x, y)
    if name.startswith("arg"):
        got_vals, got_idx = None, got
    elif isinstance(got, tuple):
        got_vals, got_idx = got
    else:
        got_vals, got_idx = got, None
    if got_vals is not None:
        torch.testing.assert_close(got_vals.double().reshape(ref_vals.shape), ref_vals, rtol=3e-7, atol=1e-7)
    if got_idx is not None:
        assert torch.equal(got_idx.reshape(ref_idx.shape).cpu(), ref_idx.cpu())
    assert again["n"] > 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("margin", [0, 3])
def test_ties_go_to_the_lower_index_and_empty_slots_last(again, device, margin, monkeypatch):
    """y's rows in equal pairs: every distance ties with its twin's, and the lower index comes first, as in
    torch.topk's order and the plain kernel's. With a margin the candidates outnumber the 6 terms: the lists'
    empty slots (index -1) must stay behind every term."""
    monkeypatch.setattr(winners, "MARGIN", margin)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(50, 48, generator=g).to(device)
    y = torch.randn(3, 48, generator=g).repeat_interleave(2, 0).to(device)
    vals, idx = ((Vi(x) - Vj(y)) ** 2).sum(-1).Kmin_argKmin(5, dim=1)
    d = sqdist64(x, y)
    want = torch.sort(d, dim=1, stable=True).indices[:, :5]
    assert torch.equal(idx.cpu(), want.cpu())
    torch.testing.assert_close(vals.double(), d.gather(1, want), rtol=3e-7, atol=0)
    assert again["n"] > 0


@pytest.mark.parametrize("device", DEVICES)
def test_nan_and_inf_are_ordered_as_the_plain_kernel_orders_them(again, device, monkeypatch):
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(40, 36, generator=g), torch.randn(90, 36, generator=g)
    x[3, 7] = float("nan")
    y[11, 0] = float("inf")
    y[12, 5] = float("nan")
    x, y = x.to(device), y.to(device)
    f = ((Vi(x) - Vj(y)) ** 2).sum(-1)
    routed = (f.Kmin_argKmin(4, dim=1), f.Kmax_argKmax(3, dim=1), f.min_argmin(1), f.max_argmax(1))
    assert again["n"] > 0
    monkeypatch.setenv("SEMIRING_OPS_LAZY_GEMM", "off")
    plain = (f.Kmin_argKmin(4, dim=1), f.Kmax_argKmax(3, dim=1), f.min_argmin(1), f.max_argmax(1))
    for (rv, ri), (pv, pi) in zip(routed, plain, strict=True):
        assert torch.equal(ri, pi)
        torch.testing.assert_close(rv, pv, rtol=1e-6, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("precision", ["exact", "high", "fast"])
def test_the_winners_are_evaluated_again_but_under_precision_fast(again, precision):
    x, y = unit_neighbours(100, 300, 40, "cpu", seed=6)
    ((Vi(x) - Vj(y)) ** 2).sum(-1).argKmin(3, dim=1, precision=precision)
    assert again["n"] == (0 if precision == "fast" else 1)
    (-((Vi(x) - Vj(y)) ** 2).sum(-1)).exp().sum(1, precision=precision)  # a sum: nothing to evaluate again
    assert again["n"] == (0 if precision == "fast" else 1)


def test_the_product_of_each_precision():
    wide = gemm_route.THREE_TF32_SUM_MAX_DIM + 1
    assert gemm_route.product_mode("exact", False, wide) == gemm_route.PROMOTED
    assert gemm_route.product_mode("exact", False, wide - 1) == gemm_route.THREE_TF32
    assert gemm_route.product_mode("exact", True, wide) == gemm_route.THREE_TF32
    assert gemm_route.product_mode("high", False, wide) == gemm_route.THREE_TF32
    assert gemm_route.product_mode("fast", True, wide) == gemm_route.TF32


@pytest.mark.parametrize("device", [CUDA])
def test_cuda_near_neighbours_keep_float32_digits_by_default(compiled, device):
    """Unit-norm embeddings at D = 256, 2,048 x 20,000, cosine ~0.96 to the nearest (H200: the 3xTF32 matrices alone
    are off by 7e-5 in a Gaussian sum and 1e-4 in the k-NN distances). By default the sum takes the promoted 3xTF32
    GEMM on Hopper, the SGEMM elsewhere (the torch form's ~6e-6), and the k-NN's winners are evaluated again
    (~3e-8); precision="high" keeps 3xTF32 for the sum."""
    x, y = unit_neighbours(2048, 20000, 256, device, seed=7)
    d = torch.cdist(x.double(), y.double()).square_()  # (float64's GEMM form: exact enough, and no 2048 x 20000 x D)
    ref_knn = d.topk(10, dim=1, largest=False).values
    gamma = 1.0 / ref_knn[:, -1].median().item()
    b = torch.randn(20000, 1, device=device)
    ref = (-gamma * d).exp() @ b.double()
    del d
    f = ((Vi(x) - Vj(y)) ** 2).sum(-1)

    def error(out: torch.Tensor) -> float:
        return ((out.double() - ref).abs().amax(1) / ref.abs().amax(1)).median().item()

    exact = error((-gamma * f).exp() @ b)
    high = error((-gamma * f).exp().__matmul__(b, precision="high"))
    assert exact <= 2e-5
    assert 2 * exact < high <= 5e-4  # 3xTF32's documented error on such data (docs/lazy.md, "Precision")
    knn = f.Kmin(10, dim=1)
    assert ((knn.double() - ref_knn).abs() / ref_knn).median() <= 2e-7
