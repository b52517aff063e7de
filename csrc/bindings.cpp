// The Python module of one backend. The same file is compiled into the CPU extension (with csrc/cpu/*.cpp)
// and into the CUDA extension (with csrc/cuda/*.cu); each links its own implementation of every entry point of ops.h.
#include <torch/extension.h>

#include "checks.h"
#include "ops.h"
#include "semiring.h"

namespace py = pybind11;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "semiring_ops kernels (one backend)";

  m.def("bmm_forward", &semiring_ops::bmm_forward,
        "Semiring batched matmul, forward: a (B, n, k), b (B, k, m) -> [out (B, n, m), arg (B, n, m) int64 or empty]",
        py::arg("a"), py::arg("b"), py::arg("semiring_id"), py::arg("with_arg"));

  m.def("log_contract", &semiring_ops::log_contract,
        "out[p, r, s] = sum_t L1[p, r, t] * R1[p, t, s] * exp(L0[p, r, t] + R0[p, t, s] + O0[p, r, s])",
        py::arg("l0"), py::arg("l1") = py::none(), py::arg("r0"), py::arg("r1") = py::none(), py::arg("o0"));

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
        "Gradient of the log-partition by one reverse scan -> [g_em, g_trans, g_start, g_end]",
        py::arg("emissions"), py::arg("transitions"), py::arg("start"), py::arg("end"), py::arg("lengths"),
        py::arg("alpha"), py::arg("log_z"), py::arg("grad"), py::arg("tags") = py::none());

  m.def("crf_log_likelihood", &semiring_ops::crf_log_likelihood,
        "A linear-chain CRF's log-likelihood of tag paths (B, T) in one forward scan -> [llh (B,), alpha, log_z]",
        py::arg("emissions"), py::arg("transitions"), py::arg("start"), py::arg("end"), py::arg("lengths"),
        py::arg("tags"));

  m.def("sequence_lengths", &semiring_ops::sequence_lengths,
        "Lengths (B,) int64 of right-padded sequences from a prefix mask or lengths, validated with the tags",
        py::arg("mask"), py::arg("lengths"), py::arg("tags"), py::arg("batch"), py::arg("steps"), py::arg("num_tags"),
        py::arg("raise_errors"));

  m.def("span_inside", &semiring_ops::span_inside,
        "Inside algorithm over spans (0: Eisner, 1: CKY, 2: semi-Markov) in one launch -> [total (B,), charts]",
        py::arg("potentials"), py::arg("lengths"), py::arg("structure"), py::arg("semiring_id"),
        py::arg("multiroot"));
  m.def("span_adjoint", &semiring_ops::span_adjoint,
        "Gradient of sum_b grad[b] * total[b] w.r.t. the potentials, from span_inside's charts -> their shape",
        py::arg("potentials"), py::arg("lengths"), py::arg("structure"), py::arg("semiring_id"), py::arg("multiroot"),
        py::arg("charts"), py::arg("grad"));
#ifdef SEMIRING_OPS_WITH_CUDA  // defined for the CUDA extension only (semiring_ops/build/jit.py, CUDA_EXTENSION)
  m.def("log_bmm_fast", &semiring_ops::log_bmm_fast,
        "Fast-mode log bmm on tensor cores: a (B, n, k), b (B, k, m) -> [out (B, n, m) float32, flags (B, n, m) "
        "uint8 (1: recompute exactly), count (1,) int64]",
        py::arg("a"), py::arg("b"), py::arg("passes"));
  m.def("bmm_packed_select", &semiring_ops::bmm_packed_select,
        "Packed 16-bit max-plus (is_max) / min-plus bmm: a (B, n, k), b (B, k, m) -> out (B, n, m) float32",
        py::arg("a"), py::arg("b"), py::arg("is_max"));
#else
  // the block engine's host writers: without the GIL, so several GPU workers' threads copy at once (as torch's
  // copy_ does) and none holds up the others' launches while it writes
  m.def("condensed_scatter", &semiring_ops::condensed_scatter,
        "A block of a symmetric (n, n) output into its condensed vector (scipy pdist's layout), in place",
        py::arg("out"), py::arg("values"), py::arg("n"), py::arg("r0"), py::arg("c0"), py::arg("diagonal"),
        py::call_guard<py::gil_scoped_release>());
  m.def("stream_copy", &semiring_ops::stream_copy,
        "dst = src for dst a block of rows (each dst[i] contiguous) of src's shape and dtype, src contiguous: "
        "streaming stores from 1 MiB, in place",
        py::arg("dst"), py::arg("src"), py::call_guard<py::gil_scoped_release>());
#endif

  m.def(
      "set_poison_outputs", [](bool enabled) { semiring_ops::poison_outputs_flag() = enabled; },
      "Testing aid: allocate outputs filled with NaN (indices with -1) instead of uninitialised.",
      py::arg("enabled"));

  m.def(
      "semiring_ids",
      [] {
        py::dict ids;
#define SEMIRING_OPS_BIND_ID(S) ids[#S] = semiring_ops::S::kId;
        SEMIRING_OPS_FOR_EACH_SEMIRING(SEMIRING_OPS_BIND_ID)
#undef SEMIRING_OPS_BIND_ID
        return ids;
      },
      "The kernel id of every semiring compiled into this module, by struct name.");
}
