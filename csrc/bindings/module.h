// What every family's Python module holds besides its own entry points (csrc/bindings/<family>.cpp): the output
// poisoning switch of checks.h and the kernel ids of the semirings. One module per kernel family and device
// (semiring_ops/build/families.py), so a first call compiles only its own family.
//
// The bindings include torch's pybind glue (the at::Tensor casters; torch._C translates c10 errors into Python
// exceptions, ValueError for TORCH_CHECK_VALUE) rather than torch/extension.h, which adds the whole C++ frontend
// (nn, optim, ...): 12 s of g++ instead of 37 s per module (docs/build.md, "Compile time").
#pragma once

#include <torch/csrc/utils/pybind.h>

#include "checks.h"
#include "semiring.h"

#if defined(SEMIRING_OPS_NVRTC_HOST)  // a family built for the NVRTC route (csrc/cuda/kernel_ref.h)
#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda/kernel_ref.h"  // nvrtc_kernel's declaration (hidden: each family's module calls its own)

namespace semiring_ops {
namespace cuda {

namespace {
// The Python function that compiles and loads a kernel (semiring_ops/build/nvrtc_kernels.py kernel_handle), set by
// the loader once the module is imported; never destroyed (the interpreter may be gone at exit). This module's own:
// internal linkage, not a function's static, which GCC would share between the families' modules (STB_GNU_UNIQUE).
pybind11::object* kernel_source = nullptr;
}  // namespace

const void* nvrtc_kernel(const char* program, const std::string& expression) {
  pybind11::gil_scoped_acquire gil;
  if (kernel_source == nullptr || !*kernel_source) {
    throw std::runtime_error("semiring_ops: this module's kernels compile through NVRTC, and no compiler was "
                             "registered (set_kernel_source): load it through semiring_ops");
  }
  try {
    return reinterpret_cast<const void*>((*kernel_source)(program, expression).cast<uintptr_t>());
  } catch (pybind11::error_already_set& e) {  // as a C++ error: the launcher may run on an autograd thread
    throw std::runtime_error(e.what());
  }
}

}  // namespace cuda
}  // namespace semiring_ops
#endif

namespace semiring_ops {

inline void bind_common(pybind11::module_& m, const char* doc) {
  namespace py = pybind11;
  m.doc() = doc;
  m.def(
      "set_poison_outputs", [](bool enabled) { poison_outputs_flag() = enabled; },
      "Testing aid: allocate outputs filled with NaN (indices with -1) instead of uninitialised.",
      py::arg("enabled"));
  m.def(
      "semiring_ids",
      [] {
        py::dict ids;
#define SEMIRING_OPS_BIND_ID(S) ids[#S] = S::kId;
        SEMIRING_OPS_FOR_EACH_SEMIRING(SEMIRING_OPS_BIND_ID)
#undef SEMIRING_OPS_BIND_ID
        return ids;
      },
      "The kernel id of every semiring compiled into this module, by struct name.");
#if defined(SEMIRING_OPS_NVRTC_HOST)
  m.def(
      "set_kernel_source",
      [](py::object source) {
        if (cuda::kernel_source == nullptr) cuda::kernel_source = new py::object();
        *cuda::kernel_source = std::move(source);
      },
      "Registers source(program, expression) -> cudaKernel_t handle (int), which compiles a kernel on its first "
      "launch (the NVRTC route).",
      py::arg("source"));
#endif
}

}  // namespace semiring_ops
