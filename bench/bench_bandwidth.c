/* The read-bandwidth probe behind every roofline of `dsv4 bench`, and `dsv4 bench bandwidth`,
 * which checks it against the former probe and against what one M = 1 FP8 linear call streams.
 *
 * Method (BENCHMARKS.md, "Benchmark methods"): a buffer of max(the caller's size, 8x the
 * last-level cache found in /sys, 1 GiB), at most a quarter of the memory, aligned to 2 MiB and
 * offered to transparent huge pages; in one OpenMP region every thread first writes, then reads
 * its own contiguous part with the widest vector loads of the machine (bandwidth_avx512.c,
 * bandwidth_avx2.c, or 8-byte loads here), eight independent chains. Passes alternate between two
 * variants — the hardware prefetchers alone, and a software prefetch of every line 8 KiB ahead
 * into L2 — and each pass is timed between two barriers by the first thread. The result is the
 * variant with the best pass: its best and its median. */
#define _DEFAULT_SOURCE /* madvise, MADV_HUGEPAGE */
#include "bench.h"
#include "dsv4.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

enum { PREFETCH_FAR = 8192, MAX_PASSES = 8 };

/* ---- the last-level cache -------------------------------------------------------------------- */
static size_t read_size_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    unsigned long long v = 0;
    char unit = 0;
    int n = fscanf(f, "%llu%c", &v, &unit);
    fclose(f);
    if (n < 1) return 0;
    return (size_t)v * (unit == 'K' ? 1024u : unit == 'M' ? 1024u * 1024u : 1u);
}

/* Every distinct instance of the highest cache level over the configured CPUs, added up. */
size_t bench_llc_bytes(void)
{
    enum { MAXI = 256 };
    long ncpu = sysconf(_SC_NPROCESSORS_CONF);
    int level_max = 0;
    size_t total = 0;
    char seen[MAXI][64];
    int nseen = 0;
    for (int idx = 0; idx < 8; idx++) {
        char path[128];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", idx);
        int lv = (int)read_size_file(path);
        if (lv > level_max) level_max = lv;
    }
    for (long cpu = 0; cpu < ncpu && level_max > 0; cpu++)
        for (int idx = 0; idx < 8; idx++) {
            char path[128], list[64] = "";
            snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%ld/cache/index%d/level", cpu, idx);
            if ((int)read_size_file(path) != level_max) continue;
            snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%ld/cache/index%d/shared_cpu_list", cpu, idx);
            FILE *f = fopen(path, "r");
            if (!f || !fgets(list, sizeof list, f)) list[0] = 0;
            if (f) fclose(f);
            int dup = 0;
            for (int i = 0; i < nseen && !dup; i++) dup = !strcmp(seen[i], list);
            if (dup || nseen == MAXI) continue;
            snprintf(seen[nseen++], sizeof seen[0], "%s", list);
            snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%ld/cache/index%d/size", cpu, idx);
            total += read_size_file(path);
        }
    if (!total) {
        long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE), l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
        total = l3 > 0 ? (size_t)l3 : l2 > 0 ? (size_t)l2 : 0;
    }
    return total;
}

/* ---- one pass ------------------------------------------------------------------------------- */
static uint64_t read_pass_scalar(const void *p, size_t bytes, size_t far)
{
    const uint64_t *v = p;
    const char *c = p;
    uint64_t a[8] = {0};
    size_t n = bytes / 64, i;
    for (i = 0; i < n; i++) {
        if (far) __builtin_prefetch(c + i * 64 + far, 0, 2);
        for (int j = 0; j < 8; j++) a[j] ^= v[i * 8 + j];
    }
    uint64_t r = a[0] ^ a[1] ^ a[2] ^ a[3] ^ a[4] ^ a[5] ^ a[6] ^ a[7];
    for (i *= 64; i < bytes; i++) r ^= (uint64_t)(unsigned char)c[i];
    return r;
}

typedef uint64_t (*pass_fn)(const void *, size_t, size_t);

static pass_fn pick_pass(const char **name)
{
    const char *isa = dsv4_cpu_isa();
    if (!strncmp(isa, "avx512", 6)) {
        *name = "avx512 (64-byte loads)";
        return bench_read_pass_avx512;
    }
    if (!strcmp(isa, "avx2")) {
        *name = "avx2 (32-byte loads)";
        return bench_read_pass_avx2;
    }
    *name = "scalar (8-byte loads)";
    return read_pass_scalar;
}

/* ---- the probe ------------------------------------------------------------------------------- */
bench_bw bench_read_bw(size_t min_bytes, int threads, int passes)
{
    bench_bw r;
    memset(&r, 0, sizeof r);
    if (threads < 1) threads = 1;
    if (passes < 2) passes = 2;
    if (passes > MAX_PASSES) passes = MAX_PASSES;
    passes &= ~1; /* the two variants take turns, pass by pass */
    r.llc = bench_llc_bytes();
    size_t bytes = min_bytes, floor_bytes = (size_t)1 << 30;
    if (bytes < 8 * r.llc) bytes = 8 * r.llc;
    if (bytes < floor_bytes) bytes = floor_bytes;
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages > 0 && psz > 0 && bytes > (size_t)pages * (size_t)psz / 4) bytes = (size_t)pages * (size_t)psz / 4;
    /* bursts of 32 MiB (at least 4 MiB a thread): a big weight matrix, the grain of the calls compared */
    size_t burst = (size_t)4 << 20;
    if (burst * (size_t)threads < ((size_t)32 << 20)) burst = ((size_t)32 << 20) / (size_t)threads;
    const int nb = (int)((bytes + burst * (size_t)threads - 1) / (burst * (size_t)threads));
    bytes = burst * (size_t)threads * (size_t)nb;
    void *buf = NULL;
    double *t = malloc(sizeof *t * (size_t)(passes * nb)), *g = malloc(sizeof *g * (size_t)(passes * nb));
    if (!t || !g || posix_memalign(&buf, (size_t)2 << 20, bytes)) {
        free(t);
        free(g);
        return r;
    }
    madvise(buf, bytes, MADV_HUGEPAGE); /* advice only: 4 KiB pages when refused */
    pass_fn pass = pick_pass(&r.isa);
    int used = threads;
    uint64_t sink = 0;
#pragma omp parallel num_threads(threads) reduction(^ : sink)
    {
        const int id = omp_get_thread_num(), nt = omp_get_num_threads();
        const size_t per = burst * (size_t)threads * (size_t)nb / (size_t)nt / 64 * 64, bt = per / (size_t)nb / 64 * 64;
        char *mine = (char *)buf + per * (size_t)id;
        if (id == 0) used = nt;
        memset(mine, 0x5A ^ id, per); /* first touch by the thread that reads it */
        double t0 = 0.0;
        for (int p = 0; p < passes; p++)
            for (int b = 0; b < nb; b++) {
#pragma omp barrier
                if (id == 0) t0 = bench_now();
                sink ^= pass(mine + bt * (size_t)b, bt, p & 1 ? (size_t)PREFETCH_FAR : 0);
#pragma omp barrier
                if (id == 0) t[p * nb + b] = bench_now() - t0;
            }
    }
    volatile uint64_t keep = sink;
    (void)keep;
    free(buf);
    const size_t bt = bytes / (size_t)used / 64 * 64 / (size_t)nb / 64 * 64;
    r.burst = bt * (size_t)used;
    double best[2] = {0.0, 0.0};
    int n[2] = {0, 0};
    for (int p = 0; p < passes; p++)
        for (int b = 0; b < nb; b++) {
            const int v = p & 1;
            const double x = (double)r.burst / t[p * nb + b] * 1e-9;
            g[v * (passes / 2) * nb + n[v]++] = x;
            if (x > best[v]) best[v] = x;
        }
    const int v = best[1] > best[0];
    r.best = best[v];
    r.median = bench_median(g + v * (passes / 2) * nb, n[v]);
    r.far = v ? PREFETCH_FAR : 0;
    r.threads = used;
    r.passes = passes;
    r.bursts = n[v];
    r.bytes = bytes;
    free(t);
    free(g);
    return r;
}

void bench_bw_print(const bench_bw *b)
{
    printf("  [read-bandwidth probe: %d thread(s), %s, %zu MiB buffer (%.0fx the %zu MiB last-level cache), "
           "%s; best %.1f GB/s, median %.1f GB/s of %d bursts of %zu MiB; the best is used]\n",
           b->threads, b->isa ? b->isa : "?", b->bytes >> 20, b->llc ? (double)b->bytes / (double)b->llc : 0.0,
           b->llc >> 20, b->far ? "software prefetch 8 KiB ahead" : "hardware prefetch only", b->best, b->median,
           b->bursts, b->burst >> 20);
}

double bench_read_bandwidth(size_t bytes, int threads, int reps)
{
    bench_bw b = bench_read_bw(bytes, threads, reps);
    bench_bw_print(&b);
    return b.best;
}

/* ---- dsv4 bench bandwidth ---------------------------------------------------------------------- */
/* The former probe: one OpenMP loop of 8-byte XORs over a fresh buffer, best of `reps`. */
static double former_probe(size_t bytes, int threads, int reps)
{
    size_t n = bytes / sizeof(uint64_t);
    uint64_t *a = bench_alloc(n * sizeof(uint64_t));
    if (!a) return 0.0;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (size_t i = 0; i < n; i++) a[i] = i * 2654435761u;
    double best = 0.0;
    volatile uint64_t sink = 0;
    for (int r = 0; r < reps; r++) {
        uint64_t acc = 0;
        double t0 = bench_now();
#pragma omp parallel for num_threads(threads) schedule(static) reduction(^ : acc)
        for (size_t i = 0; i < n; i++) acc ^= a[i];
        double dt = bench_now() - t0;
        sink ^= acc;
        double gbs = (double)(n * sizeof(uint64_t)) / dt * 1e-9;
        if (gbs > best) best = gbs;
    }
    (void)sink;
    free(a);
    return best;
}

/* dsv4_linear, FP8 128x128 blocks, M = 1, on copies of a 4096 x 8192 weight (wo_b) adding up to
 * at least `total` bytes, each call on the next copy: best and median effective GB/s. */
static int linear_rate(int threads, size_t total, int calls, double *best, double *median)
{
    const int64_t n = 4096, k = 8192;
    const size_t wb = (size_t)(n * k), sb = (size_t)((n / 128) * (k / 128));
    int copies = (int)((total + wb - 1) / wb);
    if (copies < 2) copies = 2;
    dsv4_ctx *ctx = NULL;
    const dsv4_ctx_options o = {.backend = "cpu", .threads = threads};
    uint8_t *w = bench_alloc(wb * (size_t)copies), *s = bench_alloc(sb * (size_t)copies);
    uint16_t *x = bench_alloc((size_t)k * 2), *y = bench_alloc((size_t)n * 2);
    size_t wsb = 0;
    void *work = NULL;
    int ok = w && s && x && y && dsv4_ctx_create(&o, &ctx) == DSV4_OK &&
             dsv4_linear_workspace_size(ctx, DSV4_LINEAR_FP8_B128, 1, k, &wsb) == DSV4_OK && (work = bench_alloc(wsb + 1));
    if (ok) {
        memset(w, 0x38, wb * (size_t)copies); /* E4M3 1.0 everywhere: the speed does not depend on the values */
        memset(s, 127, sb * (size_t)copies);  /* E8M0 2^0 */
        for (int64_t i = 0; i < k; i++) x[i] = 0x3F80;
        double g[256];
        if (calls > 256) calls = 256;
        const int64_t ws[2] = {n, k}, ss[2] = {n / 128, k / 128}, xs[2] = {1, k}, ys[2] = {1, n};
        dsv4_tensor tx, ty, tw, ts;
        dsv4_tensor_init(&tx, x, DSV4_BF16, 2, xs);
        dsv4_tensor_init(&ty, y, DSV4_BF16, 2, ys);
        *best = 0.0;
        for (int c = -1; c < calls && ok; c++) {
            int cp = (c + copies) % copies;
            dsv4_tensor_init(&tw, w + wb * (size_t)cp, DSV4_F8_E4M3, 2, ws);
            dsv4_tensor_init(&ts, s + sb * (size_t)cp, DSV4_E8M0, 2, ss);
            double t0 = bench_now();
            ok = dsv4_linear(ctx, DSV4_LINEAR_FP8_B128, &tx, &tw, &ts, NULL, &ty, work, wsb) == DSV4_OK;
            double v = (double)(wb + sb) / (bench_now() - t0) * 1e-9;
            if (c < 0) continue;
            g[c] = v;
            if (v > *best) *best = v;
        }
        *median = bench_median(g, calls);
    }
    if (!ok) fprintf(stderr, "bench bandwidth: linear: %s\n", dsv4_last_error());
    dsv4_ctx_destroy(ctx);
    free(w);
    free(s);
    free(x);
    free(y);
    free(work);
    return ok;
}

int dsv4_bench_bandwidth(int argc, char **argv)
{
    const int threads = bench_opt_int(argc, argv, "--threads", dsv4_default_threads());
    const int passes = bench_opt_int(argc, argv, "--passes", 4);
    printf("dsv4 bench bandwidth — %d thread(s), cpu isa %s, last-level cache %zu MiB\n", threads, dsv4_cpu_isa(),
           bench_llc_bytes() >> 20);
    bench_bw all = bench_read_bw(0, threads, passes);
    bench_bw_print(&all);
    bench_bw one = all;
    if (threads > 1) {
        one = bench_read_bw(0, 1, passes);
        bench_bw_print(&one);
    }
    const double old_small = former_probe((size_t)512 << 20, threads, 3);
    const double old_big = former_probe(all.bytes, threads, 3);
    double lbest = 0.0, lmed = 0.0;
    if (!linear_rate(threads, all.bytes, 64, &lbest, &lmed)) return 1;
    printf("\n%-66s %9s %9s %8s\n", "reader", "best GB/s", "median", "vs probe");
    printf("%-66s %9.1f %9.1f %7.2fx\n", "probe, all threads", all.best, all.median, 1.0);
    if (threads > 1) printf("%-66s %9.1f %9.1f %7.2fx\n", "probe, 1 thread", one.best, one.median, one.best / all.best);
    printf("%-66s %9.1f %9s %7.2fx\n", "former probe (OpenMP loop of 8-byte XORs, 512 MiB, best of 3)", old_small, "-",
           old_small / all.best);
    printf("%-66s %9.1f %9s %7.2fx\n", "former probe on the probe's buffer size, best of 3", old_big, "-",
           old_big / all.best);
    char what[96];
    snprintf(what, sizeof what, "dsv4_linear FP8 M=1 4096x8192, 1 call per 32 MiB copy (%zu MiB)",
             (all.bytes + ((size_t)32 << 20) - 1) / ((size_t)32 << 20) * 32);
    printf("%-66s %9.1f %9.1f %7.2fx\n", what, lbest, lmed, lbest / all.best);
    printf("\n(vs probe = best / the probe's best; the probe is the roofline of the other benches, so every other\n"
           "reader should stay at or below 1.00x)\n");
    return 0;
}
