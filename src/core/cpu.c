/* CPU facts: instruction sets (run-time detection) and the default thread count. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "core/backend.h"
#include "core/error.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int has_avx2, has_avx512, has_bf16, has_vnni;
static char features[256];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void detect(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    has_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    has_avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                 __builtin_cpu_supports("avx512vbmi") && has_avx2;
    has_bf16 = has_avx512 && __builtin_cpu_supports("avx512bf16");
    has_vnni = has_avx512 && __builtin_cpu_supports("avx512vnni");
#endif
    snprintf(features, sizeof features, "%s%s%s%s", has_avx2 ? "avx2 fma " : "",
             has_avx512 ? "avx512f/bw/vl/dq/vbmi " : "", has_bf16 ? "avx512_bf16 " : "",
             has_vnni ? "avx512_vnni" : "");
    if (!features[0]) snprintf(features, sizeof features, "(no vector extensions used)");
}

dsv4_isa dsv4_cpu_isa_best(void)
{
    pthread_once(&once, detect);
    return has_avx512 ? DSV4_ISA_AVX512 : has_avx2 ? DSV4_ISA_AVX2 : DSV4_ISA_SCALAR;
}

static int parse_isa(const char *s, dsv4_isa *out)
{
    if (!strcmp(s, "scalar")) *out = DSV4_ISA_SCALAR;
    else if (!strcmp(s, "avx2")) *out = DSV4_ISA_AVX2;
    else if (!strcmp(s, "avx512")) *out = DSV4_ISA_AVX512;
    else return 0;
    return 1;
}

dsv4_status dsv4_cpu_isa_resolve(const char *name, dsv4_isa *out)
{
    dsv4_isa cap = DSV4_ISA_AVX512;
    if (name) {
        if (!parse_isa(name, &cap))
            return dsv4_fail(DSV4_ERR_INVALID_ARG, "context: cpu_isa '%s' is not one of scalar, avx2, avx512", name);
    } else {
        const char *env = getenv("DSV4_CPU_ISA");
        if (env && *env && !parse_isa(env, &cap)) {
            dsv4_warn("DSV4_CPU_ISA='%s' is not one of scalar, avx2, avx512; not capping", env);
            cap = DSV4_ISA_AVX512;
        }
    }
    dsv4_isa best = dsv4_cpu_isa_best();
    *out = best < cap ? best : cap;
    return DSV4_OK;
}

int dsv4_cpu_isa_bf16(dsv4_isa isa)
{
    pthread_once(&once, detect);
    return has_bf16 && isa == DSV4_ISA_AVX512;
}

int dsv4_cpu_isa_vnni(dsv4_isa isa)
{
    pthread_once(&once, detect);
    return has_vnni && isa == DSV4_ISA_AVX512;
}

const char *dsv4_cpu_isa_name(dsv4_isa isa)
{
    switch (isa) {
    case DSV4_ISA_AVX512: return dsv4_cpu_isa_bf16(isa) ? "avx512+bf16" : "avx512";
    case DSV4_ISA_AVX2: return "avx2";
    default: return "scalar";
    }
}

const char *dsv4_cpu_features(void)
{
    pthread_once(&once, detect);
    return features;
}

const char *dsv4_cpu_isa(void)
{
    dsv4_isa isa = DSV4_ISA_SCALAR;
    dsv4_cpu_isa_resolve(NULL, &isa); /* never fails without a name */
    return dsv4_cpu_isa_name(isa);
}

void dsv4_host_memory(uint64_t *available, uint64_t *total)
{
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    *total = pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : 0;
    *available = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return;
    char line[256];
    unsigned long long kib;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
            *available = (uint64_t)kib * 1024;
            break;
        }
    fclose(f);
}

/* the cores this process may run on (a taskset or a container's cpuset counts) */
static int usable_cores(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int dsv4_default_threads(void)
{
    int procs = usable_cores();
    const char *s = getenv("DSV4_THREADS");
    if (s && *s) {
        char *end = NULL;
        errno = 0;
        long n = strtol(s, &end, 10);
        if (*end || errno || n < 1 || n > DSV4_MAX_THREADS || !(*s >= '0' && *s <= '9'))
            dsv4_warn("DSV4_THREADS='%s' is not a thread count in [1, %d]; using all %d cores", s, DSV4_MAX_THREADS, procs);
        else
            return (int)n;
    }
    return procs > DSV4_MAX_THREADS ? DSV4_MAX_THREADS : procs;
}
