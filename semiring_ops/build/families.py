"""The kernel families: one compiled module per family and device type, so that a first call compiles only the
family it uses (a CRF step the chain kernels, a logbmm the bmm kernels), and ``python -m semiring_ops build``
compiles them all in parallel.

Each CUDA family splits into ATen-free kernel files (``*_kernels.cu``: nvcc compiles device code only, in parallel)
and host files compiled by the C++ compiler (``*_cuda.cpp``, the bindings); csrc/cuda/launch_status.h says why.

A CPU family is built for a short first call on a small machine (issue 44: a first logbmm or CRF step in ≤ 25 s on 2
cores): torch's headers are most of a file's compile time, so its kernel files compile as one translation unit
(``cpu/<family>_kernels_cpu.cpp`` includes them), and the bmm and chain families' C++ autograd nodes are a module of
their own, an *autograd module* (``<family>_autograd``), that backends.py builds after the kernels', in the
background, while the registered operators' Python autograd formulas serve (csrc/bindings/kernel_table.h says how
the two modules connect). A family's sources are listed longest compile first: ninja starts them in that order.

This module imports nothing beyond the standard library: setup.py reads it without importing the package.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["CPU_ARCH_ENV", "FAMILIES", "ExtensionSpec", "Family", "cpu_arch", "families_for", "family"]

# -fopenmp: at::parallel_for runs threads only in files built with it (resolves to torch's libgomp);
# -fno-trapping-math: lets GCC if-convert (vectorise) the selects; no result changes, inf/NaN included.
# -march: cpu_arch(): this machine's (native) unless $SEMIRING_OPS_CPU_ARCH names another; a wheel's is the portable
# AOT_CPU_ARCH (setup.py sets it), so a JIT build for that target is the very library a wheel ships.
# --param ggc-*: g++ collects its garbage less often (more memory, ~10% less compile time on torch's headers); other
# compilers are not given them (toolkit.compiler_cflags).
GCC_ONLY_CFLAGS = ("--param=ggc-min-expand=1000", "--param=ggc-min-heapsize=2097152")
_CPU_CFLAGS = ("-O3", "-fno-math-errno", "-fno-trapping-math", "-fopenmp", *GCC_ONLY_CFLAGS)
_CUDA_HOST_CFLAGS = ("-O3",)
_CUDA_CFLAGS = ("-O3", "-lineinfo")

# What a prebuilt CPU library (a wheel) is compiled for on x86-64: AVX2 and FMA (Haswell, 2013, and later), which
# the CPU kernels' inner loops and the host writers' streaming stores use. prebuilt.py checks the running CPU
# before loading one; elsewhere the JIT builds with -march=native.
AOT_CPU_ARCH = "x86-64-v3"
AOT_CPU_FLAGS = ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe")  # /proc/cpuinfo names of x86-64-v3
CPU_ARCH_ENV = "SEMIRING_OPS_CPU_ARCH"
DEFAULT_CPU_ARCH = "default"  # $SEMIRING_OPS_CPU_ARCH's value for no -march at all: the compiler's own target


def cpu_arch() -> str:
    """The target of the CPU families' builds: $SEMIRING_OPS_CPU_ARCH (an -march value, or "default" for the
    compiler's own target), else "native". Part of each build's flags, hence of its cache folder's name."""
    return os.environ.get(CPU_ARCH_ENV, "").strip() or "native"


@dataclass(frozen=True)
class ExtensionSpec:
    """One compiled module: its name, sources (relative to csrc) and compiler flags."""

    name: str
    sources: tuple[str, ...]
    cflags: tuple[str, ...]
    cuda_cflags: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = ()
    nvrtc: bool = False  # the NVRTC route: the C++ compiler builds the kernel files' launchers, NVRTC the kernels

    @property
    def is_cuda(self) -> bool:
        """Whether nvcc builds it (a CUDA family on the nvcc route)."""
        return not self.nvrtc and any(s.endswith(".cu") for s in self.sources)


@dataclass(frozen=True)
class Family:
    """A family of kernels on one device type: the Python module its bindings make, and what the module serves."""

    name: str  # bmm, chain, span, ctc, fast_log, packed, host_writers, hmm; bmm_autograd, chain_autograd
    device_type: str  # cpu | cuda
    sources: tuple[str, ...]  # relative to csrc; one file of bindings/, the longest compile first
    serves: str  # what uses it, for `info`
    autograd_of: str = ""  # an autograd module: the family whose kernels its nodes call
    # a CUDA family whose kernels take the NVRTC route (csrc/cuda/kernel_ref.h). Every CUDA family's launchers and
    # kernels are written for it (tests/test_nvrtc_route.py compiles them all with NVRTC); a family is marked once
    # its CUDA tests have passed under the route on a GPU: all six (docs/build.md, "Two routes").
    nvrtc: bool = False

    @property
    def bindings(self) -> str:
        return next(s for s in self.sources if s.startswith("bindings/"))

    @property
    def key(self) -> str:
        return f"{self.device_type}_{self.name}"

    def spec(self, nvrtc: bool = False) -> ExtensionSpec:
        """The module's build, the same for first use and for a wheel (setup.py), for the CPU target cpu_arch();
        with `nvrtc` (a CUDA family), its host code alone, for the NVRTC route (which families take it by default:
        the `nvrtc` field; backends.jit_build)."""
        if nvrtc and self.device_type == "cuda":
            return ExtensionSpec(
                name=f"semiring_ops_{self.key}",
                sources=self.sources,
                cflags=(*_CUDA_HOST_CFLAGS, NVRTC_HOST_DEFINE),
                nvrtc=True,
            )
        if self.device_type == "cpu":
            arch = cpu_arch()
            march = () if arch == DEFAULT_CPU_ARCH else (f"-march={arch}",)
            cflags, cuda_cflags, ldflags = (*_CPU_CFLAGS, _AUTOGRAD_APART, *march), (), ("-fopenmp",)
        else:
            cflags, cuda_cflags, ldflags = _CUDA_HOST_CFLAGS, _CUDA_CFLAGS, ()
        return ExtensionSpec(
            name=f"semiring_ops_{self.key}",
            sources=self.sources,
            cflags=cflags,
            cuda_cflags=cuda_cflags,
            ldflags=ldflags,
        )


# A CUDA family compiles its eager C++ autograd nodes (csrc/autograd, calling the family's own kernels) in; on the CPU
# they are the autograd modules below, and the kernels' bindings export the table they call (this define).
_CUDA_AUTOGRAD = {
    "bmm": ("autograd/bmm_autograd.cpp",),
    "chain": ("autograd/chain_autograd.cpp", "autograd/crf_forward.cpp"),
}
_AUTOGRAD_APART = "-DSEMIRING_OPS_AUTOGRAD_APART"
NVRTC_HOST_DEFINE = "-DSEMIRING_OPS_NVRTC_HOST"


def _cpu(name: str, serves: str, *sources: str, bindings_first: bool = True) -> Family:
    kernels = tuple(f"cpu/{s}" for s in sources)
    bindings = (f"bindings/{name}.cpp",)
    return Family(name, "cpu", (*bindings, *kernels) if bindings_first else (*kernels, *bindings), serves)


def _cpu_autograd(of: str, serves: str) -> Family:
    """The CPU family `of`'s C++ autograd nodes: one translation unit (bindings/<of>_autograd.cpp includes them)."""
    return Family(f"{of}_autograd", "cpu", (f"bindings/{of}_autograd.cpp",), serves, autograd_of=of)


def _cuda(name: str, serves: str, *sources: str, nvrtc: bool = False) -> Family:
    return Family(
        name,
        "cuda",
        (f"bindings/{name}.cpp", *(f"cuda/{s}" for s in sources), *_CUDA_AUTOGRAD.get(name, ())),
        serves,
        nvrtc=nvrtc,
    )


FAMILIES: tuple[Family, ...] = (
    _cpu("bmm", "semiring matmul (log, max, min) and its gradients", "bmm_kernels_cpu.cpp"),
    _cpu("chain", "LinearChainCRF, HMM, chain_* (fused chains)", "chain_kernels_cpu.cpp", bindings_first=False),
    _cpu_autograd("bmm", "the bmm family's C++ autograd node (eager host time; built after bmm, in the background)"),
    _cpu_autograd(
        "chain", "the chain family's C++ autograd nodes and CRF forward (built after chain, in the background)"
    ),
    _cpu("span", "structures: dependency, CKY, semi-Markov, linear chain, alignment", "span_cpu.cpp"),
    _cpu("ctc", "CTC: ctc_loss, forced_align, ctc_posteriors; RNN-T: rnnt_loss", "ctc_cpu.cpp"),
    _cpu("host_writers", "the block engine's host writes", "condensed_scatter_cpu.cpp", "stream_copy_cpu.cpp"),
    _cpu(
        "hmm",
        "HMM fit and scoring on the CPU: the E-step in scaled probability space, Gaussian emissions, Dirichlet M-steps",
        "hmm_scaled_cpu.cpp",
        "hmm_emissions_cpu.cpp",
        "hmm_mstep_cpu.cpp",
    ),
    _cuda(
        "bmm",
        "semiring matmul (log, max, min) and its gradients",
        "bmm_cuda.cpp",
        "bmm_kernels.cu",
        "log_contract_kernels.cu",
        "log_grads_kernels.cu",
        nvrtc=True,
    ),
    _cuda(
        "chain",
        "LinearChainCRF, HMM, chain_* (fused chains)",
        "chain_cuda.cpp",
        "chain_kernels_scan.cu",
        "chain_kernels_viterbi.cu",
        "chain_kernels_grad.cu",
        "sequence_cuda.cpp",
        "sequence_kernels.cu",
        nvrtc=True,
    ),
    _cuda(
        "span",
        "structures: dependency, CKY, semi-Markov, linear chain, alignment",
        "span_cuda.cpp",
        "span_kernels_log.cu",
        "span_kernels_max.cu",
        "span_kernels_min.cu",
        nvrtc=True,
    ),
    _cuda(
        "ctc",
        "CTC: ctc_loss, forced_align, ctc_posteriors; RNN-T: rnnt_loss",
        "ctc_cuda.cpp",
        "ctc_kernels.cu",
        nvrtc=True,
    ),
    _cuda(
        "fast_log",
        "log matmul, precision='fast' (tensor cores)",
        "log_bmm_fast_cuda.cpp",
        "log_bmm_fast_kernels.cu",
        "fast_log_scaled_cuda.cpp",
        "fast_log_scaled_kernels.cu",
        nvrtc=True,
    ),
    _cuda(
        "packed",
        "max / min matmul without an index (float32, packed 16-bit)",
        "packed_select_cuda.cpp",
        "packed_select_kernels.cu",
        nvrtc=True,
    ),
)


def family(device_type: str, name: str) -> Family:
    for fam in FAMILIES:
        if fam.device_type == device_type and fam.name == name:
            return fam
    raise KeyError(f"no kernel family {name!r} for device type {device_type!r}")


def families_for(device_type: str) -> list[Family]:
    return [fam for fam in FAMILIES if fam.device_type == device_type]
