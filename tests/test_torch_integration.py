"""Fitting into PyTorch: torch.compile(fullgraph=True), autocast, device indices, meta tensors."""

from __future__ import annotations

import pytest
import torch
from brute import bmm as brute_bmm
from conftest import HAS_CUDA

import semiring_ops as so


def _model(a, b, c):
    x = so.logbmm(a, b)
    v, idx = so.maxbmm(x, c, return_argmax=True)
    return so.minbmm(v, c.transpose(-1, -2)).sum() + idx.float().mean()


def test_torch_compile_fullgraph_gives_the_same_numbers_and_gradients(device):
    torch._dynamo.reset()
    a = torch.randn(2, 5, 6, device=device, requires_grad=True)
    b = torch.randn(6, 7, device=device, requires_grad=True)
    c = torch.randn(2, 7, 7, device=device, requires_grad=True)
    eager = _model(a, b, c)
    grads = torch.autograd.grad(eager, (a, b, c))
    compiled = torch.compile(_model, fullgraph=True)
    out = compiled(a, b, c)
    torch.testing.assert_close(out, eager)
    for g, ref in zip(torch.autograd.grad(out, (a, b, c)), grads, strict=False):
        torch.testing.assert_close(g, ref)


def test_meta_tensors_give_shapes_without_running():
    from semiring_ops.ops import registry

    a = torch.empty(3, 5, 6, device="meta", dtype=torch.bfloat16)
    b = torch.empty(3, 6, 4, device="meta", dtype=torch.bfloat16)
    out, arg = registry.bmm_forward(a, b, so.MaxSemiring.kernel_id, True)
    assert out.shape == (3, 5, 4) and out.dtype == torch.float32
    assert arg.shape == (3, 5, 4) and arg.dtype == torch.int64


@pytest.mark.parametrize("semiring", ["log", "max", "min"])
def test_autocast_accepts_mixed_precision_and_computes_in_float32(device, semiring):
    dtype = torch.bfloat16
    a = torch.randn(2, 8, 9, device=device)
    b = torch.randn(9, 5, device=device).to(dtype)
    with torch.autocast(device_type=device, dtype=dtype):
        out = so.semiring_matmul(a, b, semiring)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), brute_bmm(a, b.float(), semiring), rtol=1e-5, atol=1e-5)


def test_autocast_backward(device):
    a = torch.randn(2, 8, 9, device=device, requires_grad=True)
    b = torch.randn(9, 5, device=device, requires_grad=True)
    with torch.autocast(device_type=device, dtype=torch.bfloat16):
        loss = so.logbmm(a, b.to(torch.bfloat16)).sum()
    loss.backward()
    assert a.grad.dtype == torch.float32 and torch.isfinite(a.grad).all()


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")
def test_every_cuda_device_index():
    for i in range(torch.cuda.device_count()):
        dev = torch.device("cuda", i)
        a = torch.randn(2, 33, 17, device=dev)
        b = torch.randn(2, 17, 65, device=dev)
        with torch.cuda.device(0):  # the current device need not be the tensors'
            out = so.logbmm(a, b)
        assert out.device == dev
        torch.testing.assert_close(out, brute_bmm(a, b, "log").float())


def test_dispatch_modes_and_fake_tensors_see_the_registered_op():
    """No-grad eager calls skip the custom op's Python dispatch (ops.registry.bmm_forward_eager), but a
    dispatch mode (here a counter, and FakeTensorMode as export uses) must still see semiring_ops ops."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: list[str] = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    a, b = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    eager = so.maxbmm(a, b)
    with Record():
        recorded = so.maxbmm(a, b)
    assert any(name.startswith("semiring_ops.bmm_forward") for name in seen), seen
    torch.testing.assert_close(recorded, eager)
    with FakeTensorMode() as mode:
        out = so.logbmm(mode.from_tensor(a), mode.from_tensor(b))
    assert out.shape == (2, 3, 5)
