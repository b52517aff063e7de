// The HMM module (CPU only): the E-step of Baum-Welch in scaled probability space (contract in ops.h). Without the
// GIL: a fit in one thread leaves the interpreter to the others.
#include "bindings/module.h"
#include "ops.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  semiring_ops::bind_common(m, "semiring_ops kernels: the HMM E-step in scaled probability space (CPU)");
  m.def("hmm_scaled_estep", &semiring_ops::hmm_scaled_estep,
        "(log_emissions (B, T, C), log_trans (C, C), log_start (C,), lengths (B,)) -> [log_likelihood (B,), "
        "posteriors (B, T, C), transitions (C, C), starts (C,), suspect (B,) bool]",
        py::arg("log_emissions"), py::arg("log_trans"), py::arg("log_start"), py::arg("lengths"),
        py::call_guard<py::gil_scoped_release>());
}
