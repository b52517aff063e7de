// CTC's kernels (the programs in ctc_dp.h; host side ctc_cuda.cpp): one block per item, a thread per state
// (strided past 1,024 states), the item's rows, staged inputs, labels and label chains in dynamic shared memory;
// and the collection of the state occupancies per label (the loss's backward): a block per item and 64 frames.
// And RNN-T's lattice kernel (rnnt_dp.h): one block per item, its threads striding over an anti-diagonal's cells,
// alpha and beta in global scratch (a diagonal reads the one before, written by the block's other threads before
// the barrier).
// A step's inputs from global memory (its frames' emissions and, in pass 2, the stored rows) are copied into
// shared memory by cp.async kCtcStages - 1 steps before (ctc_dp.h), and L2 is asked for those 8 frames ahead
// (prefetch.global.L2): the steps' chain of dependent work never waits on global memory.
#include <cstddef>
#include <cstdint>

#include "cuda/ctc_launch.h"
#include "cuda/kernel_ref.h"
#include "cuda/rnnt_launch.h"
#if SEMIRING_OPS_DEVICE_PASS
#include <cuda_pipeline.h>
#endif
#if !defined(__CUDACC_RTC__)
#include <algorithm>

#include "cuda/device_attributes.h"
#endif

namespace semiring_ops {
namespace cuda {
namespace ctc {  // named (not anonymous), so that NVRTC can name the kernels

template <class T> size_t scratch_bytes(int64_t K, bool programs) { return size_t(ctc_scratch_bytes<T>(K, programs)); }

// Frames a block of the collection takes (its labels and chains set up once for them).
constexpr int64_t kCollectFrames = 64;

// Threads a block: a state each up to 1,024 (float32) or 512 (float64: its registers, 64 a thread at 1,024).
template <class T> constexpr int max_threads() { return sizeof(T) == 4 ? 1024 : 512; }

#if SEMIRING_OPS_DEVICE_PASS
// The block as ctc_dp.h's team: lead_sum / lead_max reduce on the first warp (their result valid on thread 0).
struct BlockTeam {
  __device__ int rank() const { return int(threadIdx.x); }
  __device__ int size() const { return int(blockDim.x); }
  __device__ void barrier() const { __syncthreads(); }
  __device__ void prefetch(const void* p) const { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }
  __device__ int lane() const { return int(threadIdx.x % 32); }
  __device__ int warp() const { return int(threadIdx.x / 32); }
  __device__ int warps() const { return int((blockDim.x + 31) / 32); }
  // the thread's own copies global -> shared (cp.async: no register round trip, no stall until the wait)
  template <class T> __device__ void copy_async(T* dst, const T* src) const {
    __pipeline_memcpy_async(dst, src, sizeof(T));
  }
  __device__ void commit_copies() const { __pipeline_commit(); }
  // waits for the thread's copy groups but the kCtcStages - 2 latest (a step's, with those of later steps in flight)
  __device__ void wait_copies() const { __pipeline_wait_prior(kCtcStages - 2); }
  template <class T> __device__ T warp_sum(T v) const {
    for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
    return v;
  }
  template <class F> __device__ auto lead_sum(int64_t n, F f) const -> decltype(f(0)) {
    using T = decltype(f(0));
    T v = T(0);
    if (threadIdx.x >= 32) return v;
    for (int64_t i = threadIdx.x; i < n; i += 32) v += f(i);
    for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
    return v;
  }
  template <class F> __device__ auto lead_max(int64_t n, F f) const -> decltype(f(0)) {
    using T = decltype(f(0));
    T v = -pos_inf<T>();
    if (threadIdx.x >= 32) return v;
    for (int64_t i = threadIdx.x; i < n; i += 32) {
      const T x = f(i);
      v = (x > v || is_nan(x)) ? x : v;
    }
    for (int d = 16; d > 0; d >>= 1) {
      const T x = __shfl_xor_sync(0xffffffffu, v, d);
      v = (x > v || is_nan(x)) ? x : v;
    }
    return v;
  }
};

// The scratch in dynamic shared memory: ctc_dp.h's int32 entries, then (16-byte aligned) its values
// (ctc_scratch_bytes).
template <class T> __device__ CtcScratch<T> carve(int64_t K) {
  extern __shared__ __align__(16) unsigned char smem[];
  return ctc_carve<T>(reinterpret_cast<int32_t*>(smem), reinterpret_cast<T*>(smem + ctc_values_offset(K)), K);
}

// kMinBlocks: the blocks of max_threads<T>() a multiprocessor must hold at once, which caps the registers (ptxas,
// given the thread bound alone, aims at 2: 32 registers a float32 thread, 64 a float64 one, which spills 8-32 bytes in
// the log-sum-exps). ctc_log_launch takes 1 when every item has a multiprocessor of its own (float64 116 registers,
// no spill: 7% faster at T = 4,000, N = 16) and 2 when items queue for them (then the second block hides the
// first's latency: 15% faster in float64 at N = 1,024; docs/perf_notes.md).
template <class T, int kMinBlocks>
__global__ void __launch_bounds__(max_threads<T>(), kMinBlocks) ctc_log_kernel(CtcArgs<T> a) {
  ctc_log_item<T>(BlockTeam{}, a, carve<T>(a.K), blockIdx.x);
}

template <class T> __global__ void __launch_bounds__(max_threads<T>()) ctc_collect_kernel(CtcArgs<T> a) {
  const int64_t t0 = int64_t(blockIdx.y) * kCollectFrames;
  ctc_collect_frames<T>(BlockTeam{}, a, carve<T>(a.K), blockIdx.x, t0, t0 + kCollectFrames);
}

template <class T> __global__ void __launch_bounds__(max_threads<T>()) ctc_viterbi_kernel(CtcArgs<T> a) {
  ctc_viterbi_item<T>(BlockTeam{}, a, carve<T>(a.K), blockIdx.x);
}

template <class T, bool kMax> __global__ void rnnt_lattice_kernel(RnntArgs<T> a) {
  rnnt_item<kMax>(BlockTeam{}, a, int64_t(blockIdx.x));
}

#endif  // SEMIRING_OPS_DEVICE_PASS

}  // namespace ctc

#if !defined(__CUDACC_RTC__)
namespace ctc {

template <class T> int threads_for(int64_t K) {
  // as few threads as take the states in the fewest rounds (K = 1,601: 832 threads of 2 states, not 1,024 of
  // which some have one: the barrier waits for the two-state threads either way)
  const int64_t rounds = (K + max_threads<T>() - 1) / max_threads<T>();
  return int(std::max<int64_t>(32, ((K + rounds - 1) / rounds + 31) / 32 * 32));
}

template <class T>
LaunchStatus launch(const void* kernel, const CtcArgs<T>& a, dim3 grid, bool programs, cudaStream_t stream) {
  const size_t smem = scratch_bytes<T>(a.K, programs);
  if (smem > 48 * 1024) SEMIRING_OPS_CUDA_TRY(allow_dynamic_smem(kernel, int(smem)));
  SEMIRING_OPS_CUDA_TRY(launch_kernel(kernel, grid, dim3(threads_for<T>(a.K)), smem, stream, a));
  return last_launch();
}

template <class T> LaunchStatus check_states(int64_t K) {
  return K > ctc_max_states<T>() ? refused("targets too long: more than 1,023 labels in float32, 511 in float64 "
                                           "(the states' rows exceed shared memory)")
                                 : LaunchStatus{};
}

}  // namespace ctc

#define SEMIRING_OPS_CTC_KERNEL(kernel, ...) SEMIRING_OPS_KERNEL_OF("cuda/ctc_kernels.cu", ctc::kernel, __VA_ARGS__)

template <class T> LaunchStatus ctc_log_launch(const CtcArgs<T>& a, cudaStream_t stream) {
  const LaunchStatus states = ctc::check_states<T>(a.K);
  if (states.refusal != nullptr || a.N == 0) return states;
  int multiprocessors = 0;
  SEMIRING_OPS_CUDA_TRY(current_device_attribute(&multiprocessors, cudaDevAttrMultiProcessorCount));
  const dim3 items(unsigned(a.N));
  const void* kernel = a.N <= multiprocessors ? SEMIRING_OPS_CTC_KERNEL(ctc_log_kernel, T, SEMIRING_OPS_VALUE(1))
                                              : SEMIRING_OPS_CTC_KERNEL(ctc_log_kernel, T, SEMIRING_OPS_VALUE(2));
  return ctc::launch(kernel, a, items, true, stream);
}

template <class T> LaunchStatus ctc_collect_launch(const CtcArgs<T>& a, cudaStream_t stream) {
  const LaunchStatus states = ctc::check_states<T>(a.K);
  if (states.refusal != nullptr || a.N == 0 || a.T_ == 0) return states;
  const dim3 grid(unsigned(a.N), unsigned((a.T_ + ctc::kCollectFrames - 1) / ctc::kCollectFrames));
  return ctc::launch(SEMIRING_OPS_CTC_KERNEL(ctc_collect_kernel, T), a, grid, false, stream);
}

template <class T> LaunchStatus ctc_viterbi_launch(const CtcArgs<T>& a, cudaStream_t stream) {
  const LaunchStatus states = ctc::check_states<T>(a.K);
  if (states.refusal != nullptr || a.N == 0) return states;
  return ctc::launch(SEMIRING_OPS_CTC_KERNEL(ctc_viterbi_kernel, T), a, dim3(unsigned(a.N)), true, stream);
}

template LaunchStatus ctc_log_launch<float>(const CtcArgs<float>&, cudaStream_t);
template LaunchStatus ctc_log_launch<double>(const CtcArgs<double>&, cudaStream_t);
template LaunchStatus ctc_collect_launch<float>(const CtcArgs<float>&, cudaStream_t);
template LaunchStatus ctc_collect_launch<double>(const CtcArgs<double>&, cudaStream_t);
template LaunchStatus ctc_viterbi_launch<float>(const CtcArgs<float>&, cudaStream_t);
template LaunchStatus ctc_viterbi_launch<double>(const CtcArgs<double>&, cudaStream_t);

template <class T> LaunchStatus rnnt_lattice_launch(const RnntArgs<T>& a, bool max, cudaStream_t stream) {
  if (a.B == 0) return {};
  if (a.B > 0x7fffffff) return refused("at most 2^31 - 1 items");
  // threads: the widest diagonal's cells (U + 1), in whole warps, at most 512
  const int threads = int(std::min<int64_t>(512, (std::max<int64_t>(a.U1, 1) + 31) / 32 * 32));
  const void* kernel = max ? SEMIRING_OPS_CTC_KERNEL(rnnt_lattice_kernel, T, SEMIRING_OPS_VALUE(true))
                           : SEMIRING_OPS_CTC_KERNEL(rnnt_lattice_kernel, T, SEMIRING_OPS_VALUE(false));
  SEMIRING_OPS_CUDA_TRY(launch_kernel(kernel, dim3(unsigned(a.B)), dim3(threads), 0, stream, a));
  return last_launch();
}

template LaunchStatus rnnt_lattice_launch<float>(const RnntArgs<float>&, bool, cudaStream_t);
template LaunchStatus rnnt_lattice_launch<double>(const RnntArgs<double>&, bool, cudaStream_t);

#undef SEMIRING_OPS_CTC_KERNEL
#endif  // !__CUDACC_RTC__

}  // namespace cuda
}  // namespace semiring_ops
