// Device queries the host code makes on every call, answered once per device: attributes (multiprocessors,
// capability, shared memory), a kernel's dynamic shared memory allowance and its cluster occupancy. Each is a
// driver call otherwise, on every launch. ATen-free (the launchers include it); thread-safe (one mutex, held only
// around the lookups).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

namespace semiring_ops {
namespace cuda {

namespace detail {
inline std::mutex& device_query_mutex() {
  static std::mutex m;
  return m;
}
}  // namespace detail

// cudaDeviceGetAttribute(value, attr, device), read from the driver the first time for each (attr, device).
inline cudaError_t device_attribute(int* value, cudaDeviceAttr attr, int device) {
  static std::map<std::pair<int, int>, int> known;
  const std::pair<int, int> key(static_cast<int>(attr), device);
  {
    const std::lock_guard<std::mutex> lock(detail::device_query_mutex());
    const auto it = known.find(key);
    if (it != known.end()) {
      *value = it->second;
      return cudaSuccess;
    }
  }
  const cudaError_t e = cudaDeviceGetAttribute(value, attr, device);
  if (e == cudaSuccess) {
    const std::lock_guard<std::mutex> lock(detail::device_query_mutex());
    known[key] = *value;
  }
  return e;
}

// device_attribute of the current device (the launchers' case: they run on the caller's current device).
inline cudaError_t current_device_attribute(int* value, cudaDeviceAttr attr) {
  int device = 0;
  const cudaError_t e = cudaGetDevice(&device);
  return e == cudaSuccess ? device_attribute(value, attr, device) : e;
}

// cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) for the current device, unless
// an earlier call already allowed at least `bytes` there (the attribute only ever grows here).
inline cudaError_t allow_dynamic_smem(const void* kernel, int bytes) {
  static std::map<std::pair<const void*, int>, int> allowed;
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  const std::pair<const void*, int> key(kernel, device);
  {
    const std::lock_guard<std::mutex> lock(detail::device_query_mutex());
    const auto it = allowed.find(key);
    if (it != allowed.end() && it->second >= bytes) return cudaSuccess;
  }
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e == cudaSuccess) {
    const std::lock_guard<std::mutex> lock(detail::device_query_mutex());
    int& now = allowed[key];
    now = now > bytes ? now : bytes;
  }
  return e;
}

// cudaOccupancyMaxActiveClusters(kernel, config) for clusters of `cluster` blocks (config carries the cluster
// attribute), asked of the driver once per (kernel, cluster, threads, shared memory, device); 0 where the GPU
// cannot launch such clusters (the error is cleared).
inline int max_active_clusters(const void* kernel, const cudaLaunchConfig_t& config, int cluster, int device) {
  static std::map<std::tuple<const void*, int, unsigned, size_t, int>, int> known;
  const auto key = std::make_tuple(kernel, cluster, config.blockDim.x, config.dynamicSmemBytes, device);
  {
    const std::lock_guard<std::mutex> lock(detail::device_query_mutex());
    const auto it = known.find(key);
    if (it != known.end()) return it->second;
  }
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, kernel, &config) != cudaSuccess) {
    (void)cudaGetLastError();
    n = 0;
  }
  const std::lock_guard<std::mutex> lock(detail::device_query_mutex());
  return known[key] = n;
}

}  // namespace cuda
}  // namespace semiring_ops
