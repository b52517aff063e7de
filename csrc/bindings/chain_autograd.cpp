// The CPU chain family's autograd module (families.py: built after the kernels' module, in the background): the
// nodes of autograd/chain_autograd.cpp and LinearChainCRF.forward in one call (autograd/crf_forward.cpp), compiled
// in this one translation unit (torch's headers parsed once), calling the kernels through the table the kernels'
// module hands over (bindings/kernel_table.h).
#include "autograd/chain_autograd.cpp"
#include "autograd/crf_forward.cpp"
#include "bindings/chain_autograd.h"
#include "bindings/kernel_table.h"
#include "bindings/module.h"

SEMIRING_OPS_DEFINE_CHAIN_THROUGH_TABLE

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  semiring_ops::bind_common(m, "semiring_ops: the CPU chain family's C++ autograd nodes");
  m.def("attach", &semiring_ops::attach_kernel_table<semiring_ops::ChainKernels>,
        "Attach to the kernels' module's kernel_table() capsule", pybind11::arg("kernel_table"));
  semiring_ops::bind_chain_autograd(m);
}
