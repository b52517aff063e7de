// semiring_ops::bmm_forward for CUDA tensors (contract in ops.h):
//   out[p, i, j] = (+)_k times(to_kernel(a[p, i, k]), to_kernel(b[p, k, j])), plus argmax / argmin.
// One policy of the tile engine (tile_engine.cuh): a is the single left field, b the single right
// field, and each output's state is the semiring's Accumulator. Instantiated for every semiring of
// semiring.h x {float16, bfloat16, float32, float64}; the arg-tracking variant only for semirings
// that select (max, min).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include "checks.h"
#include "cuda/packed_select.h"
#include "cuda/tile_engine.cuh"
#include "ops.h"
#include "semiring.h"

#include <type_traits>

namespace semiring_ops {
namespace cuda {
namespace {

// Tile shapes, per accumulation type. fp64 halves the tile: its states and staging take twice
// the registers and shared memory.
template <class acc_t>
struct BmmTiles;
template <>
struct BmmTiles<float> {
  using type = TileShape</*BM*/ 64, /*BN*/ 64, /*BK*/ 16, /*TM*/ 4, /*TN*/ 4, /*min blocks*/ 2>;
};
template <>
struct BmmTiles<double> {
  using type = TileShape</*BM*/ 32, /*BN*/ 32, /*BK*/ 16, /*TM*/ 2, /*TN*/ 2, /*min blocks*/ 1>;
};

template <class S, class scalar_t_, bool kArg>
struct SemiringBmmPolicy {
  using scalar_t = scalar_t_;
  using acc_t = at::opmath_type<scalar_t>;
  using Shape = typename BmmTiles<acc_t>::type;
  static constexpr int kNumLeft = 1, kNumRight = 1;
  static constexpr bool kHasOutField = false;
  using State = typename S::template Accumulator<acc_t, kArg>;
  struct Params {
    acc_t* out;
    int64_t* arg;  // written only when kArg
  };

  static __device__ __forceinline__ acc_t load_left(int, acc_t x) { return S::to_kernel(x); }
  static __device__ __forceinline__ acc_t load_right(int, acc_t x) { return S::to_kernel(x); }
  static __device__ __forceinline__ acc_t load_out(acc_t x) { return x; }
  static __device__ __forceinline__ void init(State& st, acc_t) { st.init(); }
  static __device__ __forceinline__ void cell(State& st, const acc_t (&l)[1], const acc_t (&r)[1], int32_t k) {
    st.add(S::times(l[0], r[0]), k);
  }
  // logsumexp takes full t-tiles 4 terms at a time: one rescale of the running sum per 4 (semiring.h
  // LogSumExp2Accumulator::add_chunk), ~4 instructions per cell beside the ex2 instead of ~8.
  static constexpr int kChunk = std::is_same<S, LogSemiring>::value ? 4 : 1;
  template <int U>
  static __device__ __forceinline__ void cell_chunk(State& st, const acc_t (&l)[U][1], const acc_t (&r)[U][1],
                                                    int32_t) {
    acc_t v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = S::times(l[u][0], r[u][0]);
    st.template add_chunk<U>(v);
  }
  static __device__ __forceinline__ void store(const State& st, const Params& prm, int64_t idx) {
    prm.out[idx] = st.result();
    if constexpr (kArg) prm.arg[idx] = static_cast<int64_t>(st.arg());
  }
};

template <class S, class scalar_t, bool kArg>
void launch_bmm(const at::Tensor& a, const at::Tensor& b, at::Tensor& out, at::Tensor& arg) {
  using Policy = SemiringBmmPolicy<S, scalar_t, kArg>;
  const at::Tensor ua = with_unit_inner_stride(a);
  const at::Tensor ub = with_unit_inner_stride(b);
  ContractionArgs<Policy> args{};
  args.left[0] = left_field<scalar_t>(ua);
  args.right[0] = right_field<scalar_t>(ub);
  args.out_field = {nullptr, 0, 0, 0};
  args.params.out = out.data_ptr<typename Policy::acc_t>();
  args.params.arg = kArg ? arg.data_ptr<int64_t>() : nullptr;
  launch_contraction<Policy>(args, a.size(0), a.size(1), b.size(2), a.size(2), c10::cuda::getCurrentCUDAStream());
}

}  // namespace
}  // namespace cuda

std::vector<at::Tensor> bmm_forward(const at::Tensor& a, const at::Tensor& b, int64_t semiring_id, bool with_arg) {
  check_bmm_args(a, b);
  TORCH_CHECK(a.is_cuda(), "semiring bmm kernel (CUDA backend): CUDA tensors only, got a ", describe(a));
  const c10::cuda::OptionalCUDAGuard guard(at::device_of(a));
  const int64_t B = a.size(0), n = a.size(1), k = a.size(2), m = b.size(2);
  const auto acc_dtype = at::toOpMathType(a.scalar_type());

  at::Tensor out, arg;
  const bool known = dispatch_semiring(semiring_id, [&](auto semiring) {
    using S = decltype(semiring);
    const bool track = with_arg && S::kSelects;
    out = new_output({B, n, m}, a.options().dtype(acc_dtype));
    arg = track ? new_output({B, n, m}, a.options().dtype(at::kLong)) : at::empty({0}, a.options().dtype(at::kLong));
    if (B * n * m == 0) return;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "semiring_bmm_forward_cuda", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      if (k == 0) {
        out.fill_(S::template zero<acc_t>());
        if (track) arg.zero_();
        return;
      }
      if constexpr (S::kSelects) {
        // No index asked for, 16-bit inputs, enough tiles: packed pairs, two cells per instruction pair,
        // same values as the fp32 path once rounded to the input dtype (packed_select_cuda.cu).
        if (!track && cuda::packed_select_pays(a, b)) {
          cuda::packed_select_bmm(a, b, out, std::is_same<S, MaxSemiring>::value);
          return;
        }
        if (track) {
          cuda::launch_bmm<S, scalar_t, true>(a, b, out, arg);
          return;
        }
      }
      cuda::launch_bmm<S, scalar_t, false>(a, b, out, arg);
    });
  });
  TORCH_CHECK(known, "semiring bmm kernel: unknown semiring id ", semiring_id);
  return {out, arg};
}

}  // namespace semiring_ops
