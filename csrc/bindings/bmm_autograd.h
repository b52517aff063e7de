// The bmm family's C++ autograd node as a Python entry point: in the CUDA family's module (bindings/bmm.cpp) and in
// the CPU family's autograd module (bindings/bmm_autograd.cpp; bindings/kernel_table.h says why it is apart).
#pragma once

#include <torch/csrc/utils/pybind.h>

#include "autograd/autograd.h"

namespace semiring_ops {

inline void bind_bmm_autograd(pybind11::module_& m) {
  namespace py = pybind11;
  m.def("bmm_autograd", &bmm_autograd,
        "bmm_forward recorded for autograd as one C++ node (csrc/autograd/autograd.h) -> [out, arg]", py::arg("a"),
        py::arg("b"), py::arg("semiring_id"), py::arg("with_arg"));
}

}  // namespace semiring_ops
