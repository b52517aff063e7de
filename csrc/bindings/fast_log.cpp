// The fast log family's module (CUDA only): the log-semiring bmm on tensor cores (contract in ops.h).
#include "bindings/module.h"
#include "ops.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  semiring_ops::bind_common(m, "semiring_ops kernels: the log semiring's fast mode (CUDA)");
  m.def("log_bmm_fast", &semiring_ops::log_bmm_fast,
        "Fast-mode log bmm on tensor cores: a (B, n, k), b (B, k, m) -> [out (B, n, m) float32, flags (B, n, m) "
        "uint8 (1: recompute exactly), count (1,) int64]",
        py::arg("a"), py::arg("b"), py::arg("passes"));
  m.def("log_bmm_fast_scales", &semiring_ops::log_bmm_fast_scales,
        "The scaled tier's factors and scales: a (B, n, k), b (B, k, m) -> [fa, fb, row_top, row_state, col_top, "
        "col_state]",
        py::arg("a"), py::arg("b"));
  m.def("log_bmm_fast_finish", &semiring_ops::log_bmm_fast_finish,
        "The scaled tier's epilogue, in place on sums (B, n, m) -> [flags (B, n, m) bool, count () int64]",
        py::arg("sums"), py::arg("row_top"), py::arg("row_state"), py::arg("col_top"), py::arg("col_state"));
}
