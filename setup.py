"""Packaging. The C++/CUDA sources in csrc/ ship inside the package (semiring_ops/csrc) and compile on first use,
one kernel family at a time (JIT, cached). With SEMIRING_OPS_BUILD_EXT=1 every family is built ahead of time into
the package (semiring_ops/_C_<device>_<family>), beside a manifest (_prebuilt.json) that says for which torch, CPU
and GPUs; such a wheel installs and runs with no compiler (docs/build.md):

    SEMIRING_OPS_BUILD_EXT=1 python -m build --wheel --no-isolation    # CPU kernels, plus CUDA when a toolkit is found
    SEMIRING_OPS_BUILD_EXT=1 TORCH_CUDA_ARCH_LIST="9.0" pip install --no-build-isolation .

CUDA kernels are built for TORCH_CUDA_ARCH_LIST, by default sm_80, 86, 89, 90, 100 and 120 with PTX; with the
toolkit semiring_ops.build.toolkit finds (a system one, or the pip extra cuda13); SEMIRING_OPS_BUILD_CUDA=0 skips them.
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

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).parent
CSRC = ROOT / "csrc"
WHEEL_CUDA_ARCHS = "8.0;8.6;8.9;9.0;10.0;12.0+PTX"


class BuildPyWithSources(build_py):
    """Copies csrc/ into the built package as semiring_ops/csrc, so wheels can JIT-compile."""

    def run(self):
        super().run()
        target = Path(self.build_lib) / "semiring_ops" / "csrc"
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(CSRC, target, ignore=shutil.ignore_patterns("*.o", "__pycache__"))


def build_modules():
    """semiring_ops.build's families, toolkit and prebuilt modules, without running semiring_ops/__init__.py (which
    imports the whole library): a stand-in parent package whose path is the source folder."""
    if "semiring_ops" not in sys.modules:
        stub = types.ModuleType("semiring_ops")
        stub.__path__ = [str(ROOT / "semiring_ops")]
        sys.modules["semiring_ops"] = stub
    return tuple(importlib.import_module(f"semiring_ops.build.{m}") for m in ("families", "toolkit", "prebuilt", "jit"))


def ahead_of_time_extensions():
    if os.environ.get("SEMIRING_OPS_BUILD_EXT") != "1":
        return [], {}
    families, toolkit, prebuilt, jit = build_modules()
    cuda = None
    if os.environ.get("SEMIRING_OPS_BUILD_CUDA", "1") == "1" and toolkit.torch_cuda_major() is not None:
        cuda = toolkit.find_cuda_toolkit(jit.cache_root())
        if cuda is None:
            print(f"semiring_ops: {toolkit.missing_toolkit_reason(jit.cache_root())}: CPU kernels only", flush=True)
        else:  # before torch.utils.cpp_extension is imported: it reads CUDA_HOME once
            os.environ["CUDA_HOME"] = str(cuda.home)
            os.environ.pop("CUDA_PATH", None)
            os.environ.setdefault("TORCH_CUDA_ARCH_LIST", WHEEL_CUDA_ARCHS)
            print(
                f"semiring_ops: CUDA kernels with nvcc {cuda.version} ({cuda.source}) for "
                f"sm {os.environ['TORCH_CUDA_ARCH_LIST']}",
                flush=True,
            )
    from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

    x86 = platform.machine() in ("x86_64", "AMD64")
    rel = os.path.relpath(CSRC, ROOT)
    exts = []
    for fam in families.FAMILIES:
        if fam.device_type == "cuda" and cuda is None:
            continue
        spec = fam.spec(ahead_of_time=True)
        # setuptools compiles with Python's own -g: -g0 after it, as no debug information ships in a wheel (a third
        # of its size) and generating it cost a fifth of the compile time of the files that include torch
        cflags = [*(f for f in toolkit.compiler_cflags(spec.cflags) if x86 or not f.startswith("-march=")), "-g0"]
        kind, extra = (CUDAExtension, {"nvcc": list(spec.cuda_cflags)}) if spec.is_cuda else (CppExtension, {})
        exts.append(
            kind(
                spec.aot_module,
                [f"{rel}/{s}" for s in spec.sources],
                include_dirs=[str(CSRC)],
                extra_compile_args={"cxx": cflags, **extra},
                extra_link_args=[*spec.ldflags, "-Wl,--strip-debug"],
            )
        )

    class BuildWithManifest(BuildExtension):
        """Builds the families, then writes the manifest prebuilt.py checks before loading any of them."""

        def run(self):
            super().run()
            keys = [e.name.removeprefix("semiring_ops._C_") for e in self.extensions]
            archs = os.environ.get("TORCH_CUDA_ARCH_LIST", "").replace(";", " ").split() if cuda else []
            info = prebuilt.build_manifest(keys, archs, families.AOT_CPU_ARCH if x86 else platform.machine())
            package = ROOT / "semiring_ops" if self.inplace else Path(self.build_lib) / "semiring_ops"
            package.mkdir(parents=True, exist_ok=True)
            (package / prebuilt.MANIFEST_NAME).write_text(json.dumps(info, indent=1) + "\n")

    return exts, {"build_ext": BuildWithManifest}


ext_modules, ext_cmdclass = ahead_of_time_extensions()
setup(
    ext_modules=ext_modules,
    cmdclass={"build_py": BuildPyWithSources, **ext_cmdclass},
)
