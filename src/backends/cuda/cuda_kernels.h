/* The CUDA backend's kernels as the host glue sees them: plain C structs and launchers that
 * return a cudaError_t (as int, 0 = success) and never synchronize. Shared by the C glue
 * (backend_cuda.c, attention_cuda.c) and the kernels (*.cu). Every pointer is device memory
 * unless marked host; strides are in elements of the pointed-to type, cache strides in bytes. */
#ifndef DSV4_CUDA_KERNELS_H
#define DSV4_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One paged cache (or, for the BF16 rows of the two-pass design, docs/kernels.md §3.4: block_size 1,
 * page_stride = row bytes). */
typedef struct dsv4_cu_cache {
    const uint8_t *pages;
    long long page_stride, block_size, num_slots;
} dsv4_cu_cache;

/* KV insert (and the fused q side when q != NULL). */
typedef struct dsv4_cu_insert {
    uint16_t *q;             /* [n, h, 512] in place, or NULL */
    long long q_st, q_sh;
    long long n, h, n_ins;   /* q tokens, heads, KV rows inserted (first n_ins tokens) */
    float eps;
    const uint16_t *kv;      /* [n_ins, 512], row stride ld_kv */
    long long ld_kv;
    const int64_t *slots;    /* [n_ins] */
    const int64_t *positions;/* [n] or NULL (KV inserted as is; q needs positions) */
    const float *rope;       /* [max_pos, 64] */
    long long max_pos;
    uint8_t *pages;          /* destination cache */
    long long page_stride, block_size, num_slots;
} dsv4_cu_insert;

int dsv4_cu_insert_launch(const dsv4_cu_insert *a, void *stream);

/* out[i] (BF16 512, row stride ld_out) = dequantized entry at slots[i]; invalid slot -> zeros. */
int dsv4_cu_gather_launch(dsv4_cu_cache cache, const int32_t *slots, long long s, uint16_t *out, long long ld_out,
                          void *stream);

/* o [t, h, 512] in place: dims 448..511 rotated back by positions[i]; rows whose position is
 * outside [0, max_pos) are left as they are. */
int dsv4_cu_inv_rope_launch(uint16_t *o, long long st, long long sh, long long t, long long h, const int64_t *positions,
                            const float *rope, long long max_pos, void *stream);

/* table [max_pos, 64] from freq[32] (host values, passed by value). */
int dsv4_cu_rope_table_launch(const double *freq, long long max_pos, float *table, void *stream);

/* The decode-kernel choice of a context (dsv4_exec.variant, fixed at context creation by
 * dsv4_cu_configure, cuda_options.c): one kernel value in the low bits, the flags above. */
enum {
    DSV4_CU_AUTO = 0,     /* 64-head tiles of FP8 pages: ws2, or v1 where a CTA gets one block */
    DSV4_CU_WS2 = 1,      /* warp-specialized, one consumer warpgroup owning S */
    DSV4_CU_WS1 = 2,      /* warp-specialized, the two consumer warpgroups splitting S */
    DSV4_CU_V1 = 3,       /* single-role warpgroup-MMA kernel */
    DSV4_CU_MMA_SYNC = 4, /* no warpgroup MMA: the mma.sync kernels (FP8 pages and BF16 rows) */
    DSV4_CU_KERNEL_MASK = 7,
    DSV4_CU_NO_PAIR = 8,  /* the two 64-head tiles of H 128 in separate CTAs, not a cluster */
    DSV4_CU_NO_SPLIT = 16, /* one split per query whatever the plan: no combine kernel */
    DSV4_CU_SPLIT2 = 32,   /* two-block queries split even where the plan keeps them whole */
    DSV4_CU_NO_PDL = 64,   /* the decode launched plainly, not as a dependent of the kernel before it */
    DSV4_CU_SEQ_COMBINE = 128,    /* combine_seq_kernel whatever the split count */
    DSV4_CU_LATE_RELEASE = 256,   /* decode CTAs let the next launch start after their loop, not first */
    DSV4_CU_PDL = 512,            /* the decode always launched as a dependent (",no-pdl": never; else a rule) */
    DSV4_CU_LATE_SINK = 1024,     /* the sink read in the epilogue, not when the CTA starts */
    DSV4_CU_PREFETCH = 2048,      /* ws CTAs prefetch rounds 2 and 3 into L2 at the start (measured slower) */
    DSV4_CU_WIDE_STORE = 4096,    /* the BF16 output in 16-byte stores (a quad transpose; measured slower) */
    DSV4_CU_ONE_COPY = 8192,      /* H 128 clusters: one thread copies the half block after a barrier */
    DSV4_CU_FLAGS = DSV4_CU_NO_SPLIT | DSV4_CU_SPLIT2 | DSV4_CU_NO_PDL | DSV4_CU_SEQ_COMBINE | DSV4_CU_LATE_RELEASE |
                    DSV4_CU_PDL | DSV4_CU_LATE_SINK | DSV4_CU_PREFETCH | DSV4_CU_WIDE_STORE | DSV4_CU_ONE_COPY
};

/* Sparse MLA decode (FP8 pages, or BF16 rows for the two-pass design, docs/kernels.md §3.4). */
typedef struct dsv4_cu_scope {
    dsv4_cu_cache cache;
    const int32_t *indices; /* [t, width], row stride ld */
    long long ld, width;
    const int32_t *lengths; /* [t] or NULL */
} dsv4_cu_scope;

typedef struct dsv4_cu_decode {
    const uint16_t *q;
    long long q_st, q_sh;
    int t, h;
    const float *sink;      /* [h] or NULL */
    float scale_log2;       /* softmax scale * log2(e) */
    uint16_t *out;
    long long o_st, o_sh;
    float *lse;             /* or NULL */
    long long lse_st, lse_sh;
    dsv4_cu_scope scope[2];
    int n_scopes;
    int fp8;                /* 1: FP8 pages, 0: BF16 rows */
    int aligned;            /* cache bases and strides are 16-byte multiples (async copies) */
    int wgmma;              /* 64-head tiles on the warpgroup MMA kernel (device is sm_90) */
    int kernel;             /* with wgmma, for FP8 pages: DSV4_CU_AUTO, _WS2, _WS1 or _V1 */
    int no_pair;            /* 1: never launch the 2-CTA clusters of the ws kernels */
    int pdl;                /* the decode as a programmatic dependent of the kernel before it: 0 never,
                               2 always, 1 as the launcher's rule says (launch_pdl, decode_cuda.cu) */
    int sms;                /* the device's SM count */
    int release_late;       /* 1: decode CTAs release the next launch after their loop, 0: first */
    int seq_combine;        /* 1: combine_seq_kernel whatever the split count */
    int late_sink;          /* 1: the sink is read in the epilogue (",late-sink"), 0: when the CTA starts */
    int prefetch;           /* 1: ws CTAs prefetch rounds 2 and 3 into L2 at the start (",prefetch") */
    int wide_store;         /* 1: BF16 output rows in 16-byte stores where aligned (",wide-store") */
    int warp_copy;          /* 1: H 128 clusters copy each warp's rows to the peer (no ",one-copy") */
    int device;             /* the current device's ordinal (function attributes are per device) */
    int splits;             /* > 1: partial results in part_o/part_lse, then a combine launch */
    float *part_o;          /* [splits, t, h, 512] */
    float *part_lse;        /* [splits, t, h] */
} dsv4_cu_decode;

/* Rows of heads one CTA handles for h heads (16, 32 or 64). */
int dsv4_cu_decode_rows(long long h);
int dsv4_cu_decode_launch(const dsv4_cu_decode *d, void *stream);

#ifdef __cplusplus
}
#endif
#endif
