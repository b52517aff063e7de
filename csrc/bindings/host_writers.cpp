// The host writers' module (CPU only): the block engine's copies of downloaded blocks into a host output
// (contracts in ops.h). Without the GIL, so several GPU workers' threads copy at once (as torch's copy_ does) and
// none holds up the others' launches while it writes.
#include "bindings/module.h"
#include "ops.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  semiring_ops::bind_common(m, "semiring_ops kernels: the block engine's host writers");
  m.def("condensed_scatter", &semiring_ops::condensed_scatter,
        "A block of a symmetric (n, n) output into its condensed vector (scipy pdist's layout), in place",
        py::arg("out"), py::arg("values"), py::arg("n"), py::arg("r0"), py::arg("c0"), py::arg("diagonal"),
        py::call_guard<py::gil_scoped_release>());
  m.def("stream_copy", &semiring_ops::stream_copy,
        "dst = src for dst a block of rows (each dst[i] contiguous) of src's shape and dtype, src contiguous: "
        "streaming stores from 1 MiB, in place",
        py::arg("dst"), py::arg("src"), py::call_guard<py::gil_scoped_release>());
}
