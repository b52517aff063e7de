// The kernels a CPU family's C++ autograd nodes call, handed from the family's module to its autograd module.
//
// On the CPU the nodes (csrc/autograd) are a module of their own, built after the kernels' module, in the
// background, so that a first logbmm or CRF step waits only for its kernels (semiring_ops/build/families.py,
// "autograd modules"); until then the registered operators' Python autograd formulas run. The two modules are
// separate libraries loaded with RTLD_LOCAL: the kernels' module exports a table of its entry points as a capsule
// (`kernel_table()`), the autograd module defines the entry points the nodes call as calls through it
// (SEMIRING_OPS_DEFINE_*_THROUGH_TABLE, one translation unit with the nodes), after `attach(capsule)`.
// A CUDA family links its nodes in directly and needs none of this.
#pragma once

#include <torch/csrc/utils/pybind.h>

#include <cstring>

#include "ops.h"

namespace semiring_ops {

struct BmmKernels {
  static constexpr const char* kName = "semiring_ops.BmmKernels.v1";
  decltype(&bmm_forward) bmm_forward_fn;
  decltype(&log_bmm_grads) log_bmm_grads_fn;
};

struct ChainKernels {
  static constexpr const char* kName = "semiring_ops.ChainKernels.v1";
  decltype(&chain_log_backward) chain_log_backward_fn;
  decltype(&crf_log_likelihood) crf_log_likelihood_fn;
  decltype(&sequence_lengths) sequence_lengths_fn;
};

// The kernels' module: `table` (a static) as a named capsule.
template <class Table> pybind11::capsule export_kernel_table(const Table& table) {
  return pybind11::capsule(static_cast<const void*>(&table), Table::kName);
}

// The autograd module's side: the table it was attached to.
template <class Table> struct AttachedTable {
  Table table{};
  bool attached = false;
};

template <class Table> AttachedTable<Table>& attached_table() {
  static AttachedTable<Table> slot;
  return slot;
}

template <class Table> void attach_kernel_table(const pybind11::capsule& capsule) {
  const char* name = capsule.name();
  TORCH_CHECK(name != nullptr && std::strcmp(name, Table::kName) == 0, "semiring_ops: attach() expects the capsule ",
              Table::kName, " of the kernels' module, got ", name ? name : "an unnamed capsule");
  attached_table<Table>() = {*static_cast<const Table*>(capsule.get_pointer()), true};
}

template <class Table> const Table& kernels() {
  const AttachedTable<Table>& slot = attached_table<Table>();
  TORCH_CHECK(slot.attached, "semiring_ops: this autograd module is not attached to its kernels' module ",
              "(semiring_ops/build/backends.py attaches it when it loads it)");
  return slot.table;
}

}  // namespace semiring_ops

// The entry points the bmm nodes call, defined as calls through the attached table.
#define SEMIRING_OPS_DEFINE_BMM_THROUGH_TABLE                                                                     \
  namespace semiring_ops {                                                                                        \
  std::vector<at::Tensor> bmm_forward(const at::Tensor& a, const at::Tensor& b, int64_t semiring_id,              \
                                      bool with_arg) {                                                            \
    return kernels<BmmKernels>().bmm_forward_fn(a, b, semiring_id, with_arg);                                     \
  }                                                                                                               \
  std::vector<at::Tensor> log_bmm_grads(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,            \
                                        const at::Tensor& g, bool need_a, bool need_b) {                          \
    return kernels<BmmKernels>().log_bmm_grads_fn(a, b, c, g, need_a, need_b);                                   \
  }                                                                                                               \
  }

// The entry points the chain nodes and crf_forward call, defined as calls through the attached table.
#define SEMIRING_OPS_DEFINE_CHAIN_THROUGH_TABLE                                                                   \
  namespace semiring_ops {                                                                                        \
  std::vector<at::Tensor> chain_log_backward(const at::Tensor& emissions, const at::Tensor& transitions,          \
                                             const at::Tensor& start, const at::Tensor& end,                      \
                                             const at::Tensor& lengths, const at::Tensor& alpha,                  \
                                             const at::Tensor& log_z, const at::Tensor& grad,                     \
                                             const std::optional<at::Tensor>& tags) {                             \
    return kernels<ChainKernels>().chain_log_backward_fn(emissions, transitions, start, end, lengths, alpha,       \
                                                         log_z, grad, tags);                                      \
  }                                                                                                               \
  std::vector<at::Tensor> crf_log_likelihood(const at::Tensor& emissions, const at::Tensor& transitions,          \
                                             const at::Tensor& start, const at::Tensor& end,                      \
                                             const at::Tensor& lengths, const at::Tensor& tags) {                 \
    return kernels<ChainKernels>().crf_log_likelihood_fn(emissions, transitions, start, end, lengths, tags);      \
  }                                                                                                               \
  at::Tensor sequence_lengths(const std::optional<at::Tensor>& mask, const std::optional<at::Tensor>& lengths,    \
                              const std::optional<at::Tensor>& tags, int64_t batch, int64_t steps,                \
                              int64_t num_tags, bool raise_errors) {                                              \
    return kernels<ChainKernels>().sequence_lengths_fn(mask, lengths, tags, batch, steps, num_tags,               \
                                                       raise_errors);                                             \
  }                                                                                                               \
  }
