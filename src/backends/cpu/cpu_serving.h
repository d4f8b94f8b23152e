// The CPU backend's serving features (issue 18): the host checks of the page table, seqused_k and
// rotary positions, the append of new K/V rows into the caches (K rotated) and the rotated copy
// of Q the attention then reads. The attention itself reads keys through cpu::Slice's page table.
#pragma once

#include <cstdint>

#include "problem/problem.h"

namespace flashattn {
namespace cpu {

// Every host-checkable rule of a call's serving arrays, before anything is written: seqused_k
// within each sequence's cache (counting the append), page indices within [0, num_pages) for
// every page a sequence reads, rotary positions within the tables. cu_seqlens are checked first.
flashattn_status_t check_serving_call(const Problem &p, const Tensors &t);

// Keys sequence b attends over: seqused_k[b] (+ the appended rows), its cu_seqlens_k length, or seqlen_k.
int64_t keys_of_sequence(const Problem &p, const Tensors &t, int64_t b);

// Element offset of key `pos` of sequence b, head `head`, in a cache with strides `s`.
int64_t cache_offset(const Problem &p, const Tensors &t, const Strides &s, int64_t b, int64_t pos, int64_t head);

// Writes K_new (rotated when the plan has a rotary dim) and V_new into the caches at each
// sequence's seqused_k.
void append_rows(const Problem &p, const Tensors &t);

// Bytes of the rotated copy of Q (0 without rotary): [query rows of all sequences][heads_q][head_dim].
size_t rotated_q_bytes(const Problem &p);

// Q with its first rotary_dim columns rotated, contiguous as rotated_q_bytes() describes.
void rotate_queries(const Problem &p, const Tensors &t, unsigned char *out);

}  // namespace cpu
}  // namespace flashattn
