// semiring_ops::log_contract for CUDA tensors (contract in ops.h):
//   out[p, r, s] = sum_t L1[p, r, t] * R1[p, t, s] * exp(L0[p, r, t] + R0[p, t, s] + O0[p, r, s]).
// One policy of the tile engine (tile_engine.cuh): left fields {L0, L1?}, right fields {R0, R1?}, O0
// the output-indexed field. L0, R0 (at staging) and O0 (at init) are scaled by log2(e)
// (LogWeight::to_kernel), so each cell costs one ex2. Instantiated for float32 / float64 x
// (L1 present?) x (R1 present?).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include "checks.h"
#include "cuda/tile_engine.cuh"
#include "ops.h"
#include "semiring.h"

namespace semiring_ops {
namespace cuda {
namespace {

// Tile shapes, per element type (fp64 halves the tile, as for bmm).
template <class T>
struct ContractTiles;
template <>
struct ContractTiles<float> {
  using type = TileShape</*BM*/ 64, /*BN*/ 64, /*BK*/ 16, /*TM*/ 4, /*TN*/ 4, /*min blocks*/ 2>;
};
template <>
struct ContractTiles<double> {
  using type = TileShape</*BM*/ 32, /*BN*/ 32, /*BK*/ 16, /*TM*/ 2, /*TN*/ 2, /*min blocks*/ 1>;
};

template <class T, bool kL1, bool kR1>
struct LogContractPolicy {
  using scalar_t = T;
  using acc_t = T;
  using Shape = typename ContractTiles<T>::type;
  static constexpr int kNumLeft = kL1 ? 2 : 1;   // field 0: L0, field 1: L1
  static constexpr int kNumRight = kR1 ? 2 : 1;  // field 0: R0, field 1: R1
  static constexpr bool kHasOutField = true;     // O0
  struct State {
    acc_t sum;
    acc_t o;  // O0[p, r, s] * log2(e)
  };
  struct Params {
    acc_t* out;
  };

  static __device__ __forceinline__ acc_t load_left(int f, acc_t x) { return f == 0 ? LogWeight::to_kernel(x) : x; }
  static __device__ __forceinline__ acc_t load_right(int f, acc_t x) { return f == 0 ? LogWeight::to_kernel(x) : x; }
  static __device__ __forceinline__ acc_t load_out(acc_t x) { return LogWeight::to_kernel(x); }
  static __device__ __forceinline__ void init(State& st, acc_t o) {
    st.sum = acc_t(0);
    st.o = o;
  }
  static __device__ __forceinline__ void cell(State& st, const acc_t (&l)[kNumLeft], const acc_t (&r)[kNumRight],
                                              int32_t /*t*/) {
    const acc_t w = LogWeight::weight(l[0] + r[0] + st.o);
    if constexpr (kL1 && kR1) {
      st.sum += (l[1] * r[1]) * w;
    } else if constexpr (kL1) {
      st.sum += l[1] * w;
    } else if constexpr (kR1) {
      st.sum += r[1] * w;
    } else {
      st.sum += w;
    }
  }
  static __device__ __forceinline__ void store(const State& st, const Params& prm, int64_t idx) {
    prm.out[idx] = st.sum;
  }
};

template <class T, bool kL1, bool kR1>
void launch_log_contract(const at::Tensor& l0, const std::optional<at::Tensor>& l1, const at::Tensor& r0,
                         const std::optional<at::Tensor>& r1, const at::Tensor& o0, at::Tensor& out) {
  using Policy = LogContractPolicy<T, kL1, kR1>;
  ContractionArgs<Policy> args{};
  // A copy made by with_unit_inner_stride may be freed as soon as the launch is queued: the caching
  // allocator hands its memory only to work queued later on the same stream.
  const at::Tensor ul0 = with_unit_inner_stride(l0);
  const at::Tensor ur0 = with_unit_inner_stride(r0);
  at::Tensor ul1, ur1;
  args.left[0] = left_field<T>(ul0);
  args.right[0] = right_field<T>(ur0);
  if constexpr (kL1) {
    ul1 = with_unit_inner_stride(*l1);
    args.left[1] = left_field<T>(ul1);
  }
  if constexpr (kR1) {
    ur1 = with_unit_inner_stride(*r1);
    args.right[1] = right_field<T>(ur1);
  }
  args.out_field = out_field<T>(o0);
  args.params.out = out.data_ptr<T>();
  launch_contraction<Policy>(args, l0.size(0), l0.size(1), r0.size(2), l0.size(2), c10::cuda::getCurrentCUDAStream());
}

}  // namespace
}  // namespace cuda

at::Tensor log_contract(const at::Tensor& l0, const std::optional<at::Tensor>& l1, const at::Tensor& r0,
                        const std::optional<at::Tensor>& r1, const at::Tensor& o0) {
  check_contract_args(l0, l1, r0, r1, o0);
  TORCH_CHECK(l0.is_cuda(), "log_contract (CUDA backend): CUDA tensors only, got L0 ", describe(l0));
  const c10::cuda::OptionalCUDAGuard guard(at::device_of(l0));
  const int64_t B = l0.size(0), R = l0.size(1), T = l0.size(2), S = r0.size(2);
  at::Tensor out = new_output({B, R, S}, l0.options());
  if (B * R * S == 0) return out;
  if (T == 0) return out.zero_();
  AT_DISPATCH_FLOATING_TYPES(l0.scalar_type(), "log_contract_cuda", [&] {
    const bool has_l1 = l1.has_value(), has_r1 = r1.has_value();
    if (has_l1 && has_r1) {
      cuda::launch_log_contract<scalar_t, true, true>(l0, l1, r0, r1, o0, out);
    } else if (has_l1) {
      cuda::launch_log_contract<scalar_t, true, false>(l0, l1, r0, r1, o0, out);
    } else if (has_r1) {
      cuda::launch_log_contract<scalar_t, false, true>(l0, l1, r0, r1, o0, out);
    } else {
      cuda::launch_log_contract<scalar_t, false, false>(l0, l1, r0, r1, o0, out);
    }
  });
  return out;
}

}  // namespace semiring_ops
