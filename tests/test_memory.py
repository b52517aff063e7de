"""logbmm forward+backward at B=8, n=k=m=512 (fp32) must stay far below the 4 GiB that materialising
the (B, n, k, m) terms would take."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import HAS_CUDA

import semiring_ops as so

CPU_SCRIPT = textwrap.dedent(
    """
    import resource, torch, semiring_ops as so
    def run(n):
        a = torch.randn(8, n, n, requires_grad=True)
        b = torch.randn(8, n, n, requires_grad=True)
        so.logbmm(a, b).backward(torch.randn(8, n, n))
    run(16)  # load kernels, allocator warm-up
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    run(512)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print("PEAK_KIB", after - before)
    """
)


def test_cpu_peak_memory_of_logbmm_forward_backward():
    res = subprocess.run([sys.executable, "-c", CPU_SCRIPT], capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr
    peak_mib = int(res.stdout.split("PEAK_KIB")[1]) / 1024
    print(f"CPU peak growth {peak_mib:.0f} MiB")
    assert peak_mib < 256, f"{peak_mib:.0f} MiB"


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")
def test_cuda_peak_memory_of_logbmm_forward_backward():
    a = torch.randn(8, 512, 512, device="cuda", requires_grad=True)
    b = torch.randn(8, 512, 512, device="cuda", requires_grad=True)
    g = torch.randn(8, 512, 512, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    so.logbmm(a, b).backward(g)
    torch.cuda.synchronize()
    peak_mib = (torch.cuda.max_memory_allocated() - base) / 2**20
    print(f"CUDA peak {peak_mib:.0f} MiB")
    assert peak_mib < 128, f"{peak_mib:.0f} MiB"
