/* The execution contract of the GPU backends (docs/mainpage.md, "Threads", "Streams" and "CUDA
 * graphs"), for fa1, fa2 and fa3 and each execute entry point the backend has (forward fixed and
 * variable length on all three; the backward, fixed and variable length, on fa2, the GPU backend
 * with one; flashattn_plan_merge_states on fixed and variable-length plans of all three, fp16 and
 * fp32 partials; and a decode step through flashattn_plan_execute_args that appends a rotated K/V
 * row to the cache and attends: contiguous with 3 forced splits, and paged with pages of 16, so
 * the append kernel and the split attention (whose last split per query tile combines the
 * partials through arrival words in the workspace; a graph replays them with its captured tag),
 * launched on sm_90 as programmatic dependent launches, are covered too), every result compared
 * bitwise with a serial run on the calling thread (for the decode step: O, LSE and every byte of
 * both caches):
 * - from a fresh thread that never touched CUDA: the whole plan lifecycle there, and an execute of
 *   a plan finalized elsewhere;
 * - from several threads at once, each on its own stream with its own workspace and outputs,
 *   sharing one plan;
 * - captured into a CUDA graph and replayed (also after the inputs changed in place: the graph
 *   reads the caller's memory when it runs);
 * - replayed after the plan that captured it was destroyed (the graph holds its kernel parameters
 *   by value and references only the caller's memory).
 * The serial run itself is checked against an independent double-precision reference (O, LSE,
 * dQ, dK, dV; the merge formula over the partials), so bitwise agreement means agreement with a
 * verified result. Plans set
 * FLASHATTN_I64_DETERMINISTIC = 1 so the backward is reproducible. Skipped (77) without a GPU.
 * FLASHATTN_TEST_REDUCED=1 (compute-sanitizer runs) uses 2 threads and one graph replay. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "flashattn/flashattn.h"
#include "test_backward_reference.h"
#include "test_reference.h"
#include "test_support.h"

/* Two sequences, seqlen_q != seqlen_k, GQA 4/2, head dim 64; varlen packs lengths {150, 61} and
 * {230, 177}. Causal (bottom-right), so rows near the top see few keys. */
enum { B = 2, SQ = 150, SK = 230, HQ = 4, HKV = 2, D = 64, MAX_THREADS = 6, NUM_PARTIALS = 3 };
static const int64_t kLenQ[B] = {150, 61}, kLenK[B] = {230, 177};

#define CUDA_OK(call)                                                                          \
    do {                                                                                       \
        cudaError_t e_ = (call);                                                               \
        if (e_ != cudaSuccess) fail_msg("%s: %s", #call, cudaGetErrorString(e_));              \
    } while (0)
#define FA_OK(call)                                                                            \
    do {                                                                                       \
        flashattn_status_t s_ = (call);                                                        \
        if (s_ != FLASHATTN_SUCCESS) fail_msg("%s: %s", #call, flashattn_last_error());       \
    } while (0)

typedef enum entry { FORWARD, FORWARD_VARLEN, BACKWARD, BACKWARD_VARLEN, MERGE, MERGE_VARLEN, DECODE, DECODE_PAGED } entry;

/* The decode step: B sequences of one query each over caches holding kUsed[b] keys of DSK, one new
 * K/V row appended at kUsed[b] with a half-split rotary embedding over the first ROT columns (Q
 * rotated at the same position); DECODE: contiguous caches [B, DSK, HKV, D] and DECODE_SPLITS
 * forced; DECODE_PAGED: pages of PAGE keys through a shuffled page table, splits chosen by the plan. */
enum { DSQ = 1, DN = 1, DSK = 1000, ROT = 32, PAGE = 16, MAXP = (DSK + PAGE - 1) / PAGE, DECODE_SPLITS = 3 };
static const int32_t kUsed[B] = {700, 333};
/* 1: every call goes through the execute-arguments object (flashattn_plan_execute_args /
 * _backward_args, since 0.3) instead of the positional entry points; same contract, same bits. */
static int g_through_args = 0;
static const char *entry_name(entry e) {
    static const char *names[] = {"execute", "execute_varlen", "execute_backward", "execute_backward_varlen",
                                  "merge_states", "merge_states (varlen)",
                                  "execute_args (decode: append + rotary, contiguous cache, 3 splits)",
                                  "execute_args (decode: append + rotary, pages of 16)"};
    static const char *args_names[] = {"execute_args", "execute_args (varlen)", "execute_backward_args",
                                       "execute_backward_args (varlen)"};
    return g_through_args && e < MERGE ? args_names[e] : names[e];
}
static int is_varlen(entry e) { return e == FORWARD_VARLEN || e == BACKWARD_VARLEN || e == MERGE_VARLEN; }
static int is_merge(entry e) { return e == MERGE || e == MERGE_VARLEN; }
static int is_backward(entry e) { return e == BACKWARD || e == BACKWARD_VARLEN; }
static int is_decode(entry e) { return e == DECODE || e == DECODE_PAGED; }

/* Device inputs of one layout (fixed or packed), shared read-only by every call. */
typedef struct inputs {
    int varlen;
    int64_t rows_q, rows_k;
    void *q, *k, *v, *o, *dout; /* o: the forward's output, the backward's input */
    float *lse;
    int32_t *cu_q, *cu_k;
    float *hq, *hk, *hv, *hdout; /* host copies as float, [rows][heads][dim] */
    /* The merge's partial states, laid out as the plan's O and LSE: fp16 partials for the fixed
     * layout, fp32 for the packed one; host copies as float. */
    flashattn_dtype_t part_dtype;
    void *part_o[NUM_PARTIALS];
    float *part_lse[NUM_PARTIALS];
    float *hpart_o[NUM_PARTIALS], *hpart_lse[NUM_PARTIALS];
    /* The decode step (decode != 0): pristine caches (every call's outputs start from copies of
     * them), the new rows, seqused_k, the page table (paged) and the rotary tables. */
    int decode, paged;
    int64_t cache_rows;
    void *kcache, *vcache, *knew, *vnew;
    int32_t *seqused, *page_table, htable[B * MAXP];
    float *cos, *sin;
    float *hkcache, *hvcache, *hknew, *hvnew, hcos[DSK * ROT / 2], hsin[DSK * ROT / 2];
} inputs;

/* One call's outputs: O and LSE (forward), dQ, dK, dV (backward), or O, LSE and the K and V
 * caches the call appends to (decode), with its workspace. */
typedef struct outputs {
    void *buf[4];
    size_t bytes[4];
    const void *restore[4]; /* non-NULL: reset from this copy instead of poisoned (the caches) */
    int count;
    void *workspace;
    size_t workspace_bytes;
} outputs;

static size_t elems_q(const inputs *in) { return (size_t)in->rows_q * HQ * D; }
static size_t elems_k(const inputs *in) { return (size_t)in->rows_k * HKV * D; }
static size_t lse_count(const inputs *in) { return (size_t)in->rows_q * HQ; }
static size_t cache_elems(const inputs *in) { return (size_t)in->cache_rows * HKV * D; }
static size_t new_elems(void) { return (size_t)B * DN * HKV * D; }

static void *device_random(size_t n, uint64_t seed, float **host_copy) {
    uint16_t *h = malloc(n * 2);
    float *f = malloc(n * sizeof(float));
    test_rng rng;
    test_rng_seed(&rng, seed);
    for (size_t i = 0; i < n; ++i) {
        test_store(FLASHATTN_DTYPE_FP16, &h[i], test_rng_uniform(&rng, -1.0, 1.0));
        f[i] = (float)test_load(FLASHATTN_DTYPE_FP16, &h[i]);
    }
    void *d = NULL;
    CUDA_OK(cudaMalloc(&d, n * 2));
    CUDA_OK(cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice));
    free(h);
    if (host_copy) *host_copy = f; else free(f);
    return d;
}

static size_t part_elem_bytes(const inputs *in) { return in->part_dtype == FLASHATTN_DTYPE_FP32 ? 4 : 2; }

/* The plan's LSE index of packed query row r (fixed: r = b * SQ + i) and head h. */
static size_t lse_index(const inputs *in, size_t r, int h) {
    return in->varlen ? (size_t)h * (size_t)in->rows_q + r : ((r / SQ) * HQ + (size_t)h) * SQ + r % SQ;
}

/* Partial s: random O in [-1, 1) (exact in the partial dtype), LSE in [-3, 4); some rows -inf in
 * one partial (they add nothing there), and every 17th row -inf in all of them (O = 0, LSE = -inf). */
static void make_partials(inputs *in, uint64_t seed) {
    in->part_dtype = in->varlen ? FLASHATTN_DTYPE_FP32 : FLASHATTN_DTYPE_FP16;
    const size_t no = elems_q(in), nl = lse_count(in), es = part_elem_bytes(in);
    test_rng rng;
    test_rng_seed(&rng, seed);
    for (int s = 0; s < NUM_PARTIALS; ++s) {
        unsigned char *h = malloc(no * es);
        in->hpart_o[s] = malloc(no * sizeof(float));
        in->hpart_lse[s] = malloc(nl * sizeof(float));
        for (size_t i = 0; i < no; ++i) {
            test_store(in->part_dtype, h + i * es, test_rng_uniform(&rng, -1.0, 1.0));
            in->hpart_o[s][i] = (float)test_load(in->part_dtype, h + i * es);
        }
        for (size_t r = 0; r < (size_t)in->rows_q; ++r)
            for (int hd = 0; hd < HQ; ++hd) {
                const size_t at = lse_index(in, r, hd);
                const int none_here = (r + (size_t)hd + (size_t)s) % 5 == 0, none_at_all = r % 17 == 3;
                in->hpart_lse[s][at] = none_here || none_at_all ? -INFINITY : (float)test_rng_uniform(&rng, -3.0, 4.0);
            }
        CUDA_OK(cudaMalloc(&in->part_o[s], no * es));
        CUDA_OK(cudaMemcpy(in->part_o[s], h, no * es, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMalloc((void **)&in->part_lse[s], nl * sizeof(float)));
        CUDA_OK(cudaMemcpy(in->part_lse[s], in->hpart_lse[s], nl * sizeof(float), cudaMemcpyHostToDevice));
        free(h);
    }
}

static void inputs_make(inputs *in, int varlen, uint64_t seed) {
    memset(in, 0, sizeof *in);
    in->varlen = varlen;
    in->rows_q = varlen ? kLenQ[0] + kLenQ[1] : B * SQ;
    in->rows_k = varlen ? kLenK[0] + kLenK[1] : B * SK;
    in->q = device_random(elems_q(in), seed, &in->hq);
    in->k = device_random(elems_k(in), seed + 1, &in->hk);
    in->v = device_random(elems_k(in), seed + 2, &in->hv);
    in->dout = device_random(elems_q(in), seed + 3, &in->hdout);
    CUDA_OK(cudaMalloc(&in->o, elems_q(in) * 2));
    CUDA_OK(cudaMalloc((void **)&in->lse, lse_count(in) * 4));
    const int32_t cu_q[B + 1] = {0, (int32_t)kLenQ[0], (int32_t)(kLenQ[0] + kLenQ[1])};
    const int32_t cu_k[B + 1] = {0, (int32_t)kLenK[0], (int32_t)(kLenK[0] + kLenK[1])};
    CUDA_OK(cudaMalloc((void **)&in->cu_q, sizeof cu_q));
    CUDA_OK(cudaMalloc((void **)&in->cu_k, sizeof cu_k));
    CUDA_OK(cudaMemcpy(in->cu_q, cu_q, sizeof cu_q, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(in->cu_k, cu_k, sizeof cu_k, cudaMemcpyHostToDevice));
    make_partials(in, seed + 4);
}

static void *device_copy(const void *host, size_t bytes) {
    void *d = NULL;
    CUDA_OK(cudaMalloc(&d, bytes));
    CUDA_OK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
    return d;
}

/* Cache row of key t of sequence b: through the page table, or [b][t] contiguous. */
static int64_t cache_row(const inputs *in, int b, int64_t t) {
    return in->paged ? (int64_t)in->htable[b * MAXP + t / PAGE] * PAGE + t % PAGE : (int64_t)b * DSK + t;
}

/* The decode step's inputs: every cache slot random (the append slots too, so a slot the call
 * fails to write is seen), pages handed out in a shuffled order, rotary tables of position p and
 * frequency i (theta = p * 10000^(-2i/ROT)). */
static void inputs_make_decode(inputs *in, int paged, uint64_t seed) {
    memset(in, 0, sizeof *in);
    in->decode = 1;
    in->paged = paged;
    in->rows_q = (int64_t)B * DSQ;
    in->cache_rows = paged ? (int64_t)B * MAXP * PAGE : (int64_t)B * DSK;
    in->q = device_random(elems_q(in), seed, &in->hq);
    in->kcache = device_random(cache_elems(in), seed + 1, &in->hkcache);
    in->vcache = device_random(cache_elems(in), seed + 2, &in->hvcache);
    in->knew = device_random(new_elems(), seed + 3, &in->hknew);
    in->vnew = device_random(new_elems(), seed + 4, &in->hvnew);
    int32_t order[B * MAXP];
    for (int i = 0; i < B * MAXP; ++i) order[i] = i;
    test_rng rng;
    test_rng_seed(&rng, seed + 5);
    for (int i = B * MAXP - 1; i > 0; --i) {
        const int j = (int)test_rng_range(&rng, 0, i), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    memcpy(in->htable, order, sizeof order);
    if (paged) in->page_table = device_copy(in->htable, sizeof in->htable);
    in->seqused = device_copy(kUsed, sizeof kUsed);
    for (int p = 0; p < DSK; ++p)
        for (int i = 0; i < ROT / 2; ++i) {
            const double theta = p * pow(10000.0, -2.0 * i / ROT);
            in->hcos[p * ROT / 2 + i] = (float)cos(theta);
            in->hsin[p * ROT / 2 + i] = (float)sin(theta);
        }
    in->cos = device_copy(in->hcos, sizeof in->hcos);
    in->sin = device_copy(in->hsin, sizeof in->hsin);
}

static void inputs_free(inputs *in) {
    cudaFree(in->q); cudaFree(in->k); cudaFree(in->v); cudaFree(in->o); cudaFree(in->dout); cudaFree(in->lse);
    cudaFree(in->cu_q); cudaFree(in->cu_k);
    free(in->hq); free(in->hk); free(in->hv); free(in->hdout);
    for (int s = 0; s < NUM_PARTIALS; ++s) {
        cudaFree(in->part_o[s]); cudaFree(in->part_lse[s]);
        free(in->hpart_o[s]); free(in->hpart_lse[s]);
    }
    cudaFree(in->kcache); cudaFree(in->vcache); cudaFree(in->knew); cudaFree(in->vnew);
    cudaFree(in->seqused); cudaFree(in->page_table); cudaFree(in->cos); cudaFree(in->sin);
    free(in->hkcache); free(in->hvcache); free(in->hknew); free(in->hvnew);
}

typedef struct key_value { flashattn_i64_param_t key; int64_t value; } key_value;

/* The plan's keys for entry e (no CUDA call, no cmocka call: thread_main uses it too). */
static flashattn_status_t set_plan_keys(flashattn_plan_t *plan, flashattn_backend_t backend, entry e) {
    const key_value common[] = {
        {FLASHATTN_I64_BATCH, B}, {FLASHATTN_I64_HEADS_Q, HQ}, {FLASHATTN_I64_HEADS_KV, HKV},
        {FLASHATTN_I64_HEAD_DIM, D}, {FLASHATTN_I64_DTYPE, FLASHATTN_DTYPE_FP16}, {FLASHATTN_I64_CAUSAL, 1},
        {FLASHATTN_I64_DETERMINISTIC, 1}, {FLASHATTN_I64_BACKEND, backend}};
    const key_value attention[] = {
        {FLASHATTN_I64_SEQLEN_Q, SQ}, {FLASHATTN_I64_SEQLEN_K, SK}, {FLASHATTN_I64_VARLEN, is_varlen(e)},
        {FLASHATTN_I64_TOTAL_Q, kLenQ[0] + kLenQ[1]}, {FLASHATTN_I64_TOTAL_K, kLenK[0] + kLenK[1]}};
    const key_value decode[] = {
        {FLASHATTN_I64_SEQLEN_Q, DSQ}, {FLASHATTN_I64_SEQLEN_K, DSK}, {FLASHATTN_I64_SEQUSED_K, 1},
        {FLASHATTN_I64_NEW_KV_ROWS, DN}, {FLASHATTN_I64_ROTARY_DIM, ROT}, {FLASHATTN_I64_ROTARY_INTERLEAVED, 0},
        {FLASHATTN_I64_NUM_SPLITS, e == DECODE ? DECODE_SPLITS : 0}};
    const key_value pages[] = {
        {FLASHATTN_I64_PAGED_KV, 1}, {FLASHATTN_I64_PAGE_SIZE, PAGE}, {FLASHATTN_I64_NUM_PAGES, B * MAXP}};
    const struct { const key_value *kv; size_t n; int on; } groups[] = {
        {common, sizeof common / sizeof *common, 1},
        {attention, sizeof attention / sizeof *attention, !is_decode(e)},
        {decode, sizeof decode / sizeof *decode, is_decode(e)},
        {pages, sizeof pages / sizeof *pages, e == DECODE_PAGED}};
    flashattn_status_t st = FLASHATTN_SUCCESS;
    for (size_t g = 0; g < sizeof groups / sizeof *groups; ++g)
        for (size_t i = 0; groups[g].on && i < groups[g].n && st == FLASHATTN_SUCCESS; ++i)
            st = flashattn_plan_set_i64(plan, groups[g].kv[i].key, groups[g].kv[i].value);
    return st;
}

static flashattn_plan_t *make_plan(flashattn_backend_t backend, entry e) {
    flashattn_plan_t *plan = NULL;
    FA_OK(flashattn_plan_create(&plan));
    FA_OK(set_plan_keys(plan, backend, e));
    return plan;
}

static void outputs_make(outputs *out, const inputs *in, entry e, size_t workspace_bytes) {
    memset(out, 0, sizeof *out);
    if (is_decode(e)) {
        out->count = 4;
        out->bytes[0] = elems_q(in) * 2;
        out->bytes[1] = lse_count(in) * 4;
        out->bytes[2] = out->bytes[3] = cache_elems(in) * 2;
        out->restore[2] = in->kcache;
        out->restore[3] = in->vcache;
    } else if (is_backward(e)) {
        out->count = 3;
        out->bytes[0] = elems_q(in) * 2;
        out->bytes[1] = out->bytes[2] = elems_k(in) * 2;
    } else {
        out->count = 2;
        out->bytes[0] = elems_q(in) * 2;
        out->bytes[1] = lse_count(in) * 4;
    }
    for (int i = 0; i < out->count; ++i) CUDA_OK(cudaMalloc(&out->buf[i], out->bytes[i]));
    out->workspace_bytes = workspace_bytes;
    if (workspace_bytes) CUDA_OK(cudaMalloc(&out->workspace, workspace_bytes));
}

static void outputs_free(outputs *out) {
    for (int i = 0; i < out->count; ++i) cudaFree(out->buf[i]);
    if (out->workspace) cudaFree(out->workspace);
}

/* NaN poison, so an element the call does not write is seen; the caches back to their pristine
 * contents (whose append slots hold other values than the append writes). */
static void outputs_poison(const outputs *out, cudaStream_t stream) {
    /* The workspace too: the library may not count on anything left in it (the decode tiles'
     * split arrival words, fa2_params.h fold_count, must take 0xff.. for "none arrived"). */
    if (out->workspace) CUDA_OK(cudaMemsetAsync(out->workspace, 0xff, out->workspace_bytes, stream));
    for (int i = 0; i < out->count; ++i)
        if (out->restore[i])
            CUDA_OK(cudaMemcpyAsync(out->buf[i], out->restore[i], out->bytes[i], cudaMemcpyDeviceToDevice, stream));
        else
            CUDA_OK(cudaMemsetAsync(out->buf[i], 0xff, out->bytes[i], stream));
}

/* The same call through an args object (created and destroyed here: host memory only, so it is
 * also fine inside a graph capture). */
static flashattn_status_t enqueue_args(const flashattn_plan_t *plan, entry e, const inputs *in, const outputs *out,
                                       flashattn_stream_t s) {
    flashattn_args_t *a = NULL;
    flashattn_status_t st = flashattn_args_create(&a);
    if (st != FLASHATTN_SUCCESS) return st;
    const struct { flashattn_arg_t which; const void *ptr; } common[] = {
        {FLASHATTN_ARG_Q, in->q}, {FLASHATTN_ARG_K, in->k}, {FLASHATTN_ARG_V, in->v},
        {FLASHATTN_ARG_CU_SEQLENS_Q, is_varlen(e) ? in->cu_q : NULL},
        {FLASHATTN_ARG_CU_SEQLENS_K, is_varlen(e) ? in->cu_k : NULL}};
    for (size_t i = 0; i < sizeof common / sizeof common[0] && st == FLASHATTN_SUCCESS; ++i)
        st = flashattn_args_set(a, common[i].which, common[i].ptr);
    if (is_backward(e)) {
        const struct { flashattn_arg_t which; const void *ptr; } bwd[] = {
            {FLASHATTN_ARG_O, in->o}, {FLASHATTN_ARG_DOUT, in->dout}, {FLASHATTN_ARG_LSE, in->lse},
            {FLASHATTN_ARG_DQ, out->buf[0]}, {FLASHATTN_ARG_DK, out->buf[1]}, {FLASHATTN_ARG_DV, out->buf[2]}};
        for (size_t i = 0; i < sizeof bwd / sizeof bwd[0] && st == FLASHATTN_SUCCESS; ++i)
            st = flashattn_args_set(a, bwd[i].which, bwd[i].ptr);
        if (st == FLASHATTN_SUCCESS)
            st = flashattn_plan_execute_backward_args(plan, a, out->workspace, out->workspace_bytes, s);
    } else {
        if (st == FLASHATTN_SUCCESS) st = flashattn_args_set(a, FLASHATTN_ARG_O, out->buf[0]);
        if (st == FLASHATTN_SUCCESS) st = flashattn_args_set(a, FLASHATTN_ARG_LSE, out->buf[1]);
        if (st == FLASHATTN_SUCCESS) st = flashattn_plan_execute_args(plan, a, out->workspace, out->workspace_bytes, s);
    }
    flashattn_args_destroy(a);
    return st;
}

/* The decode step: append + rotary + attention into this call's own caches (out->buf[2], [3]). */
static flashattn_status_t enqueue_decode(const flashattn_plan_t *plan, const inputs *in, const outputs *out,
                                         flashattn_stream_t s) {
    flashattn_args_t *a = NULL;
    flashattn_status_t st = flashattn_args_create(&a);
    if (st != FLASHATTN_SUCCESS) return st;
    const struct { flashattn_arg_t which; const void *ptr; } set[] = {
        {FLASHATTN_ARG_Q, in->q}, {FLASHATTN_ARG_K, out->buf[2]}, {FLASHATTN_ARG_V, out->buf[3]},
        {FLASHATTN_ARG_O, out->buf[0]}, {FLASHATTN_ARG_LSE, out->buf[1]}, {FLASHATTN_ARG_SEQUSED_K, in->seqused},
        {FLASHATTN_ARG_K_NEW, in->knew}, {FLASHATTN_ARG_V_NEW, in->vnew}, {FLASHATTN_ARG_ROTARY_COS, in->cos},
        {FLASHATTN_ARG_ROTARY_SIN, in->sin}, {FLASHATTN_ARG_PAGE_TABLE, in->page_table}};
    for (size_t i = 0; i < sizeof set / sizeof set[0] && st == FLASHATTN_SUCCESS; ++i)
        st = flashattn_args_set(a, set[i].which, set[i].ptr);
    if (st == FLASHATTN_SUCCESS) st = flashattn_plan_execute_args(plan, a, out->workspace, out->workspace_bytes, s);
    flashattn_args_destroy(a);
    return st;
}

/* The call under test; it only enqueues. */
static flashattn_status_t enqueue(const flashattn_plan_t *plan, entry e, const inputs *in, const outputs *out,
                                  cudaStream_t stream) {
    const flashattn_stream_t s = (flashattn_stream_t)stream;
    if (is_decode(e)) return enqueue_decode(plan, in, out, s);
    if (is_merge(e)) {
        /* The pointer arrays are read during the call only: stack copies, scribbled over after it
         * (a graph replayed later must not read them). */
        const void *po[NUM_PARTIALS];
        const float *pl[NUM_PARTIALS];
        memcpy(po, in->part_o, sizeof po);
        memcpy(pl, in->part_lse, sizeof pl);
        const flashattn_status_t st = flashattn_plan_merge_states(plan, NUM_PARTIALS, po, pl, in->part_dtype,
                                                                  out->buf[0], (float *)out->buf[1], s);
        memset((void *)po, 0xa5, sizeof po);
        memset((void *)pl, 0x5a, sizeof pl);
        return st;
    }
    if (g_through_args) return enqueue_args(plan, e, in, out, s);
    switch (e) {
    case FORWARD:
        return flashattn_plan_execute(plan, in->q, in->k, in->v, out->buf[0], out->buf[1], out->workspace,
                                      out->workspace_bytes, s);
    case FORWARD_VARLEN:
        return flashattn_plan_execute_varlen(plan, in->q, in->k, in->v, out->buf[0], out->buf[1], in->cu_q, in->cu_k,
                                             out->workspace, out->workspace_bytes, s);
    case BACKWARD:
        return flashattn_plan_execute_backward(plan, in->q, in->k, in->v, in->o, in->dout, in->lse, out->buf[0],
                                               out->buf[1], out->buf[2], out->workspace, out->workspace_bytes, s);
    default:
        return flashattn_plan_execute_backward_varlen(plan, in->q, in->k, in->v, in->o, in->dout, in->lse, out->buf[0],
                                                      out->buf[1], out->buf[2], in->cu_q, in->cu_k, out->workspace,
                                                      out->workspace_bytes, s);
    }
}

/* Host copies of every output buffer, concatenated. */
static unsigned char *download(const outputs *out) {
    size_t total = 0;
    for (int i = 0; i < out->count; ++i) total += out->bytes[i];
    unsigned char *h = malloc(total), *at = h;
    CUDA_OK(cudaDeviceSynchronize());
    for (int i = 0; i < out->count; ++i) {
        CUDA_OK(cudaMemcpy(at, out->buf[i], out->bytes[i], cudaMemcpyDeviceToHost));
        at += out->bytes[i];
    }
    return h;
}

static size_t total_bytes(const outputs *out) {
    size_t total = 0;
    for (int i = 0; i < out->count; ++i) total += out->bytes[i];
    return total;
}

static void expect_bitwise(const unsigned char *want, const outputs *out, const char *gen, entry e, const char *how) {
    unsigned char *got = download(out);
    const size_t n = total_bytes(out);
    size_t first = n, differ = 0, poison = 0;
    for (size_t i = 0; i < n; ++i)
        if (got[i] != want[i]) {
            if (first == n) first = i;
            ++differ;
            poison += got[i] == 0xff;
        }
    free(got);
    if (differ)
        fail_msg("%s %s %s: %zu of %zu bytes differ from the serial run (from byte %zu; %zu of them still the 0xff "
                 "poison)", gen, entry_name(e), how, differ, n, first, poison);
    print_message("%s %s %s: bitwise equal to the serial run\n", gen, entry_name(e), how);
}

/* ---- The serial run checked against the double reference ---------------------------------- */

static ref_problem reference_problem(const inputs *in, int64_t *len_q, int64_t *len_k, int64_t *start_q, int64_t *start_k) {
    for (int b = 0; b < B; ++b) {
        len_q[b] = in->varlen ? kLenQ[b] : SQ;
        len_k[b] = in->varlen ? kLenK[b] : SK;
        start_q[b] = b == 0 ? 0 : start_q[b - 1] + len_q[b - 1];
        start_k[b] = b == 0 ? 0 : start_k[b - 1] + len_k[b - 1];
    }
    ref_problem p;
    memset(&p, 0, sizeof p);
    p.batch = B; p.heads_q = HQ; p.heads_kv = HKV; p.head_dim = D; p.head_dim_v = D;
    p.dtype = FLASHATTN_DTYPE_FP16; p.causal = 1; p.window_left = p.window_right = -1;
    p.scale = 1.0 / sqrt((double)D);
    p.len_q = len_q; p.len_k = len_k; p.start_q = start_q; p.start_k = start_k;
    p.total_q = in->rows_q; p.total_k = in->rows_k;
    p.q = in->hq; p.k = in->hk; p.v = in->hv; p.dout = in->hdout;
    return p;
}

/* max |got - ref| over n fp16 values against doubles, relative to max |ref|. */
static double rel_error(const unsigned char *got16, const double *ref, size_t n) {
    double max_ref = 1e-30, max_err = 0.0;
    for (size_t i = 0; i < n; ++i) {
        const double g = test_load(FLASHATTN_DTYPE_FP16, got16 + 2 * i);
        if (fabs(ref[i]) > max_ref) max_ref = fabs(ref[i]);
        const double err = isnan(g) ? INFINITY : fabs(g - ref[i]);
        if (err > max_err) max_err = err;
    }
    return max_err / max_ref;
}

/* The merge against the formula in double: O = sum_s e^(LSE_s - LSE) O_s, LSE = log sum_s e^LSE_s;
 * rows -inf in every partial exactly O = 0, LSE = -inf. */
static void check_serial_merge(const unsigned char *h, const inputs *in, const char *gen, entry e) {
    const float *lse = (const float *)(h + elems_q(in) * 2);
    double max_ref = 1e-30, o_err = 0.0, lse_err = 0.0;
    int empty_rows = 0;
    for (size_t r = 0; r < (size_t)in->rows_q; ++r)
        for (int hd = 0; hd < HQ; ++hd) {
            const size_t li = lse_index(in, r, hd), oi = (r * HQ + (size_t)hd) * D;
            double m = -INFINITY, sum = 0.0;
            for (int s = 0; s < NUM_PARTIALS; ++s)
                if (in->hpart_lse[s][li] > m) m = in->hpart_lse[s][li];
            if (m == -INFINITY) {
                ++empty_rows;
                if (lse[li] != -INFINITY) fail_msg("%s %s: row %zu head %d: LSE %g, expected -inf", gen, entry_name(e), r, hd, lse[li]);
                for (int c = 0; c < D; ++c)
                    if (test_load(FLASHATTN_DTYPE_FP16, h + 2 * (oi + (size_t)c)) != 0.0)
                        fail_msg("%s %s: row %zu head %d col %d: O must be 0 (no partial saw a key)", gen, entry_name(e), r, hd, c);
                continue;
            }
            for (int s = 0; s < NUM_PARTIALS; ++s) sum += exp(in->hpart_lse[s][li] - m);
            const double ref_lse = m + log(sum);
            const double le = fabs(lse[li] - ref_lse) / (1.0 + fabs(ref_lse));
            if (!(le <= lse_err)) lse_err = isnan(le) ? INFINITY : le;
            for (int c = 0; c < D; ++c) {
                double ref = 0.0;
                for (int s = 0; s < NUM_PARTIALS; ++s)
                    ref += exp(in->hpart_lse[s][li] - ref_lse) * in->hpart_o[s][oi + (size_t)c];
                const double got = test_load(FLASHATTN_DTYPE_FP16, h + 2 * (oi + (size_t)c));
                if (fabs(ref) > max_ref) max_ref = fabs(ref);
                const double err = isnan(got) ? INFINITY : fabs(got - ref);
                if (err > o_err) o_err = err;
            }
        }
    o_err /= max_ref;
    print_message("%s %s serial: max |O - ref| / max|ref| = %.2e, LSE relative %.2e, %d rows empty in every partial\n",
                  gen, entry_name(e), o_err, lse_err, empty_rows);
    if (empty_rows == 0) fail_msg("no row empty in every partial: the test does not cover them");
    if (!(o_err < 2e-3) || !(lse_err < 1e-5)) fail_msg("%s %s: the serial run is not the merged state", gen, entry_name(e));
}

/* Row x (D values) rotated at position pos over its first ROT columns (pairs (i, i + ROT/2)),
 * each value rounded once to fp16 as the library promises. */
static void rotate_row(const inputs *in, const float *x, double *out, int64_t pos) {
    for (int c = 0; c < D; ++c) out[c] = x[c];
    for (int i = 0; i < ROT / 2; ++i) {
        const double cs = in->hcos[pos * ROT / 2 + i], sn = in->hsin[pos * ROT / 2 + i];
        out[i] = test_round(FLASHATTN_DTYPE_FP16, x[i] * cs - x[i + ROT / 2] * sn);
        out[i + ROT / 2] = test_round(FLASHATTN_DTYPE_FP16, x[i] * sn + x[i + ROT / 2] * cs);
    }
}

/* Key t of sequence b, head kh, as attention sees it after the append: the rotated new row or the
 * pristine cache row. */
static void decode_key(const inputs *in, int b, int kh, int64_t t, double *k, double *v) {
    if (t >= kUsed[b]) {
        const size_t at = (((size_t)b * DN + (size_t)(t - kUsed[b])) * HKV + (size_t)kh) * D;
        rotate_row(in, in->hknew + at, k, t);
        for (int c = 0; c < D; ++c) v[c] = in->hvnew[at + (size_t)c];
        return;
    }
    const size_t at = ((size_t)cache_row(in, b, t) * HKV + (size_t)kh) * D;
    for (int c = 0; c < D; ++c) { k[c] = in->hkcache[at + (size_t)c]; v[c] = in->hvcache[at + (size_t)c]; }
}

/* Every cache byte: the appended slots hold the rotated K (within one fp16 ulp of the double
 * reference: the library rotates in fp32) and V exactly; every other slot is untouched. */
static void check_decode_caches(const unsigned char *kc, const unsigned char *vc, const inputs *in, const char *gen) {
    size_t appended = 0;
    double k[D], v[D];
    for (int64_t r = 0; r < in->cache_rows; ++r)
        for (int kh = 0; kh < HKV; ++kh) {
            const size_t at = ((size_t)r * HKV + (size_t)kh) * D;
            int owner = -1;
            int64_t t = -1;
            for (int b = 0; b < B && owner < 0; ++b)
                for (int j = 0; j < DN; ++j)
                    if (cache_row(in, b, kUsed[b] + j) == r) { owner = b; t = kUsed[b] + j; }
            if (owner >= 0) decode_key(in, owner, kh, t, k, v);
            appended += owner >= 0;
            for (int c = 0; c < D; ++c) {
                const double gk = test_load(FLASHATTN_DTYPE_FP16, kc + 2 * (at + (size_t)c));
                const double gv = test_load(FLASHATTN_DTYPE_FP16, vc + 2 * (at + (size_t)c));
                if (owner < 0) {
                    if (gk != in->hkcache[at + (size_t)c] || gv != in->hvcache[at + (size_t)c])
                        fail_msg("%s decode: cache row %lld head %d col %d was written (no append goes there)", gen,
                                 (long long)r, kh, c);
                    continue;
                }
                int ex;
                frexp(k[c], &ex);
                const double ulp = ldexp(1.0, (ex - 1 > -14 ? ex - 1 : -14) - 10);
                if (!(fabs(gk - k[c]) <= ulp) || gv != v[c])
                    fail_msg("%s decode: appended key %lld of sequence %d head %d col %d: K %g (want %g), V %g (want %g)", gen,
                             (long long)t, owner, kh, c, gk, k[c], gv, v[c]);
            }
        }
    if (appended != (size_t)B * DN * HKV) fail_msg("%s decode: %zu appended slots found", gen, appended);
}

/* O and LSE of the decode step against attention in double over the keys after the append. */
static void check_serial_decode(const unsigned char *h, const inputs *in, const char *gen, entry e) {
    const size_t nq = elems_q(in);
    const float *lse = (const float *)(h + nq * 2);
    double max_ref = 1e-30, o_err = 0.0, lse_err = 0.0, q[D], k[D], o[D];
    double *s = malloc(sizeof(double) * DSK), (*vs)[D] = malloc(sizeof(double[D]) * DSK);
    for (int b = 0; b < B; ++b)
        for (int hd = 0; hd < HQ; ++hd)
            for (int i = 0; i < DSQ; ++i) {
                const int kh = hd / (HQ / HKV);
                const int64_t keys = kUsed[b] + DN, last = i + keys - DSQ; /* causal, bottom-right */
                const size_t qi = (((size_t)b * DSQ + (size_t)i) * HQ + (size_t)hd) * D;
                rotate_row(in, in->hq + qi, q, kUsed[b] + i);
                double m = -INFINITY, sum = 0.0;
                for (int64_t t = 0; t <= last; ++t) {
                    decode_key(in, b, kh, t, k, vs[t]);
                    double dot = 0.0;
                    for (int c = 0; c < D; ++c) dot += q[c] * k[c];
                    s[t] = dot / sqrt((double)D);
                    if (s[t] > m) m = s[t];
                }
                for (int c = 0; c < D; ++c) o[c] = 0.0;
                for (int64_t t = 0; t <= last; ++t) {
                    const double p = exp(s[t] - m);
                    sum += p;
                    for (int c = 0; c < D; ++c) o[c] += p * vs[t][c];
                }
                for (int c = 0; c < D; ++c) {
                    const double ref = o[c] / sum, got = test_load(FLASHATTN_DTYPE_FP16, h + 2 * (qi + (size_t)c));
                    if (fabs(ref) > max_ref) max_ref = fabs(ref);
                    const double err = isnan(got) ? INFINITY : fabs(got - ref);
                    if (err > o_err) o_err = err;
                }
                const double ref_lse = m + log(sum), got_lse = lse[((size_t)b * HQ + (size_t)hd) * DSQ + (size_t)i];
                const double le = fabs(got_lse - ref_lse) / (1.0 + fabs(ref_lse));
                if (!(le <= lse_err)) lse_err = isnan(le) ? INFINITY : le;
            }
    free(s);
    free(vs);
    o_err /= max_ref;
    print_message("%s %s serial: max |O - ref| / max|ref| = %.2e, LSE relative %.2e\n", gen, entry_name(e), o_err, lse_err);
    if (!(o_err < 4e-3) || !(lse_err < 1e-4)) fail_msg("%s %s: the serial run is not the attention result", gen, entry_name(e));
    check_decode_caches(h + nq * 2 + lse_count(in) * 4, h + nq * 2 + lse_count(in) * 4 + cache_elems(in) * 2, in, gen);
}

static void check_serial(const unsigned char *h, const inputs *in, entry e, const char *gen) {
    if (is_decode(e)) {
        check_serial_decode(h, in, gen, e);
        return;
    }
    if (is_merge(e)) {
        check_serial_merge(h, in, gen, e);
        return;
    }
    int64_t lq[B], lk[B], sq[B], sk[B];
    const ref_problem p = reference_problem(in, lq, lk, sq, sk);
    const size_t nq = elems_q(in), nk = elems_k(in);
    double *o = malloc(nq * sizeof(double)), *dq = malloc(nq * sizeof(double));
    double *dk = malloc(nk * sizeof(double)), *dv = malloc(nk * sizeof(double));
    grad_reference(&p, dq, dk, dv, o, NULL, NULL);
    if (!is_backward(e)) {
        const double err = rel_error(h, o, nq);
        /* LSE of each row: fixed [batch][heads][seqlen], varlen [heads][total]. */
        const float *lse = (const float *)(h + nq * 2);
        double lse_err = 0.0;
        ref_row r = ref_rows_begin();
        double *s = malloc(sizeof(double) * SK);
        while (ref_next_row(&p, &r)) {
            double m = -INFINITY, sum = 0.0;
            for (int64_t j = 0; j < r.sk; ++j) {
                s[j] = -INFINITY;
                if (!ref_visible(&p, r.i, j, r.sq, r.sk)) continue;
                const float *kv = p.k + ((p.start_k[r.b] + j) * HKV + r.kh) * D;
                double dot = 0.0;
                for (int c = 0; c < D; ++c) dot += (double)r.q[c] * kv[c];
                s[j] = dot * p.scale;
                if (s[j] > m) m = s[j];
            }
            for (int64_t j = 0; j < r.sk; ++j) sum += s[j] == -INFINITY ? 0.0 : exp(s[j] - m);
            const double ref = m == -INFINITY ? -INFINITY : m + log(sum);
            const size_t at = in->varlen ? (size_t)(r.h * in->rows_q + r.tq) : (size_t)((r.b * HQ + r.h) * SQ + r.i);
            const double err_row = ref == -INFINITY ? (lse[at] == -INFINITY ? 0.0 : INFINITY) : fabs(lse[at] - ref) / (1.0 + fabs(ref));
            if (!(err_row <= lse_err)) lse_err = isnan(err_row) ? INFINITY : err_row;
        }
        free(s);
        print_message("%s %s serial: max |O - ref| / max|ref| = %.2e, LSE relative %.2e\n", gen, entry_name(e), err, lse_err);
        if (!(err < 4e-3) || !(lse_err < 1e-4)) fail_msg("%s %s: the serial run is not the attention result", gen, entry_name(e));
    } else {
        const double eq = rel_error(h, dq, nq), ek = rel_error(h + nq * 2, dk, nk), ev = rel_error(h + nq * 2 + nk * 2, dv, nk);
        print_message("%s %s serial: relative errors dQ %.2e dK %.2e dV %.2e\n", gen, entry_name(e), eq, ek, ev);
        if (!(eq < 2e-2) || !(ek < 2e-2) || !(ev < 2e-2)) fail_msg("%s %s: the serial run is not the gradient", gen, entry_name(e));
    }
    free(o); free(dq); free(dk); free(dv);
}

/* ---- Threads ---------------------------------------------------------------------------------- */

typedef struct thread_job {
    const flashattn_plan_t *plan; /* NULL: the thread makes, finalizes and destroys its own */
    flashattn_backend_t backend;
    entry e;
    const inputs *in;
    const outputs *out;
    cudaStream_t stream;
    int repeats;
    pthread_barrier_t *start;
    flashattn_status_t status;
    char message[256];
} thread_job;

/* Runs in a new thread: nothing here calls the CUDA runtime before the library does. */
static void *thread_main(void *arg) {
    thread_job *job = arg;
    if (job->start) pthread_barrier_wait(job->start);
    flashattn_plan_t *own = NULL;
    const flashattn_plan_t *plan = job->plan;
    job->status = FLASHATTN_SUCCESS;
    if (plan == NULL) {
        flashattn_status_t s = flashattn_plan_create(&own);
        if (s == FLASHATTN_SUCCESS) s = set_plan_keys(own, job->backend, job->e);
        if (s == FLASHATTN_SUCCESS) s = flashattn_plan_finalize(own);
        job->status = s;
        plan = own;
    }
    for (int r = 0; r < job->repeats && job->status == FLASHATTN_SUCCESS; ++r)
        job->status = enqueue(plan, job->e, job->in, job->out, job->stream);
    if (job->status != FLASHATTN_SUCCESS) snprintf(job->message, sizeof job->message, "%s", flashattn_last_error());
    flashattn_plan_destroy(own); /* right after enqueueing: the work in flight needs no plan */
    return NULL;
}

static void join_ok(pthread_t t, thread_job *job, const char *gen, const char *how) {
    assert_int_equal(pthread_join(t, NULL), 0);
    if (job->status != FLASHATTN_SUCCESS)
        fail_msg("%s %s %s: status %d: %s", gen, entry_name(job->e), how, job->status, job->message);
}

static int reduced(void) {
    const char *r = getenv("FLASHATTN_TEST_REDUCED");
    return r != NULL && r[0] == '1';
}

/* ---- One backend, one entry point ------------------------------------------------------------ */

static void check_entry(flashattn_backend_t backend, const char *gen, entry e, const inputs *in) {
    flashattn_plan_t *plan = make_plan(backend, e);
    FA_OK(flashattn_plan_finalize(plan));
    size_t ws = 0;
    if (is_backward(e)) FA_OK(flashattn_plan_get_backward_workspace_size(plan, &ws));
    else if (!is_merge(e)) FA_OK(flashattn_plan_get_workspace_size(plan, &ws)); /* the merge takes none */

    /* Serial, on the calling thread and the legacy default stream; checked against the reference. */
    outputs serial;
    outputs_make(&serial, in, e, ws);
    outputs_poison(&serial, NULL);
    FA_OK(enqueue(plan, e, in, &serial, NULL));
    unsigned char *want = download(&serial);
    check_serial(want, in, e, gen);
    /* A second serial run: reproducible at all (else nothing below could be bitwise). */
    outputs_poison(&serial, NULL);
    FA_OK(enqueue(plan, e, in, &serial, NULL));
    expect_bitwise(want, &serial, gen, e, "second serial run");

    /* Fresh threads: one runs the whole lifecycle, one executes the shared plan. */
    for (int shared = 0; shared < 2; ++shared) {
        outputs out;
        outputs_make(&out, in, e, ws);
        outputs_poison(&out, NULL);
        CUDA_OK(cudaDeviceSynchronize());
        thread_job job = {shared ? plan : NULL, backend, e, in, &out, NULL, 1, NULL, FLASHATTN_SUCCESS, ""};
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, thread_main, &job), 0);
        join_ok(t, &job, gen, shared ? "fresh thread, shared plan" : "fresh thread, own plan");
        expect_bitwise(want, &out, gen, e, shared ? "from a fresh thread (shared plan)" : "from a fresh thread (own plan)");
        outputs_free(&out);
    }

    /* Several threads, one stream each, one plan, started together, each repeating the call. */
    {
        const int threads = reduced() ? 2 : MAX_THREADS, repeats = reduced() ? 1 : 3;
        outputs out[MAX_THREADS];
        cudaStream_t streams[MAX_THREADS];
        thread_job jobs[MAX_THREADS];
        pthread_t tids[MAX_THREADS];
        pthread_barrier_t start;
        pthread_barrier_init(&start, NULL, (unsigned)threads);
        for (int i = 0; i < threads; ++i) {
            outputs_make(&out[i], in, e, ws);
            outputs_poison(&out[i], NULL);
            CUDA_OK(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking));
        }
        CUDA_OK(cudaDeviceSynchronize());
        for (int i = 0; i < threads; ++i) {
            thread_job job = {plan, backend, e, in, &out[i], streams[i], repeats, &start, FLASHATTN_SUCCESS, ""};
            jobs[i] = job;
            assert_int_equal(pthread_create(&tids[i], NULL, thread_main, &jobs[i]), 0);
        }
        for (int i = 0; i < threads; ++i) join_ok(tids[i], &jobs[i], gen, "concurrent threads");
        char how[64];
        snprintf(how, sizeof how, "from %d threads on %d streams", threads, threads);
        for (int i = 0; i < threads; ++i) {
            expect_bitwise(want, &out[i], gen, e, how);
            CUDA_OK(cudaStreamDestroy(streams[i]));
            outputs_free(&out[i]);
        }
        pthread_barrier_destroy(&start);
    }

    /* CUDA graph: capture (global mode: any unsafe runtime call in execute would end the capture
     * with an error), replay equals eager; replay after the inputs changed in place equals eager
     * on the new inputs; then a graph captured from a plan destroyed before the graph is even
     * instantiated. */
    {
        cudaStream_t stream;
        CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        outputs out;
        outputs_make(&out, in, e, ws);
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
        const flashattn_status_t s = enqueue(plan, e, in, &out, stream);
        CUDA_OK(cudaStreamEndCapture(stream, &graph));
        if (s != FLASHATTN_SUCCESS) fail_msg("%s %s under capture: %s", gen, entry_name(e), flashattn_last_error());
        size_t nodes0 = 0;
        CUDA_OK(cudaGraphGetNodes(graph, NULL, &nodes0));
        print_message("%s %s: the captured graph has %zu nodes\n", gen, entry_name(e), nodes0);
        CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
        const int replays = reduced() ? 1 : 2;
        for (int r = 0; r < replays; ++r) {
            outputs_poison(&out, stream);
            CUDA_OK(cudaGraphLaunch(exec, stream));
            CUDA_OK(cudaStreamSynchronize(stream));
            expect_bitwise(want, &out, gen, e, "graph replay");
        }
        /* New values in the same V buffer (Q for the backward would change its LSE input; the
         * merge: its first partial O). Whole elements permuted. */
        {
            void *const buf = is_merge(e) ? in->part_o[0] : is_decode(e) ? in->vnew : in->v;
            const size_t es = is_merge(e) ? part_elem_bytes(in) : 2;
            const size_t n = is_merge(e) ? elems_q(in) : is_decode(e) ? new_elems() : elems_k(in);
            unsigned char *saved = malloc(n * es), *fresh = malloc(n * es);
            CUDA_OK(cudaMemcpy(saved, buf, n * es, cudaMemcpyDeviceToHost));
            for (size_t i = 0; i < n; ++i) memcpy(fresh + i * es, saved + ((i * 7 + 3) % n) * es, es);
            CUDA_OK(cudaMemcpy(buf, fresh, n * es, cudaMemcpyHostToDevice));
            outputs_poison(&serial, NULL);
            FA_OK(enqueue(plan, e, in, &serial, NULL));
            unsigned char *want_new = download(&serial);
            if (memcmp(want_new, want, total_bytes(&serial)) == 0) fail_msg("new V gave the same result: the test cannot see the change");
            outputs_poison(&out, stream);
            CUDA_OK(cudaGraphLaunch(exec, stream));
            CUDA_OK(cudaStreamSynchronize(stream));
            expect_bitwise(want_new, &out, gen, e, "graph replay on changed inputs");
            CUDA_OK(cudaMemcpy(buf, saved, n * es, cudaMemcpyHostToDevice));
            CUDA_OK(cudaDeviceSynchronize()); /* a pageable copy may return before its DMA ends */
            free(saved); free(fresh); free(want_new);
            /* Back on the original inputs, the same graph gives the original bits again. */
            outputs_poison(&out, stream);
            CUDA_OK(cudaGraphLaunch(exec, stream));
            CUDA_OK(cudaStreamSynchronize(stream));
            expect_bitwise(want, &out, gen, e, "graph replay after the inputs were restored");
        }
        CUDA_OK(cudaGraphExecDestroy(exec));
        CUDA_OK(cudaGraphDestroy(graph));

        flashattn_plan_t *doomed = make_plan(backend, e);
        FA_OK(flashattn_plan_finalize(doomed));
        CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
        const flashattn_status_t s2 = enqueue(doomed, e, in, &out, stream);
        CUDA_OK(cudaStreamEndCapture(stream, &graph));
        if (s2 != FLASHATTN_SUCCESS) fail_msg("%s %s under capture: %s", gen, entry_name(e), flashattn_last_error());
        size_t nodes = 0;
        CUDA_OK(cudaGraphGetNodes(graph, NULL, &nodes));
        print_message("%s %s: the graph of the plan to be destroyed has %zu nodes\n", gen, entry_name(e), nodes);
        flashattn_plan_destroy(doomed);
        /* Overwrite the freed plan's memory with other plans' state before the graph runs. */
        for (int i = 0; i < 4; ++i) {
            flashattn_plan_t *other = make_plan(backend, is_varlen(e) ? FORWARD : FORWARD_VARLEN);
            FA_OK(flashattn_plan_finalize(other));
            flashattn_plan_destroy(other);
        }
        CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
        outputs_poison(&out, stream);
        CUDA_OK(cudaGraphLaunch(exec, stream));
        CUDA_OK(cudaStreamSynchronize(stream));
        expect_bitwise(want, &out, gen, e, "graph replay after its plan was destroyed");
        CUDA_OK(cudaGraphExecDestroy(exec));
        CUDA_OK(cudaGraphDestroy(graph));
        CUDA_OK(cudaStreamDestroy(stream));
        outputs_free(&out);
    }
    free(want);
    outputs_free(&serial);
    flashattn_plan_destroy(plan);
    CUDA_OK(cudaGetLastError());
}

/* The forward's O and LSE of `in` on fa2 (or the CPU-verified forward of whichever backend runs):
 * the backward's inputs. */
static void prepare_backward_inputs(inputs *in, flashattn_backend_t backend) {
    flashattn_plan_t *plan = make_plan(backend, in->varlen ? FORWARD_VARLEN : FORWARD);
    FA_OK(flashattn_plan_finalize(plan));
    size_t ws = 0;
    FA_OK(flashattn_plan_get_workspace_size(plan, &ws));
    void *w = NULL;
    if (ws) CUDA_OK(cudaMalloc(&w, ws));
    if (in->varlen)
        FA_OK(flashattn_plan_execute_varlen(plan, in->q, in->k, in->v, in->o, in->lse, in->cu_q, in->cu_k, w, ws, NULL));
    else
        FA_OK(flashattn_plan_execute(plan, in->q, in->k, in->v, in->o, in->lse, w, ws, NULL));
    CUDA_OK(cudaDeviceSynchronize());
    if (w) cudaFree(w);
    flashattn_plan_destroy(plan);
}

/* The decode step where the backend runs it (fa1 has no paged cache: it must say so). On fa2, the
 * backend with split-KV, the contiguous plan must run the splits it asked for (else the combine
 * would go untested); the paged plan reports what the plan chose. */
static void check_decode(flashattn_backend_t backend, const char *gen, entry e) {
    flashattn_plan_t *probe = make_plan(backend, e);
    const flashattn_status_t s = flashattn_plan_finalize(probe);
    if (s == FLASHATTN_ERROR_NOT_SUPPORTED && backend == FLASHATTN_BACKEND_FA1 && e == DECODE_PAGED) {
        print_message("%s %s: not supported (%s)\n", gen, entry_name(e), flashattn_last_error());
        flashattn_plan_destroy(probe);
        return;
    }
    FA_OK(s);
    int64_t splits = -1;
    FA_OK(flashattn_plan_get_i64(probe, FLASHATTN_I64_NUM_SPLITS, &splits));
    print_message("%s %s: the plan runs %lld split(s)\n", gen, entry_name(e), (long long)splits);
    flashattn_plan_destroy(probe);
    if (backend == FLASHATTN_BACKEND_FA2 && e == DECODE && splits != DECODE_SPLITS)
        fail_msg("fa2 %s runs %lld split(s): the split-KV path is not under test", entry_name(e), (long long)splits);
    inputs in;
    inputs_make_decode(&in, e == DECODE_PAGED, 3000 + (uint64_t)e);
    check_entry(backend, gen, e, &in);
    inputs_free(&in);
}

static void check_backend(flashattn_backend_t backend, const char *gen) {
    flashattn_plan_t *probe = make_plan(backend, FORWARD);
    const flashattn_status_t s = flashattn_plan_finalize(probe);
    if (s == FLASHATTN_ERROR_NOT_SUPPORTED) {
        print_message("%s: %s: skipped\n", gen, flashattn_last_error());
        flashattn_plan_destroy(probe);
        skip();
    }
    FA_OK(s);
    flashattn_backend_t bwd = FLASHATTN_BACKEND_AUTO;
    const int has_backward = flashattn_plan_get_backward_backend(probe, &bwd, NULL) == FLASHATTN_SUCCESS && bwd == backend;
    flashattn_plan_destroy(probe);
    for (g_through_args = 0; g_through_args < 2; ++g_through_args) {
        for (int varlen = 0; varlen < 2; ++varlen) {
            inputs in;
            inputs_make(&in, varlen, 1000 + (uint64_t)varlen);
            check_entry(backend, gen, varlen ? FORWARD_VARLEN : FORWARD, &in);
            if (has_backward) {
                prepare_backward_inputs(&in, backend);
                check_entry(backend, gen, varlen ? BACKWARD_VARLEN : BACKWARD, &in);
            } else if (varlen == 0 && !g_through_args) {
                print_message("%s has no backward pass: its backward entry points are not part of its contract\n", gen);
            }
            if (!g_through_args) check_entry(backend, gen, varlen ? MERGE_VARLEN : MERGE, &in); /* no args form */
            inputs_free(&in);
        }
    }
    g_through_args = 0;
    check_decode(backend, gen, DECODE);
    check_decode(backend, gen, DECODE_PAGED);
}

static void test_fa1(void **state) { (void)state; check_backend(FLASHATTN_BACKEND_FA1, "fa1"); }
static void test_fa2(void **state) { (void)state; check_backend(FLASHATTN_BACKEND_FA2, "fa2"); }
static void test_fa3(void **state) { (void)state; check_backend(FLASHATTN_BACKEND_FA3, "fa3"); }

int main(void) {
    /* No CUDA call on this thread before the tests: test_skip_without_gpu asks through the library. */
    test_skip_without_gpu();
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_fa1), cmocka_unit_test(test_fa2), cmocka_unit_test(test_fa3)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
