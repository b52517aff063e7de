// The CPU bmm family's kernels, one translation unit: torch's headers are most of each file's compile time, so the
// three files parsed once make a first logbmm's build ~10 s shorter on 2 cores (docs/perf_notes.md, "Compile time").
#include "cpu/bmm_forward_cpu.cpp"
#include "cpu/log_bmm_grads_cpu.cpp"
#include "cpu/log_contract_cpu.cpp"
