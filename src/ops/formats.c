/* Op layer of the format family: contract checks on tensor views, then dispatch. */
#include "core/error.h"
#include "core/ops_formats.h"
#include "core/tensor_check.h"

static dsv4_status check_fmt(const char *op, dsv4_scalar_format fmt, int decode)
{
    if ((unsigned)fmt > DSV4_FMT_E8M0 || (!decode && fmt == DSV4_FMT_E8M0))
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: format %d is not %s", op, (int)fmt,
                         decode ? "e4m3, bf16, e2m1 or e8m0" : "e4m3, bf16 or e2m1");
    return DSV4_OK;
}

dsv4_status dsv4_encode_array(dsv4_ctx *ctx, dsv4_scalar_format fmt, const float *x, int64_t n, void *codes)
{
    const char *op = "encode_array";
    DSV4_TRY(check_fmt(op, fmt, 0));
    DSV4_CHECK_ARG(n >= 0, "%s: negative length %lld", op, (long long)n);
    DSV4_CHECK_ARG(n == 0 || (x && codes), "%s: null pointer", op);
    const dsv4_backend *b;
    dsv4_exec ex;
    DSV4_TRY(dsv4_op_resolve(ctx, op, DSV4_FAMILY_FORMATS, &b, &ex));
    DSV4_TRY(DSV4_BACKEND_ENTRY_CHECK(b, formats, encode, op));
    return b->formats->encode(&ex, fmt, x, n, codes);
}

dsv4_status dsv4_decode_array(dsv4_ctx *ctx, dsv4_scalar_format fmt, const void *codes, int64_t n, float *x)
{
    const char *op = "decode_array";
    DSV4_TRY(check_fmt(op, fmt, 1));
    DSV4_CHECK_ARG(n >= 0, "%s: negative length %lld", op, (long long)n);
    DSV4_CHECK_ARG(n == 0 || (x && codes), "%s: null pointer", op);
    const dsv4_backend *b;
    dsv4_exec ex;
    DSV4_TRY(dsv4_op_resolve(ctx, op, DSV4_FAMILY_FORMATS, &b, &ex));
    DSV4_TRY(DSV4_BACKEND_ENTRY_CHECK(b, formats, decode, op));
    return b->formats->decode(&ex, fmt, codes, n, x);
}

static dsv4_status check_rule(const char *op, dsv4_qrule rule)
{
    if ((unsigned)rule >= DSV4_QRULE_COUNT)
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: unknown quantization rule %d", op, (int)rule);
    return DSV4_OK;
}

/* Every view of `all` in the memory of backend b. */
static dsv4_status in_memory(const char *op, const dsv4_tensor *const *all, const char *const *names, int n,
                             const dsv4_backend *b)
{
    for (int i = 0; i < n; i++)
        if (all[i]->device != b->device)
            return dsv4_fail(DSV4_ERR_UNSUPPORTED, "%s: %s is not in the memory of backend '%s'", op, names[i], b->name);
    return DSV4_OK;
}

/* Shared checks of quantize/dequantize: values [rows, K], codes [rows, K], scales [rows, K/G]. */
static dsv4_status check_qtriple(const char *op, dsv4_qrule rule, const dsv4_tensor *x, const dsv4_tensor *codes,
                                 const dsv4_tensor *scales, const dsv4_backend *b)
{
    DSV4_TRY(check_rule(op, rule));
    DSV4_TRY(dsv4_check_tensor(op, "x", x, DSV4_DT(DSV4_F32), 2, NULL));
    int64_t rows = x->shape[0], k = x->shape[1], g = dsv4_qrule_group(rule);
    if (k % g)
        return dsv4_fail(DSV4_ERR_SHAPE, "%s: K = %lld is not a multiple of the %s group of %lld", op, (long long)k,
                         dsv4_qrule_name(rule), (long long)g);
    const int64_t cshape[2] = {rows, k}, sshape[2] = {rows, k / g};
    DSV4_TRY(dsv4_check_tensor(op, "codes", codes, DSV4_DT(DSV4_F8_E4M3) | DSV4_DT(DSV4_U8), 2, cshape));
    DSV4_TRY(dsv4_check_tensor(op, "scales", scales, DSV4_DT(DSV4_E8M0) | DSV4_DT(DSV4_U8), 2, sshape));
    if (rule == DSV4_QRULE_FP4_32 && codes->dtype != DSV4_U8)
        return dsv4_fail(DSV4_ERR_DTYPE, "%s: fp4_32 codes are one E2M1 code per byte (u8), not %s", op,
                         dsv4_dtype_name(codes->dtype));
    const dsv4_tensor *all[3] = {x, codes, scales};
    const char *names[3] = {"x", "codes", "scales"};
    for (int i = 0; i < 3; i++) DSV4_TRY(dsv4_check_inner_contiguous(op, names[i], all[i]));
    return in_memory(op, all, names, 3, b);
}

dsv4_status dsv4_quantize(dsv4_ctx *ctx, dsv4_qrule rule, const dsv4_tensor *x, dsv4_tensor *codes,
                          dsv4_tensor *scales)
{
    DSV4_OP_BEGIN("quantize", FORMATS);
    DSV4_TRY(check_qtriple(op, rule, x, codes, scales, b));
    DSV4_TRY(dsv4_check_output(op, "codes", codes));
    DSV4_TRY(dsv4_check_output(op, "scales", scales));
    if (dsv4_tensors_overlap(x, codes) || dsv4_tensors_overlap(x, scales) || dsv4_tensors_overlap(codes, scales))
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: x, codes and scales must not overlap", op);
    DSV4_TRY(DSV4_BACKEND_ENTRY_CHECK(b, formats, quantize_rows, op));
    return b->formats->quantize_rows(&ex, rule, x->data, x->stride[0], x->shape[0], x->shape[1], codes->data,
                                     codes->stride[0], scales->data, scales->stride[0]);
}

dsv4_status dsv4_dequantize(dsv4_ctx *ctx, dsv4_qrule rule, const dsv4_tensor *codes, const dsv4_tensor *scales,
                            dsv4_tensor *x)
{
    DSV4_OP_BEGIN("dequantize", FORMATS);
    DSV4_TRY(check_qtriple(op, rule, x, codes, scales, b));
    DSV4_TRY(dsv4_check_output(op, "x", x));
    if (dsv4_tensors_overlap(x, codes) || dsv4_tensors_overlap(x, scales))
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: x must not overlap codes or scales", op);
    DSV4_TRY(DSV4_BACKEND_ENTRY_CHECK(b, formats, dequantize_rows, op));
    return b->formats->dequantize_rows(&ex, rule, codes->data, codes->stride[0], scales->data, scales->stride[0],
                                       x->shape[0], x->shape[1], x->data, x->stride[0]);
}

dsv4_status dsv4_dequantize_weight(dsv4_ctx *ctx, const dsv4_tensor *w, const dsv4_tensor *scale, dsv4_tensor *out)
{
    DSV4_OP_BEGIN("dequantize_weight", FORMATS);
    DSV4_TRY(dsv4_check_tensor(op, "w", w, DSV4_DT(DSV4_F8_E4M3) | DSV4_DT(DSV4_FP4X2), 2, NULL));
    DSV4_TRY(dsv4_check_inner_contiguous(op, "w", w));
    int fp4 = w->dtype == DSV4_FP4X2;
    int64_t n = w->shape[0], k = fp4 ? 2 * w->shape[1] : w->shape[1];
    const int64_t oshape[2] = {n, k};
    DSV4_TRY(dsv4_check_tensor(op, "out", out, DSV4_DT(DSV4_F32), 2, oshape));
    DSV4_TRY(dsv4_check_output(op, "out", out));
    DSV4_TRY(dsv4_check_inner_contiguous(op, "out", out));
    if (fp4 && k % 32) return dsv4_fail(DSV4_ERR_SHAPE, "%s: FP4 K = %lld is not a multiple of 32", op, (long long)k);
    const int64_t sshape[2] = {fp4 ? n : (n + 127) / 128, fp4 ? k / 32 : (k + 127) / 128};
    DSV4_TRY(dsv4_check_tensor(op, "scale", scale, DSV4_DT(DSV4_E8M0) | DSV4_DT(DSV4_U8), 2, sshape));
    if (dsv4_tensors_overlap(out, w) || dsv4_tensors_overlap(out, scale))
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: out must not overlap the weight or its scale", op);
    const dsv4_tensor *all[3] = {w, scale, out};
    const char *names[3] = {"w", "scale", "out"};
    DSV4_TRY(in_memory(op, all, names, 3, b));
    if (fp4) {
        DSV4_TRY(DSV4_BACKEND_ENTRY_CHECK(b, formats, dequantize_fp4_g32, op));
        return b->formats->dequantize_fp4_g32(&ex, w->data, w->stride[0], n, k, scale->data, scale->stride[0],
                                              scale->stride[1], out->data, out->stride[0]);
    }
    DSV4_TRY(DSV4_BACKEND_ENTRY_CHECK(b, formats, dequantize_fp8_b128, op));
    return b->formats->dequantize_fp8_b128(&ex, w->data, w->stride[0], n, k, scale->data, scale->stride[0],
                                           scale->stride[1], out->data, out->stride[0]);
}

dsv4_status dsv4_fp4_pack(const uint8_t *codes, int64_t n, uint8_t *packed)
{
    DSV4_CHECK_ARG(n >= 0 && n % 2 == 0, "fp4_pack: n = %lld must be even and >= 0", (long long)n);
    DSV4_CHECK_ARG(n == 0 || (codes && packed), "fp4_pack: null pointer");
    for (int64_t i = 0; i < n; i++)
        if (codes[i] > 15) return dsv4_fail(DSV4_ERR_RANGE, "fp4_pack: code %d at %lld is not a nibble", codes[i], (long long)i);
    for (int64_t i = 0; i < n / 2; i++) packed[i] = (uint8_t)(codes[2 * i] | (codes[2 * i + 1] << 4));
    return DSV4_OK;
}

dsv4_status dsv4_fp4_unpack(const uint8_t *packed, int64_t n, uint8_t *codes)
{
    DSV4_CHECK_ARG(n >= 0 && n % 2 == 0, "fp4_unpack: n = %lld must be even and >= 0", (long long)n);
    DSV4_CHECK_ARG(n == 0 || (codes && packed), "fp4_unpack: null pointer");
    for (int64_t i = 0; i < n / 2; i++) {
        uint8_t b = packed[i];
        codes[2 * i] = b & 0xF;
        codes[2 * i + 1] = b >> 4;
    }
    return DSV4_OK;
}
