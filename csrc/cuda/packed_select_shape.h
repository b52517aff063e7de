// The packed 16-bit kernel's output tile per block (packed_select_kernels.cu). semiring_ops/ops/packed.py reads it
// through the module's tile_shape() to decide when the packed kernel fills the GPU.
#pragma once

namespace semiring_ops {
namespace cuda {

constexpr int kPackedTileRows = 128, kPackedTileCols = 128;

}  // namespace cuda
}  // namespace semiring_ops
