// The chain family's module (CPU or CUDA): the fused linear chains of CRFs and HMMs and the sequence lengths they
// take (contracts in ops.h), and a CRF's log-likelihood recorded with its gradient as one C++ autograd node
// (autograd/autograd.h).
#include <torch/csrc/autograd/python_variable.h>

#include "bindings/module.h"
#include "autograd/autograd.h"
#include "ops.h"

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
  m.def("crf_log_likelihood_autograd", &semiring_ops::crf_log_likelihood_autograd,
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
            semiring_ops::crf_forward(THPVariable_Unpack(emissions.ptr()), THPVariable_Unpack(tags.ptr()), optional(mask),
                                      optional(lengths), transitions, start, end, batch_first, reduction, validate);
        if (!out) return py::none();
        return py::cast(*out);
      },
      "LinearChainCRF.forward in one call (csrc/autograd/autograd.h) -> the reduced log-likelihood, or None where the "
      "Python path must run",
      py::arg("emissions"), py::arg("tags"), py::arg("mask"), py::arg("lengths"), py::arg("transitions"),
      py::arg("start"), py::arg("end"), py::arg("batch_first"), py::arg("reduction"), py::arg("validate"));
  m.def("sequence_lengths", &semiring_ops::sequence_lengths,
        "Lengths (B,) int64 of right-padded sequences from a prefix mask or lengths, validated with the tags",
        py::arg("mask"), py::arg("lengths"), py::arg("tags"), py::arg("batch"), py::arg("steps"), py::arg("num_tags"),
        py::arg("raise_errors"));
}
