/* flashattn-info: what this machine's libflashattn is and can do. Prints the library's version and
 * build, the CUDA devices it sees with their compute capability, and, for one attention shape, the
 * backend FLASHATTN_BACKEND_AUTO picks for the forward and the backward pass and why, then whether
 * each backend could run that shape and, where not, the library's reason. Uses the public C API
 * only (the reasons are flashattn_plan_get_backend()'s and flashattn_last_error()'s). See
 * flashattn-info(1) or --help. */
#include <flashattn/flashattn.h>
#include <flashattn/flashattn_version.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v;
    int64_t dtype, causal, window_left, window_right, device;
    double softcap;
} shape_t;

static const char *const backend_names[] = {"auto", "cpu", "fa1", "fa2", "fa3"};
enum { backend_count = (int)(sizeof backend_names / sizeof backend_names[0]) };

static const char *backend_name(int backend) {
    return backend >= 0 && backend < backend_count ? backend_names[backend] : "unknown";
}

static const char *dtype_name(int64_t dtype) {
    switch (dtype) {
        case FLASHATTN_DTYPE_FP16: return "fp16";
        case FLASHATTN_DTYPE_BF16: return "bf16";
        case FLASHATTN_DTYPE_FP32: return "fp32";
        case FLASHATTN_DTYPE_FP8_E4M3: return "fp8_e4m3";
        default: return "unknown";
    }
}

static void usage(FILE *out) {
    fputs("usage: flashattn-info [options]\n"
          "\n"
          "Prints libflashattn's version and build, the CUDA devices it sees, and for one attention\n"
          "shape the backend the automatic choice picks (forward and backward) and why, then whether\n"
          "each backend could run that shape. Exit status: 0 when the automatic choice can run the\n"
          "shape, 1 when no backend can, 2 on a usage error.\n"
          "\n"
          "Shape (default: batch 1, seqlen 4096, 32 heads, head dim 128, fp16, not causal, device 0):\n"
          "  --batch N              sequences\n"
          "  --seqlen N             query and key length (--seqlen-q N, --seqlen-k N set one)\n"
          "  --heads N              query heads (--heads-kv N: key/value heads, default the same)\n"
          "  --head-dim N           head dimension of Q and K (--head-dim-v N: of V and O)\n"
          "  --dtype fp16|bf16|fp32 element type\n"
          "  --causal               causal mask (bottom-right aligned)\n"
          "  --window L,R           sliding window (-1: unbounded on that side)\n"
          "  --softcap C            logit softcap\n"
          "  --device N             CUDA device ordinal\n"
          "  -V, --version          print the library version only\n"
          "  -h, --help             this text\n",
          out);
}

static int parse_i64(const char *text, int64_t *out) {
    char *end = NULL;
    errno = 0;
    const long long v = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0') return 0;
    *out = (int64_t)v;
    return 1;
}

static int parse_dtype(const char *text, int64_t *out) {
    if (strcmp(text, "fp16") == 0 || strcmp(text, "float16") == 0) *out = FLASHATTN_DTYPE_FP16;
    else if (strcmp(text, "bf16") == 0 || strcmp(text, "bfloat16") == 0) *out = FLASHATTN_DTYPE_BF16;
    else if (strcmp(text, "fp32") == 0 || strcmp(text, "float32") == 0) *out = FLASHATTN_DTYPE_FP32;
    else if (strcmp(text, "fp8_e4m3") == 0) *out = FLASHATTN_DTYPE_FP8_E4M3;
    else return 0;
    return 1;
}

static int parse_window(const char *text, int64_t *left, int64_t *right) {
    const char *comma = strchr(text, ',');
    if (comma == NULL || comma == text) return 0;
    char buf[64];
    const size_t n = (size_t)(comma - text);
    if (n >= sizeof buf) return 0;
    memcpy(buf, text, n);
    buf[n] = '\0';
    return parse_i64(buf, left) && parse_i64(comma + 1, right);
}

/* Parses argv into *shape; returns 0 to go on, 1 after --help/--version, 2 on an error. */
static int parse_args(int argc, char **argv, shape_t *shape) {
    int64_t heads_kv = -1, head_dim_v = -1;
    for (int i = 1; i < argc; ++i) {
        const char *opt = argv[i];
        if (strcmp(opt, "-h") == 0 || strcmp(opt, "--help") == 0) {
            usage(stdout);
            return 1;
        }
        if (strcmp(opt, "-V") == 0 || strcmp(opt, "--version") == 0) {
            printf("%s\n", flashattn_version_string());
            return 1;
        }
        if (strcmp(opt, "--causal") == 0) {
            shape->causal = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "flashattn-info: %s needs a value (or is unknown); see --help\n", opt);
            return 2;
        }
        const char *val = argv[++i];
        int ok = 1;
        int64_t n = 0;
        if (strcmp(opt, "--batch") == 0) ok = parse_i64(val, &shape->batch);
        else if (strcmp(opt, "--seqlen") == 0) {
            ok = parse_i64(val, &n);
            shape->seqlen_q = shape->seqlen_k = n;
        }
        else if (strcmp(opt, "--seqlen-q") == 0) ok = parse_i64(val, &shape->seqlen_q);
        else if (strcmp(opt, "--seqlen-k") == 0) ok = parse_i64(val, &shape->seqlen_k);
        else if (strcmp(opt, "--heads") == 0) ok = parse_i64(val, &shape->heads_q);
        else if (strcmp(opt, "--heads-kv") == 0) ok = parse_i64(val, &heads_kv);
        else if (strcmp(opt, "--head-dim") == 0) ok = parse_i64(val, &shape->head_dim);
        else if (strcmp(opt, "--head-dim-v") == 0) ok = parse_i64(val, &head_dim_v);
        else if (strcmp(opt, "--dtype") == 0) ok = parse_dtype(val, &shape->dtype);
        else if (strcmp(opt, "--window") == 0) ok = parse_window(val, &shape->window_left, &shape->window_right);
        else if (strcmp(opt, "--device") == 0) ok = parse_i64(val, &shape->device);
        else if (strcmp(opt, "--softcap") == 0) {
            char *end = NULL;
            shape->softcap = strtod(val, &end);
            ok = end != val && *end == '\0';
        } else {
            fprintf(stderr, "flashattn-info: unknown option %s; see --help\n", opt);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "flashattn-info: %s: invalid value '%s'; see --help\n", opt, val);
            return 2;
        }
    }
    shape->heads_kv = heads_kv >= 0 ? heads_kv : shape->heads_q;
    shape->head_dim_v = head_dim_v >= 0 ? head_dim_v : shape->head_dim;
    return 0;
}

static void print_devices(void) {
    int32_t count = 0;
    if (flashattn_device_count(&count) != FLASHATTN_SUCCESS) {
        printf("devices:  unknown (%s)\n", flashattn_last_error());
        return;
    }
    if (count == 0) {
        /* The library says why ("no NVIDIA driver found", "no CUDA device found", "libflashattn was
         * built without CUDA") in the error of a device query; print just that reason. */
        int32_t major = 0, minor = 0;
        const char *why = "";
        if (flashattn_device_compute_capability(0, &major, &minor) != FLASHATTN_SUCCESS) {
            static const char prefix[] = "device: no usable CUDA device on this machine: ";
            why = flashattn_last_error();
            if (strncmp(why, prefix, sizeof prefix - 1) == 0) why += sizeof prefix - 1;
        }
        printf("devices:  none: %s\n", why[0] ? why : "no usable CUDA device");
        return;
    }
    printf("devices:  %d CUDA device%s\n", count, count == 1 ? "" : "s");
    for (int32_t d = 0; d < count; ++d) {
        int32_t major = 0, minor = 0;
        if (flashattn_device_compute_capability(d, &major, &minor) == FLASHATTN_SUCCESS)
            printf("  device %d: compute capability %d.%d (sm_%d%d)\n", d, major, minor, major, minor);
        else
            printf("  device %d: %s\n", d, flashattn_last_error());
    }
}

/* A plan for shape with the given backend, finalized. NULL on failure, with the library's message
 * (or the status name) copied to why. */
static flashattn_plan_t *make_plan(const shape_t *s, int backend, char *why, size_t why_size) {
    flashattn_plan_t *plan = NULL;
    flashattn_status_t st = flashattn_plan_create(&plan);
    const struct { flashattn_i64_param_t key; int64_t value; } params[] = {
        {FLASHATTN_I64_BATCH, s->batch},         {FLASHATTN_I64_SEQLEN_Q, s->seqlen_q},
        {FLASHATTN_I64_SEQLEN_K, s->seqlen_k},   {FLASHATTN_I64_HEADS_Q, s->heads_q},
        {FLASHATTN_I64_HEADS_KV, s->heads_kv},   {FLASHATTN_I64_HEAD_DIM, s->head_dim},
        {FLASHATTN_I64_HEAD_DIM_V, s->head_dim_v}, {FLASHATTN_I64_DTYPE, s->dtype},
        {FLASHATTN_I64_CAUSAL, s->causal},       {FLASHATTN_I64_WINDOW_LEFT, s->window_left},
        {FLASHATTN_I64_WINDOW_RIGHT, s->window_right}, {FLASHATTN_I64_DEVICE, s->device},
        {FLASHATTN_I64_BACKEND, backend},
    };
    for (size_t i = 0; st == FLASHATTN_SUCCESS && i < sizeof params / sizeof params[0]; ++i)
        st = flashattn_plan_set_i64(plan, params[i].key, params[i].value);
    if (st == FLASHATTN_SUCCESS && s->softcap != 0.0) st = flashattn_plan_set_f64(plan, FLASHATTN_F64_SOFTCAP, s->softcap);
    if (st == FLASHATTN_SUCCESS) st = flashattn_plan_finalize(plan);
    if (st != FLASHATTN_SUCCESS) {
        const char *msg = flashattn_last_error();
        snprintf(why, why_size, "%s", msg[0] ? msg : flashattn_status_string(st));
        flashattn_plan_destroy(plan);
        return NULL;
    }
    return plan;
}

/* The automatic choice for the shape; returns 1 when it can run. */
static int print_auto_choice(const shape_t *s) {
    char why[1024];
    flashattn_plan_t *plan = make_plan(s, FLASHATTN_BACKEND_AUTO, why, sizeof why);
    if (plan == NULL) {
        printf("auto:     no backend can run this shape: %s\n", why);
        return 0;
    }
    flashattn_backend_t backend = FLASHATTN_BACKEND_AUTO;
    const char *reason = NULL;
    size_t workspace = 0;
    if (flashattn_plan_get_backend(plan, &backend, &reason) == FLASHATTN_SUCCESS &&
        flashattn_plan_get_workspace_size(plan, &workspace) == FLASHATTN_SUCCESS)
        printf("auto:     forward on %s, workspace %zu bytes: %s\n", backend_name(backend), workspace,
               reason ? reason : "");
    else
        printf("auto:     forward: %s\n", flashattn_last_error());
    if (flashattn_plan_get_backward_backend(plan, &backend, &reason) == FLASHATTN_SUCCESS &&
        flashattn_plan_get_backward_workspace_size(plan, &workspace) == FLASHATTN_SUCCESS)
        printf("          backward on %s, workspace %zu bytes: %s\n", backend_name(backend), workspace,
               reason ? reason : "");
    else
        printf("          backward: not available: %s\n", flashattn_last_error());
    flashattn_plan_destroy(plan);
    return 1;
}

static void print_each_backend(const shape_t *s) {
    printf("each backend, asked for explicitly:\n");
    for (int b = FLASHATTN_BACKEND_CPU; b < backend_count; ++b) {
        char why[1024];
        flashattn_plan_t *plan = make_plan(s, b, why, sizeof why);
        if (plan == NULL) {
            printf("  %-4s no:  %s\n", backend_name(b), why);
            continue;
        }
        flashattn_backend_t backward = FLASHATTN_BACKEND_AUTO;
        const char *reason = NULL;
        if (flashattn_plan_get_backward_backend(plan, &backward, &reason) == FLASHATTN_SUCCESS)
            printf("  %-4s yes (backward on %s)\n", backend_name(b), backend_name(backward));
        else
            printf("  %-4s yes (no backward: %s)\n", backend_name(b), flashattn_last_error());
        flashattn_plan_destroy(plan);
    }
}

int main(int argc, char **argv) {
    shape_t shape = {1, 4096, 4096, 32, 32, 128, 128, FLASHATTN_DTYPE_FP16, 0, -1, -1, 0, 0.0};
    const int parsed = parse_args(argc, argv, &shape);
    if (parsed != 0) return parsed == 1 ? 0 : 2;

    const uint32_t v = flashattn_version();
    printf("library:  libflashattn %s (flashattn-info built against %s, ABI %d)\n", flashattn_version_string(),
           FLASHATTN_VERSION_STRING, FLASHATTN_ABI_VERSION);
    if (v / 10000 != FLASHATTN_VERSION_MAJOR)
        printf("          warning: the library's major version %u differs from the header's %d\n", v / 10000,
               FLASHATTN_VERSION_MAJOR);
    printf("build:    %s\n", flashattn_build_info());
    print_devices();
    const char *forced = getenv("FLASHATTN_BACKEND");
    if (forced != NULL && forced[0] != '\0')
        printf("note:     FLASHATTN_BACKEND=%s is set and overrides the automatic choice below\n", forced);

    printf("shape:    batch %lld, seqlen_q %lld, seqlen_k %lld, heads %lld/%lld, head_dim %lld/%lld, %s%s",
           (long long)shape.batch, (long long)shape.seqlen_q, (long long)shape.seqlen_k, (long long)shape.heads_q,
           (long long)shape.heads_kv, (long long)shape.head_dim, (long long)shape.head_dim_v, dtype_name(shape.dtype),
           shape.causal ? ", causal" : "");
    if (shape.window_left >= 0 || shape.window_right >= 0)
        printf(", window (%lld, %lld)", (long long)shape.window_left, (long long)shape.window_right);
    if (shape.softcap != 0.0) printf(", softcap %g", shape.softcap);
    printf(", device %lld\n", (long long)shape.device);
    const int runs = print_auto_choice(&shape);
    print_each_backend(&shape);
    return runs ? 0 : 1;
}
