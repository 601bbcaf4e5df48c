/* The cuda backend's context option (dsv4_ctx_options.cuda_decode, include/dsv4/core.h): parsed
 * once at context creation into dsv4_exec.variant (the DSV4_CU_* values of cuda_kernels.h), so
 * no launch reads the environment. Plain C without CUDA headers. */
#include "backends/cuda/cuda_glue.h"
#include "backends/cuda/cuda_kernels.h"
#include "core/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name;
    int value;
} kernel_names[] = {
    {"auto", DSV4_CU_AUTO}, {"ws2", DSV4_CU_WS2}, {"ws1", DSV4_CU_WS1},
    {"v1", DSV4_CU_V1},     {"mma-sync", DSV4_CU_MMA_SYNC},
};
enum { N_KERNELS = (int)(sizeof kernel_names / sizeof kernel_names[0]) };

static int kernel_value(const char *word, size_t len)
{
    for (int i = 0; i < N_KERNELS; i++)
        if (strlen(kernel_names[i].name) == len && !strncmp(kernel_names[i].name, word, len)) return kernel_names[i].value;
    return -1;
}

/* The flag words after the kernel. */
static const struct {
    const char *name;
    int value;
} flag_names[] = {
    {"no-pair", DSV4_CU_NO_PAIR},         {"no-split", DSV4_CU_NO_SPLIT},         {"split2", DSV4_CU_SPLIT2},
    {"no-pdl", DSV4_CU_NO_PDL},           {"seq-combine", DSV4_CU_SEQ_COMBINE},   {"late-release", DSV4_CU_LATE_RELEASE},
    {"pdl", DSV4_CU_PDL},                 {"late-sink", DSV4_CU_LATE_SINK},       {"prefetch", DSV4_CU_PREFETCH},
    {"wide-store", DSV4_CU_WIDE_STORE}, {"one-copy", DSV4_CU_ONE_COPY},
};
enum { N_FLAGS = (int)(sizeof flag_names / sizeof flag_names[0]) };

static int flag_value(const char *word, size_t len)
{
    for (int i = 0; i < N_FLAGS; i++)
        if (strlen(flag_names[i].name) == len && !strncmp(flag_names[i].name, word, len)) return flag_names[i].value;
    return -1;
}

#define DECODE_WORDS                                                                                       \
    "KERNEL[,no-pair][,no-split][,split2][,no-pdl][,pdl][,seq-combine][,late-release][,late-sink][,prefetch]" \
    "[,wide-store][,one-copy]"

/* DECODE_WORDS (any word may be left out, in any order, none twice) -> variant; -1 if malformed. */
static int parse_decode(const char *s)
{
    int kernel = -1, flags = 0;
    while (*s) {
        const char *comma = strchr(s, ',');
        size_t len = comma ? (size_t)(comma - s) : strlen(s);
        const int k = kernel_value(s, len), f = flag_value(s, len);
        if (k >= 0 && kernel < 0) kernel = k;
        else if (f > 0 && !(flags & f)) flags |= f;
        else return -1;
        s += len;
        if (*s == ',' && !*++s) return -1; /* a trailing comma */
    }
    if ((flags & DSV4_CU_PDL) && (flags & DSV4_CU_NO_PDL)) return -1;
    return (kernel < 0 ? DSV4_CU_AUTO : kernel) | flags;
}

static int env_on(const char *name)
{
    const char *v = getenv(name);
    return v && *v && *v != '0';
}

dsv4_status dsv4_cu_configure(const dsv4_ctx_options *o, dsv4_exec *ex)
{
    if (o->cuda_decode) {
        int v = parse_decode(o->cuda_decode);
        if (v < 0)
            return dsv4_fail(DSV4_ERR_INVALID_ARG,
                             "context: cuda_decode '%s' is not " DECODE_WORDS " with KERNEL one of auto, ws2, ws1, "
                             "v1, mma-sync",
                             o->cuda_decode);
        ex->variant = v;
        return DSV4_OK;
    }
    /* The environment defaults: $DSV4_CUDA_DECODE (the same words), $DSV4_CUDA_MMA_SYNC=1 (the
     * mma.sync kernels whatever it says), $DSV4_CUDA_NO_PAIR=1. */
    int kernel = DSV4_CU_AUTO, no_pair = 0, flags = 0;
    const char *env = getenv("DSV4_CUDA_DECODE");
    if (env && *env) {
        int v = parse_decode(env);
        if (v < 0)
            dsv4_warn("DSV4_CUDA_DECODE='%s' is not " DECODE_WORDS " with KERNEL one of auto, ws2, ws1, v1, mma-sync; using auto",
                      env);
        else {
            kernel = v & DSV4_CU_KERNEL_MASK;
            no_pair = (v & DSV4_CU_NO_PAIR) != 0;
            flags = v & DSV4_CU_FLAGS;
        }
    }
    if (env_on("DSV4_CUDA_MMA_SYNC")) kernel = DSV4_CU_MMA_SYNC;
    if (env_on("DSV4_CUDA_NO_PAIR")) no_pair = 1;
    ex->variant = kernel | (no_pair ? DSV4_CU_NO_PAIR : 0) | flags;
    return DSV4_OK;
}
