// The chain family's module (CPU or CUDA): the fused linear chains of CRFs and HMMs and the sequence lengths they
// take (contracts in ops.h), and, on CUDA, a CRF's log-likelihood recorded with its gradient as one C++ autograd
// node (autograd/autograd.h; on the CPU the nodes are a module of their own, bindings/kernel_table.h).
#include "bindings/module.h"
#include "ops.h"
#ifdef SEMIRING_OPS_AUTOGRAD_APART
#include "bindings/kernel_table.h"
#else
#include "bindings/chain_autograd.h"
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  semiring_ops::bind_common(m, "semiring_ops kernels: fused linear chains (one device type)");
  m.def("chain_scan", &semiring_ops::chain_scan,
        "One direction of the linear-chain recursion: emissions (B, T, C), transitions (C, C), start (C), end (C), "
        "lengths (B,) -> [total (B,), scores (B, T, C) or empty]",
        py::arg("emissions"), py::arg("transitions"), py::arg("start"), py::arg("end"), py::arg("lengths"),
        py::arg("semiring_id"), py::arg("reverse"), py::arg("save_scores"));
  m.def("chain_viterbi", &semiring_ops::chain_viterbi,
        "Best path per chain under max / min: same arguments as chain_scan -> [score (B,), tags (B, T) int64]",
        py::arg("emissions"), py::arg("transitions"), py::arg("start"), py::arg("end"), py::arg("lengths"),
        py::arg("semiring_id"));
  m.def("chain_log_backward", &semiring_ops::chain_log_backward,
        "Gradient of the log-partition by one reverse scan -> [g_em, g_trans, g_start, g_end, beta, weight] (beta and "
        "weight empty unless the pair marginals are left to the caller: ops.h)",
        py::arg("emissions"), py::arg("transitions"), py::arg("start"), py::arg("end"), py::arg("lengths"),
        py::arg("alpha"), py::arg("log_z"), py::arg("grad"), py::arg("tags") = py::none());
  m.def("crf_log_likelihood", &semiring_ops::crf_log_likelihood,
        "A linear-chain CRF's log-likelihood of tag paths (B, T) in one forward scan -> [llh (B,), alpha, log_z]",
        py::arg("emissions"), py::arg("transitions"), py::arg("start"), py::arg("end"), py::arg("lengths"),
        py::arg("tags"));
#ifdef SEMIRING_OPS_AUTOGRAD_APART
  m.def(
      "kernel_table",
      [] {
        static const semiring_ops::ChainKernels table{&semiring_ops::chain_log_backward,
                                                      &semiring_ops::crf_log_likelihood,
                                                      &semiring_ops::sequence_lengths};
        return semiring_ops::export_kernel_table(table);
      },
      "The entry points the autograd module's nodes call, as a capsule (bindings/kernel_table.h)");
#else
  semiring_ops::bind_chain_autograd(m);
#endif
  m.def("sequence_lengths", &semiring_ops::sequence_lengths,
        "Lengths (B,) int64 of right-padded sequences from a prefix mask or lengths, validated with the tags",
        py::arg("mask"), py::arg("lengths"), py::arg("tags"), py::arg("batch"), py::arg("steps"), py::arg("num_tags"),
        py::arg("raise_errors"));
}
