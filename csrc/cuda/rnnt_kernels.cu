// RNN-T's lattice kernel: rnnt_dp.h's program, one block an item, its threads striding over the cells of an
// anti-diagonal (a barrier between diagonals). The alpha / beta rows live in global scratch (B, T, U + 1): a
// diagonal reads the one before, written by the block's other threads before the barrier.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/rnnt_launch.h"

namespace semiring_ops {
namespace cuda {
namespace {

struct BlockTeam {
  __device__ int rank() const { return int(threadIdx.x); }
  __device__ int size() const { return int(blockDim.x); }
  __device__ void barrier() const { __syncthreads(); }
};

template <class T, bool kMax> __global__ void rnnt_lattice_kernel(RnntArgs<T> a) {
  rnnt_item<kMax>(BlockTeam{}, a, int64_t(blockIdx.x));
}

}  // namespace

template <class T> LaunchStatus rnnt_lattice_launch(const RnntArgs<T>& a, bool max, cudaStream_t stream) {
  if (a.B == 0) return {};
  if (a.B > 0x7fffffff) return refused("at most 2^31 - 1 items");
  // threads: the widest diagonal's cells (U + 1), in whole warps, at most 512
  const int threads = int(std::min<int64_t>(512, (std::max<int64_t>(a.U1, 1) + 31) / 32 * 32));
  if (max)
    rnnt_lattice_kernel<T, true><<<unsigned(a.B), threads, 0, stream>>>(a);
  else
    rnnt_lattice_kernel<T, false><<<unsigned(a.B), threads, 0, stream>>>(a);
  return last_launch();
}

template LaunchStatus rnnt_lattice_launch<float>(const RnntArgs<float>&, bool, cudaStream_t);
template LaunchStatus rnnt_lattice_launch<double>(const RnntArgs<double>&, bool, cudaStream_t);

}  // namespace cuda
}  // namespace semiring_ops
