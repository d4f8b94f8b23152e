/*
 * Writes the cross-language reference file the bindings' tests read: fixed-seed random inputs and
 * the outputs the C API gives for them on the CPU backend (fp32). Each binding runs the same cases
 * through its own API and must reproduce O and LSE within fp32 rounding.
 *
 * Format (little-endian; readers in every binding's tests, described in bindings/README.md):
 *   char magic[8] = "FAREF01\n"; int64 ncases;
 *   per case: int64 p[16] (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v,
 *             causal, window_left, window_right, varlen, total_q, total_k, 0, 0, 0);
 *             double softcap; double scale (0 = the default 1/sqrt(head_dim));
 *             when varlen: int32 cu_seqlens_q[batch+1], int32 cu_seqlens_k[batch+1];
 *             float q[], k[], v[], o[], lse[] (contiguous; lse is [batch, heads_q, seqlen_q],
 *             or [heads_q, total_q] when varlen).
 *
 * Usage: flashattn-bindings-reference OUTPUT_FILE
 */
#include <flashattn/flashattn.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v;
    int64_t causal, window_left, window_right, varlen;
    double softcap, scale;
    int32_t cu_q[8], cu_k[8]; /* varlen only */
} ref_case;

static const ref_case cases[] = {
    /* causal, seqlen_q != seqlen_k (bottom-right), GQA 4:2 */
    {2, 37, 53, 4, 2, 32, 32, 1, -1, -1, 0, 0.0, 0.0, {0}, {0}},
    /* sliding window + softcap + explicit scale, MQA, head_dim_v != head_dim */
    {1, 64, 48, 2, 1, 16, 24, 0, 8, 3, 0, 30.0, 0.3, {0}, {0}},
    /* variable length: 3 sequences, one without keys; causal, GQA 6:3 */
    {3, 9, 12, 6, 3, 8, 8, 1, -1, -1, 1, 0.0, 0.0, {0, 5, 12, 21}, {0, 7, 7, 19}},
};

static uint64_t rng_state = 0x243F6A8885A308D3ull; /* fixed seed */

static float next_uniform(void) { /* splitmix64 -> [-1, 1) */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)((double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static int check(flashattn_status_t s, const char *what) {
    if (s == FLASHATTN_SUCCESS) return 0;
    fprintf(stderr, "make_reference: %s: %s: %s\n", what, flashattn_status_string(s), flashattn_last_error());
    return 1;
}

static int write_all(FILE *f, const void *data, size_t bytes) { return fwrite(data, 1, bytes, f) == bytes ? 0 : 1; }

static int run_case(FILE *f, const ref_case *c) {
    const int64_t rows_q = c->varlen ? c->cu_q[c->batch] : c->batch * c->seqlen_q;
    const int64_t rows_k = c->varlen ? c->cu_k[c->batch] : c->batch * c->seqlen_k;
    const size_t nq = (size_t)(rows_q * c->heads_q * c->head_dim);
    const size_t nk = (size_t)(rows_k * c->heads_kv * c->head_dim);
    const size_t nv = (size_t)(rows_k * c->heads_kv * c->head_dim_v);
    const size_t no = (size_t)(rows_q * c->heads_q * c->head_dim_v);
    const size_t nlse = (size_t)(rows_q * c->heads_q);

    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nv * 4), *o = malloc(no * 4);
    float *lse = malloc(nlse * 4);
    flashattn_plan_t *plan = NULL;
    void *ws_block = NULL, *ws = NULL;
    int rc = 1;
    if (!q || !k || !v || !o || !lse) goto done;
    for (size_t i = 0; i < nq; ++i) q[i] = next_uniform();
    for (size_t i = 0; i < nk; ++i) k[i] = next_uniform();
    for (size_t i = 0; i < nv; ++i) v[i] = next_uniform();

    if (check(flashattn_plan_create(&plan), "create")) goto done;
    const struct { flashattn_i64_param_t key; int64_t value; } sets[] = {
        {FLASHATTN_I64_BATCH, c->batch}, {FLASHATTN_I64_SEQLEN_Q, c->seqlen_q},
        {FLASHATTN_I64_SEQLEN_K, c->seqlen_k}, {FLASHATTN_I64_HEADS_Q, c->heads_q},
        {FLASHATTN_I64_HEADS_KV, c->heads_kv}, {FLASHATTN_I64_HEAD_DIM, c->head_dim},
        {FLASHATTN_I64_HEAD_DIM_V, c->head_dim_v}, {FLASHATTN_I64_DTYPE, FLASHATTN_DTYPE_FP32},
        {FLASHATTN_I64_CAUSAL, c->causal}, {FLASHATTN_I64_WINDOW_LEFT, c->window_left},
        {FLASHATTN_I64_WINDOW_RIGHT, c->window_right}, {FLASHATTN_I64_BACKEND, FLASHATTN_BACKEND_CPU},
        {FLASHATTN_I64_VARLEN, c->varlen}, {FLASHATTN_I64_TOTAL_Q, c->varlen ? rows_q : 0},
        {FLASHATTN_I64_TOTAL_K, c->varlen ? rows_k : 0}};
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; ++i)
        if (check(flashattn_plan_set_i64(plan, sets[i].key, sets[i].value), "set_i64")) goto done;
    if (c->softcap > 0 && check(flashattn_plan_set_f64(plan, FLASHATTN_F64_SOFTCAP, c->softcap), "set softcap")) goto done;
    if (c->scale > 0 && check(flashattn_plan_set_f64(plan, FLASHATTN_F64_SOFTMAX_SCALE, c->scale), "set scale")) goto done;
    if (check(flashattn_plan_finalize(plan), "finalize")) goto done;
    size_t ws_bytes = 0;
    if (check(flashattn_plan_get_workspace_size(plan, &ws_bytes), "workspace size")) goto done;
    if (ws_bytes) { /* the workspace must be 256-byte aligned */
        ws_block = malloc(ws_bytes + 255);
        if (!ws_block) goto done;
        ws = (void *)(((uintptr_t)ws_block + 255) / 256 * 256);
    }
    flashattn_status_t s = c->varlen
        ? flashattn_plan_execute_varlen(plan, q, k, v, o, lse, c->cu_q, c->cu_k, ws, ws_bytes, NULL)
        : flashattn_plan_execute(plan, q, k, v, o, lse, ws, ws_bytes, NULL);
    if (check(s, "execute")) goto done;

    const int64_t header[16] = {c->batch, c->seqlen_q, c->seqlen_k, c->heads_q, c->heads_kv, c->head_dim,
                                c->head_dim_v, c->causal, c->window_left, c->window_right, c->varlen,
                                c->varlen ? rows_q : 0, c->varlen ? rows_k : 0, 0, 0, 0};
    rc = write_all(f, header, sizeof header) || write_all(f, &c->softcap, 8) || write_all(f, &c->scale, 8);
    if (!rc && c->varlen)
        rc = write_all(f, c->cu_q, (size_t)(c->batch + 1) * 4) || write_all(f, c->cu_k, (size_t)(c->batch + 1) * 4);
    if (!rc)
        rc = write_all(f, q, nq * 4) || write_all(f, k, nk * 4) || write_all(f, v, nv * 4) ||
             write_all(f, o, no * 4) || write_all(f, lse, nlse * 4);
done:
    flashattn_plan_destroy(plan);
    free(q); free(k); free(v); free(o); free(lse); free(ws_block);
    return rc;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUTPUT_FILE\n", argv[0]);
        return 2;
    }
    FILE *f = fopen(argv[1], "wb");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    const int64_t n = (int64_t)(sizeof cases / sizeof cases[0]);
    int rc = write_all(f, "FAREF01\n", 8) || write_all(f, &n, 8);
    for (int64_t i = 0; !rc && i < n; ++i) rc = run_case(f, &cases[i]);
    if (fclose(f) != 0) rc = 1;
    if (rc) {
        remove(argv[1]);
        return 1;
    }
    printf("wrote %lld cases to %s\n", (long long)n, argv[1]);
    return 0;
}
