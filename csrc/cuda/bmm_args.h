// The bmm family's kernel arguments and tile shapes (plain data, shared by the kernels, their launchers and the host
// code): the tile engine's ContractionArgs with each policy's Params.
#pragma once

#include "cuda/contraction.h"
#include "cuda/tile_launch.h"

namespace semiring_ops {
namespace cuda {

template <class acc_t>
struct BmmParams {
  acc_t* out;    // (B, n, m) contiguous, in the accumulation type
  int64_t* arg;  // (B, n, m) the selected k, written only when kArg
};

// a the one left field (B, n, k), b the one right field (B, k, m).
template <class T>
using BmmArgs = ContractionArgs<T, 1, 1, BmmParams<acc_of_t<T>>>;

template <class T>
struct LogContractParams {
  T* out;  // (B, R, S) contiguous
};

// Left fields {L0, L1 if kL1}, right fields {R0, R1 if kR1}, out_field O0.
template <class T, bool kL1, bool kR1>
using LogContractArgs = ContractionArgs<T, kL1 ? 2 : 1, kR1 ? 2 : 1, LogContractParams<T>>;

// Tile shapes, per accumulation type. fp64 halves the tile: its states and staging take twice
// the registers and shared memory.
template <class acc_t>
struct BmmTiles;
template <>
struct BmmTiles<float> {
  using type = TileShape</*BM*/ 64, /*BN*/ 64, /*BK*/ 16, /*TM*/ 4, /*TN*/ 4, /*min blocks*/ 2>;
};
template <>
struct BmmTiles<double> {
  using type = TileShape</*BM*/ 32, /*BN*/ 32, /*BK*/ 16, /*TM*/ 2, /*TN*/ 2, /*min blocks*/ 1>;
};

// Tile shapes, per element type of the log-weighted contraction (fp64 halves the tile, as for bmm).
template <class T>
struct ContractTiles;
template <>
struct ContractTiles<float> {
  using type = TileShape</*BM*/ 64, /*BN*/ 64, /*BK*/ 16, /*TM*/ 4, /*TN*/ 4, /*min blocks*/ 2>;
};
template <>
struct ContractTiles<double> {
  using type = TileShape</*BM*/ 32, /*BN*/ 32, /*BK*/ 16, /*TM*/ 2, /*TN*/ 2, /*min blocks*/ 1>;
};

}  // namespace cuda
}  // namespace semiring_ops
