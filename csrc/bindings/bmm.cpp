// The bmm family's module (CPU or CUDA, by the sources it is linked with): the semiring batched matmul and the
// log-weighted contraction its gradients are made of, the two gradients at once (contracts in ops.h), and, on CUDA,
// the forward recorded with its backward as one C++ autograd node (autograd/autograd.h; on the CPU the node is a
// module of its own, bindings/kernel_table.h).
#include "bindings/module.h"
#include "ops.h"
#ifdef SEMIRING_OPS_AUTOGRAD_APART
#include "bindings/kernel_table.h"
#else
#include "bindings/bmm_autograd.h"
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  semiring_ops::bind_common(m, "semiring_ops kernels: semiring batched matmul (one device type)");
  m.def("bmm_forward", &semiring_ops::bmm_forward,
        "Semiring batched matmul, forward: a (B, n, k), b (B, k, m) -> [out (B, n, m), arg (B, n, m) int64 or empty]",
        py::arg("a"), py::arg("b"), py::arg("semiring_id"), py::arg("with_arg"));
  m.def("log_contract", &semiring_ops::log_contract,
        "out[p, r, s] = sum_t L1[p, r, t] * R1[p, t, s] * exp(L0[p, r, t] + R0[p, t, s] + O0[p, r, s])",
        py::arg("l0"), py::arg("l1") = py::none(), py::arg("r0"), py::arg("r1") = py::none(), py::arg("o0"));
  m.def("log_bmm_grads", &semiring_ops::log_bmm_grads,
        "Both gradients of c = logbmm(a, b) given g = dL/dc -> [grad_a (B, n, k) or empty, grad_b (B, k, m) or empty]",
        py::arg("a"), py::arg("b"), py::arg("c"), py::arg("g"), py::arg("need_a"), py::arg("need_b"));
#ifdef SEMIRING_OPS_AUTOGRAD_APART
  m.def(
      "kernel_table",
      [] {
        static const semiring_ops::BmmKernels table{&semiring_ops::bmm_forward, &semiring_ops::log_bmm_grads};
        return semiring_ops::export_kernel_table(table);
      },
      "The entry points the autograd module's nodes call, as a capsule (bindings/kernel_table.h)");
#else
  semiring_ops::bind_bmm_autograd(m);
#endif
}
