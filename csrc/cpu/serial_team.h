// A team of one thread: the CPU backends' Team for the programs written once for the CPU and CUDA (ctc_dp.h,
// rnnt_dp.h), whose CUDA team is a block of threads sharing an item.
#pragma once

#include <cstdint>

#include "semiring.h"

namespace semiring_ops {

struct SerialTeam {
  int rank() const { return 0; }
  int size() const { return 1; }
  void barrier() const {}
  void prefetch(const void*) const {}
  int lane() const { return 0; }
  int warp() const { return 0; }
  int warps() const { return 1; }
  template <class T> T warp_sum(T v) const { return v; }
  template <class T> void copy_async(T* dst, const T* src) const { *dst = *src; }
  void commit_copies() const {}
  void wait_copies() const {}
  template <class F> auto lead_sum(int64_t n, F f) const -> decltype(f(0)) {
    decltype(f(0)) v = 0;
    for (int64_t i = 0; i < n; ++i) v += f(i);
    return v;
  }
  template <class F> auto lead_max(int64_t n, F f) const -> decltype(f(0)) {
    using T = decltype(f(0));
    T v = -pos_inf<T>();
    for (int64_t i = 0; i < n; ++i) {
      const T x = f(i);
      v = (x > v || is_nan(x)) ? x : v;
    }
    return v;
  }
};

}  // namespace semiring_ops
