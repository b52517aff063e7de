// CTC's kernels (the programs in ctc_dp.h; host side ctc_cuda.cpp): one block per item, a thread per state
// (strided past 1,024 states), the item's rows, staged inputs, labels and label chains in dynamic shared memory; on
// sm_90+, when the items leave multiprocessors idle, the log program takes a thread block cluster of up to 8 blocks
// an item instead (ClusterTeam: each block a slice of the states); and the collection of the state occupancies per
// label (the loss's backward): a block per item and 64 frames.
// And RNN-T's lattice kernel (rnnt_dp.h): one block per item, its threads striding over an anti-diagonal's cells,
// alpha and beta in global scratch (a diagonal reads the one before, written by the block's other threads before
// the barrier).
// A step's inputs from global memory (its frames' emissions and, in pass 2, the stored rows) are copied into
// shared memory by cp.async kCtcStages - 1 steps before (ctc_dp.h): the steps' chain of dependent work never waits
// on global memory.
#include <cstddef>
#include <cstdint>

#include "cuda/cluster.cuh"
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
struct BlockTeam : CtcWholeItem<BlockTeam> {
  __device__ int rank() const { return int(threadIdx.x); }
  __device__ int size() const { return int(blockDim.x); }
  __device__ void barrier() const { __syncthreads(); }
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

// A block of a cluster that shares an item (sm_90+): the item's states split into contiguous slices, one a block
// (balanced, each of at least 2 states: a slice reads only its neighbours' last two); after computing a state next to
// a neighbour's slice, its thread writes it into that neighbour's row (st.async into distributed shared memory),
// counted by the neighbour's mbarrier of the step that reads it; a step waits on its own. Steps g alternate between
// two mbarriers (g odd: bars[1], even: bars[0]), one phase a use: a phase expects its bytes (one arrival, by thread
// 0, after the block's barrier of step g - 2, when every thread has seen that step's phase complete), and completes
// when the neighbours' writes are in. No cluster-wide barrier in the steps (its release fence would wait for every
// store of the stored rows in flight); one before the first step (the mbarriers set up), two at the total and one
// at the end (no block leaves while a neighbour may read its shared memory).
template <class T> struct ClusterTeam : BlockTeam {
  uint64_t* bars;  // two mbarriers in shared memory
  int crank, csize;
  __device__ ClusterTeam(uint64_t* b, int size) : bars(b), crank(cluster_rank()), csize(size) {
    if (threadIdx.x == 0) {
      barrier_init(bars, 1);
      barrier_init(bars + 1, 1);
    }
  }
  __device__ bool leads_item() const { return threadIdx.x == 0 && crank == 0; }
  __device__ unsigned halo_bytes(const CtcSlice& sl) const {
    return unsigned(((sl.left ? 2 : 0) + (sl.right ? 2 : 0)) * sizeof(T));
  }
  __device__ CtcSlice slice(int K) const {
    const int active = csize < K / 2 ? csize : (K / 2 > 1 ? K / 2 : 1);
    CtcSlice sl;
    sl.lo = crank < active ? int(int64_t(crank) * K / active) : K;
    sl.hi = crank < active ? int(int64_t(crank + 1) * K / active) : K;
    sl.left = crank > 0 && crank < active;
    sl.right = crank + 1 < active;
    if (threadIdx.x == 0) {  // steps 1 and 2
      barrier_expect(bars + 1, halo_bytes(sl));
      barrier_expect(bars, halo_bytes(sl));
    }
    cluster_sync();  // every block's mbarriers set up before any neighbour writes
    return sl;
  }
  __device__ void pass_on(const CtcSlice& sl, int64_t g, T* an, T* bn, int s, T va, T vb) const {
    const uint32_t bar = shared_address(bars + ((g + 1) & 1));  // (step g + 1's)
    if (sl.left && s < sl.lo + 2)  // beta, to the block before
      store_async(peer_address(shared_address(bn + s), crank - 1), vb, peer_address(bar, crank - 1));
    if (sl.right && s >= sl.hi - 2)  // alpha, to the block after
      store_async(peer_address(shared_address(an + s), crank + 1), va, peer_address(bar, crank + 1));
  }
  __device__ void wait_inputs(int64_t g) const {
    if (g > 0) barrier_wait(bars + (g & 1), unsigned((g - 1) / 2) & 1u);
  }
  __device__ void step_done(const CtcSlice& sl, int64_t g) const {
    if (g > 0 && threadIdx.x == 0) barrier_expect(bars + (g & 1), halo_bytes(sl));  // step g + 2's
  }
  template <bool kMax> __device__ T share(T v, T* cell) const {
    if (threadIdx.x == 0) *cell = v;
    cluster_sync();
    T r = kMax ? -pos_inf<T>() : T(0);
    for (int q = 0; q < csize; ++q) {  // (in rank order: every block gets the same sum)
      const T x = *cluster_peer(cell, q);
      r = kMax ? ((x > r || is_nan(x)) ? x : r) : r + x;
    }
    return r;
  }
  __device__ T share_max(T v, T* cell) const { return share<true>(v, cell); }
  __device__ T share_sum(T v, T* cell) const { return share<false>(v, cell); }
  __device__ void finish() const {
    cluster_sync();
    if (threadIdx.x == 0) {
      barrier_inval(bars);
      barrier_inval(bars + 1);
    }
  }
};

// kMinBlocks: the blocks of max_threads<T>() a multiprocessor must hold at once, which caps the registers (ptxas,
// given the thread bound alone, aims at 2: 32 registers a float32 thread, 64 a float64 one, which spills 8-32 bytes in
// the log-sum-exps). ctc_log_launch takes 1 when every item has a multiprocessor of its own (float64 116 registers,
// no spill: 7% faster at T = 4,000, N = 16) and 2 when items queue for them (then the second block hides the
// first's latency: 15% faster in float64 at N = 1,024; docs/perf_notes.md).
// kCluster: a.cluster blocks an item (ClusterTeam).
template <class T, int kMinBlocks, bool kCluster>
__global__ void __launch_bounds__(max_threads<T>(), kMinBlocks) ctc_log_kernel(CtcArgs<T> a) {
  if constexpr (kCluster) {
    __shared__ uint64_t bars[2];
    const ClusterTeam<T> team(bars, int(a.cluster));
    ctc_log_item<T>(team, a, carve<T>(a.K), blockIdx.x / a.cluster);
    team.finish();
  } else {
    ctc_log_item<T>(BlockTeam{}, a, carve<T>(a.K), blockIdx.x);
  }
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

namespace ctc {

constexpr int kMaxCluster = 8;        // portable
constexpr int kMinClusterSlice = 64;  // states a block of a cluster computes, at least

// Blocks an item, before the occupancy check (choose_cluster): 1 before sm_90 (the caller's test); else forced
// (SEMIRING_OPS_CTC_CLUSTER, checked by the host: measurements and tests) or the most, up to 8, that keep every item
// on blocks of its own (N c <= multiprocessors) and >= kMinClusterSlice states a block. A long item's steps then run
// on c multiprocessors, which is what its sequential depth needs (docs/perf_notes.md).
inline int first_cluster(int64_t N, int64_t K, int sms, int forced) {
  if (N * kMaxCluster > 0x7fffffff) return 1;
  if (forced > 0) return forced;
  return int(std::max<int64_t>(1, std::min<int64_t>({kMaxCluster, sms / N, K / kMinClusterSlice})));
}

// first (first_cluster's), less one until the GPU runs the N clusters at once (a GPC's free multiprocessors bound
// them: 16 clusters of 7 or 8 blocks do not all run at once on the H200; forced: until it runs one).
template <class T> int choose_cluster(int64_t N, int64_t K, int first, int forced, const void* kernel, int device) {
  int c = first;
  for (; c > 1; --c) {
    const int threads = threads_for<T>((K + c - 1) / c);
    const int active = max_active_clusters(kernel, c, threads, scratch_bytes<T>(K, true), device);
    if (active > 0 && (active >= N || forced > 0)) break;
  }
  return c;
}

}  // namespace ctc

template <class T> LaunchStatus ctc_log_launch(const CtcArgs<T>& args, int forced_cluster, cudaStream_t stream) {
  const LaunchStatus states = ctc::check_states<T>(args.K);
  if (states.refusal != nullptr || args.N == 0) return states;
  int device = 0, multiprocessors = 0, major = 0;
  SEMIRING_OPS_CUDA_TRY(cudaGetDevice(&device));
  SEMIRING_OPS_CUDA_TRY(device_attribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device));
  SEMIRING_OPS_CUDA_TRY(device_attribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CtcArgs<T> a = args;
  a.cluster = 1;
  const int first = major >= 9 ? ctc::first_cluster(a.N, a.K, multiprocessors, forced_cluster) : 1;
  if (first > 1) {
    const void* clustered =
        SEMIRING_OPS_CTC_KERNEL(ctc_log_kernel, T, SEMIRING_OPS_VALUE(1), SEMIRING_OPS_VALUE(true));
    const size_t smem = ctc::scratch_bytes<T>(a.K, true);
    if (smem > 48 * 1024) SEMIRING_OPS_CUDA_TRY(allow_dynamic_smem(clustered, int(smem)));
    const int cluster = ctc::choose_cluster<T>(a.N, a.K, first, forced_cluster, clustered, device);
    if (cluster > 1) {
      a.cluster = cluster;
      const ClusterLaunch launch(cluster, dim3(unsigned(a.N * cluster)),
                                 dim3(ctc::threads_for<T>((a.K + cluster - 1) / cluster)), smem, stream);
      void* params[] = {&a};
      SEMIRING_OPS_CUDA_TRY(cudaLaunchKernelExC(&launch.cfg, clustered, params));
      return last_launch();
    }
  }  // else (no cluster fits) one block an item
  const dim3 items(unsigned(a.N));
  const void* kernel =
      a.N <= multiprocessors
          ? SEMIRING_OPS_CTC_KERNEL(ctc_log_kernel, T, SEMIRING_OPS_VALUE(1), SEMIRING_OPS_VALUE(false))
          : SEMIRING_OPS_CTC_KERNEL(ctc_log_kernel, T, SEMIRING_OPS_VALUE(2), SEMIRING_OPS_VALUE(false));
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

template LaunchStatus ctc_log_launch<float>(const CtcArgs<float>&, int, cudaStream_t);
template LaunchStatus ctc_log_launch<double>(const CtcArgs<double>&, int, cudaStream_t);
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
