// Copying runs of bytes into host memory that is written once and not read back soon (the block engine's
// output), with non-temporal (streaming) stores: the written cache lines go to memory through the
// write-combining buffers instead of being read into the cache first and evicted later, so a copy moves
// each destination byte across the memory bus once instead of twice (read for ownership, then write back).
// Measured on the lent H100 host (16 cores, 256 MiB pieces, AVX2 stores, 2026-11-26): 53.5 GB/s into
// pre-faulted memory against 37.1 GB/s for memcpy and 24.8 GB/s for torch's copy_ (docs/scaling.md, "Engine").
//
// Used by stream_copy_cpu.cpp (a block of a dense output) and condensed_scatter_cpu.cpp (pdist's layout):
// each thread copies its runs with copy_run(..., stream) and calls stream_fence() once at the end of its
// work, before the parallel region joins (streaming stores are weakly ordered: the fence makes them visible
// to the threads that read the output afterwards). Portable: without AVX2 (another architecture, or a
// build without -march=native on an old x86) copy_run is memcpy and stream_fence does nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace semiring_ops {

// Copies smaller than this in total are plain memcpy: their destination is likely read soon (caches help),
// and the streaming path's fences and unaligned ends cost more than it saves.
constexpr int64_t kStreamMinBytes = int64_t{1} << 20;
// Within a streaming copy, runs shorter than this (short rows of a block) are memcpy too.
constexpr int64_t kStreamMinRunBytes = 256;

#if defined(__AVX512F__)
constexpr bool kStreamingStores = true;
constexpr std::size_t kStreamAlign = 64;  // one cache line per store
inline void stream_aligned(char* d, const char* s, std::size_t n) {  // d 64-byte aligned, n a multiple of 256
  for (std::size_t i = 0; i < n; i += 256) {
    const __m512i a = _mm512_loadu_si512(s + i);
    const __m512i b = _mm512_loadu_si512(s + i + 64);
    const __m512i c = _mm512_loadu_si512(s + i + 128);
    const __m512i e = _mm512_loadu_si512(s + i + 192);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + i), a);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + i + 64), b);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + i + 128), c);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + i + 192), e);
  }
}
#elif defined(__AVX2__)
constexpr bool kStreamingStores = true;
constexpr std::size_t kStreamAlign = 32;
inline void stream_aligned(char* d, const char* s, std::size_t n) {  // d 32-byte aligned, n a multiple of 128
  for (std::size_t i = 0; i < n; i += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 64));
    const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 96), e);
  }
}
#else
constexpr bool kStreamingStores = false;
#endif

// dst[0, n) = src[0, n) (not overlapping): with streaming stores when `stream` and the run is long enough
// (the unaligned head before the first aligned destination address and the tail shorter than one unrolled
// step are memcpy), else memcpy.
inline void copy_run(char* dst, const char* src, int64_t n, bool stream) {
  if (n <= 0) return;
#if defined(__AVX2__) || defined(__AVX512F__)
  if (stream && n >= kStreamMinRunBytes) {
    constexpr std::size_t step = 4 * kStreamAlign;  // the unrolled loop's bytes per iteration
    const std::size_t head = (kStreamAlign - reinterpret_cast<std::uintptr_t>(dst) % kStreamAlign) % kStreamAlign;
    const std::size_t body = (static_cast<std::size_t>(n) - head) / step * step;
    std::memcpy(dst, src, head);
    stream_aligned(dst + head, src + head, body);
    std::memcpy(dst + head + body, src + head + body, static_cast<std::size_t>(n) - head - body);
    return;
  }
#endif
  (void)stream;
  std::memcpy(dst, src, static_cast<std::size_t>(n));
}

// Orders this thread's streaming stores before whatever it does next (call once per thread, after its runs).
inline void stream_fence() {
#if defined(__AVX2__) || defined(__AVX512F__)
  _mm_sfence();
#endif
}

}  // namespace semiring_ops
