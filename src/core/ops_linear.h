/* Linear op family (docs/kernels.md §5): quantized / BF16 / F32 linear layers and the grouped wo_a product
 * (include/dsv4/linear.h has the contract and the numerics).
 *
 * Entry points get raw pointers the op layer (src/ops/linear.c) has validated: dtypes, shapes,
 * unit inner strides, non-negative strides, non-overlap of y and the work space with the
 * inputs, and a work space of at least workspace_size(fmt, groups*m, k) bytes (a staging
 * describes itself in the work space; only the backend reads and checks that). Strides are in
 * elements of the pointed-to type (FP4X2: bytes, i.e. two values). */
#ifndef DSV4_CORE_OPS_LINEAR_H
#define DSV4_CORE_OPS_LINEAR_H

#include "core/backend.h"
#include "dsv4/linear.h"

/* One call: for g < groups, m < m_rows, n < n_out:
 *   y[m*ys_m + g*ys_g + n] = sum_k x[m*xs_m + g*xs_g + k] * W[g*n_out + n][k] (+ bias[n*bias_s]).
 * W row r starts at w + r*ws_r (elements; FP4: bytes). Scale element (i, j) is at
 * scale[i*ss0 + j*ss1]; for FP8_B128, i = r/128 and j = k/128, otherwise i = r and j = k/32. */
typedef struct dsv4_linear_args {
    dsv4_linear_format fmt;
    int64_t groups, m, n, k;
    const void *x;
    int x_bf16;
    int64_t xs_m, xs_g;
    const void *w;
    int64_t ws_r;
    const uint8_t *scale;
    int64_t ss0, ss1;
    const void *bias; /* NULL: none */
    int bias_bf16;
    int64_t bias_s;
    void *y;
    int y_bf16;
    int64_t ys_m, ys_g;
    void *workspace;
    size_t workspace_bytes;
    /* 1 (quantized formats, groups = 1): the work space already holds the staging that `stage`
     * made of the m rows (x is then not read); the backend checks it is one of m rows of length
     * k, of fmt's family and its own layout, and fails without writing y if not. */
    int staged;
} dsv4_linear_args;

/* The format's name, for messages (the one table, shared by the op layer and the backends). */
static inline const char *dsv4_linear_fmt_str(dsv4_linear_format fmt)
{
    static const char *const names[DSV4_LINEAR_FORMAT_COUNT] = {"fp8_b128", "mxfp8", "fp4", "bf16", "f32"};
    return (unsigned)fmt < DSV4_LINEAR_FORMAT_COUNT ? names[fmt] : "?";
}

struct dsv4_linear_ops {
    /* Work space bytes for `rows` rows of length k (k a multiple of 32). */
    size_t (*workspace_size)(dsv4_linear_format fmt, int64_t rows, int64_t k);
    dsv4_status (*linear)(const dsv4_exec *ex, const dsv4_linear_args *a);
    /* The staging step of `linear` alone (quantized formats; groups = 1, and of the args only fmt,
     * m, k, x, x_bf16, xs_m and the work space are read): quantize the m rows of x into the work
     * space, in the form `linear` with staged = 1 consumes. NULL: the backend cannot stage. */
    dsv4_status (*stage)(const dsv4_exec *ex, const dsv4_linear_args *a);
};

#endif
