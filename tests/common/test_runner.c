/* The cmocka side shared by the suites (see test_runner.h). */
#include "test_runner.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

uint64_t test_seed_from_env(uint64_t fallback) {
    const char *seed_env = getenv("FLASHATTN_TEST_SEED");
    return seed_env != NULL && seed_env[0] != '\0' ? strtoull(seed_env, NULL, 0) : fallback;
}

uint64_t test_case_seed(uint64_t base, size_t index) { return base + 0x9e3779b97f4a7c15ull * (index + 1); }

int test_reduced_grid(void) {
    const char *reduced_env = getenv("FLASHATTN_TEST_REDUCED");
    return reduced_env != NULL && reduced_env[0] != '\0' && strcmp(reduced_env, "0") != 0;
}

int test_keeps_case(int reduced, const attn_case *c, size_t *small) {
    return !(reduced && (c->seqlen_q * c->seqlen_k > 128 * 256 || (*small)++ % 3 != 0));
}

flashattn_dtype_t test_effective_dtype(flashattn_backend_t backend, flashattn_dtype_t dtype) {
    if (backend != FLASHATTN_BACKEND_CPU && dtype == FLASHATTN_DTYPE_FP32) return FLASHATTN_DTYPE_BF16;
    return dtype;
}

int test_case_name(char *buf, size_t size, const char *prefix, const attn_case *c, flashattn_dtype_t dtype) {
    int n = snprintf(buf, size, "%sb%lld_q%lld_k%lld_h%lld-%lld_d%lld", prefix, (long long)c->batch,
                     (long long)c->seqlen_q, (long long)c->seqlen_k, (long long)c->heads_q, (long long)c->heads_kv,
                     (long long)c->head_dim);
    if (c->head_dim_v && c->head_dim_v != c->head_dim)
        n += snprintf(buf + n, size - (size_t)n, "-%lld", (long long)c->head_dim_v);
    n += snprintf(buf + n, size - (size_t)n, "_%s", test_dtype_name(dtype));
    if (c->causal) n += snprintf(buf + n, size - (size_t)n, "_causal");
    if (c->window_left >= 0 || c->window_right >= 0)
        n += snprintf(buf + n, size - (size_t)n, "_win%lld,%lld", (long long)c->window_left, (long long)c->window_right);
    if (c->softcap > 0) n += snprintf(buf + n, size - (size_t)n, "_cap%g", c->softcap);
    if (c->scale > 0) n += snprintf(buf + n, size - (size_t)n, "_scale%g", c->scale);
    if (c->varlen) n += snprintf(buf + n, size - (size_t)n, "_varlen");
    return n;
}

/* Whether a device of compute capability major.minor runs the GPU `backend`. */
static int device_runs(flashattn_backend_t backend, int32_t major, int32_t minor) {
    switch (backend) {
    case FLASHATTN_BACKEND_FA1: return major * 10 + minor >= 75;
    case FLASHATTN_BACKEND_FA2: return major >= 8;
    default: return major == 9 && minor == 0;
    }
}

void test_require_gpu_backend(flashattn_backend_t backend, int32_t *major, int32_t *minor) {
    const char *name = test_backend_name(backend);
    const char *info = flashattn_build_info();
    const char *list = strstr(info, "backends=");
    test_skip_without_gpu();
    if (list == NULL || strstr(list, name) == NULL) {
        printf("this build has no %s backend (%s): skipping\n", name, info);
        exit(77);
    }
    if (flashattn_device_compute_capability(0, major, minor) != FLASHATTN_SUCCESS) {
        printf("no compute capability for device 0 (%s): skipping\n", flashattn_last_error());
        exit(77);
    }
    if (!device_runs(backend, *major, *minor)) {
        printf("device 0 is sm_%d%d, which %s does not run: skipping\n", *major, *minor, name);
        exit(77);
    }
}

void test_skip_if_outside(const char *why) {
    if (why == NULL) return;
    print_message("not run on this backend: %s\n", why);
    skip();
}

struct CMUnitTest test_unit(const char *name, CMUnitTestFunction func, const void *state) {
    struct CMUnitTest t;
    t.name = name;
    t.test_func = func;
    t.setup_func = NULL;
    t.teardown_func = NULL;
    t.initial_state = (void *)state;
    return t;
}

void assert_message_mentions(const char *word) {
    if (strstr(flashattn_last_error(), word) == NULL)
        fail_msg("message '%s' does not mention '%s'", flashattn_last_error(), word);
}

void set_keys_or_fail(flashattn_plan_t *plan, const test_key_value *keys, size_t n) {
    size_t i;
    for (i = 0; i < n; ++i) assert_status(flashattn_plan_set_i64(plan, keys[i].key, keys[i].value), FLASHATTN_SUCCESS);
}

flashattn_plan_t *plan_with_keys(const test_key_value *keys, size_t n) {
    flashattn_plan_t *plan = NULL;
    assert_status(flashattn_plan_create(&plan), FLASHATTN_SUCCESS);
    assert_non_null(plan);
    set_keys_or_fail(plan, keys, n);
    return plan;
}

typedef struct thread_job {
    const flashattn_plan_t *plan;
    plan_call call;
    void *buffers;
    int reps;
    flashattn_status_t status;
} thread_job;

static void *run_job(void *arg) {
    thread_job *job = (thread_job *)arg;
    int i;
    for (i = 0; i < job->reps && job->status == FLASHATTN_SUCCESS; ++i) job->status = job->call(job->plan, job->buffers);
    return NULL;
}

void run_in_threads(const flashattn_plan_t *plan, plan_call call, void *const *buffers, int n, int reps) {
    thread_job jobs[16];
    pthread_t threads[16];
    int t;
    assert_true(n <= 16);
    for (t = 0; t < n; ++t) {
        jobs[t].plan = plan;
        jobs[t].call = call;
        jobs[t].buffers = buffers[t];
        jobs[t].reps = reps;
        jobs[t].status = FLASHATTN_SUCCESS;
        assert_int_equal(pthread_create(&threads[t], NULL, run_job, &jobs[t]), 0);
    }
    for (t = 0; t < n; ++t) {
        pthread_join(threads[t], NULL);
        assert_int_equal(jobs[t].status, FLASHATTN_SUCCESS);
    }
}
