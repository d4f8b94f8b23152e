// What the user set on a plan, before resolution: raw values, which keys were set, and the rule
// each key's value must satisfy on its own.
#pragma once

#include <cstdint>

#include "flashattn/flashattn.h"

namespace flashattn {

constexpr int kMaxI64Key = 75;  // one past the largest flashattn_i64_param_t value (keys up to 74 allocated)

struct PlanParams {
    int64_t i64[kMaxI64Key] = {};
    bool is_set[kMaxI64Key] = {};
    double softmax_scale = 0.0;
    double softcap = 0.0;

    int64_t get(flashattn_i64_param_t key, int64_t fallback) const {
        return is_set[key] ? i64[key] : fallback;
    }
};

// The key's name as the header spells it ("FLASHATTN_I64_HEAD_DIM"), or nullptr if unknown.
const char *i64_key_name(int key);
const char *f64_key_name(int key);

// The range of SOFTMAX_SCALE and of a non-zero SOFTCAP: normal floats (a subnormal scale or cap
// flushes to 0 in the kernels' float arithmetic) small enough that scale * log2(e), the exp2
// multiplier every kernel forms, and the scores of fp16 inputs (|q.k| < 2^41) times it stay far
// from float overflow. Finalize adds a rule on scale / softcap (resolve.cpp).
constexpr double kMinF64Value = 0x1p-126;
constexpr double kMaxF64Value = 0x1p64;

// Check a value against its key's own rule; on failure sets the message and returns the status.
flashattn_status_t check_i64_value(int key, int64_t value);
flashattn_status_t check_f64_value(int key, double value);

// Value reported by get_i64 for a key that was never set (before finalize).
int64_t i64_default(int key);

}  // namespace flashattn
