// Host-side encoding of TMA tensor maps (CUtensorMap) for the Hopper (sm_90a) path.
// cuTensorMapEncodeTiled is reached through the runtime's driver entry point
// (cudaGetDriverEntryPointByVersion, ABI version 12000), so the library does not link libcuda.
// Compiled only when FLASHATTN_WITH_CUDA; host code only.
#pragma once

#include <cuda.h>  // CUtensorMap (type only; no libcuda symbols are used)

#include <cstdint>

#include "flashattn/flashattn.h"

namespace flashattn {

// e4m3: FP8 (E4M3) bytes, loaded as 8-bit integers (TMA copies bits; 1-byte elements).
enum class TmaElement { bf16, fp16, e4m3 };

// Bytes of one element.
constexpr int tma_element_bytes(TmaElement e) { return e == TmaElement::e4m3 ? 1 : 2; }

// A rank-2, -3 or -4 tiled tensor map with CU_TENSOR_MAP_SWIZZLE_128B, elementStrides all 1,
// no interleave, L2_128B promotion and zero fill for out-of-bounds elements.
//   dims[i]          extent of dim i, innermost first (dims[0] is the contiguous one)
//   strides_bytes[i] byte stride of dim i+1 (rank-1 entries), each a multiple of 16 and < 2^40
//   box[i]           box extent of dim i; box[0] * element bytes must be 16..128 in steps of 16
//                    (the 128 B swizzle span), every box[i] in 1..256
// `base` must be 16-byte aligned device memory. Fails with FLASHATTN_ERROR_INVALID_ARGUMENT on a
// rule violation and FLASHATTN_ERROR_DEVICE when the driver entry point or the encode fails;
// flashattn_last_error() names the cause.
flashattn_status_t encode_tensor_map_sw128(CUtensorMap *out, TmaElement element, const void *base, int rank,
                                           const uint64_t *dims, const uint64_t *strides_bytes,
                                           const uint32_t *box);

}  // namespace flashattn
