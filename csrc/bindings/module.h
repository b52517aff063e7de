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
}

}  // namespace semiring_ops
