// The part of ATen the host code compiles against: at::Tensor with its methods (new_empty, new_full, where,
// contiguous, ...) and the dtype dispatch macros. Not ATen/ATen.h: its headers of every free operator function
// (at::empty, at::cat, ...) and of the Tensor operators (a + b) cost about 6 s of g++ and 36 s of nvcc per
// translation unit, most of a family's compile (docs/build.md, "Compile time"). Host code here allocates with
// the methods (like.new_empty(sizes, options)) and calls methods, never the free functions or operators.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
