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
 * `passes` passes (at most 8) alternating two prefetch variants, timed in 32 MiB bursts; the
 * variant with the best burst gives best and median (GB/s = 1e9 B/s). */
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
/* The same with 256-bit FMAs, `iters` steps of every chain (bench/peak_avx2.c). */
double bench_fma_peak_avx2(int threads, long iters);
/* Peak of the multiply-add the linear kernels run on, in GFLOP/s: vdpbf16ps (2 products per fp32
 * lane) with AVX-512 BF16, else the fp32 FMA peak. */
double bench_dot_peak(int threads);
/* Aligned allocation filled with a deterministic pseudo-random pattern (bench inputs only). */
void *bench_alloc(size_t bytes);
void *bench_alloc_or_die(size_t bytes); /* bench_alloc, or a message and exit(1) */
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
dsv4_tensor bench_device_view(void *p, dsv4_dtype dt, int nd, const int64_t *shape); /* a CUDA-resident view */
void *bench_device_alloc(struct dsv4_ctx *ctx, size_t bytes);
/* One row of a linear benchmark's table: a weight of `groups` groups of n x k in format fmt
 * (a dsv4_linear_format). */
typedef struct bench_linear_case {
    const char *name;
    int fmt;
    int64_t n, k, groups; /* n: outputs per group */
} bench_linear_case;
/* The CBLAS peer (row-major = 101, no transpose = 111, transpose = 112), opened when a benchmark
 * runs (dsv4 is not linked with it): bench_blas_open loads the first of libopenblas.so.0,
 * libopenblas.so, libcblas.so.3, libblas.so.3 that has cblas_sgemv and cblas_sgemm; sgemv stays
 * NULL when none does. */
typedef struct bench_blas_lib {
    void (*sgemv)(int order, int trans, int m, int n, float alpha, const float *a, int lda, const float *x, int incx,
                  float beta, float *y, int incy);
    void (*sgemm)(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                  const float *b, int ldb, float beta, float *c, int ldc);
    void (*set_threads)(int n);  /* OpenBLAS only */
    char *(*get_config)(void);   /* OpenBLAS only */
    const char *file;
} bench_blas_lib;
extern bench_blas_lib bench_blas;
void bench_blas_open(void);

/* Median of n doubles (sorts in place). */
double bench_median(double *v, int n);

/* ---- checkpoints (bench_run.c) ---- */
/* Write the synthetic checkpoint with V4-Flash layer shapes (3 blocks + MTP, file holes but the
 * routing) into dir; 1 on success. */
int bench_flash_like(const char *dir);
/* V4-Flash's first n_layers blocks (3: one SWA, one CSA, one HCA block) + MTP, written as file holes but the routing. */
int bench_flash_layers(const char *dir, int n_layers);
void bench_rm_tree(const char *dir); /* remove a temporary checkpoint folder */

/* ---- one timing method over distinct copies (bench_util.c) ----
 * `call(arg, c)` runs the measured product on copy c (0 = success). One pass: an untimed call on
 * the last copy, then every copy once, back to back, each call timed. best = the fastest call,
 * sustained = the pass's time / copies (both seconds per call); a pass only lowers what `r`
 * holds, so alternating passes of two callers over rounds give each its best of the rounds. */
typedef int (*bench_call_fn)(void *arg, int copy);
typedef struct bench_rate {
    double best, sustained;
} bench_rate;
#define BENCH_RATE_INIT {1e30, 1e30}
int bench_time_pass(bench_call_fn call, void *arg, int copies, bench_rate *r); /* 0, or the failing call's status */

/* ---- linear-layer weights at the V4-Flash shapes (linear_weights.c) ---- */
typedef struct bench_lshape {
    const char *name;
    int64_t n, k, groups;       /* n: outputs per group (groups > 1: dsv4_grouped_linear) */
    dsv4_linear_format ckpt;    /* the format of the checkpoint's weight of this shape */
} bench_lshape;
extern const bench_lshape bench_lshapes[]; /* every distinct linear shape of a V4-Flash block */
extern const int bench_nlshapes;
extern const bench_lshape bench_lshape_head; /* the LM head, vocabulary x D */
/* `copies` distinct copies of one weight + its scale in `fmt`, together >= min_total bytes. */
typedef struct bench_wset {
    dsv4_linear_format fmt;
    int64_t rows, k, wcols, srows, scols; /* rows = groups * n */
    size_t wbytes, sbytes;                /* one copy */
    int copies;
    uint8_t *w, *s;
} bench_wset;
/* Random codes (no NaN; BF16 finite around 1), scale bytes 118..124; exits when out of memory. */
void bench_wset_init(bench_wset *ws, const bench_lshape *c, dsv4_linear_format fmt, size_t min_total);
void bench_wset_view(const bench_wset *ws, int copy, dsv4_tensor *w, dsv4_tensor *s);
/* Copy 0 dequantized to F32 [rows, k], replicated `copies` times (NULL when out of memory). */
float *bench_wset_f32(dsv4_ctx *ctx, const bench_wset *ws, int copies);
void bench_wset_free(bench_wset *ws);
/* One dsv4 product on the copies of a bench_wset: x BF16 [m, k] (grouped: [m, groups, k]),
 * y BF16 [m, n] ([m, groups, n]); bench_lcall_run(call, c) is a bench_call_fn on copy c. */
typedef struct bench_lcall {
    dsv4_ctx *ctx;
    const bench_lshape *c;
    const bench_wset *ws;
    dsv4_tensor x, y;
    void *work;
    size_t wsb;
} bench_lcall;
void bench_lcall_init(bench_lcall *a, dsv4_ctx *ctx, const bench_lshape *c, const bench_wset *ws, int64_t m,
                      uint16_t *x, uint16_t *y, void *work, size_t wsb);
int bench_lcall_run(void *arg, int copy);

#endif
