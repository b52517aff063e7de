// The CPU bmm family's autograd module (families.py: built after the kernels' module, in the background): the
// node of autograd/bmm_autograd.cpp, compiled in this one translation unit (torch's headers parsed once), calling
// the kernels through the table the kernels' module hands over (bindings/kernel_table.h).
#include "autograd/bmm_autograd.cpp"
#include "bindings/bmm_autograd.h"
#include "bindings/kernel_table.h"
#include "bindings/module.h"

SEMIRING_OPS_DEFINE_BMM_THROUGH_TABLE

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  semiring_ops::bind_common(m, "semiring_ops: the CPU bmm family's C++ autograd node");
  m.def("attach", &semiring_ops::attach_kernel_table<semiring_ops::BmmKernels>,
        "Attach to the kernels' module's kernel_table() capsule", pybind11::arg("kernel_table"));
  semiring_ops::bind_bmm_autograd(m);
}
