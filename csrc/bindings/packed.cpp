// The packed family's module (CUDA only): max-plus / min-plus bmm without an index, float32 and float16 / bfloat16
// pairs (contract in ops.h), and its tile shape, from which semiring_ops/build/backends.py decides when it pays.
#include "bindings/module.h"
#include "cuda/packed_select_shape.h"
#include "ops.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  semiring_ops::bind_common(m, "semiring_ops kernels: max / min bmm without an index, float32 and packed 16-bit (CUDA)");
  m.def("bmm_packed_select", &semiring_ops::bmm_packed_select,
        "Max-plus (is_max) / min-plus bmm without an index, float32 / float16 / bfloat16: a (B, n, k), b (B, k, m) -> "
        "out (B, n, m) float32",
        py::arg("a"), py::arg("b"), py::arg("is_max"));
  m.def(
      "tile_shape", [] { return py::make_tuple(semiring_ops::cuda::kPackedTileRows, semiring_ops::cuda::kPackedTileCols); },
      "(rows, columns) of the output tile one block computes");
}
