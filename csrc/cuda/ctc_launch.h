// CTC's launchers (ctc_kernels.cu), called by ctc_cuda.cpp. ATen-free: CtcArgs (ctc_dp.h) is plain data.
#pragma once

#include <cstdint>

#include "ctc_dp.h"
#if !defined(__CUDACC_RTC__)
#include "cuda/launch_status.h"
#endif

namespace semiring_ops {
namespace cuda {

// The largest K = 2 S + 1 the kernels take: an item's rows and staged inputs live in shared memory (17 K values
// and 3 K int32: 160 KiB in float32 at K = 2,047, 148 KiB in float64 at K = 1,023): targets of up to 1,023 labels
// in float32, 511 in float64, within the A100's, H100's and H200's 163-227 KiB a block. (GPUs of 99 KiB, compute
// capability 8.6 / 8.9, take 631 labels in float32, 340 in float64: alignment/ctc.py's fused_ok reads the device's
// shared memory and sends longer targets to the structure's PyTorch program; ctc_dp.h, ctc_scratch_bytes.)
template <class T> constexpr int64_t ctc_max_states() { return sizeof(T) == 4 ? 2047 : 1023; }

#if !defined(__CUDACC_RTC__)
// The log program (ctc_dp.h) over a.N items (with a.rows: its state occupancies), one block each or, on sm_90+, a
// cluster of blocks each (a.cluster is the launcher's; forced_cluster: SEMIRING_OPS_CTC_CLUSTER, 0 to choose); T in
// {float, double}; the host has filled and checked the arguments.
template <class T> LaunchStatus ctc_log_launch(const CtcArgs<T>& a, int forced_cluster, cudaStream_t stream);

// The collection of the state occupancies a.rows per label, times a.weight, into a.occupancy (every entry), a block
// per item and 64 frames.
template <class T> LaunchStatus ctc_collect_launch(const CtcArgs<T>& a, cudaStream_t stream);

// The max program (best paths), one block an item.
template <class T> LaunchStatus ctc_viterbi_launch(const CtcArgs<T>& a, cudaStream_t stream);
#endif

}  // namespace cuda
}  // namespace semiring_ops
