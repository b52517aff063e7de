"""The two routes to the CUDA kernels (docs/build.md, "Two routes to the CUDA kernels"), side by side:

compile   the kernels a first logbmm forward + backward runs (the log forward, both log-weighted contractions,
          the fused gradient; float32), compiled by NVRTC one instantiation at a time as the NVRTC route does
          (nvrtc_kernels.nvrtc_options, csrc/nvrtc's stand-in headers), and the bmm family's kernel files by nvcc
          (device code only, -cubin) as the nvcc route does. No GPU needed (both for sm_90).
kernels   (--kernels, on a GPU) a call of each CUDA family (logbmm forward and forward + backward, maxbmm forward:
          the packed select, logbmm precision="fast", a CRF training step and decode, a dependency tree's log Z
          forward + backward, CTC forward + backward; float32) under each route ($SEMIRING_OPS_CUDA_KERNELS), in
          fresh processes alternated --rounds times, median of 40 CUDA-event timings each, the best process shown.

  python benchmarks/build_routes.py              # compile times
  python benchmarks/build_routes.py --kernels    # and the kernels' times (a GPU, a toolkit for the nvcc route)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ARCH = "sm_90"
_ENGINE = "semiring_ops::cuda::contraction_kernel"
_REPO = Path(__file__).resolve().parent.parent  # the child's "benchmarks" folder (timing.py) is found from here
FIRST_LOGBMM = (  # (kernel file, expression): what a first logbmm forward + backward launches, and the contractions
    (
        "cuda/bmm_kernels.cu",
        f"{_ENGINE}<semiring_ops::cuda::SemiringBmmPolicy<semiring_ops::LogSemiring, float, false>>",
    ),
    ("cuda/log_grads_kernels.cu", "semiring_ops::cuda::log_grads::log_bmm_grads_fused_kernel"),
    ("cuda/log_contract_kernels.cu", f"{_ENGINE}<semiring_ops::cuda::LogContractPolicy<float, true, false>>"),
    ("cuda/log_contract_kernels.cu", f"{_ENGINE}<semiring_ops::cuda::LogContractPolicy<float, false, true>>"),
)

_TIMING = """
import json, sys, torch, semiring_ops as so
from semiring_ops.structures import DependencyTree, LinearChainCRF
sys.path.insert(0, "benchmarks")
from timing import time_ms
torch.manual_seed(0)
dev = "cuda"
a = torch.randn(8, 1024, 1024, device=dev, requires_grad=True)
b = torch.randn(8, 1024, 1024, device=dev, requires_grad=True)
crf = LinearChainCRF(32, batch_first=True).to(dev)
em = torch.randn(32, 128, 32, device=dev)
tags = torch.randint(0, 32, (32, 128), device=dev)
dep = torch.randn(32, 40, 40, device=dev)
T, N, C, S = 1000, 32, 1000, 200
lp = torch.randn(T, N, C, device=dev).log_softmax(-1).requires_grad_()
tg = torch.randint(1, C, (N, S), device=dev)
il, tl = torch.full((N,), T, device=dev), torch.full((N,), S, device=dev)

def dep_step():
    p = dep.detach().requires_grad_()
    DependencyTree().partition(p).sum().backward()

cases = {  # name: (family, call)
    "logbmm fwd": lambda: so.logbmm(a.detach(), b.detach()),
    "logbmm fwd+bwd": lambda: so.logbmm(a, b).sum().backward(),
    "maxbmm fwd (packed)": lambda: so.maxbmm(a.detach(), b.detach()),
    "logbmm fast fwd": lambda: so.logbmm(a.detach(), b.detach(), precision="fast"),
    "CRF train step": lambda: (-crf(em, tags)).backward(),
    "CRF decode": lambda: crf.decode(em),
    "dependency log Z fwd+bwd": dep_step,
    "CTC fwd+bwd": lambda: so.ctc_loss(lp, tg, il, tl).backward(),
}
print(json.dumps({name: time_ms(fn, dev, 40) for name, fn in cases.items()}))
"""


def nvrtc_seconds() -> list[tuple[str, float]]:
    from semiring_ops.build import nvrtc, nvrtc_kernels

    paths = nvrtc_kernels.cuda_runtime_paths()
    if paths is None:
        sys.exit("the CUDA runtime's headers are needed (a CUDA build of torch)")
    options = nvrtc_kernels.nvrtc_options(ARCH, paths[0])
    FAILED = nvrtc_kernels.cache_dir() / "failed"
    rows = []
    for program, expression in FIRST_LOGBMM:
        t0 = time.perf_counter()
        nvrtc.nvrtc_compile_named(f'#include "{program}"\n', options, True, "build_routes", (f"&{expression}",), FAILED)
        rows.append((expression.removeprefix(f"{_ENGINE}<").split("::")[-1][:60], time.perf_counter() - t0))
    return rows


def nvcc_seconds() -> list[tuple[str, float]] | None:
    import torch

    from semiring_ops.build import jit, toolkit

    tk = toolkit.find_cuda_toolkit(jit.cache_root())
    if tk is None:
        return None
    torch_include = Path(torch.__file__).parent / "include"
    rows = []
    for name in ("bmm_kernels.cu", "log_contract_kernels.cu", "log_grads_kernels.cu"):
        cmd = [
            str(tk.home / "bin" / "nvcc"), "-cubin", f"-arch={ARCH}", "-O3", "-lineinfo", "-std=c++17",
            "--expt-relaxed-constexpr", f"-I{jit.source_root()}", "-isystem", str(torch_include),
            str(jit.source_root() / "cuda" / name), "-o", os.devnull,
        ]  # fmt: skip
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        rows.append((name, time.perf_counter() - t0))
    return rows


def kernel_times(rounds: int) -> None:
    """Each family's kernels under both routes, a fresh process per (round, route), the routes alternating."""
    times: dict[str, dict[str, list[float]]] = {}
    for _ in range(rounds):
        for route in ("nvcc", "nvrtc"):
            env = {**os.environ, "SEMIRING_OPS_CUDA_KERNELS": route}
            out = subprocess.run(
                [sys.executable, "-c", _TIMING], env=env, capture_output=True, text=True, check=True, cwd=_REPO
            )
            for name, ms in json.loads(out.stdout.splitlines()[-1]).items():
                times.setdefault(name, {}).setdefault(route, []).append(ms)
    print(f"kernels (ms, the best of {rounds} processes' medians of 40; float32):")
    print(f"    {'call':28s} {'nvcc':>9s} {'nvrtc':>9s} {'nvrtc/nvcc':>11s}")
    for name, by_route in times.items():
        nvcc, nvrtc = min(by_route["nvcc"]), min(by_route["nvrtc"])
        print(f"    {name:28s} {nvcc:9.3f} {nvrtc:9.3f} {nvrtc / nvcc:11.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", action="store_true", help="time both routes' kernels (a GPU)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from semiring_ops.build import nvrtc

    print(f"{os.cpu_count()} CPU cores; NVRTC {'.'.join(map(str, nvrtc.nvrtc_version()))}; target {ARCH}")
    print("NVRTC, one instantiation at a time (the route's first launches):")
    rows = nvrtc_seconds()
    for name, s in rows:
        print(f"    {name:60s} {s:6.2f} s")
    first = rows[0][1] + rows[1][1]
    print(f"    {'a first logbmm fwd + bwd (the first two, one after the other)':60s} {first:6.2f} s")
    nvcc = nvcc_seconds()
    if nvcc is None:
        print("nvcc: no CUDA toolkit found")
    else:
        print("nvcc, device code only (-cubin), the bmm family's kernel files (every instantiation):")
        for name, s in nvcc:
            print(f"    {name:60s} {s:6.2f} s")
    if args.kernels:
        kernel_times(args.rounds)


if __name__ == "__main__":
    main()
