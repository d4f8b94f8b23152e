// flashattn-bench: options and helpers shared by the CPU and GPU benchmarks.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "flashattn/flashattn.h"

namespace bench {

struct Options {
    // Which benchmark: "cpu", "fa1", "fa2", "fa3" or "all-gpu".
    std::string backend = "cpu";
    // Restrictions of the grid; empty = the default list of the benchmark.
    std::vector<int64_t> hdims;
    std::vector<int64_t> seqlens;
    std::vector<int> causal;                    // subset of {0, 1}
    std::vector<flashattn_dtype_t> dtypes;      // GPU: bf16 and/or fp16 (default bf16)
    bool decode = false;        // --decode: decode table only (GPU)
    bool no_decode = false;     // --no-decode: leave the decode table out of the default GPU run
    bool no_standard = false;   // --no-standard: leave the unfused baseline out (GPU)
    bool no_lse = false;        // --no-lse: pass lse = NULL to execute
    bool host_cost = false;     // --host-cost: only the host enqueue time per execute (GPU)
    bool backward = false;      // --backward: also the backward and forward+backward table
    bool backward_only = false; // --backward-only: the backward table alone (GPU: no forward grid, no decode)
    bool deterministic = false; // --deterministic: also time the backward with FLASHATTN_I64_DETERMINISTIC = 1
    int warmup = -1;            // -1: default of the benchmark (CPU 1, GPU 3)
    int reps = -1;              // -1: default of the benchmark (CPU 5, GPU 10)
    // CPU benchmark shape.
    int64_t cpu_batch = 1;
    int64_t cpu_heads = 4;
    int64_t cpu_hdim = 64;
    int naive_threads = 0;      // 0: std::thread::hardware_concurrency()
    // GPU run limits.
    int device = 0;
    double budget_s = 230.0;    // wall-clock budget of the whole GPU run; later cells are skipped
    double max_decode_gb = 40.0;
    // Decode table: paged K/V caches of this many keys per page (0: contiguous), and restrictions
    // of its grid (empty: the default batches, kv heads and key counts).
    int64_t page_size = 0;
    int64_t decode_head_dim = 128;  // --decode-head-dim: the decode table's head dim
    std::vector<int64_t> decode_batches, decode_kv_heads, decode_seqlens;
    int64_t num_splits = 0;      // --num-splits: FLASHATTN_I64_NUM_SPLITS of every decode plan (0: auto)
    bool append_rotary = false;  // --append-rotary: each decode step also appends its K/V row with rotary
    bool seqused_k = false;      // --seqused-k: decode steps pass seqused_k = seqlen_k (append's baseline)
    std::string markdown;       // also write the tables to this file
    std::string json;           // also write one record per measurement to this file (bench/README.md)
};

// One measurement of one method on one shape: a record of the --json file. The schema
// ("flashattn-bench-results/1") is documented in bench/README.md; bench/compare_torch.py writes the
// same. NaN numbers are written as null.
struct Record {
    std::string kind;         // "prefill", "decode", "cpu" or "copy" (the device's copy bandwidth);
                              // --backward: "backward", "fwd-bwd", "cpu-backward", "cpu-fwd-bwd"
    std::string backend;      // fa1, fa2, fa3, cpu, naive, standard, memcpy (compare_torch: torch-flash, ...)
    std::string dtype;        // bf16, fp16, fp32 ("" for copy)
    int64_t batch = 0, seqlen_q = 0, seqlen_k = 0, heads_q = 0, heads_kv = 0, head_dim = 0;
    bool causal = false;
    std::string status = "ok";  // ok, n/a, error, oom, bad (wrong result), skipped
    double ms = std::nan("");   // median time of one call
    double tflops = std::nan("");  // attention FLOPs / time (prefill, cpu)
    double gbps = std::nan("");    // bytes / time: K and V read (decode), read + written (copy)
    double bytes = std::nan("");   // the bytes behind gbps
    bool reduced = false;       // the first run took over 1 s: median of 3 after 1 warm-up
    std::string note;           // why a cell is not "ok"
    bool deterministic = false; // backward kinds: run with FLASHATTN_I64_DETERMINISTIC = 1
};


// Collects the lines of the tables so they can be written to --markdown as well.
class Report {
public:
    void line(const std::string &s) {
        std::fputs(s.c_str(), stdout);
        std::fputc('\n', stdout);
        std::fflush(stdout);
        text_ += s;
        text_ += '\n';
    }
    bool write(const std::string &path) const;
    const std::string &text() const { return text_; }

    // The --json side: run-wide facts (device, library, timing method) and one record per measurement.
    void meta(const std::string &key, const std::string &value) { meta_.emplace_back(key, value); }
    void record(const Record &r) { records_.push_back(r); }
    bool write_json(const std::string &path, const std::string &tool) const;

private:
    std::string text_;
    std::vector<std::pair<std::string, std::string>> meta_;
    std::vector<Record> records_;
};

std::string format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
double median(std::vector<double> v);
const char *dtype_name(flashattn_dtype_t dt);
// Last libflashattn error of this thread, with the status name.
std::string lib_error(flashattn_status_t st);
// Attention FLOPs as the FlashAttention papers count them: 4*b*h*sq*sk*d, halved when causal.
double attention_flops(int64_t b, int64_t h, int64_t sq, int64_t sk, int64_t d, bool causal);
// FLOPs of the backward pass and of forward + backward as FlashAttention counts them: 2.5x and
// 3.5x the forward's (the backward's five matrix products against the forward's two).
constexpr double kBackwardFlopsFactor = 2.5;
constexpr double kFwdBwdFlopsFactor = 3.5;

// The keys every benchmark's plan sets. create_shaped_plan creates a plan with them (not yet
// finalized); on a failure it destroys the plan, leaves *out NULL and returns the status.
struct PlanKeys {
    int64_t b, sq, sk, hq, hkv, d;
    flashattn_dtype_t dtype;
    bool causal;
    flashattn_backend_t backend;
};
flashattn_status_t create_shaped_plan(const PlanKeys &keys, flashattn_plan_t **out);

int run_cpu(const Options &opt);
int run_gpu(const Options &opt);  // only when built with CUDA; otherwise reports that and fails

}  // namespace bench
