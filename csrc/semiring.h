// The semirings, defined once for every kernel of the project (CPU, CUDA and generated code).
//
// A semiring here is a struct with
//   zero<T>(), one<T>()            the identities of plus and times,
//   times(a, b)                    the product of two elements (in the kernel domain),
//   plus(a, b)                     the sum of two elements (used by merges and tests),
//   to_kernel(x)                   maps a user value into the kernel domain when a tile is staged
//                                  (the log semiring works in base 2: x * log2(e), so its inner loop
//                                  needs one ex2 per cell and no multiply),
//   Accumulator<T, kArg>           the running sum of one output, fed one product at a time in
//                                  increasing k with add(v, k); result() maps back to the user domain;
//                                  arg() is the index of the selected term for max / min (kArg).
//
// Adding a semiring is one struct below plus one line in SEMIRING_OPS_FOR_EACH_SEMIRING; the ids must
// match semiring_ops/semirings.py (Semiring.kernel_id).
#pragma once

#if defined(__CUDACC_RTC__)
// NVRTC (the lazy reductions' generated kernels) has no standard headers: the few names used here.
typedef int int32_t;
typedef long long int64_t;
typedef unsigned int uint32_t;
#ifndef HUGE_VALF
#define HUGE_VALF __int_as_float(0x7f800000)
#endif
#ifndef HUGE_VAL
#define HUGE_VAL __longlong_as_double(0x7ff0000000000000LL)
#endif
#else
#include <cmath>
#include <cstdint>
#endif

#if defined(__CUDACC__)
#define SR_HD __host__ __device__ __forceinline__
#define SR_HD_ALWAYS_INLINE __host__ __device__ __forceinline__
#else
#define SR_HD inline
// What a vectorised CPU loop calls: inlined whatever the size of its caller (GCC's inlining budgets of a large
// function otherwise leave a call, and the loop scalar).
#define SR_HD_ALWAYS_INLINE inline __attribute__((always_inline))
#endif

namespace semiring_ops {

// ---------------------------------------------------------------- scalar helpers

template <class T> SR_HD T pos_inf();
template <> SR_HD float pos_inf<float>() { return HUGE_VALF; }
template <> SR_HD double pos_inf<double>() { return HUGE_VAL; }

template <class T> SR_HD T max_finite();
template <> SR_HD float max_finite<float>() { return 3.402823466e+38f; }
template <> SR_HD double max_finite<double>() { return 1.7976931348623157e+308; }

// A quiet NaN (NVRTC has no __builtin_nan: the bits).
template <class T> SR_HD T quiet_nan();
#if defined(__CUDACC_RTC__)
template <> SR_HD float quiet_nan<float>() { return __int_as_float(0x7fc00000); }
template <> SR_HD double quiet_nan<double>() { return __longlong_as_double(0x7ff8000000000000LL); }
#else
template <> SR_HD float quiet_nan<float>() { return __builtin_nanf(""); }
template <> SR_HD double quiet_nan<double>() { return __builtin_nan(""); }
#endif

template <class T> SR_HD bool is_nan(T x) { return x != x; }

constexpr double kLog2e = 1.4426950408889634073599246810018921;
constexpr double kLn2 = 0.6931471805599453094172321214581766;

template <class T> SR_HD T sr_abs(T x) { return x < T(0) ? -x : x; }

// 2^x for the inner loops. GPU fp32: one MUFU.EX2 (ex2.approx: -inf -> 0, +inf -> inf, NaN -> NaN,
// relative error ~2^-22). CPU fp32: a branch-free Cephes-style polynomial (~2 ulp) that the compiler
// vectorises (a libm call would not); CPU fp64 likewise (~1 ulp). GPU fp64: the library exp2.
SR_HD_ALWAYS_INLINE float fast_exp2(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  float xc = x < -127.f ? -127.f : (x > 128.f ? 128.f : x);
  xc = is_nan(x) ? 0.f : xc;  // keeps the float -> int conversion defined; NaN is restored below
  // Round to nearest with the 1.5 * 2^23 trick (exact for |xc| <= 2^22). GCC 12 does not if-convert
  // (so does not vectorise) the equivalent floor(xc + 0.5) through a float -> int -> float round trip.
  const float r = (xc + 12582912.f) - 12582912.f;
  const int32_t i = static_cast<int32_t>(r);
  const float f = xc - r;  // in [-0.5, 0.5]
  float p = 1.535336188319500e-4f;
  p = p * f + 1.339887440266574e-3f;
  p = p * f + 9.618437357674640e-3f;
  p = p * f + 5.550332471162809e-2f;
  p = p * f + 2.402264791363012e-1f;
  p = p * f + 6.931472028550421e-1f;
  p = p * f + 1.0f;
  union {
    uint32_t u;
    float f;
  } scale;
  scale.u = static_cast<uint32_t>(i + 127) << 23;  // 2^i; i = 128 gives the bits of +inf
  float y = p * scale.f;
  y = (x < -126.f) ? 0.f : y;
  return is_nan(x) ? x : y;
#endif
}
SR_HD_ALWAYS_INLINE double fast_exp2(double x) {
#if defined(__CUDA_ARCH__)
  return exp2(x);
#else
  // fp64 on the CPU: the same scheme, branch-free so that it vectorises with AVX2 (libm's exp2 is a call
  // per element: the log kernels ran 7x slower in fp64 than in fp32). 2^x = 2^r * 2^f, r = round(x),
  // f in [-0.5, 0.5]; 2^f by its Taylor series to degree 13 (the next term is < 2^-57), Horner in fp64:
  // ~1 ulp. Results below 2^-1022 (subnormal) flush to 0, as the fp32 path and the GPU's ftz do.
  double xc = x < -1022. ? -1022. : (x > 1024. ? 1024. : x);
  xc = is_nan(x) ? 0. : xc;
  constexpr double kRound = 6755399441055744.0;  // 1.5 * 2^52: x + kRound holds round(x) in its low bits
  union {
    uint64_t u;
    double d;
  } big, magic, scale;
  big.d = xc + kRound;
  magic.d = kRound;
  const double r = big.d - kRound;
  const double f = xc - r;
  const int64_t i = static_cast<int64_t>(big.u - magic.u);  // round(x) as an integer: integer ops only
  double p = 1.3691488853904124e-12;
  p = p * f + 2.5678435993488196e-11;
  p = p * f + 4.44553827187081e-10;
  p = p * f + 7.054911620801121e-09;
  p = p * f + 1.0178086009239696e-07;
  p = p * f + 1.3215486790144305e-06;
  p = p * f + 1.5252733804059838e-05;
  p = p * f + 0.00015403530393381606;
  p = p * f + 0.0013333558146428441;
  p = p * f + 0.009618129107628477;
  p = p * f + 0.055504108664821576;
  p = p * f + 0.2402265069591007;
  p = p * f + 0.6931471805599453;
  p = p * f + 1.0;
  // 2^i for i <= 1023; i = 1024 (x in [1023.5, 1024]) as 2 * 2^1023, finite below 2^1024 and inf at it
  const double twice = i > 1023 ? 2. : 1.;
  scale.u = static_cast<uint64_t>((i > 1023 ? 1023 : i) + 1023) << 52;
  double y = (p * twice) * scale.d;
  y = (x < -1022.) ? 0. : y;
  return is_nan(x) ? x : y;
#endif
}

SR_HD float sr_log2(float x) {
#if defined(__CUDA_ARCH__)
  return log2f(x);
#else
  return std::log2(x);
#endif
}
SR_HD double sr_log2(double x) {
#if defined(__CUDA_ARCH__)
  return log2(x);
#else
  return std::log2(x);
#endif
}

// max that ignores NaN (the other operand wins; NaN only when both are): one FMNMX on the GPU.
template <class T> SR_HD T max_drop_nan(T a, T b) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) == 4) {
    return fmaxf(a, b);
  } else {
    return fmax(a, b);
  }
#else
  return std::fmax(a, b);
#endif
}

// max / min that propagate NaN (plain fmaxf drops it).
template <class T> SR_HD T nan_max(T a, T b) { return (b > a || is_nan(b)) ? b : a; }
template <class T> SR_HD T nan_min(T a, T b) { return (b < a || is_nan(b)) ? b : a; }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
template <> __device__ __forceinline__ float nan_max<float>(float a, float b) {
  float y;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(y) : "f"(a), "f"(b));
  return y;
}
template <> __device__ __forceinline__ float nan_min<float>(float a, float b) {
  float y;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(y) : "f"(a), "f"(b));
  return y;
}
#endif

// The bits of a float and back (host: through a union, which GCC and Clang define).
SR_HD uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  union {
    float f;
    uint32_t u;
  } b;
  b.f = x;
  return b.u;
#endif
}
SR_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  union {
    uint32_t u;
    float f;
  } b;
  b.u = u;
  return b.f;
#endif
}

SR_HD float fma_f32(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// 2^x in float on the FMA pipe instead of the MUFU, for kernels that the MUFU bounds (the log bmm and its
// gradients mix it with fast_exp2 so that neither pipe is the bound: docs/perf_notes.md, issue 29). Same
// values as fast_exp2 on the GPU (ex2.approx.ftz) wherever they are defined, the same range semantics:
//   x < -126 -> +0 (no subnormal results), x >= 128 -> +inf, +inf -> +inf, -inf -> +0, NaN -> NaN;
//   elsewhere relative error <= 1.68e-7 (2^-22.5, tests/test_log_exp2_poly.py measures it; ex2.approx: ~2^-22).
// x = n + f with n = floor(x) and f in [0, 1) (exact); 2^f by a degree-5 polynomial, p(0) = 1 exactly (its
// coefficients minimise the relative error of the float32 Horner evaluation, c1..c5 tuned by a few ulps
// after a float64 minimax fit); then 2^n from n's bits. On the GPU: 2 FMNMX, 3 FADD, 5 FFMA, 1 LEA, 1 FMUL
// (the FMUL fuses into the caller's accumulation), against 1 MUFU.EX2. The host build computes the same
// values (floor instead of the rounding-mode add; std::fma), which is what the test evaluates.
SR_HD float exp2_poly(float x) {
  constexpr float kMagic = 12582912.f;  // 1.5 * 2^23: x + kMagic holds floor(x) in its low mantissa bits
  x = nan_max(-127.f, x);               // NaN stays NaN; -inf -> -127, whose result is exactly +0
  x = nan_min(128.f, x);                // +inf -> 128 -> +inf
#if defined(__CUDA_ARCH__)
  const float j = __fadd_rd(x, kMagic);  // kMagic + floor(x), exact for |x| <= 2^22
  const float n = j - kMagic;
#else
  const float n = std::floor(x);
  const float j = n + kMagic;
#endif
  const float f = x - n;  // [0, 1), exact
  float p = 1.8695772e-3f;
  p = fma_f32(p, f, 9.0148942e-3f);
  p = fma_f32(p, f, 5.5797629e-2f);
  p = fma_f32(p, f, 2.4016672e-1f);
  p = fma_f32(p, f, 6.9315094e-1f);
  p = fma_f32(p, f, 1.f);  // [1, 2]
  // 2^n = bits (n + 127) << 23 for n in [-127, 128]: +0 at n = -127, +inf at 128. j's bits are 0x4B400000 + n,
  // and 0x4B400000 << 23 vanishes in 32 bits, so the shift leaves n << 23 (one LEA with the 127 << 23).
  const float scale = bits_float((float_bits(j) << 23) + 0x3F800000u);
  return p * scale;  // exact: a power of two times p, never subnormal
}

// ---------------------------------------------------------------- accumulators

// Running log-sum-exp in base 2 with one ex2 per term and no branch:
// d = v - m; e = 2^-|d|; a new maximum rescales the old sum by e, otherwise e is added.
// m starts at the most negative finite value, so -inf terms add 2^-inf = 0 and an all -inf
// reduction ends with s = 0 -> -inf. NaN terms poison s, so NaN propagates.
template <class T> struct LogSumExp2Accumulator {
  T m, s;
  SR_HD void init() { m = -max_finite<T>(); s = T(0); }
  SR_HD void add(T v, int32_t /*k*/) {
    const T d = v == m ? T(0) : v - m;  // v == m == +inf: one more +inf term, not inf - inf = NaN
    const T e = fast_exp2(-sr_abs(d));
    const bool up = d > T(0);
    s = up ? s * e + T(1) : s + e;
    m = up ? v : m;
  }
  // U consecutive terms v[u] = x[u] * scale at once (scale 1: x in base 2, as add() takes them; kLog2e:
  // x in natural-log units, the conversion fused into the exponent's FFMA). The running sum is kept
  // against the clamped maximum c(m) = min(m, max_finite) (so v = +inf adds 2^inf = inf, never
  // 2^(inf - inf)); it is rescaled only when the chunk raises m, so a term costs one ex2 and ~4 other
  // instructions (add(): one ex2 and ~8). m itself may become +inf, as in add(), and the two mix: same
  // value as U calls of add(). (The GPU predicates the rescale, so its ex2 still takes a MUFU slot:
  // 1 + 1/U per term; forcing a branch through an out-of-line call spilled registers.)
  template <int U> SR_HD void add_chunk(const T* x, T scale = T(1)) {
    T top = x[0];
#pragma unroll
    for (int u = 1; u < U; ++u) top = max_drop_nan(top, x[u]);
    top *= scale;  // scale > 0: the largest x is the largest term
    if (top > m) {  // a new maximum (never for NaN): rescale once (the GPU predicates it)
      s *= fast_exp2(clamp_finite(m) - clamp_finite(top));
      m = top;
    }
    const T shift = clamp_finite(m);
#pragma unroll
    for (int u = 0; u < U; ++u) s += fast_exp2(x[u] * scale - shift);
  }
  SR_HD static T clamp_finite(T v) { return v < max_finite<T>() ? v : max_finite<T>(); }
  // Folds in another accumulator of a disjoint set of terms (split reductions, warp merges).
  SR_HD void merge(const LogSumExp2Accumulator& o) {
    const T top = o.m > m ? o.m : m;
    const T ea = fast_exp2(m == top ? T(0) : m - top);  // m == top == +inf: factor 1, not 2^NaN
    const T eb = fast_exp2(o.m == top ? T(0) : o.m - top);
    s = s * ea + o.s * eb;
    m = top;
  }
  SR_HD T result() const { return (m + sr_log2(s)) * T(kLn2); }
  SR_HD int32_t arg() const { return 0; }
};

// The log bmm's running log-sum-exp in base 2 (float; the CUDA tile engine's LogBmmPolicy), built so that
// the hot loop has no rescale at all. Same values and semantics as LogSumExp2Accumulator (-inf, +inf, NaN).
//   m: the running maximum rounded up to an integer (finite: +inf clamps to max_finite, and since a +inf
//      term makes s = inf, the result is the same), so every rescale is by an exact power of two, applied
//      to s by exponent arithmetic (no MUFU).
//   s: the sum of 2^(v - m) over the terms so far.
//   c: the fast path's partial sum over the current k-tile, against the same m: add_fast() adds 2^(v - m)
//      without comparing v to m (one FADD, one ex2 -- MUFU or exp2_poly -- and one FADD a term). The engine
//      then checks the tile (tile_ok: c <= 2^64, which fails for NaN and inf): then s += c; otherwise it
//      drops c and redoes the tile on the exact path, add_chunk(), which raises m. So a term of the fast
//      path is at most 2^64 (x = v - m <= 64, where both exponentials are exact to 2^-22) and s stays below
//      2^64 per tile (result() takes s's exponent apart, so a large s costs no accuracy).
struct LogSumExp2TileAccumulator {
  float m, s, c;
  SR_HD void init() {
    m = -max_finite<float>();
    s = 0.f;
    c = 0.f;
  }
  // The exact path: U terms x[u] * scale (scale > 0), as LogSumExp2Accumulator::add_chunk but with an integer m.
  template <int U> SR_HD void add_chunk(const float* x, float scale = 1.f) {
    float top = x[0];
#pragma unroll
    for (int u = 1; u < U; ++u) top = max_drop_nan(top, x[u]);
    top *= scale;
    if (top > m) {  // a new maximum (never for NaN); +inf gives m = max_finite
      const float mn = top < max_finite<float>() ? ceil_f32(top) : max_finite<float>();
      s = times_pow2(s, m - mn);
      m = mn;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) s += fast_exp2(x[u] * scale - m);
  }
  SR_HD void add(float v, int32_t /*k*/) { add_chunk<1>(&v); }
  // The fast path: one term v of the current tile (first: the tile's first term), on the MUFU or the FMA pipe.
  SR_HD void add_fast(float v, bool first, bool poly) {
    const float x = v - m;
    const float e = poly ? exp2_poly(x) : fast_exp2(x);
    c = first ? e : c + e;
  }
  SR_HD bool tile_ok() const { return c <= 1.8446744e19f; }  // 2^64; false for NaN
  SR_HD void tile_commit() { s += c; }
  // (m + log2 s) ln 2, with s's binary exponent added to m exactly first (m is an integer).
  SR_HD float result() const {
    const uint32_t b = float_bits(s);
    const uint32_t e = (b >> 23) & 0xFFu;
    if (e == 0u || e == 0xFFu) return (m + sr_log2(s)) * float(kLn2);  // 0, subnormal, inf, NaN
    const float mant = bits_float((b & 0x807FFFFFu) | 0x3F800000u);  // [1, 2)
    return ((m + float(static_cast<int32_t>(e) - 127)) + sr_log2(mant)) * float(kLn2);
  }
  SR_HD int32_t arg() const { return 0; }

  SR_HD static float ceil_f32(float x) {
#if defined(__CUDA_ARCH__)
    return ceilf(x);
#else
    return std::ceil(x);
#endif
  }
  // s * 2^d for an integer-valued d <= 0, exactly (d < -126 gives 0: s < 2^91, so what is dropped is below
  // 2^-35 while the new maximum's term is at least 1/2).
  SR_HD static float times_pow2(float s, float d) {
    const int32_t n = d < -126.f ? -127 : static_cast<int32_t>(d);
    return s * bits_float(static_cast<uint32_t>(n + 127) << 23);
  }
};

// Running max (kIsMax) or min; with kArg it also keeps the index of the first extremum
// (ties resolve to the lowest k, as terms arrive in increasing k) and of the first NaN.
template <class T, bool kArg, bool kIsMax> struct ExtremumAccumulator {
  T best;
  int32_t idx;
  SR_HD void init() {
    best = kIsMax ? -pos_inf<T>() : pos_inf<T>();
    idx = 0;
  }
  SR_HD void add(T v, int32_t k) {
    if constexpr (kArg) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
      if constexpr (sizeof(T) == 4) {
        // One max.NaN and an integer compare of the bits instead of three compares and two selects: the
        // index moves exactly when the NaN-propagating extremum changes. v + 0 turns -0 into +0, so a
        // tie of -0 and +0 keeps the first index, and max.NaN returns the canonical NaN, so a second NaN
        // leaves the bits (and the first NaN's index) alone.
        const T nb = kIsMax ? nan_max(best, v + T(0)) : nan_min(best, v + T(0));
        idx = __float_as_int(nb) != __float_as_int(best) ? k : idx;
        best = nb;
        return;
      }
#endif
      const bool better = kIsMax ? (v > best) : (v < best);
      if (better || (is_nan(v) && !is_nan(best))) {
        best = v;
        idx = k;
      }
    } else {
      best = kIsMax ? nan_max(best, v) : nan_min(best, v);
    }
  }
  // Folds in another accumulator of a disjoint set of terms; with kArg the result is the one a single
  // pass in increasing k would give (lowest index among ties, first NaN).
  SR_HD void merge(const ExtremumAccumulator& o) {
    if constexpr (kArg) {
      const bool better = kIsMax ? (o.best > best) : (o.best < best);
      const bool tie = (o.best == best || (is_nan(o.best) && is_nan(best))) && o.idx < idx;
      if (better || tie || (is_nan(o.best) && !is_nan(best))) {
        best = o.best;
        idx = o.idx;
      }
    } else {
      best = kIsMax ? nan_max(best, o.best) : nan_min(best, o.best);
    }
  }
  SR_HD T result() const { return best; }
  SR_HD int32_t arg() const { return idx; }
};

template <class T> struct SumAccumulator {
  T s;
  SR_HD void init() { s = T(0); }
  SR_HD void add(T v, int32_t /*k*/) { s += v; }
  SR_HD void merge(const SumAccumulator& o) { s += o.s; }
  SR_HD T result() const { return s; }
  SR_HD int32_t arg() const { return 0; }
};

// ---------------------------------------------------------------- semirings

struct LogSemiring {
  static constexpr int64_t kId = 0;
  static constexpr bool kSelects = false;  // no argmax: the gradient is a softmax, not a selection
  template <class T> SR_HD static T zero() { return -pos_inf<T>(); }
  template <class T> SR_HD static T one() { return T(0); }
  template <class T> SR_HD static T to_kernel(T x) { return x * T(kLog2e); }
  template <class T> SR_HD static T times(T a, T b) { return a + b; }
  template <class T> SR_HD static T plus(T a, T b) {
    const T m = nan_max(a, b);
    if (m == -pos_inf<T>() || m == pos_inf<T>()) return m;
    return m + sr_log2(fast_exp2((a - m) * T(kLog2e)) + fast_exp2((b - m) * T(kLog2e))) * T(kLn2);
  }
  template <class T, bool kArg> using Accumulator = LogSumExp2Accumulator<T>;
};

struct MaxSemiring {
  static constexpr int64_t kId = 1;
  static constexpr bool kSelects = true;
  template <class T> SR_HD static T zero() { return -pos_inf<T>(); }
  template <class T> SR_HD static T one() { return T(0); }
  template <class T> SR_HD static T to_kernel(T x) { return x; }
  template <class T> SR_HD static T times(T a, T b) { return a + b; }
  template <class T> SR_HD static T plus(T a, T b) { return nan_max(a, b); }
  template <class T, bool kArg> using Accumulator = ExtremumAccumulator<T, kArg, true>;
};

struct MinSemiring {
  static constexpr int64_t kId = 2;
  static constexpr bool kSelects = true;
  template <class T> SR_HD static T zero() { return pos_inf<T>(); }
  template <class T> SR_HD static T one() { return T(0); }
  template <class T> SR_HD static T to_kernel(T x) { return x; }
  template <class T> SR_HD static T times(T a, T b) { return a + b; }
  template <class T> SR_HD static T plus(T a, T b) { return nan_min(a, b); }
  template <class T, bool kArg> using Accumulator = ExtremumAccumulator<T, kArg, false>;
};

struct StdSemiring {
  static constexpr int64_t kId = 3;
  static constexpr bool kSelects = false;
  template <class T> SR_HD static T zero() { return T(0); }
  template <class T> SR_HD static T one() { return T(1); }
  template <class T> SR_HD static T to_kernel(T x) { return x; }
  template <class T> SR_HD static T times(T a, T b) { return a * b; }
  template <class T> SR_HD static T plus(T a, T b) { return a + b; }
  template <class T, bool kArg> using Accumulator = SumAccumulator<T>;
};

// The registry: one line per semiring.
#define SEMIRING_OPS_FOR_EACH_SEMIRING(X) \
  X(LogSemiring)                          \
  X(MaxSemiring)                          \
  X(MinSemiring)                          \
  X(StdSemiring)

// Calls f(S{}) for the semiring whose kId is `id`; returns false when no semiring has that id.
template <class F> bool dispatch_semiring(int64_t id, F&& f) {
#define SEMIRING_OPS_DISPATCH_CASE(S) \
  if (id == S::kId) {                 \
    f(S{});                           \
    return true;                      \
  }
  SEMIRING_OPS_FOR_EACH_SEMIRING(SEMIRING_OPS_DISPATCH_CASE)
#undef SEMIRING_OPS_DISPATCH_CASE
  return false;
}

// ---------------------------------------------------------------- the log-weighted contraction
//
// Gradients of the log semiring (and their gradients) are all of one form:
//   out[r, s] = sum_t  L1[r, t] * R1[t, s] * exp(L0[r, t] + R0[t, s] + O0[r, s])
// with L1, R1 optional (1 when absent). In the kernel domain the three exponent terms are pre-scaled
// by log2(e), so each cell is one ex2: weight(x) = 2^x.
struct LogWeight {
  template <class T> SR_HD static T to_kernel(T x) { return x * T(kLog2e); }
  template <class T> SR_HD static T weight(T x2) { return fast_exp2(x2); }
};

}  // namespace semiring_ops
