// The span family's module (CPU or CUDA): the structures' fused dynamic programs (Eisner, CKY, semi-Markov,
// linear chain, alignment) and their adjoints (contracts in ops.h).
#include "bindings/module.h"
#include "ops.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  semiring_ops::bind_common(m, "semiring_ops kernels: span structures (one device type)");
  m.def("span_inside", &semiring_ops::span_inside,
        "Inside algorithm over spans (0: Eisner, 1: CKY, 2: semi-Markov, 3: linear chain, 4: alignment) in one "
        "launch -> [total (B,), charts]",
        py::arg("potentials"), py::arg("lengths"), py::arg("structure"), py::arg("semiring_id"),
        py::arg("multiroot"));
  m.def("span_adjoint", &semiring_ops::span_adjoint,
        "Gradient of sum_b grad[b] * total[b] w.r.t. the potentials, from span_inside's charts -> their shape",
        py::arg("potentials"), py::arg("lengths"), py::arg("structure"), py::arg("semiring_id"), py::arg("multiroot"),
        py::arg("charts"), py::arg("grad"));
}
