// The ctc family's module (CPU or CUDA): CTC's fused programs, the loss with its occupancies and the best path,
// and RNN-T's lattice program (contracts in ops.h).
#include "bindings/module.h"
#include "ops.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  semiring_ops::bind_common(m, "semiring_ops kernels: CTC (one device type)");
  m.def("ctc_log", &semiring_ops::ctc_log,
        "log Z of every item and, with need_states, the state occupancies -> [total (N,), states (N, T, 2 S + 1)]",
        py::arg("log_probs"), py::arg("targets"), py::arg("input_lengths"), py::arg("target_lengths"),
        py::arg("blank"), py::arg("need_states"));
  m.def("ctc_collect", &semiring_ops::ctc_collect,
        "weight[n] * d log Z_n / d log_probs from ctc_log's total and states -> (T, N, C)", py::arg("log_probs"),
        py::arg("targets"), py::arg("input_lengths"), py::arg("target_lengths"), py::arg("blank"), py::arg("total"),
        py::arg("states"), py::arg("weight"));
  m.def("ctc_viterbi", &semiring_ops::ctc_viterbi,
        "The best path of every item -> [score (N,), states (N, T) int64, -1 past each item's frames]",
        py::arg("log_probs"), py::arg("targets"), py::arg("input_lengths"), py::arg("target_lengths"),
        py::arg("blank"));
  m.def("rnnt_lattice", &semiring_ops::rnnt_lattice,
        "RNN-T's lattice: each item's semiring total and, with need_posteriors, d total / d potentials -> "
        "[total (B,), posteriors (B, T, U + 1, 2) or empty]",
        py::arg("potentials"), py::arg("frames"), py::arg("labels"), py::arg("max"), py::arg("need_posteriors"));
}
