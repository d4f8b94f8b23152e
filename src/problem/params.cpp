#include "problem/params.h"

#include <cmath>

#include "base/status.h"

namespace flashattn {
namespace {

struct KeyInfo {
    const char *name;
    int64_t min;  // inclusive
    int64_t max;  // inclusive
    int64_t unset_value;
};

constexpr int64_t kNoMax = INT64_MAX;

// Indexed by key value; entries with a null name are not keys.
const KeyInfo *key_info(int key) {
    static const KeyInfo table[kMaxI64Key] = {
        /* 0 */ {nullptr, 0, 0, 0},
        /* BATCH */ {"FLASHATTN_I64_BATCH", 1, kNoMax, 0},
        /* SEQLEN_Q */ {"FLASHATTN_I64_SEQLEN_Q", 1, kNoMax, 0},
        /* SEQLEN_K */ {"FLASHATTN_I64_SEQLEN_K", 1, kNoMax, 0},
        /* HEADS_Q */ {"FLASHATTN_I64_HEADS_Q", 1, kNoMax, 0},
        /* HEADS_KV */ {"FLASHATTN_I64_HEADS_KV", 1, kNoMax, 0},
        /* HEAD_DIM */ {"FLASHATTN_I64_HEAD_DIM", 8, 256, 0},
        /* HEAD_DIM_V */ {"FLASHATTN_I64_HEAD_DIM_V", 8, 256, 0},
        /* DTYPE */ {"FLASHATTN_I64_DTYPE", FLASHATTN_DTYPE_FP16, FLASHATTN_DTYPE_FP8_E4M3, FLASHATTN_DTYPE_FP16},
        /* CAUSAL */ {"FLASHATTN_I64_CAUSAL", 0, 1, 0},
        /* WINDOW_LEFT */ {"FLASHATTN_I64_WINDOW_LEFT", -1, kNoMax, -1},
        /* WINDOW_RIGHT */ {"FLASHATTN_I64_WINDOW_RIGHT", -1, kNoMax, -1},
        /* BACKEND */ {"FLASHATTN_I64_BACKEND", FLASHATTN_BACKEND_AUTO, FLASHATTN_BACKEND_FA3, FLASHATTN_BACKEND_AUTO},
        /* DEVICE */ {"FLASHATTN_I64_DEVICE", 0, INT32_MAX, 0},
        /* VARLEN */ {"FLASHATTN_I64_VARLEN", 0, 1, 0},
        /* TOTAL_Q */ {"FLASHATTN_I64_TOTAL_Q", 0, kNoMax, 0},
        /* TOTAL_K */ {"FLASHATTN_I64_TOTAL_K", 0, kNoMax, 0},
        /* 17 */ {nullptr, 0, 0, 0},
        /* 18 */ {nullptr, 0, 0, 0},
        /* 19 */ {nullptr, 0, 0, 0},
        {"FLASHATTN_I64_Q_BATCH_STRIDE", 1, kNoMax, -1},
        {"FLASHATTN_I64_Q_ROW_STRIDE", 1, kNoMax, -1},
        {"FLASHATTN_I64_Q_HEAD_STRIDE", 1, kNoMax, -1},
        {"FLASHATTN_I64_K_BATCH_STRIDE", 1, kNoMax, -1},
        {"FLASHATTN_I64_K_ROW_STRIDE", 1, kNoMax, -1},
        {"FLASHATTN_I64_K_HEAD_STRIDE", 1, kNoMax, -1},
        {"FLASHATTN_I64_V_BATCH_STRIDE", 1, kNoMax, -1},
        {"FLASHATTN_I64_V_ROW_STRIDE", 1, kNoMax, -1},
        {"FLASHATTN_I64_V_HEAD_STRIDE", 1, kNoMax, -1},
        {"FLASHATTN_I64_O_BATCH_STRIDE", 1, kNoMax, -1},
        {"FLASHATTN_I64_O_ROW_STRIDE", 1, kNoMax, -1},
        {"FLASHATTN_I64_O_HEAD_STRIDE", 1, kNoMax, -1},
        /* DETERMINISTIC */ {"FLASHATTN_I64_DETERMINISTIC", 0, 1, 0},
        {"FLASHATTN_I64_DO_BATCH_STRIDE", 1, kNoMax, -1},
        {"FLASHATTN_I64_DO_ROW_STRIDE", 1, kNoMax, -1},
        {"FLASHATTN_I64_DO_HEAD_STRIDE", 1, kNoMax, -1},
        {"FLASHATTN_I64_DQ_BATCH_STRIDE", 1, kNoMax, -1},
        {"FLASHATTN_I64_DQ_ROW_STRIDE", 1, kNoMax, -1},
        {"FLASHATTN_I64_DQ_HEAD_STRIDE", 1, kNoMax, -1},
        {"FLASHATTN_I64_DK_BATCH_STRIDE", 1, kNoMax, -1},
        {"FLASHATTN_I64_DK_ROW_STRIDE", 1, kNoMax, -1},
        {"FLASHATTN_I64_DK_HEAD_STRIDE", 1, kNoMax, -1},
        {"FLASHATTN_I64_DV_BATCH_STRIDE", 1, kNoMax, -1},
        {"FLASHATTN_I64_DV_ROW_STRIDE", 1, kNoMax, -1},
        {"FLASHATTN_I64_DV_HEAD_STRIDE", 1, kNoMax, -1},
    };
    if (key < 0 || key >= kMaxI64Key || table[key].name == nullptr) return nullptr;
    return &table[key];
}

bool is_stride_key(int key) {
    return (key >= FLASHATTN_I64_Q_BATCH_STRIDE && key <= FLASHATTN_I64_O_HEAD_STRIDE) ||
           (key >= FLASHATTN_I64_DO_BATCH_STRIDE && key <= FLASHATTN_I64_DV_HEAD_STRIDE);
}

}  // namespace

const char *i64_key_name(int key) {
    const KeyInfo *info = key_info(key);
    return info ? info->name : nullptr;
}

const char *f64_key_name(int key) {
    switch (key) {
        case FLASHATTN_F64_SOFTMAX_SCALE: return "FLASHATTN_F64_SOFTMAX_SCALE";
        case FLASHATTN_F64_SOFTCAP: return "FLASHATTN_F64_SOFTCAP";
        default: return nullptr;
    }
}

int64_t i64_default(int key) {
    const KeyInfo *info = key_info(key);
    return info ? info->unset_value : 0;
}

flashattn_status_t check_i64_value(int key, int64_t value) {
    const KeyInfo *info = key_info(key);
    if (info == nullptr) return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "key: %d is not a flashattn_i64_param_t value", key);
    if (key == FLASHATTN_I64_DTYPE && value == 0)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "value: 0 is not a flashattn_dtype_t value for FLASHATTN_I64_DTYPE");
    if (value < info->min || value > info->max) {
        if (is_stride_key(key))
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "value: %s must be at least 1 element (got %lld)", info->name, (long long)value);
        if (info->max == kNoMax)
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "value: %s must be at least %lld (got %lld)", info->name,
                        (long long)info->min, (long long)value);
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "value: %s must be in [%lld, %lld] (got %lld)", info->name,
                    (long long)info->min, (long long)info->max, (long long)value);
    }
    if ((key == FLASHATTN_I64_HEAD_DIM || key == FLASHATTN_I64_HEAD_DIM_V) && value % 8 != 0)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "value: %s must be a multiple of 8 (got %lld)", info->name, (long long)value);
    return FLASHATTN_SUCCESS;
}

flashattn_status_t check_f64_value(int key, double value) {
    const char *name = f64_key_name(key);
    if (name == nullptr) return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "key: %d is not a flashattn_f64_param_t value", key);
    if (!std::isfinite(value)) return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "value: %s must be finite (got %g)", name, value);
    if (key == FLASHATTN_F64_SOFTCAP && value == 0.0) return FLASHATTN_SUCCESS;  // off
    if (key == FLASHATTN_F64_SOFTMAX_SCALE && value <= 0.0)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "value: %s must be > 0, in [2^-126, 2^64] (got %g)", name, value);
    if (value < 0.0)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "value: %s must be >= 0, 0 meaning off, else in [2^-126, 2^64] (got %g)",
                    name, value);
    if (value < kMinF64Value || value > kMaxF64Value)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "value: %s must be in [2^-126, 2^64] (about [1.2e-38, 1.8e19])%s (got %g)",
                    name, key == FLASHATTN_F64_SOFTCAP ? ", or 0 meaning off" : "", value);
    return FLASHATTN_SUCCESS;
}

}  // namespace flashattn
