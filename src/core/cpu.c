/* CPU facts: instruction sets (run-time detection) and the default thread count. */
#include "core/backend.h"

#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static dsv4_isa cap(void)
{
    const char *s = getenv("DSV4_CPU_ISA");
    if (!s || !*s) return DSV4_ISA_AVX512;
    if (!strcmp(s, "scalar")) return DSV4_ISA_SCALAR;
    if (!strcmp(s, "avx2")) return DSV4_ISA_AVX2;
    return DSV4_ISA_AVX512;
}

dsv4_isa dsv4_cpu_isa_level(void)
{
    pthread_once(&once, detect);
    dsv4_isa best = has_avx512 ? DSV4_ISA_AVX512 : has_avx2 ? DSV4_ISA_AVX2 : DSV4_ISA_SCALAR;
    dsv4_isa c = cap();
    return best < c ? best : c;
}

int dsv4_cpu_has_avx512bf16(void)
{
    pthread_once(&once, detect);
    return has_bf16 && dsv4_cpu_isa_level() == DSV4_ISA_AVX512;
}

const char *dsv4_cpu_features(void)
{
    pthread_once(&once, detect);
    return features;
}

const char *dsv4_cpu_isa(void)
{
    switch (dsv4_cpu_isa_level()) {
    case DSV4_ISA_AVX512: return dsv4_cpu_has_avx512bf16() ? "avx512+bf16" : "avx512";
    case DSV4_ISA_AVX2: return "avx2";
    default: return "scalar";
    }
}

int dsv4_default_threads(void)
{
    const char *s = getenv("DSV4_THREADS");
    if (s && *s) {
        int n = atoi(s);
        if (n > 0) return n;
    }
    return omp_get_num_procs();
}
