// The CPU chain family's kernels, one translation unit: torch's headers are most of each file's compile time, so the
// two files parsed once make a first CRF step's build shorter on 2 cores (docs/perf_notes.md, "Compile time").
#include "cpu/chain_cpu.cpp"
#include "cpu/sequence_cpu.cpp"
