/* flashattn-decode: the loop of an inference server, on the CPU backend. Each of a few sequences
 * keeps its K/V cache in pages of a shared pool (a shuffled page table); every decode step is one
 * flashattn_plan_execute_args() call that appends the step's K/V row (K rotated, GPT-NeoX style),
 * rotates the query and attends over the cache; then the caller advances seqused_k. After the
 * last step the outputs are checked against a double-precision attention over the cache, done
 * here from the rows this program appended and rotated itself.
 *
 *   flashattn-decode [--steps N]     (exit status 0 on success, 1 on a failed call or check) */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flashattn/flashattn.h>

enum { BATCH = 3, HEADS = 8, KV_HEADS = 2, DIM = 64, ROTARY = 32, PAGE = 16, MAX_PAGES = 8 };
#define CAPACITY (PAGE * MAX_PAGES)  /* keys each sequence can hold */
#define POOL (BATCH * MAX_PAGES)     /* pages in the shared pool */

static float uniform(uint64_t *state) {
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*state >> 40) & 0xffffff) / 16777216.0f - 0.5f;
}

/* x [DIM] rotated at position pos: pairs (i, i + ROTARY/2), the others unchanged. */
static void rotate(const float *x, double *out, int pos, const float *cos_t, const float *sin_t) {
    for (int c = 0; c < DIM; ++c) out[c] = x[c];
    for (int i = 0; i < ROTARY / 2; ++i) {
        const double c = cos_t[pos * ROTARY / 2 + i], s = sin_t[pos * ROTARY / 2 + i];
        out[i] = x[i] * c - x[i + ROTARY / 2] * s;
        out[i + ROTARY / 2] = x[i] * s + x[i + ROTARY / 2] * c;
    }
}

static flashattn_plan_t *make_plan(void) {
    const struct { flashattn_i64_param_t key; int64_t value; } keys[] = {
        {FLASHATTN_I64_BATCH, BATCH}, {FLASHATTN_I64_SEQLEN_Q, 1}, {FLASHATTN_I64_SEQLEN_K, CAPACITY},
        {FLASHATTN_I64_HEADS_Q, HEADS}, {FLASHATTN_I64_HEADS_KV, KV_HEADS}, {FLASHATTN_I64_HEAD_DIM, DIM},
        {FLASHATTN_I64_DTYPE, FLASHATTN_DTYPE_FP32}, {FLASHATTN_I64_BACKEND, FLASHATTN_BACKEND_CPU},
        {FLASHATTN_I64_CAUSAL, 1}, {FLASHATTN_I64_PAGED_KV, 1}, {FLASHATTN_I64_PAGE_SIZE, PAGE},
        {FLASHATTN_I64_NUM_PAGES, POOL}, {FLASHATTN_I64_SEQUSED_K, 1}, {FLASHATTN_I64_NEW_KV_ROWS, 1},
        {FLASHATTN_I64_ROTARY_DIM, ROTARY},
    };
    flashattn_plan_t *plan = NULL;
    if (flashattn_plan_create(&plan) != FLASHATTN_SUCCESS) return NULL;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; ++i)
        if (flashattn_plan_set_i64(plan, keys[i].key, keys[i].value) != FLASHATTN_SUCCESS) goto fail;
    if (flashattn_plan_finalize(plan) == FLASHATTN_SUCCESS) return plan;
fail:
    fprintf(stderr, "flashattn-decode: plan: %s\n", flashattn_last_error());
    flashattn_plan_destroy(plan);
    return NULL;
}

/* Largest |O - reference| of the last step: every query head attends over the appended (rotated)
 * keys of its sequence. k_log/v_log [BATCH][CAPACITY][KV_HEADS][DIM] hold what was appended. */
static double check_last_step(const float *q, const float *o, const double *k_log, const float *v_log,
                              const int32_t *seqused, const float *cos_t, const float *sin_t) {
    double worst = 0.0, qr[DIM], s[CAPACITY];
    for (int b = 0; b < BATCH; ++b) {
        const int n = seqused[b];  /* already advanced past this step's row */
        for (int h = 0; h < HEADS; ++h) {
            const int kh = h / (HEADS / KV_HEADS);
            double m = -INFINITY, sum = 0.0;
            rotate(q + (b * HEADS + h) * DIM, qr, n - 1, cos_t, sin_t);
            for (int j = 0; j < n; ++j) {
                const double *k = k_log + ((size_t)(b * CAPACITY + j) * KV_HEADS + kh) * DIM;
                double dot = 0.0;
                for (int c = 0; c < DIM; ++c) dot += qr[c] * k[c];
                s[j] = dot / sqrt((double)DIM);
                if (s[j] > m) m = s[j];
            }
            for (int j = 0; j < n; ++j) sum += exp(s[j] - m);
            for (int c = 0; c < DIM; ++c) {
                double ref = 0.0;
                for (int j = 0; j < n; ++j)
                    ref += exp(s[j] - m) / sum * v_log[((size_t)(b * CAPACITY + j) * KV_HEADS + kh) * DIM + c];
                const double err = fabs(o[(b * HEADS + h) * DIM + c] - ref);
                if (err > worst) worst = err;
            }
        }
    }
    return worst;
}

int main(int argc, char **argv) {
    int steps = 40, status = 1;
    if (argc == 3 && strcmp(argv[1], "--steps") == 0) steps = atoi(argv[2]);
    if (steps < 1 || steps > CAPACITY - 8) {
        fprintf(stderr, "usage: flashattn-decode [--steps 1..%d]\n", CAPACITY - 8);
        return 2;
    }
    uint64_t rng = 42;
    const size_t cache = (size_t)POOL * PAGE * KV_HEADS * DIM, logged = (size_t)BATCH * CAPACITY * KV_HEADS * DIM;
    float *k_cache = calloc(cache, sizeof(float)), *v_cache = calloc(cache, sizeof(float));
    double *k_log = calloc(logged, sizeof(double));
    float *v_log = calloc(logged, sizeof(float));
    float q[BATCH * HEADS * DIM], o[BATCH * HEADS * DIM], k_new[BATCH * KV_HEADS * DIM], v_new[BATCH * KV_HEADS * DIM];
    float cos_t[CAPACITY * ROTARY / 2], sin_t[CAPACITY * ROTARY / 2];
    int32_t table[BATCH * MAX_PAGES], seqused[BATCH] = {0, 3, 5};  /* sequences start at different lengths */
    flashattn_plan_t *plan = make_plan();
    flashattn_args_t *args = NULL;
    void *workspace = NULL;
    size_t workspace_bytes = 0;
    if (!plan || !k_cache || !v_cache || !k_log || !v_log || flashattn_args_create(&args) != FLASHATTN_SUCCESS) goto cleanup;

    for (int p = 0; p < CAPACITY; ++p)
        for (int i = 0; i < ROTARY / 2; ++i) {
            const double theta = p * pow(10000.0, -2.0 * i / ROTARY);
            cos_t[p * ROTARY / 2 + i] = (float)cos(theta);
            sin_t[p * ROTARY / 2 + i] = (float)sin(theta);
        }
    for (int i = 0; i < BATCH * MAX_PAGES; ++i) table[i] = (i * 7 + 3) % POOL;  /* a shuffled pool */
    flashattn_plan_get_workspace_size(plan, &workspace_bytes);
    if (workspace_bytes > 0 && !(workspace = aligned_alloc(256, (workspace_bytes + 255) / 256 * 256))) goto cleanup;

    /* The tensors that stay put are set once; the step's rows are rewritten in place. */
    const struct { flashattn_arg_t which; const void *ptr; } fixed[] = {
        {FLASHATTN_ARG_Q, q}, {FLASHATTN_ARG_K, k_cache}, {FLASHATTN_ARG_V, v_cache}, {FLASHATTN_ARG_O, o},
        {FLASHATTN_ARG_PAGE_TABLE, table}, {FLASHATTN_ARG_SEQUSED_K, seqused}, {FLASHATTN_ARG_K_NEW, k_new},
        {FLASHATTN_ARG_V_NEW, v_new}, {FLASHATTN_ARG_ROTARY_COS, cos_t}, {FLASHATTN_ARG_ROTARY_SIN, sin_t},
    };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; ++i) flashattn_args_set(args, fixed[i].which, fixed[i].ptr);

    /* One decode step per iteration; the log of appended rows (K rotated here) is the reference's. */
    for (int step = 0; step < steps; ++step) {
        for (size_t i = 0; i < sizeof q / sizeof q[0]; ++i) q[i] = uniform(&rng);
        for (size_t i = 0; i < sizeof k_new / sizeof k_new[0]; ++i) k_new[i] = uniform(&rng), v_new[i] = uniform(&rng);
        for (int b = 0; b < BATCH; ++b)
            for (int h = 0; h < KV_HEADS; ++h) {
                const size_t at = ((size_t)(b * CAPACITY + seqused[b]) * KV_HEADS + h) * DIM;
                rotate(k_new + (b * KV_HEADS + h) * DIM, k_log + at, seqused[b], cos_t, sin_t);
                memcpy(v_log + at, v_new + (b * KV_HEADS + h) * DIM, DIM * sizeof(float));
            }
        const flashattn_status_t st = flashattn_plan_execute_args(plan, args, workspace, workspace_bytes, NULL);
        if (st != FLASHATTN_SUCCESS) {
            fprintf(stderr, "flashattn-decode: step %d: %s\n", step, flashattn_last_error());
            goto cleanup;
        }
        for (int b = 0; b < BATCH; ++b) seqused[b] += 1;  /* the caller advances the cache lengths */
    }
    /* Rows below the starting lengths were never appended: they are zeros in the (calloc'd) pool
     * and in the log alike. */
    {
        const double worst = check_last_step(q, o, k_log, v_log, seqused, cos_t, sin_t);
        printf("flashattn-decode: %d steps, %d sequences of %d..%d keys, max |O - reference| = %.2e\n", steps, BATCH,
               seqused[0], seqused[2], worst);
        status = worst <= 2e-5 ? 0 : 1;
    }
cleanup:
    flashattn_args_destroy(args);
    flashattn_plan_destroy(plan);
    free(workspace), free(k_cache), free(v_cache), free(k_log), free(v_log);
    return status;
}
