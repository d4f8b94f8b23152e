// The CPU backend's merge of partial attention states (flashattn_plan_merge_states on the host).
#pragma once

#include "problem/problem.h"
#include "problem/variants.h"

namespace flashattn {
namespace cpu {

// O = sum_s exp(LSE_s - LSE) O_s, LSE = log sum_s exp(LSE_s) for every (row, head) of `p`'s
// output layout; rows -inf in every partial get O = 0, LSE = -inf. Arguments checked.
void merge_states(const Problem &p, const MergeCall &m);

}  // namespace cpu
}  // namespace flashattn
