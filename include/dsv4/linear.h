/* Linear layers on quantized weights kept in the checkpoint's own layout (docs/formats.md §3,
 * docs/kernels.md §4-§5, docs/contracts.md §7):  y[m, n] = sum_k x[m, k] * W[n, k]  (+ bias[n]).
 *
 * Weight formats (dsv4_linear_format), consumed by view, never copied:
 *   FP8_B128  w F8_E4M3 [N, K], scale E8M0 [ceil(N/128), ceil(K/128)] (edge blocks allowed)
 *   MXFP8     w F8_E4M3 [N, K], scale E8M0 [N, K/32]
 *   FP4       w FP4X2   [N, K/2] (low nibble = even k), scale E8M0 [N, K/32]
 *   BF16      w BF16    [N, K], no scale (pass NULL)
 *   F32       w F32     [N, K], no scale (pass NULL)
 * Scales may be any strided view (e.g. the transposed view of a contiguous [K/32, N] buffer,
 * strides (1, N)); weights, x and y need unit stride in their last dim, any row stride.
 * E8M0 scale tensors may be typed E8M0 or U8.
 *
 * Numerics (docs/model.md §2.2, §11):
 *   FP8_B128, FP4: each row of x is quantized per 1x128 block of K with the act128 rule
 *     (dsv4/formats.h; a last block shorter than 128 is its own group), then
 *     y = sum over scale blocks of (sum_k xq*wq) * (sx * sw) with fp32 accumulation; the FP4
 *     weight scale is per 32 of K, so its blocks are 32 long.
 *   MXFP8: x quantized per 1x32 with the mx32 rule; blocks of 32, both scales per 32 of K.
 *   BF16, F32: y = sum_k x*w, fp32 products and accumulation (x not rounded).
 *   The bias (F32 or BF16, [N], any stride) is added in fp32; a BF16 y is rounded once (RNE).
 *   Only the summation order differs from a float64 evaluation of these formulas (short of
 *   fp32 overflow or underflow), and it is fixed: the result never depends on the thread
 *   count, nor on the other rows of x in the call.
 * Non-finite input: for the quantized formats a NaN or +-Inf anywhere in a row of x makes that
 *   whole row of y NaN (the act rules give the group a NaN scale or a NaN code); a NaN weight
 *   code (0x7F/0xFF) or scale byte 255 makes the outputs that read it NaN. BF16/F32 follow IEEE.
 *
 * Shapes: M >= 0 rows (M = 0 does nothing), N >= 1, K >= 32 and a multiple of 32.
 * Work space: the quantized formats stage the quantized activations in caller memory sized by
 * dsv4_linear_workspace_size (any alignment; 0 bytes for BF16/F32). Nothing is allocated.
 *
 * Staging once for several weights: dsv4_linear_stage quantizes the rows of x into the work
 * space exactly as dsv4_linear does, and dsv4_linear_staged runs the product on that staging,
 * so activations multiplied by several weights (an expert's w1 and w3) are quantized once;
 * dsv4_linear_stage + dsv4_linear_staged == dsv4_linear bit for bit. The staged values depend
 * only on the activation rule, hence the families that share a staging:
 *   act128: FP8_B128 and FP4 (rows staged for one are consumed by the other, same K);
 *   mx32:   MXFP8 alone.
 * BF16/F32 have nothing to stage: dsv4_linear_stage only checks x (the work space is not
 * touched; 0 bytes needed), and dsv4_linear_staged is then dsv4_linear (it reads x). */
#ifndef DSV4_LINEAR_H
#define DSV4_LINEAR_H

#include "core.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsv4_linear_format {
    DSV4_LINEAR_FP8_B128 = 0,
    DSV4_LINEAR_MXFP8 = 1,
    DSV4_LINEAR_FP4 = 2,
    DSV4_LINEAR_BF16 = 3,
    DSV4_LINEAR_F32 = 4,
    DSV4_LINEAR_FORMAT_COUNT = 5
} dsv4_linear_format;

DSV4_API const char *dsv4_linear_format_name(dsv4_linear_format fmt);

/* Bytes of work space dsv4_linear / dsv4_grouped_linear / dsv4_linear_stage / dsv4_linear_staged
 * need for `rows` rows of x of length k (rows = M, or T*G for the grouped form) on the context's
 * backend. */
DSV4_API dsv4_status dsv4_linear_workspace_size(dsv4_ctx *ctx, dsv4_linear_format fmt, int64_t rows, int64_t k,
                                                size_t *bytes);

/* y [M, N] (F32 or BF16) = x [M, K] (F32 or BF16) times the weight (w, scale) of `fmt`,
 * plus bias [N] when bias is not NULL. y must not overlap any input or the work space. */
DSV4_API dsv4_status dsv4_linear(dsv4_ctx *ctx, dsv4_linear_format fmt, const dsv4_tensor *x, const dsv4_tensor *w,
                                 const dsv4_tensor *scale, const dsv4_tensor *bias, dsv4_tensor *y, void *workspace,
                                 size_t workspace_bytes);

/* Quantize the rows of x [M, K] (F32 or BF16) into the work space (at least
 * dsv4_linear_workspace_size(fmt, M, K) bytes) with the activation rule of `fmt`. The staging
 * is opaque and belongs to the context's backend and, for "cpu", to the ISA path in use: it
 * records M, K, the family and its layout, and stays valid until the work space is written by
 * another call (dsv4_linear and dsv4_grouped_linear write theirs there too). The work space
 * must not overlap x. M = 0 stages nothing. */
DSV4_API dsv4_status dsv4_linear_stage(dsv4_ctx *ctx, dsv4_linear_format fmt, const dsv4_tensor *x, void *workspace,
                                       size_t workspace_bytes);

/* dsv4_linear(fmt, x, w, scale, bias, y) on the activations staged in the work space by
 * dsv4_linear_stage. For the quantized formats x gives only the shape [M, K] (its values are not
 * read: pass the x that was staged, or any F32/BF16 tensor of its shape outside the work space);
 * a staging of other rows (M or K), of another family (MXFP8 vs FP8_B128/FP4), or made by
 * another backend or ISA path (or no staging at all) fails with DSV4_ERR_INVALID_ARG, nothing
 * written.
 * The call may rewrite the staging in place into the arrangement of its own format (it stays a
 * staging of the same rows for the whole family), so calls on one staging must not run at the
 * same time. The other checks are those of dsv4_linear. */
DSV4_API dsv4_status dsv4_linear_staged(dsv4_ctx *ctx, dsv4_linear_format fmt, const dsv4_tensor *x,
                                        const dsv4_tensor *w, const dsv4_tensor *scale, const dsv4_tensor *bias,
                                        dsv4_tensor *y, void *workspace, size_t workspace_bytes);

/* Grouped product (the attention's wo_a): G = x->shape[1] groups,
 *   y[t, g, :] = x[t, g, :] times rows g*R .. g*R+R-1 of the weight,
 * x [T, G, K], w the canonical checkpoint tensor [G*R, K] (FP4: [G*R, K/2]) with its scale as
 * for dsv4_linear over all G*R rows, y [T, G, R]. Equal to G separate dsv4_linear calls. */
DSV4_API dsv4_status dsv4_grouped_linear(dsv4_ctx *ctx, dsv4_linear_format fmt, const dsv4_tensor *x,
                                         const dsv4_tensor *w, const dsv4_tensor *scale, dsv4_tensor *y,
                                         void *workspace, size_t workspace_bytes);

#ifdef __cplusplus
}
#endif
#endif
