// The chain family's C++ autograd entry points in Python: in the CUDA family's module (bindings/chain.cpp) and in
// the CPU family's autograd module (bindings/chain_autograd.cpp; bindings/kernel_table.h says why it is apart).
#pragma once

#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>

#include "autograd/autograd.h"

namespace semiring_ops {

inline void bind_chain_autograd(pybind11::module_& m) {
  namespace py = pybind11;
  m.def("crf_log_likelihood_autograd", &crf_log_likelihood_autograd,
        "crf_log_likelihood recorded for autograd as one C++ node (csrc/autograd/autograd.h) -> [llh, alpha, log_z]; "
        "reduction 1 / 2 / 3: llh's sum / mean / token mean instead of llh",
        py::arg("emissions"), py::arg("transitions"), py::arg("start"), py::arg("end"), py::arg("lengths"),
        py::arg("tags"), py::arg("reduction") = 0);
  m.def(
      "crf_forward",
      [](const py::object& emissions, const py::object& tags, const py::object& mask, const py::object& lengths,
         const at::Tensor& transitions, const at::Tensor& start, const at::Tensor& end, bool batch_first,
         int64_t reduction, bool validate) -> py::object {
        // a torch.Tensor or nn.Parameter exactly (a subclass, a list or any other object: None, the Python path)
        const auto plain = [](const py::object& x) { return THPVariable_CheckExact(x.ptr()); };
        const auto optional = [&](const py::object& x) -> std::optional<at::Tensor> {
          if (x.is_none()) return std::nullopt;
          return THPVariable_Unpack(x.ptr());
        };
        if (!plain(emissions) || !plain(tags) || !(mask.is_none() || plain(mask)) || !(lengths.is_none() || plain(lengths)))
          return py::none();
        const std::optional<at::Tensor> out =
            crf_forward(THPVariable_Unpack(emissions.ptr()), THPVariable_Unpack(tags.ptr()), optional(mask),
                                      optional(lengths), transitions, start, end, batch_first, reduction, validate);
        if (!out) return py::none();
        return py::cast(*out);
      },
      "LinearChainCRF.forward in one call (csrc/autograd/autograd.h) -> the reduced log-likelihood, or None where the "
      "Python path must run",
      py::arg("emissions"), py::arg("tags"), py::arg("mask"), py::arg("lengths"), py::arg("transitions"),
      py::arg("start"), py::arg("end"), py::arg("batch_first"), py::arg("reduction"), py::arg("validate"));
}

}  // namespace semiring_ops
