// Stand-in for crt/host_defines.h (csrc/nvrtc_host/README.md): for a host compiler, CUDA's qualifiers mean nothing
// and the few GCC attributes the runtime API's declarations use.
#pragma once
#if defined(__CUDACC__)
#error "csrc/nvrtc_host is for host compilers: nvcc brings its own crt headers"
#endif

#define __no_return__ __attribute__((noreturn))
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __inline_hint__
#define __align__(n) __attribute__((aligned(n)))
#define __builtin_align__(a) __align__(a)
#define __maxnreg__(a)
#define __local_maxnreg__(a)
#define __thread__ __thread
#define __import__
#define __export__
#define __cdecl
#define __annotate__(a)
#define __location__(a)
#define __specialization_static
#define __launch_bounds__(...)
#define __cluster_dims__(...)
#define __block_size__(...)
#define __grid_constant__
#define __host__
#define __device__
#define __global__
#define __shared__
#define __constant__
#define __managed__
#define __nv_pure__
#define __device_builtin__
#define __device_builtin_texture_type__
#define __device_builtin_surface_type__
#define __cudart_builtin__
#ifndef CUDARTAPI
#define CUDARTAPI
#endif
#define __CUDA_ARCH_HAS_FEATURE__(feature) 0
#define __CUDA_HAS_ARCH_FAMILY_SPECIFIC(n) 0
#define __CUDA_HAS_ARCH_SPECIFIC(n) 0
