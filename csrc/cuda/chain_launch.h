// The fused linear chains' launchers (chain_kernels.cuh, instantiated by chain_kernels_*.cu), called by
// chain_cuda.cpp: the kernel's arguments, how a batch runs (ChainPlan) and the launch. ATen-free.
#pragma once

#include <cstddef>
#include <cstdint>
#if !defined(__CUDACC_RTC__)
#include "cuda/launch_status.h"
#endif

namespace semiring_ops {
namespace cuda {

template <class T> struct ChainParams {
  const T* em;
  int64_t es0, es1, es2;
  const T* trans;         // (C, C) the transitions [from, to], user domain, any strides
  int64_t trs0, trs1;
  const T* mat;           // (C, C) output-major, user domain, contiguous: read from L2 when not kMatShared
  const T* boundary_in;   // start (forward) or end (reverse), contiguous (C)
  const T* boundary_out;  // end (forward) or start (reverse)
  const int64_t* lengths;
  T* total;               // (B,)
  T* scores;              // (B, T, C) or null
  int16_t* pointers;      // (B, T, C) global back-pointers, or null when they live in shared memory
  int64_t* tags;          // (B, T) or null
  int steps, C;  // T (the chain dimension) and C
  int group;     // G: lanes per output (a power of two <= 32)
  int pitch;     // P: the on-chip matrix's row pitch (kMatShared)
  int cluster;   // K: blocks per chain (kCluster; else 1)
  int slice;     // S: the outputs each block of a chain owns, ceil(C / K)
  bool reverse;
  // The log-partition's gradient, computed during the reverse scan (kGrad; the log semiring only):
  const T* alpha;      // (B, T, C) the forward scan's scores
  const T* log_z;      // (B,) the forward totals
  const T* grad;       // (B,) d loss / d log_z (with gold: d loss / d llh), stride grad_stride (0: one value)
  int64_t grad_stride;
  T* g_em;             // (B, T, C) g * marginals
  T* g_start;          // (C) accumulated with atomics
  T* g_end;            // (C)
  T* g_trans;          // (C, C) accumulated with atomics, when kXi (pair marginals summed on chip)
  // Gold tag paths (log semiring; null without): the forward scan writes llh = gold - log_z, the reverse
  // scan (kGrad) subtracts the gold path's indicators from the marginals.
  const int64_t* gold;  // (B, T) any strides
  int64_t gs0, gs1;
  T* llh;               // (B,) forward only
  T* g_trans_gold;      // (C, C) the gold transitions' counts go here with atomics (kGrad)
  T* grad_used;         // (B,) or null: the weight each chain's gradient got (0 for an impossible chain)
};

// How a batch of chains runs: K blocks per chain (a cluster when K > 1), each owning S = ceil(C / K) outputs
// of a step; what lives in shared memory; the block size.
struct ChainPlan {
  int K = 1, S = 0, G = 32, P = 0, warps = 1;
  bool mat_shared = false, xi = false, ptr_shared = false;
  size_t smem = 0;
};

#if !defined(__CUDACC_RTC__)
// The plan for a batch of B chains of Tn steps and C tags on `device` (blocks per chain, what lives in shared
// memory, the block size; the kernel's shared memory attributes set), for the semiring S, element type T,
// back-pointers (kArg, Viterbi) and the log-partition's gradient (kGrad). forced_cluster: 0 to choose, else the
// blocks per chain SEMIRING_OPS_CHAIN_CLUSTER asks for (a power of two <= 16; the host checks it).
template <class S, class T, bool kArg, bool kGrad>
LaunchStatus chain_plan(ChainPlan& plan, int64_t B, int Tn, int C, int device, int forced_cluster);

// Runs the plan's kernel over the batch (the parameters filled for that plan).
template <class S, class T, bool kArg, bool kGrad>
LaunchStatus chain_launch(const ChainPlan& plan, const ChainParams<T>& p, int64_t B, cudaStream_t stream);
#endif

}  // namespace cuda
}  // namespace semiring_ops
