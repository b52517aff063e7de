// semiring_ops::chain_scan and chain_viterbi for CUDA tensors (contracts in ops.h).
//
// One thread block per chain walks the chain's whole length in one launch ("persistent" over t): the
// vector of the current step lives in shared memory, and so does the step matrix (in the kernel domain)
// when it fits, else it is read from global memory (L2) at every step. A step
//     u[o] = (+)_k vec[k] (x) M[o, k]        (M output-major: lanes read consecutive k)
// gives each warp kOutPerWarp outputs at a time (independent accumulators, for instruction-level
// parallelism); the warp's lanes split k, and their accumulators are merged with shuffles (merge() of
// semiring.h). Viterbi keeps int16 back-pointers (in shared memory when they fit) and backtracks in the
// same kernel, so a decode is one launch.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstring>

#include "checks.h"
#include "ops.h"
#include "semiring.h"

namespace semiring_ops {
namespace cuda {
namespace {

constexpr int kOutPerWarp = 4;
constexpr int kMaxWarps = 16;  // 512 threads: up to 128 registers each

template <class T> struct ChainParams {
  const T* em;
  int64_t es0, es1, es2;
  const T* mat;           // (C, C) output-major, user domain, contiguous
  const T* boundary_in;   // start (forward) or end (reverse), contiguous (C)
  const T* boundary_out;  // end (forward) or start (reverse)
  const int64_t* lengths;
  T* total;               // (B,)
  T* scores;              // (B, T, C) or null
  int16_t* pointers;      // (B, T, C) global back-pointers, or null when they live in shared memory
  int64_t* tags;          // (B, T) or null
  int steps, C;  // T (the chain dimension) and C
  bool reverse;
};

// Shuffles an accumulator (a few 32-bit words) across the lanes of a warp.
template <class Acc> __device__ __forceinline__ Acc shfl_xor(const Acc& a, int mask) {
  static_assert(sizeof(Acc) % 4 == 0, "accumulators are made of 32-bit words");
  unsigned words[sizeof(Acc) / 4];
  memcpy(words, &a, sizeof(Acc));
#pragma unroll
  for (int w = 0; w < int(sizeof(Acc) / 4); ++w) words[w] = __shfl_xor_sync(0xffffffffu, words[w], mask);
  Acc r;
  memcpy(&r, words, sizeof(Acc));
  return r;
}

template <class Acc> __device__ __forceinline__ void warp_merge(Acc& a) {
#pragma unroll
  for (int mask = 16; mask > 0; mask >>= 1) a.merge(shfl_xor(a, mask));
}

template <class S, class T, bool kArg, bool kMatShared>
__global__ void __launch_bounds__(kMaxWarps * 32) chain_kernel(ChainParams<T> p) {
  using Acc = typename S::template Accumulator<T, kArg>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int C = p.C, Tn = p.steps;
  T* vec = reinterpret_cast<T*>(smem_raw);  // the step's input, kernel domain
  T* nxt = vec + C;                         // the next step's input
  T* mat_s = nxt + C;                       // (C, C) kernel domain, when kMatShared
  int16_t* ptr_s = reinterpret_cast<int16_t*>(mat_s + (kMatShared ? C * C : 0));
  const int64_t b = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int64_t given = p.lengths[b];
  const int64_t L = given < 0 ? 0 : (given > Tn ? Tn : given);  // defensive: Python validates lengths
  const T* em = p.em + b * p.es0;
  int16_t* pointers = p.pointers ? p.pointers + b * int64_t(Tn) * C : ptr_s;

  if constexpr (kMatShared) {
    for (int i = threadIdx.x; i < C * C; i += blockDim.x) mat_s[i] = S::to_kernel(p.mat[i]);
  }
  if (p.scores) {
    T* sc = p.scores + b * int64_t(Tn) * C;
    for (int64_t i = L * C + threadIdx.x; i < int64_t(Tn) * C; i += blockDim.x) sc[i] = S::template zero<T>();
  }
  if (p.tags) {
    for (int64_t t = L + threadIdx.x; t < Tn; t += blockDim.x) p.tags[b * Tn + t] = -1;
  }

  // u (user domain) -> the stored score and the next input; t is the position of this step.
  auto emit = [&](int o, int64_t t, T u, T* dst) {
    const T through = S::times(u, em[t * p.es1 + o * p.es2]);
    if (p.scores) p.scores[(b * Tn + t) * C + o] = p.reverse ? u : through;
    dst[o] = S::to_kernel(through);
  };

  if (L > 0) {
    const int64_t t0 = p.reverse ? L - 1 : 0;
    for (int o = threadIdx.x; o < C; o += blockDim.x) emit(o, t0, p.boundary_in[o], vec);
  }
  __syncthreads();
  for (int64_t s = 1; s < L; ++s) {
    const int64_t t = p.reverse ? L - 1 - s : s;
    for (int o0 = warp * kOutPerWarp; o0 < C; o0 += nwarps * kOutPerWarp) {
      Acc acc[kOutPerWarp];
#pragma unroll
      for (int r = 0; r < kOutPerWarp; ++r) acc[r].init();
      for (int k = lane; k < C; k += 32) {
        const T v = vec[k];
#pragma unroll
        for (int r = 0; r < kOutPerWarp; ++r) {
          const int o = min(o0 + r, C - 1);  // rows past C repeat the last one and are never stored
          const T m = kMatShared ? mat_s[o * C + k] : S::to_kernel(__ldg(p.mat + int64_t(o) * C + k));
          acc[r].add(S::times(v, m), k);
        }
      }
#pragma unroll
      for (int r = 0; r < kOutPerWarp; ++r) {
        warp_merge(acc[r]);
        const int o = o0 + r;
        if (lane == r && o < C) {
          emit(o, t, acc[r].result(), nxt);
          if constexpr (kArg) pointers[t * C + o] = static_cast<int16_t>(acc[r].arg());
        }
      }
    }
    __syncthreads();
    T* tmp = vec;
    vec = nxt;
    nxt = tmp;
  }

  if (warp == 0) {
    Acc acc;
    acc.init();
    if (L > 0)
      for (int c = lane; c < C; c += 32) acc.add(S::times(vec[c], S::to_kernel(p.boundary_out[c])), c);
    warp_merge(acc);
    if (lane == 0) {
      p.total[b] = L > 0 ? acc.result() : S::template one<T>();
      if constexpr (kArg) {
        if (L > 0) {
          int c = acc.arg();
          int64_t* tags = p.tags + b * Tn;
          tags[L - 1] = c;
          for (int64_t t = L - 1; t > 0; --t) {
            c = pointers[t * C + c];
            tags[t - 1] = c;
          }
        }
      }
    }
  }
}

template <class S, class T, bool kArg>
void launch(const at::Tensor& em, const at::Tensor& trans, const at::Tensor& start, const at::Tensor& end,
            const at::Tensor& lengths, bool reverse, at::Tensor& total, at::Tensor* scores, at::Tensor* tags) {
  const int64_t B = em.size(0);
  const int Tn = static_cast<int>(em.size(1)), C = static_cast<int>(em.size(2));
  if (B == 0) return;
  // Output-major step matrix: forward steps produce tag j from tag i (M[j, i] = trans[i, j]); reverse
  // steps produce i from j (M[i, j] = trans[i, j]).
  const at::Tensor mat = (reverse ? trans : trans.t()).contiguous();
  const at::Tensor start_c = start.contiguous(), end_c = end.contiguous();

  int device = em.get_device();
  int optin = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const size_t vec_bytes = 2 * size_t(C) * sizeof(T);
  const size_t mat_bytes = size_t(C) * C * sizeof(T);
  const size_t ptr_bytes = kArg ? size_t(Tn) * C * sizeof(int16_t) : 0;
  const bool mat_shared = vec_bytes + mat_bytes <= size_t(optin);
  const bool ptr_shared = vec_bytes + (mat_shared ? mat_bytes : 0) + ptr_bytes <= size_t(optin);
  const size_t smem = vec_bytes + (mat_shared ? mat_bytes : 0) + (ptr_shared ? ptr_bytes : 0);
  at::Tensor ptr_scratch;
  if (kArg && !ptr_shared) ptr_scratch = at::empty({B, Tn, C}, em.options().dtype(at::kShort));

  ChainParams<T> p{};
  p.em = em.data_ptr<T>();
  p.es0 = em.stride(0);
  p.es1 = em.stride(1);
  p.es2 = em.stride(2);
  p.mat = mat.data_ptr<T>();
  p.boundary_in = (reverse ? end_c : start_c).data_ptr<T>();
  p.boundary_out = (reverse ? start_c : end_c).data_ptr<T>();
  p.lengths = lengths.data_ptr<int64_t>();
  p.total = total.data_ptr<T>();
  p.scores = scores ? scores->data_ptr<T>() : nullptr;
  p.pointers = ptr_scratch.defined() ? ptr_scratch.data_ptr<int16_t>() : nullptr;
  p.tags = tags ? tags->data_ptr<int64_t>() : nullptr;
  p.steps = Tn;
  p.C = C;
  p.reverse = reverse;

  const int warps = std::max(1, std::min(kMaxWarps, (C + kOutPerWarp - 1) / kOutPerWarp));
  auto kernel = mat_shared ? chain_kernel<S, T, kArg, true> : chain_kernel<S, T, kArg, false>;
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  kernel<<<static_cast<unsigned>(B), warps * 32, smem, at::cuda::getCurrentCUDAStream()>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void check_cuda(const at::Tensor& em, const char* what) {
  TORCH_CHECK(em.is_cuda(), what, " (CUDA): got emissions ", describe(em));
  TORCH_CHECK(em.size(0) <= 0x7fffffff && em.size(1) <= 0x7fffffff, what,
              " (CUDA): at most 2^31 - 1 chains and steps, got emissions ", describe(em));
}

}  // namespace
}  // namespace cuda

std::vector<at::Tensor> chain_scan(const at::Tensor& emissions, const at::Tensor& transitions,
                                   const at::Tensor& start, const at::Tensor& end, const at::Tensor& lengths,
                                   int64_t semiring_id, bool reverse, bool save_scores) {
  check_chain_args(emissions, transitions, start, end, lengths);
  cuda::check_cuda(emissions, "chain_scan");
  const c10::cuda::CUDAGuard guard(emissions.device());
  const int64_t B = emissions.size(0), T_len = emissions.size(1), C = emissions.size(2);
  at::Tensor total = new_output({B}, emissions.options());
  at::Tensor scores = save_scores ? new_output({B, T_len, C}, emissions.options()) : at::empty({0}, emissions.options());
  const bool found = dispatch_semiring(semiring_id, [&](auto semiring) {
    using S = decltype(semiring);
    AT_DISPATCH_FLOATING_TYPES(emissions.scalar_type(), "semiring_chain_scan_cuda", [&] {
      cuda::launch<S, scalar_t, false>(emissions, transitions, start, end, lengths, reverse, total,
                                       save_scores ? &scores : nullptr, nullptr);
    });
  });
  TORCH_CHECK(found, "chain_scan (CUDA): unknown semiring id ", semiring_id);
  return {total, scores};
}

std::vector<at::Tensor> chain_viterbi(const at::Tensor& emissions, const at::Tensor& transitions,
                                      const at::Tensor& start, const at::Tensor& end, const at::Tensor& lengths,
                                      int64_t semiring_id) {
  check_chain_args(emissions, transitions, start, end, lengths);
  cuda::check_cuda(emissions, "chain_viterbi");
  const c10::cuda::CUDAGuard guard(emissions.device());
  const int64_t B = emissions.size(0), T_len = emissions.size(1);
  at::Tensor total = new_output({B}, emissions.options());
  at::Tensor tags = new_output({B, T_len}, emissions.options().dtype(at::kLong));
  bool selects = false;
  const bool found = dispatch_semiring(semiring_id, [&](auto semiring) {
    using S = decltype(semiring);
    if constexpr (S::kSelects) {
      selects = true;
      AT_DISPATCH_FLOATING_TYPES(emissions.scalar_type(), "semiring_chain_viterbi_cuda", [&] {
        cuda::launch<S, scalar_t, true>(emissions, transitions, start, end, lengths, false, total, nullptr, &tags);
      });
    }
  });
  TORCH_CHECK(found && selects, "chain_viterbi (CUDA): semiring id ", semiring_id, " is not a selecting semiring");
  return {total, tags};
}

}  // namespace semiring_ops
