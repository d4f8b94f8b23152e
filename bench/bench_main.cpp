// flashattn-bench: forward-attention throughput of libflashattn against unfused baselines.
//
//   flashattn-bench --backend cpu                CPU backend vs a naive CPU attention (fp32)
//   flashattn-bench --backend all-gpu            fa1/fa2/fa3 vs cuBLAS "standard attention" on
//                                                the FlashAttention-3 paper's grid, then decode
//   flashattn-bench --backend fa3 --decode       the decode table only
//
// See bench/README.md for the method and the exact setup.
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <algorithm>
#include <string>
#include <vector>

#include "bench_common.h"

namespace bench {

std::string format(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char buf[1024];
    const int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0) return std::string();
    if (static_cast<size_t>(n) < sizeof buf) return std::string(buf, static_cast<size_t>(n));
    std::string big(static_cast<size_t>(n) + 1, '\0');
    va_start(ap, fmt);
    std::vsnprintf(&big[0], big.size(), fmt, ap);
    va_end(ap);
    big.resize(static_cast<size_t>(n));
    return big;
}

bool Report::write(const std::string &path) const {
    std::ofstream f(path);
    if (!f) return false;
    f << text_;
    return static_cast<bool>(f);
}

namespace {

std::string json_string(const std::string &s) {
    std::string out = "\"";
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += static_cast<char>(c);
        } else if (c < 0x20) {
            out += format("\\u%04x", c);
        } else {
            out += static_cast<char>(c);
        }
    }
    return out + "\"";
}

std::string json_number(double v) { return std::isfinite(v) ? format("%.6g", v) : std::string("null"); }

std::string json_record(const Record &r) {
    return format("{\"kind\": %s, \"backend\": %s, \"dtype\": %s, \"batch\": %lld, \"seqlen_q\": %lld, "
                  "\"seqlen_k\": %lld, \"heads_q\": %lld, \"heads_kv\": %lld, \"head_dim\": %lld, \"causal\": %s, "
                  "\"status\": %s, \"ms\": %s, \"tflops\": %s, \"gbps\": %s, \"bytes\": %s, \"reduced\": %s, "
                  "\"note\": %s, \"deterministic\": %s}",
                  json_string(r.kind).c_str(), json_string(r.backend).c_str(), json_string(r.dtype).c_str(),
                  static_cast<long long>(r.batch), static_cast<long long>(r.seqlen_q),
                  static_cast<long long>(r.seqlen_k), static_cast<long long>(r.heads_q),
                  static_cast<long long>(r.heads_kv), static_cast<long long>(r.head_dim), r.causal ? "true" : "false",
                  json_string(r.status).c_str(), json_number(r.ms).c_str(), json_number(r.tflops).c_str(),
                  json_number(r.gbps).c_str(), json_number(r.bytes).c_str(), r.reduced ? "true" : "false",
                  json_string(r.note).c_str(), r.deterministic ? "true" : "false");
}

}  // namespace

bool Report::write_json(const std::string &path, const std::string &tool) const {
    std::ofstream f(path);
    if (!f) return false;
    f << "{\n  \"schema\": \"flashattn-bench-results/1\",\n  \"tool\": " << json_string(tool) << ",\n";
    for (const auto &kv : meta_) f << "  " << json_string(kv.first) << ": " << json_string(kv.second) << ",\n";
    f << "  \"records\": [";
    for (size_t i = 0; i < records_.size(); ++i) f << (i ? ",\n    " : "\n    ") << json_record(records_[i]);
    f << "\n  ]\n}\n";
    return static_cast<bool>(f);
}

double median(std::vector<double> v) {
    if (v.empty()) return std::nan("");
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

const char *dtype_name(flashattn_dtype_t dt) {
    switch (dt) {
        case FLASHATTN_DTYPE_FP16: return "fp16";
        case FLASHATTN_DTYPE_BF16: return "bf16";
        case FLASHATTN_DTYPE_FP32: return "fp32";
        case FLASHATTN_DTYPE_FP8_E4M3: return "fp8_e4m3";
    }
    return "?";
}

std::string lib_error(flashattn_status_t st) {
    std::string msg = flashattn_last_error();
    return std::string(flashattn_status_string(st)) + (msg.empty() ? "" : ": " + msg);
}

double attention_flops(int64_t b, int64_t h, int64_t sq, int64_t sk, int64_t d, bool causal) {
    const double f = 4.0 * static_cast<double>(b) * static_cast<double>(h) * static_cast<double>(sq) *
                     static_cast<double>(sk) * static_cast<double>(d);
    return causal ? 0.5 * f : f;
}

flashattn_status_t create_shaped_plan(const PlanKeys &keys, flashattn_plan_t **out) {
    flashattn_plan_t *plan = nullptr;
    flashattn_status_t st = flashattn_plan_create(&plan);
    const std::pair<flashattn_i64_param_t, int64_t> values[] = {
        {FLASHATTN_I64_BATCH, keys.b},        {FLASHATTN_I64_SEQLEN_Q, keys.sq},  {FLASHATTN_I64_SEQLEN_K, keys.sk},
        {FLASHATTN_I64_HEADS_Q, keys.hq},     {FLASHATTN_I64_HEADS_KV, keys.hkv}, {FLASHATTN_I64_HEAD_DIM, keys.d},
        {FLASHATTN_I64_DTYPE, keys.dtype},    {FLASHATTN_I64_CAUSAL, keys.causal ? 1 : 0},
        {FLASHATTN_I64_BACKEND, keys.backend}};
    for (const auto &kv : values)
        if (st == FLASHATTN_SUCCESS) st = flashattn_plan_set_i64(plan, kv.first, kv.second);
    if (st != FLASHATTN_SUCCESS) {
        flashattn_plan_destroy(plan);
        plan = nullptr;
    }
    *out = plan;
    return st;
}

#ifndef FLASHATTN_BENCH_WITH_CUDA
int run_gpu(const Options &) {
    std::fprintf(stderr,
                 "flashattn-bench: this build has no CUDA support (configure with "
                 "-DFLASHATTN_ENABLE_CUDA=ON); only --backend cpu is available\n");
    return 2;
}
#endif

}  // namespace bench

namespace {

void usage(FILE *out) {
    std::fputs(
        "usage: flashattn-bench [--backend cpu|fa1|fa2|fa3|all-gpu] [options]\n"
        "\n"
        "CPU (--backend cpu, the default): the library's CPU backend against a naive attention that\n"
        "materialises the N x N fp32 score matrix; fp32, causal off unless --causal 1.\n"
        "  --seqlen LIST        default 512,1024,2048,4096\n"
        "  --batch N            default 1\n"
        "  --heads N            default 4\n"
        "  --hdim N             default 64 (one value)\n"
        "  --naive-threads N    threads of the naive baseline (default: all cores, as the CPU backend)\n"
        "  --warmup N --reps N  default 1 warm-up, median of 5 runs\n"
        "\n"
        "GPU (--backend fa1|fa2|fa3|all-gpu): the FlashAttention-3 paper's grid (hidden 2048,\n"
        "heads = 2048/hdim, batch = 16384/seqlen) against cuBLAS + softmax 'standard attention',\n"
        "then the decode table (seqlen_q = 1, bf16, hdim 128).\n"
        "  --dtype bf16|fp16|both   default bf16\n"
        "  --hdim LIST          default 64,128,256\n"
        "  --seqlen LIST        default 512,1024,2048,4096,8192,16384\n"
        "  --causal 0|1|both    default both\n"
        "  --decode             only the decode table\n"
        "  --no-decode          leave the decode table out\n"
        "  --no-standard        leave the unfused baseline out\n"
        "  --no-lse             pass lse = NULL (default: an fp32 LSE buffer is written and checked)\n"
        "  --host-cost          only the host enqueue time per execute (decode shape; also printed last\n"
        "                       in every GPU run)\n"
        "  --warmup N --reps N  default 3 warm-ups, median of 10 timed runs (CUDA events)\n"
        "  --device N           CUDA device ordinal (default 0)\n"
        "  --budget-s S         wall-clock budget of the GPU run; cells past it are skipped (default 230)\n"
        "  --max-decode-gb G    skip decode shapes whose K+V exceed G GB (default 40)\n"
        "  --page-size N        decode table on paged K/V caches of N keys per page, shuffled page table\n"
        "                       (default 0: contiguous caches)\n"
        "  --decode-batch LIST --decode-kv-heads LIST --decode-seqlen LIST\n"
        "                       restrict the decode table (default 1,8,32 / 8,32 / 8192,32768,131072)\n"
        "  --decode-head-dim D  the decode table's head dim (default 128)\n"
        "  --num-splits N       decode plans with FLASHATTN_I64_NUM_SPLITS = N (default 0: auto)\n"
        "  --append-rotary      decode steps that also append the new K/V row (seqused_k = seqlen_k - 1)\n"
        "                       with a rotary embedding over the whole head dim (no reference check)\n"
        "  --seqused-k          decode steps pass seqused_k = seqlen_k (every key used): the append's baseline\n"
        "\n"
        "Both:\n"
        "  --backward           also the backward and forward+backward table (FLOPs 2.5x and 3.5x the\n"
        "                       forward's; CPU: against a naive backward, GPU: methods checked against\n"
        "                       each other)\n"
        "  --backward-only      GPU: the backward table alone (no forward grid, no decode table)\n"
        "  --deterministic      with --backward: also the backward with FLASHATTN_I64_DETERMINISTIC = 1\n"
        "  --markdown PATH      also write the tables (markdown) to PATH\n"
        "  --json PATH          also write one JSON record per measurement to PATH (schema in\n"
        "                       bench/README.md; bench/plot.py draws charts from it)\n"
        "  -h, --help\n",
        out);
}

[[noreturn]] void bad_arg(const char *what, const char *value) {
    std::fprintf(stderr, "flashattn-bench: bad value '%s' for %s\n\n", value ? value : "(missing)", what);
    usage(stderr);
    std::exit(2);
}

int64_t parse_int(const char *what, const char *s) {
    if (s == nullptr || *s == '\0') bad_arg(what, s);
    char *end = nullptr;
    const long long v = std::strtoll(s, &end, 10);
    if (*end != '\0' || v < 0) bad_arg(what, s);
    return static_cast<int64_t>(v);
}

std::vector<int64_t> parse_list(const char *what, const char *s) {
    if (s == nullptr) bad_arg(what, s);
    std::vector<int64_t> out;
    std::string text(s);
    size_t pos = 0;
    while (pos <= text.size()) {
        size_t comma = text.find(',', pos);
        if (comma == std::string::npos) comma = text.size();
        const std::string item = text.substr(pos, comma - pos);
        const int64_t v = parse_int(what, item.c_str());
        if (v <= 0) bad_arg(what, s);
        out.push_back(v);
        pos = comma + 1;
    }
    return out;
}

}  // namespace

int main(int argc, char **argv) {
    bench::Options opt;
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i];
        auto value = [&](const char *name) -> const char * {
            if (i + 1 >= argc) bad_arg(name, nullptr);
            return argv[++i];
        };
        if (!std::strcmp(a, "-h") || !std::strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!std::strcmp(a, "--backend")) {
            opt.backend = value(a);
            if (opt.backend != "cpu" && opt.backend != "fa1" && opt.backend != "fa2" && opt.backend != "fa3" &&
                opt.backend != "all-gpu")
                bad_arg(a, opt.backend.c_str());
        } else if (!std::strcmp(a, "--hdim")) {
            opt.hdims = parse_list(a, value(a));
        } else if (!std::strcmp(a, "--seqlen")) {
            opt.seqlens = parse_list(a, value(a));
        } else if (!std::strcmp(a, "--causal")) {
            const char *v = value(a);
            if (!std::strcmp(v, "0")) opt.causal = {0};
            else if (!std::strcmp(v, "1")) opt.causal = {1};
            else if (!std::strcmp(v, "both")) opt.causal = {0, 1};
            else bad_arg(a, v);
        } else if (!std::strcmp(a, "--dtype")) {
            const char *v = value(a);
            if (!std::strcmp(v, "bf16")) opt.dtypes = {FLASHATTN_DTYPE_BF16};
            else if (!std::strcmp(v, "fp16")) opt.dtypes = {FLASHATTN_DTYPE_FP16};
            else if (!std::strcmp(v, "both")) opt.dtypes = {FLASHATTN_DTYPE_BF16, FLASHATTN_DTYPE_FP16};
            else bad_arg(a, v);
        } else if (!std::strcmp(a, "--decode")) {
            opt.decode = true;
        } else if (!std::strcmp(a, "--no-decode")) {
            opt.no_decode = true;
        } else if (!std::strcmp(a, "--no-standard")) {
            opt.no_standard = true;
        } else if (!std::strcmp(a, "--no-lse")) {
            opt.no_lse = true;
        } else if (!std::strcmp(a, "--backward")) {
            opt.backward = true;
        } else if (!std::strcmp(a, "--backward-only")) {
            opt.backward = opt.backward_only = true;
        } else if (!std::strcmp(a, "--deterministic")) {
            opt.deterministic = true;
        } else if (!std::strcmp(a, "--host-cost")) {
            opt.host_cost = true;
        } else if (!std::strcmp(a, "--warmup")) {
            opt.warmup = static_cast<int>(parse_int(a, value(a)));
        } else if (!std::strcmp(a, "--reps")) {
            opt.reps = static_cast<int>(parse_int(a, value(a)));
            if (opt.reps < 1) bad_arg(a, argv[i]);
        } else if (!std::strcmp(a, "--batch")) {
            opt.cpu_batch = parse_int(a, value(a));
            if (opt.cpu_batch < 1) bad_arg(a, argv[i]);
        } else if (!std::strcmp(a, "--heads")) {
            opt.cpu_heads = parse_int(a, value(a));
            if (opt.cpu_heads < 1) bad_arg(a, argv[i]);
        } else if (!std::strcmp(a, "--naive-threads")) {
            opt.naive_threads = static_cast<int>(parse_int(a, value(a)));
        } else if (!std::strcmp(a, "--device")) {
            opt.device = static_cast<int>(parse_int(a, value(a)));
        } else if (!std::strcmp(a, "--budget-s")) {
            const char *v = value(a);
            char *end = nullptr;
            opt.budget_s = std::strtod(v, &end);
            if (*end != '\0' || !(opt.budget_s > 0)) bad_arg(a, v);
        } else if (!std::strcmp(a, "--max-decode-gb")) {
            const char *v = value(a);
            char *end = nullptr;
            opt.max_decode_gb = std::strtod(v, &end);
            if (*end != '\0' || !(opt.max_decode_gb > 0)) bad_arg(a, v);
        } else if (!std::strcmp(a, "--page-size")) {
            opt.page_size = parse_int(a, value(a));
            if (opt.page_size < 0) bad_arg(a, argv[i]);
        } else if (!std::strcmp(a, "--decode-head-dim")) {
            opt.decode_head_dim = parse_int(a, value(a));
            if (opt.decode_head_dim <= 0 || opt.decode_head_dim % 8 != 0) bad_arg(a, argv[i]);
        } else if (!std::strcmp(a, "--num-splits")) {
            opt.num_splits = parse_int(a, value(a));
            if (opt.num_splits < 0) bad_arg(a, argv[i]);
        } else if (!std::strcmp(a, "--append-rotary")) {
            opt.append_rotary = true;
        } else if (!std::strcmp(a, "--seqused-k")) {
            opt.seqused_k = true;
        } else if (!std::strcmp(a, "--decode-batch")) {
            opt.decode_batches = parse_list(a, value(a));
        } else if (!std::strcmp(a, "--decode-kv-heads")) {
            opt.decode_kv_heads = parse_list(a, value(a));
        } else if (!std::strcmp(a, "--decode-seqlen")) {
            opt.decode_seqlens = parse_list(a, value(a));
        } else if (!std::strcmp(a, "--markdown")) {
            opt.markdown = value(a);
        } else if (!std::strcmp(a, "--json")) {
            opt.json = value(a);
        } else {
            std::fprintf(stderr, "flashattn-bench: unknown argument '%s'\n\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (opt.deterministic && !opt.backward) bad_arg("--deterministic (goes with --backward)", "alone");
    if (opt.backend == "cpu") {
        if (opt.hdims.size() > 1) bad_arg("--hdim (CPU: one value)", "list");
        if (opt.hdims.size() == 1) opt.cpu_hdim = opt.hdims[0];
        if (opt.decode) bad_arg("--decode (GPU only)", "with --backend cpu");
        if (opt.backward_only) bad_arg("--backward-only (GPU only; use --backward)", "with --backend cpu");
        return bench::run_cpu(opt);
    }
    return bench::run_gpu(opt);
}
