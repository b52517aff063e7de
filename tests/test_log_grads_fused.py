"""The fused CUDA log gradient (csrc/cuda/log_grads_kernels.cu): both gradients of logbmm from one exponential per
cell, grad_b's sums over row tiles added with atomics. Checked against float64 by definition on fresh random shapes
that straddle its 64-row / 128-column tiles and 8-column chunks, with -inf and NaN where they matter, strided and
broadcast operands, and against the two-contraction path that torch.use_deterministic_algorithms selects."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from semiring_ops.build import backends

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")]


@pytest.fixture(autouse=True)
def fused(monkeypatch):
    """The fused kernel at every size (unset, small products take the two contractions, which fill the GPU better)."""
    monkeypatch.setenv("SEMIRING_OPS_LOG_GRADS", "fused")


def _kernels():
    be = backends.backend_for(torch.device("cuda"))
    if be.kind == "reference":
        pytest.skip(f"no compiled CUDA kernels: {be.detail}")
    return be.family("bmm")


def _float64_grads(a, b, g):
    """w = g exp(a + b - c) summed over j (grad_a) and over i (grad_b), 0 where c is -inf; and c."""
    cells = a.double().unsqueeze(-1) + b.double().unsqueeze(-3)  # (B, n, k, m)
    c = torch.logsumexp(cells, dim=-2, keepdim=True)
    w = g.double().unsqueeze(-2) * torch.where(c == -torch.inf, 0.0, torch.exp(cells - c))
    return w.sum(-1), w.sum(-3), c.squeeze(-2)


@given(
    B=st.integers(1, 3),
    n=st.integers(1, 140),
    k=st.integers(1, 140),
    m=st.integers(1, 40),
    scale=st.sampled_from([1.0, 10.0]),
)
def test_fused_gradients_match_float64(B, n, k, m, scale):
    kernels = _kernels()
    gen = torch.Generator().manual_seed(B * 7919 + n * 131 + k * 17 + m)
    a = (scale * torch.randn(B, n, k, generator=gen)).cuda()
    b = (scale * torch.randn(B, k, m, generator=gen)).cuda()
    g = torch.randn(B, n, m, generator=gen).cuda()
    want_a, want_b, c = _float64_grads(a, b, g)
    ga, gb = kernels.log_bmm_grads(a, b, c.float(), g, True, True)
    tol = 2e-5 * max(1.0, g.abs().max().item())
    torch.testing.assert_close(ga.double(), want_a, rtol=1e-4, atol=tol)
    torch.testing.assert_close(gb.double(), want_b, rtol=1e-4, atol=tol * n)


def test_fused_gradients_with_inf_nan_strides_and_broadcast():
    kernels = _kernels()
    gen = torch.Generator().manual_seed(0)
    B, n, k, m = 2, 130, 257, 19
    a = torch.randn(B, k, n, generator=gen).transpose(1, 2)  # strided rows
    a[0, 5] = -torch.inf  # row 5 of c all -inf: no gradient through it
    a[1, 7, 3] = torch.inf  # c[1, 7] = +inf: grad_a[1, 7, 3] and grad_b[1, 3] NaN (inf - inf), the rest of row 7 0
    b = torch.randn(1, k, m, generator=gen).expand(B, k, m)  # batch stride 0
    g = torch.randn(1, 1, 1, generator=gen).expand(B, n, m)  # the backward of a sum: all strides 0
    g = g.clone()
    g[1, 100, 3] = torch.nan  # reaches grad_a[1, 100, :] and grad_b[1, :, 3]
    a, b, g = a.cuda(), b.cuda(), g.cuda()
    want_a, want_b, c = _float64_grads(a, b, g)
    ga, gb = kernels.log_bmm_grads(a, b, c.float(), g, True, True)
    torch.testing.assert_close(ga.double(), want_a, rtol=1e-4, atol=1e-5, equal_nan=True)
    torch.testing.assert_close(gb.double(), want_b, rtol=1e-4, atol=1e-4, equal_nan=True)
    assert ga[0, 5].eq(0).all() and ga[1, 100].isnan().all() and gb[1, 3].isnan().all()
    assert ga[1, 7, 3].isnan() and ga[1, 7, :3].eq(0).all() and ga[1, 7, 4:].eq(0).all()


def _problem(seed: int, B: int, n: int, k: int, m: int):
    """a, b, c = logbmm(a, b) and g on the GPU, float32."""
    gen = torch.Generator().manual_seed(seed)
    a, b = torch.randn(B, n, k, generator=gen).cuda(), torch.randn(B, k, m, generator=gen).cuda()
    g = torch.randn(B, n, m, generator=gen).cuda()
    return a, b, torch.logsumexp(a.unsqueeze(-1) + b.unsqueeze(-3), dim=-2), g


def _check_repeatable_and_close(first, second, fused) -> None:
    """Two runs of the contractions agree bitwise (no atomics); the fused gradients agree with them to rounding."""
    for x, y, z in zip(first, second, fused, strict=True):
        assert torch.equal(x, y)
        torch.testing.assert_close(z, x, rtol=1e-5, atol=1e-5)


def test_the_contractions_when_asked(monkeypatch):
    """SEMIRING_OPS_LOG_GRADS=contractions: the two-contraction path; any other value is refused by name."""
    kernels = _kernels()
    args = (*_problem(2, 1, 70, 130, 9), True, True)
    fused = kernels.log_bmm_grads(*args)
    monkeypatch.setenv("SEMIRING_OPS_LOG_GRADS", "contractions")
    _check_repeatable_and_close(kernels.log_bmm_grads(*args), kernels.log_bmm_grads(*args), fused)
    monkeypatch.setenv("SEMIRING_OPS_LOG_GRADS", "sometimes")
    with pytest.raises(RuntimeError, match="SEMIRING_OPS_LOG_GRADS must be fused or contractions"):
        kernels.log_bmm_grads(*args)


def test_deterministic_mode_takes_the_two_contractions():
    """Under torch.use_deterministic_algorithms the contractions run, whatever SEMIRING_OPS_LOG_GRADS says."""
    kernels = _kernels()
    args = (*_problem(1, 2, 200, 300, 50), True, True)
    fused = kernels.log_bmm_grads(*args)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        first, second = kernels.log_bmm_grads(*args), kernels.log_bmm_grads(*args)
    finally:
        torch.use_deterministic_algorithms(previous)
    _check_repeatable_and_close(first, second, fused)
