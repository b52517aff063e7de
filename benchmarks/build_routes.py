"""The two routes to the CUDA kernels (docs/build.md, "Two routes to the CUDA kernels"), side by side:

compile   the kernels a first logbmm forward + backward runs (the log forward, both log-weighted contractions,
          the fused gradient; float32), compiled by NVRTC one instantiation at a time as the NVRTC route does
          (nvrtc_kernels.nvrtc_options, csrc/nvrtc's stand-in headers), and the bmm family's kernel files by nvcc
          (device code only, -cubin) as the nvcc route does. No GPU needed (both for sm_90).
kernels   (--kernels, on a GPU) a call of each CUDA family (logbmm forward and forward + backward, maxbmm forward:
          the packed select, logbmm precision="fast", a CRF training step and decode, a dependency tree's log Z
          forward + backward, CTC forward + backward; float32) under each route ($SEMIRING_OPS_CUDA_KERNELS), in
          fresh processes alternated --rounds times, median of 40 CUDA-event timings each, the best process shown.
sass      (--sass, a toolkit) the SASS of the compile rows' kernels from NVRTC's cubin and from nvcc's, compared
          instruction by instruction (csrc/cuda/shared_span.cuh says why they can differ).

  python benchmarks/build_routes.py              # compile times
  python benchmarks/build_routes.py --kernels    # and the kernels' times (a GPU, a toolkit for the nvcc route)
  python benchmarks/build_routes.py --sass       # and the two routes' SASS of those kernels, compared (a toolkit)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
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


def _name(expression: str) -> str:
    return expression.removeprefix(f"{_ENGINE}<").split("::")[-1][:60]


def nvrtc_seconds(out: Path) -> list[tuple[str, float, str]]:
    """(name, NVRTC's seconds, lowered name) of each FIRST_LOGBMM kernel, its cubin written to ``out``."""
    from semiring_ops.build import nvrtc, nvrtc_kernels

    paths = nvrtc_kernels.cuda_runtime_paths()
    if paths is None:
        sys.exit("the CUDA runtime's headers are needed (a CUDA build of torch)")
    options = nvrtc_kernels.nvrtc_options(ARCH, paths[0])
    FAILED = nvrtc_kernels.cache_dir() / "failed"
    rows = []
    for program, expression in FIRST_LOGBMM:
        t0 = time.perf_counter()
        image, (lowered,) = nvrtc.nvrtc_compile_named(
            f'#include "{program}"\n', options, True, "build_routes", (f"&{expression}",), FAILED
        )
        rows.append((_name(expression), time.perf_counter() - t0, lowered))
        (out / f"{lowered}.cubin").write_bytes(image)
    return rows


def _toolkit() -> Path | None:
    from semiring_ops.build import jit, toolkit

    tk = toolkit.find_cuda_toolkit(jit.cache_root())
    return None if tk is None else tk.home


def _nvcc_cubin(home: Path, program: str, out: Path) -> list[str]:
    """nvcc's command for a kernel file's cubin, with the flags the nvcc route gives it: the family's and those torch's
    extension builder adds (COMMON_NVCC_FLAGS, -std=c++17)."""
    import torch
    from torch.utils.cpp_extension import COMMON_NVCC_FLAGS

    from semiring_ops.build import families, jit

    flags = families.family("cuda", "bmm").spec().cuda_cflags
    torch_include = Path(torch.__file__).parent / "include"
    return [
        str(home / "bin" / "nvcc"), "-cubin", f"-arch={ARCH}", *flags, *COMMON_NVCC_FLAGS, "-std=c++17",
        f"-I{jit.source_root()}", "-isystem", str(torch_include), str(jit.source_root() / program), "-o", str(out),
    ]  # fmt: skip


def nvcc_seconds(home: Path, out: Path) -> list[tuple[str, float]]:
    """nvcc's time for each kernel file of FIRST_LOGBMM (every instantiation); its cubin written to ``out``."""
    rows = []
    for program in dict.fromkeys(program for program, _ in FIRST_LOGBMM):
        t0 = time.perf_counter()
        subprocess.run(_nvcc_cubin(home, program, out / f"{Path(program).stem}.cubin"), check=True, capture_output=True)
        rows.append((Path(program).name, time.perf_counter() - t0))
    return rows


def _cuobjdump(home: Path) -> str | None:
    """The toolkit's cuobjdump, or one on PATH, or the one Triton's wheel carries."""
    for candidate in (home / "bin" / "cuobjdump", shutil.which("cuobjdump")):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    try:
        import triton
    except ImportError:
        return None
    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(bundled) if bundled.is_file() else None


def sass_comparison(home: Path, lowered_names: list[str], nvrtc_out: Path, nvcc_out: Path) -> None:
    """The SASS of each kernel a first logbmm runs (``lowered_names``, FIRST_LOGBMM's order), from NVRTC's cubin and
    from nvcc's (the ones the timings wrote), instruction by instruction (register numbers included; addresses and
    encodings left out)."""
    tool = _cuobjdump(home)
    if tool is None:
        print("SASS: needs cuobjdump")
        return

    def sass(cubin: Path, name: str) -> list[str]:
        out = subprocess.run([tool, "-sass", "-fun", name, str(cubin)], capture_output=True, text=True).stdout
        return [" ".join(m.group(1).split()) for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", out)]

    print(f"SASS for {ARCH} (cuobjdump {tool}):")
    print(f"    {'kernel':60s} {'nvcc':>6s} {'NVRTC':>6s}  instructions")
    for (program, expression), lowered in zip(FIRST_LOGBMM, lowered_names, strict=True):
        a = sass(nvcc_out / f"{Path(program).stem}.cubin", lowered)
        b = sass(nvrtc_out / f"{lowered}.cubin", lowered)
        ops_a, ops_b = (Counter(i.split()[0] for i in x) for x in (a, b))
        moved = sum(((ops_a - ops_b) + (ops_b - ops_a)).values())
        same = "identical" if a == b else "same opcodes, other order" if not moved else f"{moved} by opcode differ"
        print(f"    {_name(expression):60s} {len(a):6d} {len(b):6d}  {same}")


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
    parser.add_argument("--sass", action="store_true", help="compare the two routes' SASS (no GPU needed)")
    args = parser.parse_args()
    from semiring_ops.build import nvrtc

    print(f"{os.cpu_count()} CPU cores; NVRTC {'.'.join(map(str, nvrtc.nvrtc_version()))}; target {ARCH}")
    print("NVRTC, one instantiation at a time (the route's first launches):")
    with tempfile.TemporaryDirectory() as tmp:
        nvrtc_out, nvcc_out = Path(tmp) / "nvrtc", Path(tmp) / "nvcc"
        nvrtc_out.mkdir(), nvcc_out.mkdir()
        rows = nvrtc_seconds(nvrtc_out)
        for name, s, _ in rows:
            print(f"    {name:60s} {s:6.2f} s")
        first = rows[0][1] + rows[1][1]
        print(f"    {'a first logbmm fwd + bwd (the first two, one after the other)':60s} {first:6.2f} s")
        home = _toolkit()
        if home is None:
            print("nvcc: no CUDA toolkit found")
        else:
            print("nvcc, device code only (-cubin), the bmm family's kernel files (every instantiation):")
            for name, s in nvcc_seconds(home, nvcc_out):
                print(f"    {name:60s} {s:6.2f} s")
            if args.sass:
                sass_comparison(home, [lowered for _, _, lowered in rows], nvrtc_out, nvcc_out)
    if args.kernels:
        kernel_times(args.rounds)


if __name__ == "__main__":
    main()
