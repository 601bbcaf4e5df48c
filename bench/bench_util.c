#include "bench.h"
#include "dsv4.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void *bench_alloc(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? (bytes + 63) / 64 * 64 : 64)) return NULL;
    return p;
}

void *bench_alloc_or_die(size_t bytes)
{
    void *p = bench_alloc(bytes);
    if (!p) {
        fprintf(stderr, "bench: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void bench_fill_random_f32(float *x, size_t n, uint64_t seed, float scale)
{
    for (size_t i = 0; i < n; i++) x[i] = scale * ((float)(splitmix(&seed) >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f);
}

/* Eight bytes a step: the benchmarks fill gigabytes of weight copies with it. */
void bench_fill_random_u8(uint8_t *x, size_t n, uint64_t seed)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const uint64_t z = splitmix(&seed);
        memcpy(x + i, &z, 8);
    }
    for (uint64_t z = splitmix(&seed); i < n; i++, z >>= 8) x[i] = (uint8_t)z;
}

int bench_opt_int(int argc, char **argv, const char *name, int dflt)
{
    for (int i = 0; i + 1 < argc; i++)
        if (!strcmp(argv[i], name)) return atoi(argv[i + 1]);
    return dflt;
}

int bench_opt_flag(int argc, char **argv, const char *name)
{
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], name)) return 1;
    return 0;
}

const char *bench_opt_str(int argc, char **argv, const char *name, const char *dflt)
{
    for (int i = 0; i + 1 < argc; i++)
        if (!strcmp(argv[i], name)) return argv[i + 1];
    return dflt;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double bench_device_copy_rate(dsv4_ctx *c)
{
    const size_t bytes = (size_t)1 << 30;
    void *a = NULL, *d = NULL;
    dsv4_device_timer *tm = NULL;
    if (dsv4_device_alloc(c, bytes, &a) || dsv4_device_alloc(c, bytes, &d) || dsv4_device_memset(c, a, 0x3C, bytes) ||
        dsv4_device_timer_create(c, &tm)) {
        fprintf(stderr, "bench: device copy: %s\n", dsv4_last_error());
        exit(1);
    }
    double best = 0;
    for (int r = 0; r < 6; r++) {
        double ms = 0;
        if (dsv4_device_timer_start(tm) || dsv4_device_copy(c, d, a, bytes) || dsv4_device_timer_stop(tm) ||
            dsv4_device_timer_elapsed_ms(tm, &ms)) {
            fprintf(stderr, "bench: device copy: %s\n", dsv4_last_error());
            exit(1);
        }
        const double gbs = 2.0 * (double)bytes / (ms * 1e-3) * 1e-9;
        if (r && gbs > best) best = gbs;
    }
    dsv4_device_timer_destroy(tm);
    dsv4_device_free(c, a);
    dsv4_device_free(c, d);
    return best;
}

void *bench_device_alloc(dsv4_ctx *c, size_t bytes)
{
    void *p = NULL;
    if (dsv4_device_alloc(c, bytes ? bytes : 1, &p)) {
        fprintf(stderr, "bench: device_alloc of %zu bytes: %s\n", bytes, dsv4_last_error());
        exit(1);
    }
    return p;
}

int bench_time_pass(bench_call_fn call, void *arg, int copies, bench_rate *r)
{
    int st = call(arg, copies - 1); /* warm: code, thread pool, work space; the last copy, not the first timed */
    if (st) return st;
    double best = 1e30;
    const double start = bench_now();
    double t0 = start;
    for (int c = 0; c < copies; c++) {
        st = call(arg, c);
        const double t1 = bench_now();
        if (st) return st;
        if (t1 - t0 < best) best = t1 - t0;
        t0 = t1;
    }
    const double sustained = (t0 - start) / copies;
    if (best < r->best) r->best = best;
    if (sustained < r->sustained) r->sustained = sustained;
    return 0;
}

dsv4_tensor bench_device_view(void *p, dsv4_dtype dt, int nd, const int64_t *shape)
{
    dsv4_tensor t;
    dsv4_tensor_init(&t, p, dt, nd, shape);
    t.device = DSV4_DEVICE_CUDA;
    return t;
}

bench_blas_lib bench_blas;

void bench_blas_open(void)
{
    static int tried;
    if (tried++) return; /* once per process */
    static const char *const blas_names[] = {"libopenblas.so.0", "libopenblas.so", "libcblas.so.3", "libblas.so.3"};
    for (size_t i = 0; i < sizeof blas_names / sizeof blas_names[0]; i++) {
        void *h = dlopen(blas_names[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) continue;
        *(void **)&bench_blas.sgemv = dlsym(h, "cblas_sgemv");
        *(void **)&bench_blas.sgemm = dlsym(h, "cblas_sgemm");
        if (!bench_blas.sgemv || !bench_blas.sgemm) {
            bench_blas.sgemv = NULL;
            dlclose(h);
            continue;
        }
        *(void **)&bench_blas.set_threads = dlsym(h, "openblas_set_num_threads");
        *(void **)&bench_blas.get_config = dlsym(h, "openblas_get_config");
        bench_blas.file = blas_names[i];
        return;
    }
}
