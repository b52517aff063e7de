// The HMM module (CPU only): the E-step of Baum-Welch in scaled probability space, Gaussian emission log-densities
// and the Dirichlet M-step (contracts in ops.h). Without the GIL: a fit in one thread leaves the interpreter to the
// others.
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
  m.def("hmm_gaussian_log_prob", &semiring_ops::hmm_gaussian_log_prob,
        "(x (N, D), means (C, D), factors (C, D) or (C, D, D), offsets (C,)) -> (N, C): offsets[c] - 0.5 |F_c (x_n - "
        "means_c)|^2",
        py::arg("x"), py::arg("means"), py::arg("factors"), py::arg("offsets"),
        py::call_guard<py::gil_scoped_release>());
  m.def("hmm_dirichlet_map", &semiring_ops::hmm_dirichlet_map,
        "(counts (..., K), concentration_minus_one (..., K), previous (..., K), keep_zeros) -> (..., K) log "
        "probabilities: the Dirichlet MAP of each row (previous where a row has no mass)",
        py::arg("counts"), py::arg("concentration_minus_one"), py::arg("previous"), py::arg("keep_zeros"));
}
