// Stand-in for crt/host_config.h (csrc/nvrtc_host/README.md): its checks concern nvcc's host compilers; a host
// compiler building the runtime API's declarations needs none of them.
#pragma once
#if defined(__CUDACC__)
#error "csrc/nvrtc_host is for host compilers: nvcc brings its own crt headers"
#endif
