/* Benchmarks behind `dsv4 bench NAME`. Each prints ratios taken in one run: against this
 * machine's measured roofline (read bandwidth, FMA peak) and against a baseline timed in the same run. */
#ifndef DSV4_BENCH_H
#define DSV4_BENCH_H

#include <stddef.h>
#include <stdint.h>

typedef struct dsv4_bench_entry {
    const char *name;
    const char *help;
    int (*run)(int argc, char **argv); /* argv: options after the name */
} dsv4_bench_entry;

extern const dsv4_bench_entry dsv4_benches[]; /* bench_registry.c; ends with a NULL name */

/* ---- utilities (bench_util.c) ---- */
double bench_now(void); /* seconds, monotonic */
/* Memory read bandwidth in GB/s (1e9 B/s), best of `reps` passes over `bytes` of fresh memory,
 * with `threads` threads. */
double bench_read_bandwidth(size_t bytes, int threads, int reps);
/* Peak fp32 FMA rate in GFLOP/s (2 FLOP per lane-FMA) with `threads` threads, best ISA. */
double bench_fma_peak(int threads);
/* Aligned allocation filled with a deterministic pseudo-random pattern (bench inputs only). */
void *bench_alloc(size_t bytes);
void bench_fill_random_f32(float *x, size_t n, uint64_t seed, float scale);
void bench_fill_random_u8(uint8_t *x, size_t n, uint64_t seed);
/* `--threads N` and `--quick` style option lookup in argv. */
int bench_opt_int(int argc, char **argv, const char *name, int dflt);
int bench_opt_flag(int argc, char **argv, const char *name);
const char *bench_opt_str(int argc, char **argv, const char *name, const char *dflt);
/* Median of n doubles (sorts in place). */
double bench_median(double *v, int n);

#endif
