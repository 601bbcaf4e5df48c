/* Phase profile of the warp-specialized decode kernels (not part of the library or the test
 * suite; `STEPS=profile make test-gpu` builds and runs it): includes decode_cuda.cu built with
 * -DDSV4_WS_PROFILE, times each kernel the launcher can pick (dsv4_cu_decode.kernel = ws2, ws1, v1) on
 * MODEL1-like shapes (random FP8 entries over a 613 MB pool, one query per row of indices), then
 * runs one more launch and prints clock64 cycles per 64-entry block and warp, by role and phase:
 *   prod  [wait for a free tile, dequantize + store (includes waiting for the loaded data), the
 *          rest (issuing loads, index reads, fences, arrivals); H 128 clusters: + the producers'
 *          barrier before the copy to the peer, the copy's issue and the arrivals]
 *   ws2: wg0 = lead [wait for a full tile, Q K^T (+ the previous P V's tail), softmax, wait for a
 *          free P tile, rescale + issue P V, final wait], wg1 = follower [wait for P, P V, release]
 *   ws1: wg0, wg1 [wait for a full tile, Q K^T, softmax (with the exchange of maxima), P V]
 *   v1 is not instrumented (zeros). */
#include "backends/cuda/decode_cuda.cu"
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); exit(1); } } while (0)

__global__ void fill_pages(uint8_t *pool, long long nent, long long pb, unsigned seed)
{
    long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (e >= nent) return;
    long long page = e / 64, row = e % 64;
    uint8_t *base = pool + page * pb, *d = base + dsv4_kve_row_data(row), *sc = base + dsv4_kve_row_scale(64, row);
    unsigned x = (unsigned)(e * 2654435761ull) ^ seed;
    for (int k = 0; k < DSV4_KVE_NOPE_DIM; k++) {
        x = x * 1664525u + 1013904223u;
        uint8_t c = x >> 24;
        if ((c & 0x7F) == 0x7F) c ^= 1;
        d[k] = c;
    }
    for (int k = 0; k < DSV4_KVE_ROPE_DIM; k++) {
        x = x * 1664525u + 1013904223u;
        uint16_t b = (uint16_t)(((x >> 31) << 15) | (0x3E00 + ((x >> 16) & 0x1FF)));
        memcpy(d + DSV4_KVE_NOPE_BYTES + 2 * k, &b, 2);
    }
    for (int k = 0; k < DSV4_KVE_GROUPS; k++) {
        x = x * 1664525u + 1013904223u;
        sc[k] = 117 + (x >> 24) % 7;
    }
    sc[DSV4_KVE_GROUPS] = 0;
}

int main(int argc, char **argv)
{
    const long long npages = 16384, pb = 64 * DSV4_KVE_ENTRY_BYTES, nent = npages * 64;
    uint8_t *pool;
    CK(cudaMalloc(&pool, npages * pb));
    fill_pages<<<(unsigned)((nent + 255) / 256), 256>>>(pool, nent, pb, 1234);
    CK(cudaDeviceSynchronize());
    const int TMAX = 512, HMAX = 128, KMAX = 1024;
    std::vector<uint16_t> hq((size_t)TMAX * HMAX * 512);
    unsigned x = 7;
    for (auto &v : hq) { x = x * 1664525u + 1013904223u; v = (uint16_t)(((x >> 31) << 15) | (0x3E00 + ((x >> 16) & 0x1FF))); }
    std::vector<int32_t> i0((size_t)TMAX * 128), i1((size_t)TMAX * KMAX);
    for (auto &v : i0) { x = x * 1664525u + 1013904223u; v = (int32_t)(((unsigned long long)x * nent) >> 32); }
    for (auto &v : i1) { x = x * 1664525u + 1013904223u; v = (int32_t)(((unsigned long long)x * nent) >> 32); }
    std::vector<float> hs(HMAX, 0.5f);
    uint16_t *q, *out; float *lse, *sink; int32_t *d0, *d1;
    CK(cudaMalloc(&q, hq.size() * 2)); CK(cudaMalloc(&out, hq.size() * 2)); CK(cudaMalloc(&lse, TMAX * HMAX * 4));
    CK(cudaMalloc(&sink, HMAX * 4)); CK(cudaMalloc(&d0, i0.size() * 4)); CK(cudaMalloc(&d1, i1.size() * 4));
    CK(cudaMemcpy(q, hq.data(), hq.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(sink, hs.data(), HMAX * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d0, i0.data(), i0.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d1, i1.data(), i1.size() * 4, cudaMemcpyHostToDevice));
    struct { int t, h, k; } shapes[] = {{256, 64, 512}, {256, 128, 512}, {256, 64, 1024}, {128, 64, 512}};
    const char *kern[] = {"ws2", "ws1", "v1"};
    const int kern_id[] = {DSV4_CU_WS2, DSV4_CU_WS1, DSV4_CU_V1};
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    for (auto &sh : shapes) {
        dsv4_cu_decode d = {};
        d.q = q; d.q_st = sh.h * 512; d.q_sh = 512; d.t = sh.t; d.h = sh.h; d.sink = sink;
        d.scale_log2 = 0.044194173824159216f * 1.4426950408889634f;
        d.out = out; d.o_st = sh.h * 512; d.o_sh = 512; d.lse = lse; d.lse_st = sh.h; d.lse_sh = 1;
        d.scope[0].cache = {pool, pb, 64, nent}; d.scope[0].indices = d0; d.scope[0].ld = 128; d.scope[0].width = 128;
        d.scope[1].cache = {pool, pb, 64, nent}; d.scope[1].indices = d1; d.scope[1].ld = KMAX; d.scope[1].width = sh.k;
        d.n_scopes = 2; d.fp8 = 1; d.aligned = 1; d.wgmma = 1; d.splits = 1;
        const double flop = 2.0 * sh.t * sh.h * (128.0 + sh.k) * 1024;
        const int nblk = (128 + sh.k) / 64, ctas = sh.t * (sh.h / 64);
        for (int ki = 0; ki < 3; ki++) {
            const char *k = kern[ki];
            d.kernel = kern_id[ki];
            for (int i = 0; i < 3; i++) CK((cudaError_t)dsv4_cu_decode_launch(&d, 0));
            CK(cudaEventRecord(e0));
            for (int i = 0; i < 20; i++) CK((cudaError_t)dsv4_cu_decode_launch(&d, 0));
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
            double us = ms * 1e3 / 20;
            unsigned long long z[3][8] = {}, pr[3][8];
            CK(cudaMemcpyToSymbol(dsv4_ws_prof, z, sizeof z));
            CK((cudaError_t)dsv4_cu_decode_launch(&d, 0));
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpyFromSymbol(pr, dsv4_ws_prof, sizeof pr));
            printf("h%-3d T%-3d K%-4d %-3s %8.1f us %6.1f TFLOP/s | cycles per block and warp:", sh.h, sh.t, sh.k, k, us,
                   flop / us * 1e-6);
            const char *names[3] = {"prod", "wg0", "wg1"};
            for (int r = 0; r < 3; r++) {
                printf(" %s[", names[r]);
                for (int b = 0; b < 6; b++) printf(b ? " %.0f" : "%.0f", (double)pr[r][b] / (4.0 * ctas * nblk));
                printf("]");
            }
            printf("\n");
        }
    }
    return 0;
}
