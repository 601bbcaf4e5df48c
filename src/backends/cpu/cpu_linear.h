/* Linear kernels of the cpu backends. The driver (linear_cpu.c) quantizes the activations into
 * the work space, cuts the output into tiles of MT activation rows x NT weight rows, spreads the
 * tiles of N over the threads and adds bias / rounds the tile results; the kernels compute one
 * tile. Every output element is computed by the same sequence of operations whatever the tile
 * shape, the tile's position or the thread, so results never depend on the thread count or on
 * the other rows of the call. */
#ifndef DSV4_CPU_LINEAR_H
#define DSV4_CPU_LINEAR_H

#include "core/ops_linear.h"

#define DSV4_LIN_MT 4 /* most activation rows of one tile */
#define DSV4_LIN_NT 8 /* most weight rows of one tile */

extern const struct dsv4_linear_ops dsv4_cpu_ref_linear_ops;
extern const struct dsv4_linear_ops dsv4_cpu_linear_ops;

/* Staging of the quantized formats, in the work space: from its first 64-byte boundary, a
 * 64-byte description (rows, k, the format it is arranged for, the kernel set that made it:
 * linear_cpu.c checks it before a staged product), then the rows (stride dsv4_lin_row_bytes(k)).
 * Staged activation row:
 *   value staging (vector kernels): the dequantized activation x_q * s_x as BF16 (AVX-512) or
 *     F32 (AVX2; for FP8 and MXFP8 the code times 2^119, the scales and codes following the
 *     values: linear_avx2.c), exact either way (a code times a power of two), k values then
 *     zeros up to a multiple of 128 (in the kernel's order of K, see stage_row).
 *   code staging (scalar reference): k E4M3 codes, then one scale byte per activation group. */
int64_t dsv4_lin_row_bytes(int64_t k);

/* One tile. Rows past mt / nt repeat the last valid one (the kernel may compute them; the
 * driver drops them). */
typedef struct dsv4_lin_tile {
    dsv4_linear_format fmt;
    int64_t k;
    int mt, nt;                            /* the kernel's tile shape (from its `shape`) */
    const void *act[DSV4_LIN_MT];          /* staged rows, or x rows for BF16/F32 weights */
    int x_bf16;                            /* BF16/F32 weights: x rows are BF16 (else F32) */
    const void *w[DSV4_LIN_NT];            /* weight rows */
    const uint8_t *s[DSV4_LIN_NT];         /* scale rows: block j at s[i][j * ss1] */
    int64_t ss1;
    int64_t w_next;                        /* bytes from a weight row to the same row of the next
                                            * tile (where to prefetch once this one is read) */
} dsv4_lin_tile;

typedef struct dsv4_cpu_linear_kernels {
    int stage_bytes; /* bytes of one staged value: 2 (BF16 staging), 4 (F32 staging), 0: code staging */
    /* The tile shape for a call with m activation rows (mt <= DSV4_LIN_MT, nt <= DSV4_LIN_NT). */
    void (*shape)(dsv4_linear_format fmt, int64_t m, int *mt, int *nt);
    /* out[i][j] = y before bias of activation row i and weight row j, i < mt, j < nt. */
    void (*tile)(const dsv4_lin_tile *t, float out[DSV4_LIN_MT][DSV4_LIN_NT]);
    /* Value staging of one activation group: dst[i] = e4m3(codes[i]) * scale as BF16 or F32
     * (stage_bytes), i < len. */
    void (*stage_group)(const uint8_t *codes, int len, float scale, void *dst);
    /* NULL, or the whole value staging of one row of x (k values, F32 or BF16): quantized,
     * dequantized, zero-padded to a multiple of 128 and put in the order the kernel's weight
     * decoding produces; replaces the generic loop over stage_group. */
    void (*stage_row)(dsv4_linear_format fmt, const void *x, int x_bf16, int64_t k, uint16_t *dst);
    /* NULL when the staged row of an act128 format (FP8_B128, FP4) does not depend on which one;
     * else the staged row arranged for `from` rewritten in place into the arrangement of `to`
     * (both act128 formats). */
    void (*rearrange_row)(dsv4_linear_format from, dsv4_linear_format to, uint16_t *row, int64_t k);
} dsv4_cpu_linear_kernels;

extern const dsv4_cpu_linear_kernels dsv4_cpu_linear_kernels_scalar;
extern const dsv4_cpu_linear_kernels dsv4_cpu_linear_kernels_avx2;
extern const dsv4_cpu_linear_kernels dsv4_cpu_linear_kernels_avx512; /* needs AVX512-BF16 */

#endif
