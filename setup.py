"""Packaging. The C++/CUDA sources in csrc/ ship inside the package (semiring_ops/csrc) and are
compiled on first use (JIT, cached). For an ahead-of-time build set SEMIRING_OPS_BUILD_EXT=1:

    SEMIRING_OPS_BUILD_EXT=1 pip install .            # CPU kernels, plus CUDA kernels if nvcc is found
    SEMIRING_OPS_BUILD_EXT=1 TORCH_CUDA_ARCH_LIST="8.0;9.0" pip install --no-build-isolation .
"""

import os
import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).parent
CSRC = ROOT / "csrc"


class BuildPyWithSources(build_py):
    """Copies csrc/ into the built package as semiring_ops/csrc, so wheels can JIT-compile."""

    def run(self):
        super().run()
        target = Path(self.build_lib) / "semiring_ops" / "csrc"
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(CSRC, target, ignore=shutil.ignore_patterns("*.o", "__pycache__"))


def ahead_of_time_extensions():
    if os.environ.get("SEMIRING_OPS_BUILD_EXT") != "1":
        return [], {}
    import importlib.util

    from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

    # the extension specs (names, sources, flags) are the JIT's own, read from its file without
    # importing the package; dataclasses need the module registered while it executes
    spec = importlib.util.spec_from_file_location("_semiring_ops_jit", ROOT / "semiring_ops" / "build" / "jit.py")
    jit = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = jit
    spec.loader.exec_module(jit)
    rel = os.path.relpath(CSRC, ROOT)
    cpu = jit.CPU_EXTENSION
    exts = [
        CppExtension(
            cpu.aot_module,
            [f"{rel}/{s}" for s in cpu.sources],
            include_dirs=[str(CSRC)],
            extra_compile_args={"cxx": list(cpu.cflags)},
            extra_link_args=list(cpu.ldflags),
        )
    ]
    if CUDA_HOME is not None and os.environ.get("SEMIRING_OPS_BUILD_CUDA", "1") == "1":
        cu = jit.CUDA_EXTENSION
        exts.append(
            CUDAExtension(
                cu.aot_module,
                [f"{rel}/{s}" for s in cu.sources],
                include_dirs=[str(CSRC)],
                extra_compile_args={"cxx": list(cu.cflags), "nvcc": list(cu.cuda_cflags)},
            )
        )
    return exts, {"build_ext": BuildExtension}


ext_modules, ext_cmdclass = ahead_of_time_extensions()
setup(
    ext_modules=ext_modules,
    cmdclass={"build_py": BuildPyWithSources, **ext_cmdclass},
)
