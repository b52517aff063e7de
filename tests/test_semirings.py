"""The Python semiring classes and the C++ registry agree."""

from __future__ import annotations

import math

import pytest
import torch

import semiring_ops as so
from semiring_ops.build.backends import backend_for
from semiring_ops.semirings import SEMIRINGS, resolve_semiring


def test_identities():
    assert so.LogSemiring.zero == -math.inf and so.LogSemiring.one == 0.0
    assert so.MaxSemiring.zero == -math.inf and so.MinSemiring.zero == math.inf
    assert so.StdSemiring.zero == 0.0 and so.StdSemiring.one == 1.0


def test_resolve_by_name_and_class():
    for name, S in SEMIRINGS.items():
        assert resolve_semiring(name) is S
        assert resolve_semiring(S) is S


def test_kernel_ids_match_the_compiled_registry():
    be = backend_for(torch.device("cpu"))
    if be.kind == "reference":
        pytest.skip("compiled CPU kernels unavailable")
    ids = be.family("bmm").semiring_ids()
    py = {S.__name__: S.kernel_id for S in SEMIRINGS.values()}
    assert ids == py


def test_empty_reductions_give_zero():
    x = torch.empty(3, 0)
    assert torch.all(so.MaxSemiring.sum(x, dim=-1) == -math.inf)
    assert torch.all(so.MinSemiring.sum(x, dim=-1) == math.inf)
    assert torch.all(so.LogSemiring.sum(x, dim=-1) == -math.inf)
    assert torch.all(so.StdSemiring.sum(x, dim=-1) == 0)


def test_log_sum_of_an_all_minus_inf_row_has_zero_gradient():
    from semiring_ops.semirings import LogSemiring

    x = torch.tensor([[0.5, -1.0, 2.0], [-math.inf] * 3], dtype=torch.float64, requires_grad=True)
    out = LogSemiring.sum(x, -1)
    torch.testing.assert_close(out[0], torch.logsumexp(x[0].detach(), 0))
    assert out[1] == -math.inf
    (g,) = torch.autograd.grad(out[0] + 0 * out[1].clamp(min=-1e300), x, create_graph=True)
    assert not g.isnan().any() and g[1].eq(0).all()
    torch.testing.assert_close(g[0], torch.softmax(x[0].detach(), 0))
    finite = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda t: LogSemiring.sum(t, 0), (finite,))


def test_max_and_min_sums_send_the_gradient_to_one_term():
    from semiring_ops.semirings import MaxSemiring, MinSemiring

    x = torch.tensor([[1.0, 3.0, 3.0], [-math.inf] * 3, [2.0, 0.0, 0.0]], requires_grad=True)
    (g,) = torch.autograd.grad(MaxSemiring.sum(x, -1)[:2].sum() + MinSemiring.sum(x, -1)[2], x)
    assert g.tolist() == [[0, 1, 0], [0, 0, 0], [0, 1, 0]]  # the first of tied extrema; none for an all -inf row
    y = torch.tensor([[math.inf, math.inf]], requires_grad=True)
    (g,) = torch.autograd.grad(MinSemiring.sum(y, -1).clamp(max=1e30).sum(), y)
    assert g.tolist() == [[0, 0]]
