// The tile engine's shapes and its launcher (tile_engine.cuh has the kernel): no device code, so the launchers of
// a kernel file build with the C++ compiler alone for the NVRTC route (kernel_ref.h), and NVRTC reads the shapes.
#pragma once

#include <cstdint>
#if !defined(__CUDACC_RTC__)
#include <algorithm>
#include <limits>

#include "cuda/launch_status.h"
#endif

namespace semiring_ops {
namespace cuda {

// BM x BN outputs per block, t-tiles of BK, TM x TN outputs per thread, (BM/TM) * (BN/TN) threads.
// kMinBlocks goes to __launch_bounds__ (2 caps a 256-thread block at 128 registers per thread).
template <int BM_, int BN_, int BK_, int TM_, int TN_, int kMinBlocks_>
struct TileShape {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, TM = TM_, TN = TN_;
  static constexpr int kMinBlocks = kMinBlocks_;
  static constexpr int kThreadsN = BN / TN;
  static constexpr int kThreadsM = BM / TM;
  static constexpr int kThreads = kThreadsM * kThreadsN;
  static_assert(BM % TM == 0 && BN % TN == 0, "TM / TN must divide BM / BN");
  static_assert((BM * BK) % kThreads == 0 && (BN * BK) % kThreads == 0,
                "each thread stages a whole number of elements per tile");
  static_assert((BM * BK) / kThreads <= 32 && (BN * BK) / kThreads <= 32, "validity masks are 32-bit");
};

#if !defined(__CUDACC_RTC__)

// Fills the shape part of args (the kernel's ArgsOf<Policy>, Policy::Shape being Shape; or any arguments with the same
// shape fields, as the packed select's) and launches `kernel` (contraction_kernel<Policy>, as kernel_ref.h names it)
// on `stream`, a block of Shape::kThreads per BM x BN output tile and batch entry; the host has filled the fields and
// params and checked the extents (contraction_host.h). Needs batch * rows * cols > 0.
template <class Shape, class Args>
LaunchStatus launch_contraction(const void* kernel, Args& args, int64_t batch, int64_t rows, int64_t cols,
                                int64_t depth, cudaStream_t stream) {
  const int64_t tiles_m = (rows + Shape::BM - 1) / Shape::BM;
  const int64_t tiles_n = (cols + Shape::BN - 1) / Shape::BN;
  if (tiles_m * tiles_n > std::numeric_limits<int32_t>::max()) return refused("too many output tiles (over 2^31)");
  args.batch = batch;
  args.rows = static_cast<int32_t>(rows);
  args.cols = static_cast<int32_t>(cols);
  args.depth = static_cast<int32_t>(depth);
  args.tiles_n = static_cast<int32_t>(tiles_n);
  const dim3 grid(static_cast<unsigned>(tiles_m * tiles_n), static_cast<unsigned>(std::min<int64_t>(batch, 65535)));
  void* params[] = {&args};
  SEMIRING_OPS_CUDA_TRY(cudaLaunchKernel(kernel, grid, dim3(Shape::kThreads), params, 0, stream));
  return last_launch();
}

#endif  // !__CUDACC_RTC__

}  // namespace cuda
}  // namespace semiring_ops
