// The span structures' kernels (semiring_ops::span_inside and span_adjoint: contracts in ops.h; host side
// span_cuda.cpp; launcher span_launch.h, instantiated per semiring by span_kernels_*.cu; the dynamic programs in
// span_dp.h): one thread block per batch item, its warps the teams (a warp reduces one span at a time, its
// lanes over the split points), a __syncthreads between the phases of a width. 256 threads; 1024 for the
// semi-Markov program over more than 8 labels (one warp per label: a position's labels in one round). The charts live in global
// memory (L2-resident at the sizes these structures have: 4 (N + 1)^2 values per item).
// The linear chain (chain_dp.h) has its own launches: the alpha and (log) beta passes as two blocks per item, 8
// lanes a label up to 64 labels (else a warp), the rows in shared memory and the tiles of edges staged there up to
// 3 steps ahead by asynchronous copies; its backward is one pass over the cells (log) or the path's steps. The
// alignment (alignment_dp.h): one block per item, a thread per cell of an anti-diagonal.
#pragma once

#include <cstdint>

#include "cuda/kernel_ref.h"
#include "cuda/span_launch.h"
#include "span_dp.h"
#if SEMIRING_OPS_DEVICE_PASS
#include <cuda_pipeline.h>

#include "alignment_dp.h"
#include "chain_dp.h"
#include "warp_merge.cuh"
#endif
#if !defined(__CUDACC_RTC__)
#include <algorithm>

#include "cuda/device_attributes.h"
#endif

namespace semiring_ops {
namespace cuda {
namespace span {  // named (not anonymous), so that NVRTC can name the kernels

#if SEMIRING_OPS_DEVICE_PASS
template <int kThreads> struct WarpTeam {
  int lane, warp;
  __device__ int rank() const { return lane; }
  __device__ int size() const { return 32; }
  __device__ int group() const { return warp; }
  __device__ int groups() const { return kThreads / 32; }
  template <class Acc> __device__ Acc all_reduce(Acc acc) const {
    warp_merge(acc);
    return acc;
  }
  __device__ void barrier() const { __syncthreads(); }
};

template <class S, class T, int kThreads> __global__ void __launch_bounds__(kThreads) span_inside_kernel(SpanArgs<T> a) {
  span_inside_item<S, T>(WarpTeam<kThreads>{int(threadIdx.x % 32), int(threadIdx.x / 32)}, a, blockIdx.x);
}

template <class S, class T, int kThreads>
__global__ void __launch_bounds__(kThreads) span_adjoint_kernel(SpanArgs<T> a) {
  span_adjoint_item<S, T>(WarpTeam<kThreads>{int(threadIdx.x % 32), int(threadIdx.x / 32)}, a, blockIdx.x);
}

// ---------------------------------------------------------------- the alignment

// One thread a cell (a cell reduces three or four terms): the block's threads are the item's teams.
struct ThreadTeam {
  __device__ int rank() const { return 0; }
  __device__ int size() const { return 1; }
  __device__ int group() const { return int(threadIdx.x); }
  __device__ int groups() const { return int(blockDim.x); }
  template <class Acc> __device__ Acc all_reduce(const Acc& acc) const { return acc; }
  __device__ void barrier() const { __syncthreads(); }
};

template <class S, class T> __global__ void __launch_bounds__(1024) alignment_inside_kernel(SpanArgs<T> a) {
  alignment_inside_item<S, T>(ThreadTeam{}, a, blockIdx.x);
}

template <class S, class T> __global__ void __launch_bounds__(1024) alignment_adjoint_kernel(SpanArgs<T> a) {
  alignment_adjoint_item<S, T>(ThreadTeam{}, a, blockIdx.x);
}

// ---------------------------------------------------------------- the linear chain

// The (C, C) tiles of the next kStages - 1 steps in shared memory, rows padded to C + 1 (a team reading a column
// spreads over the banks), filled by asynchronous copies: ready(i) waits for step i's tile (one commit group per
// step, empty past the last, so the count is uniform), and after the step's barrier starts the copy of step
// i + stages - 1 into the slot that step i - 1 read (every thread is past it).
template <class T> struct StagedTiles {
  ChainEdges<T> edges;
  T* buf;  // stages x C x (C + 1)
  int C, stages;
  int64_t first = 0, steps = 0, dir = 1;
  __device__ T* slot(int64_t i) const { return buf + (i % stages) * C * (C + 1); }
  __device__ void fetch(int64_t i) {  // step i's copies, one commit group
    if (i < steps) {
      T* tile = slot(i);
      const T* src = edges.data + (first + dir * i) * edges.s1;
      for (int k = threadIdx.x; k < C * C; k += blockDim.x) {
        const int c = k / C, cp = k - c * C;
        __pipeline_memcpy_async(tile + c * (C + 1) + cp, src + c * edges.s2 + cp * edges.s3, sizeof(T));
      }
    }
    __pipeline_commit();
  }
  template <class Team> __device__ void begin(const Team&, int64_t first_step, int64_t count, int64_t direction) {
    first = first_step, steps = count, dir = direction;
    for (int64_t i = 0; i + 1 < stages; ++i) fetch(i);
  }
  template <class Team> __device__ void ready(const Team& team, int64_t i) {
    if (stages == 4)  // (wait_prior takes a constant: the stages - 2 later steps' groups may stay in flight)
      __pipeline_wait_prior(2);
    else if (stages == 3)
      __pipeline_wait_prior(1);
    else
      __pipeline_wait_prior(0);
    team.barrier();
    fetch(i + stages - 1);
  }
  __device__ T operator()(int64_t n, int64_t c, int64_t cp) const { return slot((n - first) * dir)[c * (C + 1) + cp]; }
};

// kLanes consecutive lanes of a warp reduce one label together (4 to 32, a power of 2): fewer lanes per label
// than a warp means fewer merge rounds and fewer warps through each step's barrier when labels are few.
template <int kLanes> struct LaneTeam {
  int lane, team;
  __device__ int rank() const { return lane; }
  __device__ int size() const { return kLanes; }
  __device__ int group() const { return team; }
  __device__ int groups() const { return int(blockDim.x) / kLanes; }
  template <class Acc> __device__ Acc all_reduce(Acc acc) const {
    lane_merge<kLanes>(acc);
    return acc;
  }
  __device__ void barrier() const { __syncthreads(); }
};

// blockIdx.y is the pass (0: alpha, 1: beta). Dynamic shared memory: the 2 C rows, then `scratch` values: the
// `stages` tiles (kStaged), which chain_follow reuses once the alpha pass is done (max / min), or its own rows.
template <class S, class T, int kLanes, bool kStaged>
__global__ void __launch_bounds__(1024) chain_inside_kernel(SpanArgs<T> a, int64_t scratch, int stages) {
  extern __shared__ __align__(16) unsigned char chain_smem[];
  T* rows = reinterpret_cast<T*>(chain_smem);
  const LaneTeam<kLanes> team{int(threadIdx.x % kLanes), int(threadIdx.x / kLanes)};
  if constexpr (kStaged) {
    StagedTiles<T> tiles{chain_edges_of(a, blockIdx.x), rows + 2 * a.C, int(a.C), stages};
    chain_inside_item<S, T>(team, a, blockIdx.x, int(blockIdx.y), tiles, rows, rows + 2 * a.C, scratch / a.C);
  } else {
    DirectTiles<T> tiles{chain_edges_of(a, blockIdx.x)};
    chain_inside_item<S, T>(team, a, blockIdx.x, int(blockIdx.y), tiles, rows, rows + 2 * a.C, scratch / a.C);
  }
}

// The warps of an item's gridDim.y blocks as one set of teams (the backward needs no barrier).
struct GridTeam {
  int lane, warp;
  __device__ int rank() const { return lane; }
  __device__ int size() const { return 32; }
  __device__ int group() const { return int(blockIdx.y * (blockDim.x / 32)) + warp; }
  __device__ int groups() const { return int(gridDim.y * (blockDim.x / 32)); }
  template <class Acc> __device__ Acc all_reduce(Acc acc) const {
    warp_merge(acc);
    return acc;
  }
};

template <class S, class T> __global__ void __launch_bounds__(256) chain_adjoint_kernel(SpanArgs<T> a) {
  chain_adjoint_item<S, T>(GridTeam{int(threadIdx.x % 32), int(threadIdx.x / 32)}, a, blockIdx.x);
}

#endif  // SEMIRING_OPS_DEVICE_PASS

}  // namespace span

#if !defined(__CUDACC_RTC__)
#define SEMIRING_OPS_SPAN_KERNEL(kernel, ...) SEMIRING_OPS_KERNEL_OF("cuda/span_kernels.cuh", span::kernel, __VA_ARGS__)

// One block per item, a thread per cell of the longest anti-diagonal (at most min(N, M) cells).
template <class S, class T> LaunchStatus launch_alignment(bool adjoint, const SpanArgs<T>& a, int64_t B, cudaStream_t stream) {
  const int64_t cells = std::min(a.N, a.C);
  const int threads = int(std::min<int64_t>(1024, std::max<int64_t>(32, (cells + 31) / 32 * 32)));
  const void* kernel = adjoint ? SEMIRING_OPS_SPAN_KERNEL(alignment_adjoint_kernel, S, T)
                               : SEMIRING_OPS_SPAN_KERNEL(alignment_inside_kernel, S, T);
  SEMIRING_OPS_CUDA_TRY(launch_kernel(kernel, dim3(unsigned(B)), dim3(threads), 0, stream, a));
  return last_launch();
}

// The kernel with the 2 C rows and `scratch` values of dynamic shared memory.
template <class T>
LaunchStatus launch_with_smem(const void* kernel, dim3 grid, int threads, int64_t scratch, int stages, cudaStream_t stream,
                              const SpanArgs<T>& a) {
  const size_t smem = (2 * a.C + scratch) * sizeof(T);
  if (smem > 48 * 1024) SEMIRING_OPS_CUDA_TRY(allow_dynamic_smem(kernel, int(smem)));
  SEMIRING_OPS_CUDA_TRY(launch_kernel(kernel, grid, dim3(threads), smem, stream, a, scratch, stages));
  return last_launch();
}

constexpr size_t kMaxStagedBytes = 160 * 1024;

template <class S, class T> LaunchStatus launch_chain(bool adjoint, const SpanArgs<T>& a, int64_t B, cudaStream_t stream) {
  const int64_t C = a.C;
  if (adjoint) {  // log: a warp a step, an item's steps over up to 64 blocks of 8; max / min: one block an item
    const unsigned y = S::kSelects ? 1u : unsigned(std::min<int64_t>(64, std::max<int64_t>(1, (a.N - 1 + 7) / 8)));
    SEMIRING_OPS_CUDA_TRY(
        launch_kernel(SEMIRING_OPS_SPAN_KERNEL(chain_adjoint_kernel, S, T), dim3(unsigned(B), y), dim3(256), 0, stream, a));
    return last_launch();
  }
  const dim3 grid(unsigned(B), S::kSelects ? 1u : 2u);
  const int64_t tile = C * (C + 1);  // one staged step, padded
  int optin = 0;
  SEMIRING_OPS_CUDA_TRY(current_device_attribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin));
  const size_t budget = std::min(kMaxStagedBytes, size_t(optin));
  const int stages = int(std::min<int64_t>(4, int64_t(budget / sizeof(T) - 2 * C) / tile));
  if (stages >= 2 && C <= 64) {  // 8 lanes a label: C x 8 threads
    const int threads = int((C * 8 + 31) / 32 * 32);
    const void* kernel = SEMIRING_OPS_SPAN_KERNEL(chain_inside_kernel, S, T, SEMIRING_OPS_VALUE(8), SEMIRING_OPS_VALUE(true));
    return launch_with_smem(kernel, grid, threads, stages * tile, stages, stream, a);
  }
  if (stages >= 2) {
    const void* kernel = SEMIRING_OPS_SPAN_KERNEL(chain_inside_kernel, S, T, SEMIRING_OPS_VALUE(32), SEMIRING_OPS_VALUE(true));
    return launch_with_smem(kernel, grid, 1024, stages * tile, stages, stream, a);
  }
  // tiles read in place; chain_follow gets 16 KiB of rows (at least one)
  const int64_t follow = std::max<int64_t>(C, 16 * 1024 / sizeof(T) / C * C);
  if ((2 * C + follow) * sizeof(T) > 48 * 1024)
    return refused(sizeof(T) == 4 ? "a linear chain of at most 4096 labels in float32" : "a linear chain of at most 2048 labels in float64");
  const void* kernel = SEMIRING_OPS_SPAN_KERNEL(chain_inside_kernel, S, T, SEMIRING_OPS_VALUE(32), SEMIRING_OPS_VALUE(false));
  return launch_with_smem(kernel, grid, 1024, follow, 0, stream, a);
}

// One block per item, with the thread count of the module comment.
template <class S, class T> LaunchStatus span_launch(bool adjoint, const SpanArgs<T>& a, int64_t B, cudaStream_t stream) {
  if (a.structure == kSpanLinearChain) return launch_chain<S, T>(adjoint, a, B, stream);
  if (a.structure == kSpanAlignment) return launch_alignment<S, T>(adjoint, a, B, stream);
  const bool wide = a.structure == kSpanSemiMarkov && a.C > 8;  // a warp per label: 1024 threads
  const void* kernel =
      wide ? (adjoint ? SEMIRING_OPS_SPAN_KERNEL(span_adjoint_kernel, S, T, SEMIRING_OPS_VALUE(1024))
                      : SEMIRING_OPS_SPAN_KERNEL(span_inside_kernel, S, T, SEMIRING_OPS_VALUE(1024)))
           : (adjoint ? SEMIRING_OPS_SPAN_KERNEL(span_adjoint_kernel, S, T, SEMIRING_OPS_VALUE(256))
                      : SEMIRING_OPS_SPAN_KERNEL(span_inside_kernel, S, T, SEMIRING_OPS_VALUE(256)));
  SEMIRING_OPS_CUDA_TRY(launch_kernel(kernel, dim3(unsigned(B)), dim3(wide ? 1024 : 256), 0, stream, a));
  return last_launch();
}

#undef SEMIRING_OPS_SPAN_KERNEL
#endif  // !__CUDACC_RTC__

}  // namespace cuda
}  // namespace semiring_ops

// The launchers of one semiring, for the span_kernels_*.cu files.
#define SEMIRING_OPS_SPAN_LAUNCHERS(S)                                                                        \
  template LaunchStatus span_launch<S, float>(bool, const SpanArgs<float>&, int64_t, cudaStream_t);   \
  template LaunchStatus span_launch<S, double>(bool, const SpanArgs<double>&, int64_t, cudaStream_t);
