// How a launcher names the kernel it launches, so that one launcher serves both ways of building a CUDA family
// (docs/build.md, "Two routes to the CUDA kernels"):
//
//   nvcc (a CUDA toolkit, or a wheel): the launcher and its kernels are one translation unit; the kernel is its
//     address.
//   NVRTC (SEMIRING_OPS_NVRTC_HOST): the kernel file is compiled twice. The C++ compiler builds its launchers alone
//     (device code behind SEMIRING_OPS_DEVICE_PASS); each kernel instantiation is compiled when first launched, by
//     NVRTC, from the same file (semiring_ops/build/nvrtc_kernels.py), and loaded as a library. The kernel is that
//     library's handle (cudaKernel_t), which the runtime's launch and attribute calls take as they take an address.
//
// A launcher writes SEMIRING_OPS_KERNEL(program, kernel) for a plain kernel, SEMIRING_OPS_KERNEL_OF(program, kernel,
// template arguments...) for a template, with each non-type argument as SEMIRING_OPS_VALUE(v); program is the kernel
// file (relative to csrc) that defines it; the kernel lives in namespace semiring_ops::cuda. Under NVRTC the
// template arguments are spelled from their types (a forward declaration suffices).
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define SEMIRING_OPS_DEVICE_PASS 1  // the kernel file's device code is compiled (nvcc, NVRTC)
#else
#define SEMIRING_OPS_DEVICE_PASS 0  // only its launchers are (the C++ compiler, for NVRTC)
#endif

#if !defined(__CUDACC_RTC__)

#include <cuda_runtime_api.h>

namespace semiring_ops {
namespace cuda {

// Launches `kernel` (an address or a handle, as SEMIRING_OPS_KERNEL gives it) with `args`, which must have the types of
// its parameters (each is passed by address, as cudaLaunchKernel takes them).
template <class... Args>
cudaError_t launch_kernel(const void* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&... args) {
  void* params[] = {const_cast<void*>(static_cast<const void*>(&args))...};
  return cudaLaunchKernel(kernel, grid, block, params, smem, stream);
}

}  // namespace cuda
}  // namespace semiring_ops

#if defined(__CUDACC__)

#define SEMIRING_OPS_VALUE(v) v
#define SEMIRING_OPS_KERNEL(program, kernel) reinterpret_cast<const void*>(&kernel)
#define SEMIRING_OPS_KERNEL_OF(program, kernel, ...) reinterpret_cast<const void*>(&kernel<__VA_ARGS__>)

#else  // the C++ compiler: launchers for kernels that NVRTC compiles

#include <atomic>
#include <string>

namespace semiring_ops {
namespace cuda {

// A non-type template argument, carried as a type for spelling.
template <class T, T v>
struct KernelValue {};

// The handle of `expression` (e.g. "semiring_ops::cuda::k<float, true>"), compiled from `program` on first use;
// throws std::runtime_error with the compiler's message when it cannot be had. Defined by the family's bindings
// (bindings/module.h), which hold the compiler Python registers; hidden, so that each family's module calls its own.
__attribute__((visibility("hidden"))) const void* nvrtc_kernel(const char* program, const std::string& expression);

namespace detail {

// The spelling of T as the C++ compiler prints it, from __PRETTY_FUNCTION__ ("... [with T = X]" in GCC,
// "... [T = X]" in Clang); KernelValue<T, v> becomes v.
template <class T>
const char* pretty_name() {
  return __PRETTY_FUNCTION__;
}

inline std::string spelled_type(const char* pretty) {
  const std::string s(pretty);
  size_t start = s.find("[with T = ");
  start = start == std::string::npos ? s.find("[T = ") + 5 : start + 10;
  size_t end = start;
  for (int depth = 0; end < s.size(); ++end) {  // up to the bracket (or GCC's "; ...") closing the list
    const char c = s[end];
    if (c == '<' || c == '(') ++depth;
    if (c == '>' || c == ')') --depth;
    if ((c == ']' || c == ';') && depth == 0) break;
  }
  std::string type = s.substr(start, end - start);
  const std::string value = "semiring_ops::cuda::KernelValue<";
  if (type.compare(0, value.size(), value) == 0) {  // KernelValue<T, v>: v
    const size_t comma = type.find(", ", value.size());
    type = type.substr(comma + 2, type.size() - comma - 3);
  }
  return type;
}

template <class... Ts>
std::string template_arguments() {
  std::string out;
  ((out += (out.empty() ? "" : ", ") + spelled_type(pretty_name<Ts>())), ...);
  return out;
}

}  // namespace detail

template <class... Ts>
std::string kernel_expression(const char* kernel) {
  return std::string("semiring_ops::cuda::") + kernel + "<" + detail::template_arguments<Ts...>() + ">";
}

}  // namespace cuda
}  // namespace semiring_ops

#define SEMIRING_OPS_VALUE(v) ::semiring_ops::cuda::KernelValue<decltype(v), v>
// The handle is looked up once per instantiation (an atomic, not a static's guarded initialisation: a thread that
// waits for the Python compiler must never block one that holds the GIL).
#define SEMIRING_OPS_NVRTC_HANDLE(program, ...)                                            \
  ([]() -> const void* {                                                                   \
    static std::atomic<const void*> semiring_ops_kernel_{nullptr};                         \
    const void* semiring_ops_k_ = semiring_ops_kernel_.load(std::memory_order_acquire);    \
    if (semiring_ops_k_ == nullptr) {                                                      \
      semiring_ops_k_ = ::semiring_ops::cuda::nvrtc_kernel(program, __VA_ARGS__);          \
      semiring_ops_kernel_.store(semiring_ops_k_, std::memory_order_release);              \
    }                                                                                      \
    return semiring_ops_k_;                                                                \
  }())
#define SEMIRING_OPS_KERNEL(program, kernel) \
  SEMIRING_OPS_NVRTC_HANDLE(program, std::string("semiring_ops::cuda::") + #kernel)
#define SEMIRING_OPS_KERNEL_OF(program, kernel, ...) \
  SEMIRING_OPS_NVRTC_HANDLE(program, ::semiring_ops::cuda::kernel_expression<__VA_ARGS__>(#kernel))

#endif  // __CUDACC__
#endif  // !__CUDACC_RTC__
