"""A model of the H200's 3xTF32 GEMM (docs/perf_notes.md, "3xTF32 on Hopper"), run on the CPU: the TF32 parts and
their products exact, each MMA's 8 products summed exactly, the float32 accumulator updated with round-toward-zero.
It first reproduces the errors measured on the GPU (random-sign products of depth 2,352 and 20,000: median relative
error 2.4e-5 and 2.0e-4 measured), then predicts the squared distance |x|^2 + |y|^2 - 2 x.y of near neighbours of
unit-norm embeddings (cosine 0.9 and 0.98 at D = 768), which random points do not show: one GEMM (the route
today), the depth in chunks summed in IEEE float32 (cuBLAS's epilogue, or a kernel of our own promoting every 32),
the SGEMM (IEEE, round to nearest: what the torch form's addmm computes) and the plain kernel (the formula
(x - y)^2 summed in order in float32).

    python benchmarks/tf32_accumulation_model.py        # ~1 min on 2 cores
"""

from __future__ import annotations

import torch

from semiring_ops.lazy.gemm_route import _split_tf32

D = 768
PAIRS = 300


def tf32_split(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) of x in float32 as float64: the route's own split (hi rounded to TF32's 10 bits, lo the rest)."""
    hi, lo = _split_tf32(x.float())
    return hi.double(), lo.double()


def round_toward_zero(x: torch.Tensor) -> torch.Tensor:
    """float64 x rounded to float32 toward zero, as float64."""
    f = x.float()
    over = f.double().abs() > x.abs()
    f[over] = torch.nextafter(f[over], torch.zeros_like(f[over]))
    return f.double()


def mma_sum(products: torch.Tensor, group: int = 8) -> torch.Tensor:
    """Row sums of (pairs, depth) exact products the model's way: groups of 8 exact, the accumulator truncated."""
    acc = torch.zeros(products.shape[0], dtype=torch.float64)
    for k in range(0, products.shape[1], group):
        acc = round_toward_zero(acc + products[:, k : k + group].sum(1))
    return acc


def ieee_sum(terms: torch.Tensor) -> torch.Tensor:
    """Row sums in float32, in order, each addition rounded to nearest."""
    acc = torch.zeros(terms.shape[0], dtype=torch.float32)
    for k in range(terms.shape[1]):
        acc = acc + terms[:, k].float()
    return acc.double()


def three_tf32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The products of the 3xTF32 GEMM of rows a and b in its depth order: hi hi, hi lo, lo hi."""
    ah, al = tf32_split(a)
    bh, bl = tf32_split(b)
    return torch.cat([ah * bh, ah * bl, al * bh], dim=1)


def in_chunks(a: torch.Tensor, b: torch.Tensor, width: int) -> torch.Tensor:
    """The 3xTF32 dot product with the depth in chunks of ``width`` components, the chunks added in IEEE float32."""
    out = torch.zeros(a.shape[0], dtype=torch.float32)
    for c in range(0, a.shape[1], width):
        out = out + mma_sum(three_tf32(a[:, c : c + width], b[:, c : c + width])).float()
    return out.double()


def median_relative(got: torch.Tensor, exact: torch.Tensor) -> float:
    return ((got - exact).abs() / exact.abs()).median().item()


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    for depth, measured in ((2352, 2.4e-5), (20000, 2.0e-4)):
        a = torch.randn(400, depth, generator=gen, dtype=torch.float64).float().double()
        b = torch.randn(400, depth, generator=gen, dtype=torch.float64).float().double()
        model = median_relative(mma_sum(three_tf32(a, b)), (a * b).sum(1))
        print(f"random-sign products of depth {depth}: model {model:.1e}, measured on the H200 {measured:.1e}")
    for cosine in (0.9, 0.98):
        x = torch.randn(PAIRS, D, generator=gen, dtype=torch.float64)
        x /= x.norm(dim=1, keepdim=True)
        noise = torch.randn(PAIRS, D, generator=gen, dtype=torch.float64)
        noise -= (noise * x).sum(1, keepdim=True) * x
        noise /= noise.norm(dim=1, keepdim=True)
        y = cosine * x + (1 - cosine**2) ** 0.5 * noise  # unit norm, at that cosine to x
        x, y = x.float().double(), y.float().double()
        exact = ((x - y) ** 2).sum(1)
        norms = (ieee_sum(x * x) + ieee_sum(y * y)).float().double()
        forms = {
            "one 3xTF32 GEMM (the route)": mma_sum(three_tf32(x, y)),
            "chunks of 256": in_chunks(x, y, 256),
            "chunks of 32": in_chunks(x, y, 32),
            "SGEMM": ieee_sum(x * y),
        }
        errors = [f"{name} {median_relative(norms - 2 * g, exact):.1e}" for name, g in forms.items()]
        errors.append(f"plain kernel {median_relative(ieee_sum((x - y) ** 2), exact):.1e}")
        head = f"D = {D}, cosine {cosine} (distance {exact.mean().item():.2f}), median relative error: "
        print(head + ", ".join(errors))


if __name__ == "__main__":
    main()
