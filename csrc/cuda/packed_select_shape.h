// The select kernel's shape (packed_select_kernels.cu): its output tile per block, which semiring_ops/build/backends.py
// reads through the module's tile_shape() to decide when the kernel fills the GPU, and its staging runs.
#pragma once

namespace semiring_ops {
namespace cuda {

constexpr int kPackedTileRows = 128, kPackedTileCols = 128;

// The threads of a block, and the elements of each operand a thread stages per k-tile for an element of
// type T: one 16-byte run along the operand's unit-stride dimension (read as one vector where aligned).
constexpr int kPackedThreads = 256;
template <class T>
constexpr int select_run() {
  return 16 / static_cast<int>(sizeof(T));
}

}  // namespace cuda
}  // namespace semiring_ops
