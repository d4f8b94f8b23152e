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

// The attention variants' keys (60..69, since 0.3), in a table of their own.
constexpr int kFirstVariantKey = FLASHATTN_I64_MASK_ALIGN;
const KeyInfo *variant_key_info(int key) {
    static const KeyInfo table[] = {
        /* MASK_ALIGN */ {"FLASHATTN_I64_MASK_ALIGN", FLASHATTN_MASK_ALIGN_BOTTOM_RIGHT, FLASHATTN_MASK_ALIGN_TOP_LEFT,
                          FLASHATTN_MASK_ALIGN_BOTTOM_RIGHT},
        /* SINK_TOKENS */ {"FLASHATTN_I64_SINK_TOKENS", 0, kNoMax, 0},
        /* SINK_LOGITS */ {"FLASHATTN_I64_SINK_LOGITS", 0, 1, 0},
        /* ALIBI */ {"FLASHATTN_I64_ALIBI", 0, 1, 0},
    };
    const int index = key - kFirstVariantKey;
    if (index < 0 || index >= static_cast<int>(sizeof table / sizeof table[0]) || key >= kMaxI64Key) return nullptr;
    return &table[index];
}

// The FP8 keys (64..69, since 0.3). -1: resolved at finalize (the defaults depend on the dtype and
// heads_kv).
constexpr int kFirstFp8Key = FLASHATTN_I64_OUTPUT_DTYPE;
const KeyInfo *fp8_key_info(int key) {
    static const KeyInfo table[] = {
        /* OUTPUT_DTYPE */ {"FLASHATTN_I64_OUTPUT_DTYPE", FLASHATTN_DTYPE_FP16, FLASHATTN_DTYPE_FP8_E4M3, -1},
        /* DESCALE_BATCH_STRIDE */ {"FLASHATTN_I64_DESCALE_BATCH_STRIDE", 0, kNoMax, -1},
        /* DESCALE_HEAD_STRIDE */ {"FLASHATTN_I64_DESCALE_HEAD_STRIDE", 0, kNoMax, -1},
    };
    const int index = key - kFirstFp8Key;
    if (index < 0 || index >= static_cast<int>(sizeof table / sizeof table[0]) || key >= kMaxI64Key) return nullptr;
    return &table[index];
}

// The decode keys (70..74, since 0.3).
constexpr int kFirstDecodeKey = FLASHATTN_I64_NUM_SPLITS;
constexpr int64_t kMaxNumSplits = 128;  // the split-KV combine reduces at most 128 partials
const KeyInfo *decode_key_info(int key) {
    static const KeyInfo table[] = {
        /* NUM_SPLITS */ {"FLASHATTN_I64_NUM_SPLITS", 0, kMaxNumSplits, 0},
    };
    const int index = key - kFirstDecodeKey;
    if (index < 0 || index >= static_cast<int>(sizeof table / sizeof table[0]) || key >= kMaxI64Key) return nullptr;
    return &table[index];
}

// Indexed by key value; entries with a null name are not keys.
const KeyInfo *key_info(int key) {
    static const KeyInfo table[kFirstVariantKey] = {
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
        /* PAGED_KV */ {"FLASHATTN_I64_PAGED_KV", 0, 1, 0},
        /* PAGE_SIZE */ {"FLASHATTN_I64_PAGE_SIZE", 1, INT32_MAX, 0},
        /* NUM_PAGES */ {"FLASHATTN_I64_NUM_PAGES", 1, INT32_MAX, 0},
        /* MAX_PAGES_PER_SEQUENCE */ {"FLASHATTN_I64_MAX_PAGES_PER_SEQUENCE", 1, INT32_MAX, -1},
        /* PAGE_TABLE_STRIDE */ {"FLASHATTN_I64_PAGE_TABLE_STRIDE", 1, kNoMax, -1},
        /* SEQUSED_K */ {"FLASHATTN_I64_SEQUSED_K", 0, 1, 0},
        /* NEW_KV_ROWS */ {"FLASHATTN_I64_NEW_KV_ROWS", 0, INT32_MAX, 0},
        {"FLASHATTN_I64_K_NEW_BATCH_STRIDE", 1, kNoMax, -1},
        {"FLASHATTN_I64_K_NEW_ROW_STRIDE", 1, kNoMax, -1},
        {"FLASHATTN_I64_K_NEW_HEAD_STRIDE", 1, kNoMax, -1},
        {"FLASHATTN_I64_V_NEW_BATCH_STRIDE", 1, kNoMax, -1},
        {"FLASHATTN_I64_V_NEW_ROW_STRIDE", 1, kNoMax, -1},
        {"FLASHATTN_I64_V_NEW_HEAD_STRIDE", 1, kNoMax, -1},
        /* ROTARY_DIM */ {"FLASHATTN_I64_ROTARY_DIM", 0, 256, 0},
        /* ROTARY_INTERLEAVED */ {"FLASHATTN_I64_ROTARY_INTERLEAVED", 0, 1, 0},
    };
    if (key >= kFirstDecodeKey) return decode_key_info(key);
    if (key >= kFirstFp8Key) return fp8_key_info(key);
    if (key >= kFirstVariantKey) return variant_key_info(key);
    if (key < 0 || table[key].name == nullptr) return nullptr;
    return &table[key];
}

bool is_stride_key(int key) {
    return (key >= FLASHATTN_I64_Q_BATCH_STRIDE && key <= FLASHATTN_I64_O_HEAD_STRIDE) ||
           (key >= FLASHATTN_I64_DO_BATCH_STRIDE && key <= FLASHATTN_I64_DV_HEAD_STRIDE) ||
           (key >= FLASHATTN_I64_K_NEW_BATCH_STRIDE && key <= FLASHATTN_I64_V_NEW_HEAD_STRIDE) ||
           key == FLASHATTN_I64_PAGE_TABLE_STRIDE;
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
    if ((key == FLASHATTN_I64_DTYPE || key == FLASHATTN_I64_OUTPUT_DTYPE) && value == 0)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "value: 0 is not a flashattn_dtype_t value for %s", info->name);
    if (value < info->min || value > info->max) {
        if (is_stride_key(key))
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "value: %s must be at least 1 element (got %lld)", info->name, (long long)value);
        if (info->max == kNoMax)
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "value: %s must be at least %lld (got %lld)", info->name,
                        (long long)info->min, (long long)value);
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "value: %s must be in [%lld, %lld] (got %lld)", info->name,
                    (long long)info->min, (long long)info->max, (long long)value);
    }
    if (key == FLASHATTN_I64_ROTARY_DIM && value % 2 != 0)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "value: %s must be even, it rotates pairs of columns (got %lld)",
                    info->name, (long long)value);
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
