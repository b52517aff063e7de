"""Lazy reductions over several devices of one process (``devices=``, lazy/multi_device.py): every reduction
kind equals the one-device answer, values, indices and gradients, over i and over j, with more devices than
rows, batch dimensions and bad input. CPU devices run the same code as GPUs (one thread per device);
two-GPU runs are marked cuda and skipped with fewer than two."""

from __future__ import annotations

import pytest
import torch

from semiring_ops.lazy import LazyTensor, Vi, Vj

CPU3 = ["cpu", "cpu", "cpu"]
TWO_GPUS = pytest.param(
    ["cuda:0", "cuda:1"],
    marks=[pytest.mark.cuda, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")],
)


def _data(m=37, n=29, d=3, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, d, generator=g, dtype=torch.float64).to(device).requires_grad_()
    y = torch.randn(n, d, generator=g, dtype=torch.float64).to(device).requires_grad_()
    b = torch.randn(n, 2, generator=g, dtype=torch.float64).to(device).requires_grad_()
    return x, y, b


REDUCTIONS = {
    "sum": lambda K, dim, **kw: K.exp().sum(dim, **kw),
    "logsumexp": lambda K, dim, **kw: (-K).logsumexp(dim, **kw),
    "min": lambda K, dim, **kw: K.min(dim, **kw),
    "argmin": lambda K, dim, **kw: K.argmin(dim, **kw),
    "Kmin_argKmin": lambda K, dim, **kw: K.Kmin_argKmin(4, dim, **kw),
    "argKmax": lambda K, dim, **kw: K.argKmax(3, dim, **kw),
    "weighted logsumexp": lambda K, dim, **kw: (-K).logsumexp(dim, weight=K.exp() + 1, **kw),
}


@pytest.mark.parametrize("devices", [CPU3, TWO_GPUS])
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("kind", list(REDUCTIONS))
def test_every_reduction_equals_one_device(kind, dim, devices):
    home = "cuda:0" if devices[0].startswith("cuda") else "cpu"
    x, y, _ = _data(device=home)
    K = ((Vi(x) - Vj(y)) ** 2).sum(-1)
    want = REDUCTIONS[kind](K, dim)
    got = REDUCTIONS[kind](K, dim, devices=devices)
    for w, o in zip(
        want if isinstance(want, tuple) else (want,), got if isinstance(got, tuple) else (got,), strict=True
    ):
        assert o.device == w.device and o.dtype == w.dtype and o.shape == w.shape
        torch.testing.assert_close(o, w, rtol=1e-12, atol=1e-12)
    first = want[0] if isinstance(want, tuple) else want
    if first.is_floating_point():  # gradients through the devices' copies
        gw = torch.autograd.grad(first.sum(), (x, y))
        out = got[0] if isinstance(got, tuple) else got
        go = torch.autograd.grad(out.sum(), (x, y))
        for a, c in zip(gw, go, strict=True):
            torch.testing.assert_close(c, a, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("devices", [CPU3, TWO_GPUS])
def test_kernel_product_and_more_devices_than_rows(devices):
    home = "cuda:0" if devices[0].startswith("cuda") else "cpu"
    x, y, b = _data(m=2, n=40, device=home)  # 2 rows on 3 CPU devices: one device idle
    K = (-((Vi(x) - Vj(y)) ** 2).sum(-1)).exp()
    torch.testing.assert_close(K.__matmul__(b, devices=devices), K @ b, rtol=1e-12, atol=1e-12)
    with torch.no_grad():  # the caller's grad mode reaches the workers
        assert not K.sum(1, devices=devices).requires_grad


def test_batch_dimensions_and_parameters():
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(2, 1, 23, 3, generator=g), torch.randn(1, 4, 19, 3, generator=g)  # broadcast batches
    s = torch.randn(1, generator=g)
    K = (-((LazyTensor(x[..., :, None, :]) - LazyTensor(y[..., None, :, :])) ** 2).sum(-1) * s.exp()).exp()
    for dim in (-3, -2):  # over i, over j
        torch.testing.assert_close(K.sum(dim, devices=CPU3), K.sum(dim), rtol=1e-6, atol=1e-6)


def test_bad_input_is_named():
    x, y, _ = _data()
    K = ((Vi(x) - Vj(y)) ** 2).sum(-1)
    with pytest.raises(ValueError, match=r"sum: devices: .cpux. is not a device"):
        K.sum(1, devices=["cpux"])
    with pytest.raises(ValueError, match=r"give group= .* or devices="):
        K.sum(1, devices=CPU3, group=object())
    with pytest.raises(NotImplementedError, match="devices= with ranges="):
        K.sum(1, devices=CPU3, ranges=(torch.tensor([[0, 37]]), torch.tensor([1]), torch.tensor([[0, 29]])) * 2)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"argmin: .*no CUDA GPU"):
            K.argmin(1, devices=["cuda:0"])
