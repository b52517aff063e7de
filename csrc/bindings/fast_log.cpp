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
}
