"""Packaging. The C++/CUDA sources in csrc/ ship inside the package (semiring_ops/csrc) and compile on first use,
one kernel family at a time (JIT, cached). With SEMIRING_OPS_BUILD_EXT=1 every family is built ahead of time by that
same JIT path (semiring_ops.build.parallel, into the cache: a family already cached with the same flags is taken as
it is) and its library copied into the package (semiring_ops/_prebuilt/), beside a manifest (_prebuilt.json) that
says for which torch, CPU and GPUs; such a wheel installs and runs with no compiler (docs/build.md):

    SEMIRING_OPS_BUILD_EXT=1 python -m build --wheel --no-isolation    # CPU kernels, plus CUDA when a toolkit is found
    SEMIRING_OPS_BUILD_EXT=1 TORCH_CUDA_ARCH_LIST="9.0" pip install --no-build-isolation .

The CUDA families take one of two routes (docs/build.md, "Two routes", "Wheels with prebuilt kernels"): with a CUDA
toolkit (semiring_ops.build.toolkit finds a system one, or the pip extra cuda13), their kernels are built for
TORCH_CUDA_ARCH_LIST, by default sm_80, 86, 89, 90, 100 and 120 with PTX; without one (or with
SEMIRING_OPS_CUDA_KERNELS=nvrtc), their host code alone, built by the C++ compiler, whose kernels NVRTC compiles on
the user's GPU on their first launch. SEMIRING_OPS_BUILD_CUDA=0 skips them.
The CPU kernels are built for x86-64-v3 (AVX2, FMA) on x86-64, not for the build machine.
"""

import importlib
import json
import os
import platform
import shutil
import sys
import types
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = Path(__file__).parent
CSRC = ROOT / "csrc"
WHEEL_CUDA_ARCHS = "8.0;8.6;8.9;9.0;10.0;12.0+PTX"
BUILD_KERNELS = os.environ.get("SEMIRING_OPS_BUILD_EXT") == "1"


class BuildPyWithSources(build_py):
    """Copies csrc/ into the built package as semiring_ops/csrc, so wheels can JIT-compile."""

    def run(self):
        super().run()
        target = Path(self.build_lib) / "semiring_ops" / "csrc"
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(CSRC, target, ignore=shutil.ignore_patterns("*.o", "__pycache__"))


def build_modules():
    """semiring_ops.build's modules, without running semiring_ops/__init__.py (which imports the whole library): a
    stand-in parent package whose path is the source folder."""
    if "semiring_ops" not in sys.modules:
        stub = types.ModuleType("semiring_ops")
        stub.__path__ = [str(ROOT / "semiring_ops")]
        sys.modules["semiring_ops"] = stub
    names = ("families", "toolkit", "prebuilt", "jit", "parallel", "nvrtc_kernels")
    return tuple(importlib.import_module(f"semiring_ops.build.{m}") for m in names)


class BuildKernels(build_ext):
    """SEMIRING_OPS_BUILD_EXT=1: every family built as on first use, its library copied into the package, then the
    manifest prebuilt.py checks before loading any of them."""

    def run(self):
        families, toolkit, prebuilt, jit, parallel, nvrtc_kernels = build_modules()
        x86 = platform.machine() in ("x86_64", "AMD64")
        cpu_arch = families.AOT_CPU_ARCH if x86 else families.DEFAULT_CPU_ARCH
        os.environ[families.CPU_ARCH_ENV] = cpu_arch  # the portable target, whatever this machine's default
        os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
        cuda, route = None, None
        if os.environ.get("SEMIRING_OPS_BUILD_CUDA", "1") == "1" and toolkit.torch_cuda_major() is not None:
            choice = nvrtc_kernels.route_choice()
            cuda = toolkit.find_cuda_toolkit(jit.cache_root()) if choice != "nvrtc" else None
            # (the NVRTC route's host code needs the CUDA runtime's headers and library, not a GPU)
            problem = None if nvrtc_kernels.cuda_runtime_paths() else "the CUDA runtime's headers are not found"
            route = prebuilt.wheel_cuda_route(choice, cuda is not None, problem)
            if route is None:
                why = toolkit.missing_toolkit_reason(jit.cache_root()) if choice != "nvrtc" else problem
                print(f"semiring_ops: {why}: CPU kernels only", flush=True)
            elif route == "nvcc":
                os.environ.setdefault("TORCH_CUDA_ARCH_LIST", WHEEL_CUDA_ARCHS)
                print(
                    f"semiring_ops: CUDA kernels with nvcc {cuda.version} ({cuda.source}) for "
                    f"sm {os.environ['TORCH_CUDA_ARCH_LIST']}",
                    flush=True,
                )
            else:
                cuda = None
                print(
                    "semiring_ops: CUDA host code only (the NVRTC route: kernels compile on the GPU in use)", flush=True
                )
            os.environ["SEMIRING_OPS_CUDA_KERNELS"] = route or "nvcc"
        fams = [fam for fam in families.FAMILIES if fam.device_type == "cpu" or route is not None]
        print(f"semiring_ops: building {len(fams)} kernel families for the wheel in {jit.cache_root()}", flush=True)
        jobs = int(os.environ.get("MAX_JOBS") or os.cpu_count() or 1)
        results = parallel.build_families(fams, jobs, echo=lambda line: print(line, flush=True), use_prebuilt=False)
        failed = [r for r in results if r.status not in ("compiled", "cached")]
        if failed:
            raise RuntimeError(
                "semiring_ops: these kernel families could not be built for the wheel: "
                + "; ".join(f"{r.family.key} {r.status} {r.detail}" for r in failed)
            )
        package = ROOT / "semiring_ops" if self.inplace else Path(self.build_lib) / "semiring_ops"
        target = package / prebuilt.LIBRARY_FOLDER
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        for fam in fams:
            nvrtc = fam.device_type == "cuda" and route == "nvrtc"
            built = jit.library_path(fam.spec(nvrtc=nvrtc), cuda if fam.device_type == "cuda" else None)
            shutil.copyfile(built, target / prebuilt.library_file(fam))
        archs = os.environ.get("TORCH_CUDA_ARCH_LIST", "").replace(";", " ").split() if route == "nvcc" else []
        cpu_target = cpu_arch if x86 else platform.machine()
        info = prebuilt.build_manifest([fam.key for fam in fams], archs, cpu_target, route or "nvcc")
        (package / prebuilt.MANIFEST_NAME).write_text(json.dumps(info, indent=1) + "\n")


class WithKernels(Distribution):
    """A distribution with compiled libraries (a platform wheel, and build_ext run) though it lists no Extension:
    BuildKernels builds them."""

    def has_ext_modules(self):
        return BUILD_KERNELS


setup(
    cmdclass={"build_py": BuildPyWithSources, **({"build_ext": BuildKernels} if BUILD_KERNELS else {})},
    distclass=WithKernels,
)
