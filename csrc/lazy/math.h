// Scalar functions of the lazy reductions' formulas (semiring_ops/lazy/formula.py emits calls to these),
// for float and double, on the host (generated C++) and the device (generated CUDA, NVRTC).
//
// exp in float is 2^(x log2 e) through semiring.h's fast_exp2: one MUFU.EX2 on the GPU, a vectorisable
// polynomial on the CPU; relative error about 1e-7 * |x| (the rounding of x log2 e), ~1e-5 at |x| = 80.
// Every other function is the accurate library one.
#pragma once

#include "semiring.h"

namespace semiring_ops {
namespace lazy {

// The library functions, by overload on float / double.
#if defined(__CUDA_ARCH__)
#define LZ_LIB(f, fd) ::fd
#define LZ_LIBF(f, fd) ::f
#else
#define LZ_LIB(f, fd) std::fd
#define LZ_LIBF(f, fd) std::fd
#endif
namespace detail {
SR_HD float log(float x) { return LZ_LIBF(logf, log)(x); }
SR_HD double log(double x) { return LZ_LIB(logf, log)(x); }
SR_HD float fabs(float x) { return LZ_LIBF(fabsf, fabs)(x); }
SR_HD double fabs(double x) { return LZ_LIB(fabsf, fabs)(x); }
SR_HD float sqrt(float x) { return LZ_LIBF(sqrtf, sqrt)(x); }
SR_HD double sqrt(double x) { return LZ_LIB(sqrtf, sqrt)(x); }
SR_HD float sin(float x) { return LZ_LIBF(sinf, sin)(x); }
SR_HD double sin(double x) { return LZ_LIB(sinf, sin)(x); }
SR_HD float cos(float x) { return LZ_LIBF(cosf, cos)(x); }
SR_HD double cos(double x) { return LZ_LIB(cosf, cos)(x); }
SR_HD float pow(float x, float p) { return LZ_LIBF(powf, pow)(x, p); }
SR_HD double pow(double x, double p) { return LZ_LIB(powf, pow)(x, p); }
SR_HD float asin(float x) { return LZ_LIBF(asinf, asin)(x); }
SR_HD double asin(double x) { return LZ_LIB(asinf, asin)(x); }
SR_HD float acos(float x) { return LZ_LIBF(acosf, acos)(x); }
SR_HD double acos(double x) { return LZ_LIB(acosf, acos)(x); }
SR_HD float atan(float x) { return LZ_LIBF(atanf, atan)(x); }
SR_HD double atan(double x) { return LZ_LIB(atanf, atan)(x); }
SR_HD float atan2(float y, float x) { return LZ_LIBF(atan2f, atan2)(y, x); }
SR_HD double atan2(double y, double x) { return LZ_LIB(atan2f, atan2)(y, x); }
SR_HD float floor(float x) { return LZ_LIBF(floorf, floor)(x); }
SR_HD double floor(double x) { return LZ_LIB(floorf, floor)(x); }
SR_HD float round(float x) { return LZ_LIBF(roundf, round)(x); }
SR_HD double round(double x) { return LZ_LIB(roundf, round)(x); }
}  // namespace detail
#undef LZ_LIB
#undef LZ_LIBF

SR_HD float lz_exp(float x) { return fast_exp2(x * float(kLog2e)); }
SR_HD double lz_exp(double x) {
#if defined(__CUDA_ARCH__)
  return ::exp(x);
#else
  return std::exp(x);
#endif
}
template <class T> SR_HD T lz_log(T x) { return detail::log(x); }
template <class T> SR_HD T lz_sqrt(T x) { return detail::sqrt(x); }
template <class T> SR_HD T lz_sin(T x) { return detail::sin(x); }
template <class T> SR_HD T lz_cos(T x) { return detail::cos(x); }
SR_HD float lz_rsqrt(float x) {
#if defined(__CUDA_ARCH__)
  return ::rsqrtf(x);
#else
  return 1.f / std::sqrt(x);
#endif
}
SR_HD double lz_rsqrt(double x) {
#if defined(__CUDA_ARCH__)
  return ::rsqrt(x);
#else
  return 1.0 / std::sqrt(x);
#endif
}
template <class T> SR_HD T lz_pow(T x, T p) { return detail::pow(x, p); }
template <class T> SR_HD T lz_asin(T x) { return detail::asin(x); }
template <class T> SR_HD T lz_acos(T x) { return detail::acos(x); }
template <class T> SR_HD T lz_atan(T x) { return detail::atan(x); }
template <class T> SR_HD T lz_atan2(T y, T x) { return detail::atan2(y, x); }
template <class T> SR_HD T lz_floor(T x) { return detail::floor(x); }
// rounding half away from zero (C's round, KeOps' Round)
template <class T> SR_HD T lz_round(T x) { return detail::round(x); }
// x log x, 0 at x = 0 (KeOps' XLogX)
template <class T> SR_HD T lz_xlogx(T x) { return x == T(0) ? T(0) : x * detail::log(x); }
// The n-th derivative of sin(x) / x (n = 0: the function itself, 1 at x = 0), in double: a series near 0, where
// the recurrence x f^(n) + n f^(n-1) = sin^(n)(x) would cancel, and that recurrence elsewhere.
template <class T> SR_HD T lz_sinxdivx(T xt, int n) {
  const double x = double(xt);
  if (is_nan(x)) return xt;
  if (x > -0.5 && x < 0.5) {  // sum over 2k >= n of (-1)^k x^(2k - n) / ((2k + 1) (2k - n)!)
    double s = 0.0;
    const int k0 = (n + 1) / 2;
    for (int k = k0; k < k0 + 10; ++k) {
      double term = (k % 2 ? -1.0 : 1.0) / double(2 * k + 1);
      for (int q = 1; q <= 2 * k - n; ++q) term *= x / double(q);
      s += term;
    }
    return T(s);
  }
  const double sn = detail::sin(x), cs = detail::cos(x);
  double f = sn / x;
  for (int m = 1; m <= n; ++m) {
    const double dm = (m % 4 == 0) ? sn : (m % 4 == 1) ? cs : (m % 4 == 2) ? -sn : -cs;  // sin^(m)(x)
    f = (dm - double(m) * f) / x;
  }
  return T(f);
}
// abs: the sign bit cleared (-0 gives +0, as torch.abs), a free operand modifier of the next add on the GPU
template <class T> SR_HD T lz_abs(T x) { return detail::fabs(x); }
// sign: -1, 0 or 1 (NaN gives NaN), as torch.sign
template <class T> SR_HD T lz_sign(T x) { return x > T(0) ? T(1) : (x < T(0) ? T(-1) : x * T(0)); }
// step: 0 for x < 0, else 1 (NaN gives NaN), as KeOps' Step
template <class T> SR_HD T lz_step(T x) { return x < T(0) ? T(0) : (is_nan(x) ? x : T(1)); }
template <class T> SR_HD T lz_relu(T x) { return x < T(0) ? T(0) : x; }
template <class T> SR_HD T lz_clamp(T x, T lo, T hi) { return x < lo ? lo : (x > hi ? hi : x); }
// 1 where lo <= x <= hi, else 0: the derivative of clamp with respect to x
template <class T> SR_HD T lz_inside(T x, T lo, T hi) { return (x >= lo && x <= hi) ? T(1) : T(0); }
template <class T> SR_HD T lz_ifelse(T c, T a, T b) { return c >= T(0) ? a : b; }
template <class T> SR_HD T lz_max(T a, T b) { return nan_max(a, b); }
// x^n for an integer n, by repeated squaring (n known at compile time in generated code)
template <class T> SR_HD T lz_ipow(T x, int n) {
  const bool inv = n < 0;
  unsigned m = inv ? unsigned(-n) : unsigned(n);
  T r = T(1), b = x;
  while (m) {
    if (m & 1u) r *= b;
    b *= b;
    m >>= 1;
  }
  return inv ? T(1) / r : r;
}
// exp(f - o), the softmax weight of a logsumexp's term f against its result o; exactly 0 when f = -inf,
// so an all -inf reduction (o = -inf) gives weights 0, not NaN.
template <class T> SR_HD T lz_softmax_weight(T f, T o) { return f == -pos_inf<T>() ? T(0) : lz_exp(f - o); }

}  // namespace lazy
}  // namespace semiring_ops
