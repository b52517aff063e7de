"""SemiringLinear: values, shapes, gradients, module conventions."""

from __future__ import annotations

import pytest
import torch

import semiring_ops as so


@pytest.mark.parametrize("semiring", ["log", "max", "min", "std"])
def test_semiring_linear_matches_its_definition(device, semiring):
    layer = so.SemiringLinear(6, 4, semiring=semiring, dtype=torch.float64, device=device)
    with torch.no_grad():
        layer.bias.normal_()
    x = torch.randn(2, 3, 6, dtype=torch.float64, device=device)
    S = layer.semiring
    ref = S.times(S.sum(S.times(x.unsqueeze(-1), layer.weight), dim=-2), layer.bias)
    y = layer(x)
    assert y.shape == (2, 3, 4)
    torch.testing.assert_close(y, ref)


def test_semiring_linear_trains(device):
    torch.manual_seed(0)
    layer = so.SemiringLinear(5, 3, device=device, dtype=torch.float64)
    x = torch.randn(16, 5, dtype=torch.float64, device=device)
    assert torch.autograd.gradcheck(lambda w: so.logbmm(x, w), (layer.weight.detach().clone().requires_grad_(),))
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    target = torch.randn(16, 3, dtype=torch.float64, device=device)
    losses = []
    for _ in range(20):
        opt.zero_grad()
        loss = (layer(x) - target).pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_semiring_linear_without_bias_and_repr():
    layer = so.SemiringLinear(3, 2, semiring="max", bias=False)
    assert layer.bias is None
    assert "semiring=max" in repr(layer)
    assert dict(layer.named_parameters()).keys() == {"weight"}
