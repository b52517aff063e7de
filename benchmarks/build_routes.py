"""The two routes to GPU kernels without a system CUDA toolkit (issue 26, docs/build.md "Why nvcc from pip, not
NVRTC"), measured on the kernels a first logbmm forward + backward runs: the tile engine's log-semiring forward
policy and its two log-weighted contraction policies (float32).

  (a) nvcc (a system toolkit or NVIDIA's pip wheels) under torch.utils.cpp_extension: the family compiles every
      instantiation ahead of its first call (the bmm family: 24 forward + 8 contraction kernels); timed here as
      nvcc's device-only compile (-cubin) of the family's two kernel files.
  (b) NVRTC (libnvrtc, which PyTorch's CUDA wheels bring): each instantiation compiled when first called; timed
      here for the three a first logbmm needs, one NVRTC program each, the kernel headers included as they are
      (they compile under NVRTC: tile_engine.cuh keeps its host launcher out of it), the standard headers they use
      mapped onto libcu++ (a shim: NVRTC has no C++ standard library).

    python benchmarks/build_routes.py            # no GPU needed: both compile for sm_90
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from semiring_ops.build import jit, toolkit
from semiring_ops.lazy import nvrtc

ARCH = "sm_90"
SHIMS = {  # the names the kernel headers take from the standard library, from libcu++
    "type_traits": "#include <cuda/std/type_traits>\nnamespace std { using namespace cuda::std; }\n",
    "limits": "#include <cuda/std/limits>\nnamespace std { using cuda::std::numeric_limits; }\n",
    "cstdint": "typedef int int32_t;\ntypedef long long int64_t;\ntypedef unsigned int uint32_t;\n"
    "typedef unsigned char uint8_t;\n",
    "algorithm": "",
}
FIRST_LOGBMM = {  # kernel instantiation -> the policy header it needs
    "SemiringBmmPolicy<LogSemiring, float, false>": "cuda/bmm_policy.cuh",
    "LogContractPolicy<float, true, false>": "cuda/log_contract_policy.cuh",  # grad_a: L1 = g
    "LogContractPolicy<float, false, true>": "cuda/log_contract_policy.cuh",  # grad_b: R1 = g
}


def _program(policy: str, header: str) -> str:
    return (
        f'#include "{header}"\nnamespace semiring_ops {{ namespace cuda {{\n'
        f"template __global__ void contraction_kernel<{policy}>(const __grid_constant__ ArgsOf<{policy}>);\n"
        "} }\n"
    )


def nvrtc_seconds(cuda_include: Path) -> list[tuple[str, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in SHIMS.items():
            Path(tmp, name).write_text(f"#pragma once\n{text}")
        options = (
            f"--gpu-architecture={ARCH}",
            "-std=c++17",
            "-default-device",
            "-lineinfo",
            f"--include-path={tmp}",
            f"--include-path={jit.source_root()}",
            f"--include-path={cuda_include}",
            f"--include-path={cuda_include / 'cccl'}",
        )
        rows = []
        for policy, header in FIRST_LOGBMM.items():
            t0 = time.perf_counter()
            nvrtc._nvrtc_compile(_program(policy, header), options, True, "build_routes")
            rows.append((policy, time.perf_counter() - t0))
        return rows


def nvcc_seconds(home: Path) -> list[tuple[str, float]]:
    import torch

    torch_include = Path(torch.__file__).parent / "include"
    rows = []
    for name in ("bmm_kernels.cu", "log_contract_kernels.cu"):
        cmd = [
            str(home / "bin" / "nvcc"), "-cubin", f"-arch={ARCH}", "-O3", "-lineinfo", "-std=c++20",
            "--expt-relaxed-constexpr", f"-I{jit.source_root()}", "-isystem", str(torch_include),
            str(jit.source_root() / "cuda" / name), "-o", os.devnull,
        ]  # fmt: skip
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        rows.append((name, time.perf_counter() - t0))
    return rows


def main() -> None:
    tk = toolkit.find_cuda_toolkit(jit.cache_root())
    if tk is None:
        sys.exit("a CUDA toolkit is needed for the nvcc row (and its libcu++ headers for the NVRTC shim)")
    major, minor = nvrtc.nvrtc_version()
    print(f"{os.cpu_count()} CPU cores; nvcc {tk.version} ({tk.source}); NVRTC {major}.{minor}; target {ARCH}")
    print("(b) NVRTC, per instantiation a first logbmm fwd + bwd needs:")
    rows_b = nvrtc_seconds(tk.home / "include")
    for policy, s in rows_b:
        print(f"    {policy:48s} {s:6.2f} s")
    print(f"    {'the first logbmm (3 programs, one after the other)':48s} {sum(s for _, s in rows_b):6.2f} s")
    print("(a) nvcc, device code only (-cubin), the bmm family's kernel files (all 32 instantiations):")
    rows_a = nvcc_seconds(tk.home)
    for name, s in rows_a:
        print(f"    {name:48s} {s:6.2f} s")


if __name__ == "__main__":
    main()
