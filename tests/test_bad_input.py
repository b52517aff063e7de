"""Bad input raises a clear exception naming the argument and its shape, dtype or device."""

from __future__ import annotations

import pytest
import torch
from conftest import HAS_CUDA

import semiring_ops as so


@pytest.mark.parametrize("semiring", ["log", "max", "min", "std"])
def test_inner_dimension_mismatch_names_both_shapes(semiring):
    with pytest.raises(ValueError, match=r"\(2, 3, 4\).*\(2, 5, 6\)"):
        so.semiring_matmul(torch.randn(2, 3, 4), torch.randn(2, 5, 6), semiring)


def test_batch_not_broadcastable_names_both_shapes():
    with pytest.raises(ValueError, match=r"batch.*\(2, 3, 4\).*\(3, 4, 5\)"):
        so.logbmm(torch.randn(2, 3, 4), torch.randn(3, 4, 5))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.uint8, torch.complex64])
def test_non_floating_dtype_is_a_type_error(dtype):
    bad = torch.zeros(2, 3, dtype=dtype)
    with pytest.raises(TypeError, match=str(dtype)):
        so.maxbmm(bad, torch.randn(3, 2))
    with pytest.raises(TypeError, match=r"b has dtype"):
        so.logbmm(torch.randn(2, 3), bad.reshape(3, 2))


def test_mixed_dtypes_name_both():
    with pytest.raises(TypeError, match=r"torch.float32.*torch.float64"):
        so.logbmm(torch.randn(2, 3), torch.randn(3, 2, dtype=torch.float64))


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.cuda
def test_mixed_devices_name_both():
    with pytest.raises(ValueError, match=r"cpu.*cuda"):
        so.logbmm(torch.randn(2, 3), torch.randn(3, 2, device="cuda"))


def test_mixed_devices_meta_and_cpu():
    with pytest.raises(ValueError, match=r"cpu.*meta"):
        so.logbmm(torch.randn(2, 3), torch.randn(3, 2, device="meta"))


def test_not_a_tensor():
    with pytest.raises(TypeError, match=r"a must be a torch\.Tensor"):
        so.logbmm([[1.0]], torch.randn(1, 1))


def test_one_dimensional_input_is_refused_with_advice():
    with pytest.raises(ValueError, match="at least 2-D"):
        so.logbmm(torch.randn(3), torch.randn(3, 2))


def test_unknown_semiring_and_argmax_of_log():
    with pytest.raises(ValueError, match="'plus'"):
        so.semiring_matmul(torch.randn(2, 2), torch.randn(2, 2), "plus")
    with pytest.raises(TypeError, match="Semiring subclass"):
        so.semiring_matmul(torch.randn(2, 2), torch.randn(2, 2), 3)
    with pytest.raises(ValueError, match="return_argmax"):
        so.semiring_matmul(torch.randn(2, 2), torch.randn(2, 2), "log", return_argmax=True)


def test_kernel_entry_points_check_their_arguments():
    """The compiled entry points guard themselves too (a wrong call raises, never crashes)."""
    from semiring_ops.build.backends import backend_for

    be = backend_for(torch.device("cpu"))
    if be.kind == "reference":
        pytest.skip("compiled CPU kernels unavailable")
    with pytest.raises(RuntimeError, match="disagree"):
        be.bmm_forward(torch.randn(2, 3, 4), torch.randn(2, 5, 6), 0, False)
    with pytest.raises(RuntimeError, match="semiring"):
        be.bmm_forward(torch.randn(2, 3, 4), torch.randn(2, 4, 6), 99, False)
    with pytest.raises(RuntimeError, match="log_contract"):
        be.log_contract(torch.randn(2, 3, 4), None, torch.randn(2, 5, 6), None, torch.randn(2, 3, 6))


def test_semiring_linear_checks_its_input():
    layer = so.SemiringLinear(4, 3)
    with pytest.raises(ValueError, match=r"in_features=4"):
        layer(torch.randn(2, 5))
