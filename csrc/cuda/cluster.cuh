// Thread block clusters (sm_90+), shared by the kernels that split one problem over several blocks (the fused
// chains, chain_kernels.cuh; CTC's log program, ctc_kernels.cu): the device helpers (a block's rank, the
// cluster-wide barrier, peers' shared memory, mbarriers counting st.async writes) and the host's launch of 1-D
// clusters with its occupancy query. Before sm_90 the device helpers are no-ops (a rank of 0, a block barrier): the
// hosts launch clusters only from sm_90 on.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/kernel_ref.h"
#if SEMIRING_OPS_DEVICE_PASS && !defined(__CUDACC_RTC__)
#include <cooperative_groups.h>  // NVRTC: its header needs libcu++; the helpers below use PTX there
#endif
#if !defined(__CUDACC_RTC__)
#include "cuda/device_attributes.h"
#endif

namespace semiring_ops {
namespace cuda {

#if SEMIRING_OPS_DEVICE_PASS

// Thread block clusters (sm_90+; the host launches clusters only there). cluster_sync: the cluster-wide
// barrier (release / acquire; costly: its fence waits for every global store in flight, so it runs only
// at the start and the end of a kernel). Each step's outputs instead travel as st.async writes into the
// peers' shared memory, each counted (complete_tx) by the receiving block's mbarrier for that buffer;
// the receiver waits on its own mbarrier's phase. Under NVRTC (no cooperative_groups) the same three operations
// are their PTX: %cluster_ctarank, barrier.cluster.arrive / wait (release / acquire), mapa.
__device__ __forceinline__ int cluster_rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDACC_RTC__)
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return static_cast<int>(rank);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return static_cast<int>(cooperative_groups::this_cluster().block_rank());
#else
  return 0;
#endif
}

__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDACC_RTC__)
  asm volatile("barrier.cluster.arrive;\n\tbarrier.cluster.wait;" ::: "memory");
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cooperative_groups::this_cluster().sync();
#else
  __syncthreads();
#endif
}

template <class X> __device__ __forceinline__ X* cluster_peer(X* ours, int rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDACC_RTC__)
  X* peer;
  asm volatile("mapa.u64 %0, %1, %2;" : "=l"(peer) : "l"(ours), "r"(rank));
  return peer;
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return cooperative_groups::this_cluster().map_shared_rank(ours, static_cast<unsigned>(rank));
#else
  return ours;
#endif
}

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Our shared-memory address `local` as seen in block `rank` of the cluster.
__device__ __forceinline__ uint32_t peer_address(uint32_t local, int rank) {
  uint32_t remote = local;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
#endif
  return remote;
}

__device__ __forceinline__ void barrier_init(uint64_t* bar, unsigned arrivals) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(arrivals) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// Ends an mbarrier's life: its shared memory may then hold anything else (PTX: an mbarrier object must be
// invalidated before its memory is repurposed; the next block on this SM reuses it).
__device__ __forceinline__ void barrier_inval(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(shared_address(bar)) : "memory");
#endif
}

// One arrival that also announces `bytes` more to come (the phase completes when both are in).
__device__ __forceinline__ void barrier_expect(uint64_t* bar, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(bar)), "r"(bytes)
               : "memory");
#endif
}

// Waits for the phase of `bar` with this parity. Acquire at cluster scope: the phase completes by the peers'
// st.async complete_tx, releases at cluster scope, and only an acquire of that scope makes their data (and
// their earlier reads of the buffers this block writes next) ordered before what follows.
__device__ __forceinline__ void barrier_wait(uint64_t* bar, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t addr = shared_address(bar);
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
  }
#endif
}

// x (float or double) into a peer's shared memory at `remote`, counted by the peer's mbarrier at
// `remote_bar`.
template <class T> __device__ __forceinline__ void store_async(uint32_t remote, T x, uint32_t remote_bar) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "32- or 64-bit values");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (sizeof(T) == 4) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(remote),
                 "r"(__float_as_uint(x)), "r"(remote_bar)
                 : "memory");
  } else {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [%0], %1, [%2];" ::"r"(remote),
                 "l"(__double_as_longlong(x)), "r"(remote_bar)
                 : "memory");
  }
#endif
}

#endif  // SEMIRING_OPS_DEVICE_PASS

#if !defined(__CUDACC_RTC__)
// A launch of 1-D clusters of K blocks (cudaLaunchKernelEx / cudaOccupancyMaxActiveClusters); not copyable:
// the config points at its own attribute.
struct ClusterLaunch {
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr{};
  ClusterLaunch(int K, dim3 grid, dim3 block, size_t smem, cudaStream_t stream) {
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = K;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

// How many K-block clusters of `kernel` the GPU runs at once (0: it cannot launch them), cached per device.
inline int max_active_clusters(const void* kernel, int K, int threads, size_t smem, int device) {
  const ClusterLaunch launch(K, dim3(K), dim3(threads), smem, nullptr);
  return cuda::max_active_clusters(kernel, launch.cfg, K, device);
}
#endif  // !__CUDACC_RTC__

}  // namespace cuda
}  // namespace semiring_ops
