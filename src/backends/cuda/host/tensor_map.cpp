#include "backends/cuda/host/tensor_map.h"

#include <cuda_runtime_api.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled_v12000

#include <cinttypes>
#include <cstring>

#include "base/status.h"

namespace flashattn {
namespace {

struct EncodeEntry {
    PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
    cudaError_t err = cudaSuccess;
    cudaDriverEntryPointQueryResult query = cudaDriverEntryPointSuccess;
};

// Resolved once per process (thread-safe static initialisation).
const EncodeEntry &encode_entry() {
    static const EncodeEntry entry = [] {
        EncodeEntry e;
        void *fn = nullptr;
        e.err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &e.query);
        if (e.err != cudaSuccess) {
            cudaGetLastError();  // do not leave a sticky-looking error behind for the caller
        } else if (e.query == cudaDriverEntryPointSuccess && fn != nullptr) {
            e.fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
        }
        return e;
    }();
    return entry;
}

}  // namespace

flashattn_status_t encode_tensor_map_sw128(CUtensorMap *out, TmaElement element, const void *base, int rank,
                                           const uint64_t *dims, const uint64_t *strides_bytes,
                                           const uint32_t *box) {
    if (out == nullptr || dims == nullptr || box == nullptr || (rank > 1 && strides_bytes == nullptr))
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "tensor map: null argument");
    if (rank < 2 || rank > 4) return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "tensor map: rank %d (2..4)", rank);
    if (base == nullptr || (reinterpret_cast<uintptr_t>(base) & 15u) != 0)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "tensor map: base address %p is not 16-byte aligned", base);
    const uint64_t elem_bytes = static_cast<uint64_t>(tma_element_bytes(element));
    for (int i = 0; i < rank; ++i) {
        if (dims[i] == 0 || dims[i] > (uint64_t{1} << 32))
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "tensor map: dim %d extent %" PRIu64 " out of range", i,
                        dims[i]);
        if (box[i] == 0 || box[i] > 256)
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "tensor map: box dim %d is %u (1..256)", i, box[i]);
    }
    const uint64_t inner_box_bytes = box[0] * elem_bytes;
    if (inner_box_bytes % 16 != 0 || inner_box_bytes > 128)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                    "tensor map: inner box of %" PRIu64 " bytes (a multiple of 16, at most the 128 B swizzle span)",
                    inner_box_bytes);
    for (int i = 0; i + 1 < rank; ++i) {
        if (strides_bytes[i] % 16 != 0 || strides_bytes[i] >= (uint64_t{1} << 40))
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                        "tensor map: stride of dim %d is %" PRIu64 " bytes (a multiple of 16, below 2^40)", i + 1,
                        strides_bytes[i]);
    }

    const EncodeEntry &entry = encode_entry();
    if (entry.err != cudaSuccess)
        return fail(FLASHATTN_ERROR_DEVICE, "cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled): CUDA error %d (%s): %s",
                    static_cast<int>(entry.err), cudaGetErrorName(entry.err), cudaGetErrorString(entry.err));
    if (entry.fn == nullptr)
        return fail(FLASHATTN_ERROR_DEVICE,
                    "cuTensorMapEncodeTiled is not available from the driver (query result %d)",
                    static_cast<int>(entry.query));

    cuuint64_t gdim[4] = {};
    cuuint64_t gstride[3] = {};
    cuuint32_t bdim[4] = {};
    cuuint32_t estride[4] = {1, 1, 1, 1};
    for (int i = 0; i < rank; ++i) {
        gdim[i] = dims[i];
        bdim[i] = box[i];
    }
    for (int i = 0; i + 1 < rank; ++i) gstride[i] = strides_bytes[i];

    std::memset(out, 0, sizeof *out);
    const CUtensorMapDataType dtype = element == TmaElement::bf16   ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                      : element == TmaElement::e4m3 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                                                    : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    const CUresult r = entry.fn(out, dtype, static_cast<cuuint32_t>(rank), const_cast<void *>(base), gdim, gstride,
                                bdim, estride, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return fail(FLASHATTN_ERROR_DEVICE, "cuTensorMapEncodeTiled failed with CUresult %d", static_cast<int>(r));
    return FLASHATTN_SUCCESS;
}

}  // namespace flashattn
