/* Benchmarks behind `dsv4 bench NAME`. Each prints ratios taken in one run: against this
 * machine's measured roofline (read bandwidth, FMA peak) and against a baseline timed in the same run. */
#ifndef DSV4_BENCH_H
#define DSV4_BENCH_H

#include "cli/cli.h"

#include <stddef.h>
#include <stdint.h>

typedef struct dsv4_bench_entry {
    const char *name;
    const char *help;
    const char *opts; /* the options it takes, by name, from bench_options (bench_registry.c) */
    int (*run)(int argc, char **argv); /* argv: its options as "--name [value]" pairs, already checked */
} dsv4_bench_entry;

extern const dsv4_bench_entry dsv4_benches[]; /* bench_registry.c; ends with a NULL name */
/* Every option a benchmark may take (name, kind, help), in the form of src/cli/cli.h's tables
 * with dst unset; bench_registry.c. */
extern const cli_opt bench_options[];

/* ---- utilities (bench_util.c) ---- */
double bench_now(void); /* seconds, monotonic */
/* Memory read bandwidth (bench_bandwidth.c): `threads` threads each read their own contiguous part
 * of a buffer of max(min_bytes, 8x the last-level cache, 1 GiB) with the widest vector loads, in
 * `passes` passes of each of two prefetch variants; the variant with the best pass gives best and
 * median (GB/s = 1e9 B/s). */
typedef struct bench_bw {
    double best, median;
    int threads, passes, bursts; /* passes over the buffer; timed bursts of the variant used */
    size_t bytes, burst, llc;    /* buffer, one burst (all threads); last-level cache (0: unknown) */
    const char *isa;   /* the loads used */
    size_t far;        /* 0: hardware prefetch only; else the software prefetch distance */
} bench_bw;
bench_bw bench_read_bw(size_t min_bytes, int threads, int passes);
void bench_bw_print(const bench_bw *b); /* one line: method and result */
/* bench_read_bw + bench_bw_print; returns the best. */
double bench_read_bandwidth(size_t min_bytes, int threads, int passes);
size_t bench_llc_bytes(void);
/* One pass of the probe over `bytes` (prefetching `far` bytes ahead when far > 0); ISA units. */
uint64_t bench_read_pass_avx512(const void *p, size_t bytes, size_t far);
uint64_t bench_read_pass_avx2(const void *p, size_t bytes, size_t far);
/* Peak fp32 FMA rate in GFLOP/s (2 FLOP per lane-FMA) with `threads` threads, best ISA. */
double bench_fma_peak(int threads);
/* Peak of the multiply-add the linear kernels run on, in GFLOP/s: vdpbf16ps (2 products per fp32
 * lane) with AVX-512 BF16, else the fp32 FMA peak. */
double bench_dot_peak(int threads);
/* Aligned allocation filled with a deterministic pseudo-random pattern (bench inputs only). */
void *bench_alloc(size_t bytes);
void bench_fill_random_f32(float *x, size_t n, uint64_t seed, float scale);
void bench_fill_random_u8(uint8_t *x, size_t n, uint64_t seed);
/* `--threads N` and `--quick` lookup in the checked argv a benchmark receives. */
int bench_opt_int(int argc, char **argv, const char *name, int dflt);
int bench_opt_flag(int argc, char **argv, const char *name);
const char *bench_opt_str(int argc, char **argv, const char *name, const char *dflt);
/* The device copy rate of an accelerator context in GB/s, read + write bytes counted: the best of
 * 5 timed device-to-device copies of 1 GiB after one untimed (bench_util.c). Exits on failure. */
struct dsv4_ctx;
double bench_device_copy_rate(struct dsv4_ctx *ctx);
/* `bytes` (0 counts as 1) of the context's device memory; exits with the error on failure. */
void *bench_device_alloc(struct dsv4_ctx *ctx, size_t bytes);
/* One row of a linear benchmark's table: a weight of `groups` groups of n x k in format fmt
 * (a dsv4_linear_format). */
typedef struct bench_linear_case {
    const char *name;
    int fmt;
    int64_t n, k, groups; /* n: outputs per group */
} bench_linear_case;
/* Median of n doubles (sorts in place). */
double bench_median(double *v, int n);

/* ---- checkpoints (bench_run.c) ---- */
/* Write the synthetic checkpoint with V4-Flash layer shapes (3 blocks + MTP, file holes but the
 * routing) into dir; 1 on success. */
int bench_flash_like(const char *dir);
void bench_rm_tree(const char *dir); /* remove a temporary checkpoint folder */

#endif
