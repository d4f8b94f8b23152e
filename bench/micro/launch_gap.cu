// Micro-benchmark (not built by CMake; stop 45): does a small follow-up kernel's shared-memory
// carveout, or a programmatic dependent launch, change the event-timed span of a pair (a 100 KB
// shared-memory streaming kernel of 256 CTAs reading 512 MB, then a 64-CTA kernel without shared
// memory)? The shape of the b 8 / 16k decode step: attention kernel, then split-KV combine.
//   nvcc -O2 -arch=sm_90 -o /tmp/launch_gap bench/micro/launch_gap.cu && /tmp/launch_gap
// Prints each variant's median per round (rounds rotate the variants' order).
#include <cuda_runtime.h>
#include <cstdio>
#include <vector>
#include <algorithm>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e_)); return 1; } } while (0)

__global__ void __launch_bounds__(128) big(const uint4 *src, size_t per_cta, float *sink) {
    extern __shared__ float sm[];
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    const uint4 *p = src + blockIdx.x * per_cta;
    unsigned acc = 0;
    for (size_t i = threadIdx.x; i < per_cta; i += 128 * 4) {
        uint4 a = p[i], b = i + 128 < per_cta ? p[i + 128] : a, c = i + 256 < per_cta ? p[i + 256] : a,
              d = i + 384 < per_cta ? p[i + 384] : a;
        acc ^= a.x ^ b.y ^ c.z ^ d.w;
    }
    sm[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x == 0) sink[blockIdx.x] = sm[5] + sm[77];
}

__global__ void __launch_bounds__(128) small(const float *in, float *out, int n) {
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    int i = blockIdx.x * 128 + threadIdx.x;
    if (i < n) out[i] = in[i % 256] * 2.f + 1.f;
}

static cudaError_t launch(bool pdl, void (*k)(const float *, float *, int), dim3 g, dim3 b, cudaStream_t s,
                          const float *in, float *out, int n) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = g; cfg.blockDim = b; cfg.stream = s;
    cudaLaunchAttribute a[1];
    a[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    a[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = a; cfg.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, k, in, out, n);
}

int main() {
    const size_t bytes = 512ull << 20;  // 512 MB, like b 8 / 16k / 8 heads / d 128 K+V
    const int ctas = 256, smem = 100 * 1024;
    uint4 *src; float *sink, *sin, *sout;
    CK(cudaMalloc(&src, bytes * 2));  // two sets, alternated (no L2 reuse)
    CK(cudaMemset(src, 1, bytes * 2));
    CK(cudaMalloc(&sink, 4096)); CK(cudaMalloc(&sin, 4096)); CK(cudaMalloc(&sout, 1 << 20));
    CK(cudaFuncSetAttribute(big, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const size_t per = bytes / 16 / ctas;
    const int reps = 40;
    std::vector<cudaEvent_t> e0(reps), e1(reps);
    for (int i = 0; i < reps; ++i) { CK(cudaEventCreate(&e0[i])); CK(cudaEventCreate(&e1[i])); }
    struct V { const char *name; int mode; bool pdl; int carve; };
    // mode 0: big + small, 1: big only, 2: small only
    V vs[] = {{"big+small default", 0, false, -1}, {"big+small pdl default", 0, true, -1},
              {"big+small carve100", 0, false, 100}, {"big+small pdl carve100", 0, true, 100},
              {"big+small pdl carve0", 0, true, 0}, {"big only", 1, false, -1}, {"small only", 2, false, -1}};
    const int nv = sizeof(vs) / sizeof(vs[0]);
    std::vector<std::vector<float>> med(nv);
    for (int round = 0; round < 6; ++round) {
        for (int vi0 = 0; vi0 < nv; ++vi0) {
            const int vi = (vi0 + round) % nv;
            const V &v = vs[vi];
            CK(cudaFuncSetAttribute(small, cudaFuncAttributePreferredSharedMemoryCarveout, v.carve));
            for (int w = 0; w < 3; ++w) {
                big<<<ctas, 128, smem, s>>>(src, per, sink);
                CK(launch(v.pdl, small, dim3(64), dim3(128), s, sin, sout, 8192));
            }
            CK(cudaStreamSynchronize(s));
            for (int i = 0; i < reps; ++i) {
                CK(cudaEventRecord(e0[i], s));
                const uint4 *set = src + (i & 1) * (bytes / 16);
                if (v.mode != 2) big<<<ctas, 128, smem, s>>>(set, per, sink);
                if (v.mode != 1) CK(launch(v.pdl, small, dim3(64), dim3(128), s, sin, sout, 8192));
                CK(cudaEventRecord(e1[i], s));
            }
            CK(cudaStreamSynchronize(s));
            std::vector<float> t(reps);
            for (int i = 0; i < reps; ++i) CK(cudaEventElapsedTime(&t[i], e0[i], e1[i]));
            std::sort(t.begin(), t.end());
            med[vi].push_back(t[reps / 2] * 1000.f);
        }
    }
    printf("%-26s %s\n", "variant", "median us per round");
    for (int vi = 0; vi < nv; ++vi) {
        printf("%-26s", vs[vi].name);
        for (float m : med[vi]) printf(" %7.2f", m);
        std::vector<float> m = med[vi];
        std::sort(m.begin(), m.end());
        printf("   med %7.2f\n", m[m.size() / 2]);
    }
    return 0;
}
