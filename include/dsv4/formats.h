/* Number formats of DeepSeek-V4, defined to the bit (docs/formats.md; docs/contracts.md §2-§4).
 *
 *   E4M3   OCP E4M3FN: bias 7, max +-448, no infinities, NaN = 0x7F/0xFF. Encoding rounds to
 *          nearest-even and saturates: |x| >= 448 (and +-Inf) -> +-448, NaN -> NaN (sign kept).
 *   E8M0   scale byte b means 2^(b-127); 255 is NaN; 0 is 2^-127.
 *   BF16   round-to-nearest-even; NaN -> the quiet NaN 0x7FC0 with the input's sign.
 *   E2M1   FP4 grid {0, .5, 1, 1.5, 2, 3, 4, 6} with sign bit 3; nearest-even (ties to the even
 *          code); |x| > 6 and +-Inf saturate to +-6; NaN encodes as +0 (E2M1 has no NaN).
 *          Packed two per byte: low nibble = even element.
 *
 * Block quantization rules: per group of G consecutive elements of a row,
 *   amax  = max(max |x_i|, amax_floor)                 (NaN elements do not raise amax)
 *   y     = max(amax / max_code, quot_floor)           (fp32 division)
 *   e     = ceil(log2(y)), from y's bits: exponent + (mantissa != 0)
 *   byte  = clamp(e + 127, 0, 255);  codes = encode(x * 2^-e)
 * rule      G    max_code  amax_floor   quot_floor   all-zero group byte
 * KV64     64    448       1e-4         -            105
 * ACT128  128    448       1e-4         -            105
 * MX32     32    448       1e-10        1e-10        94
 * FP4_32   32    6         6*2^-126     -            1
 * A group holding +-Inf gets byte 255 (NaN): it dequantizes to NaN, so the fault stays visible. */
#ifndef DSV4_FORMATS_H
#define DSV4_FORMATS_H

#include "core.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

DSV4_API uint8_t dsv4_e4m3_encode(float x);
DSV4_API float dsv4_e4m3_decode(uint8_t code);
DSV4_API uint16_t dsv4_bf16_encode(float x);
DSV4_API float dsv4_bf16_decode(uint16_t bits);
DSV4_API uint8_t dsv4_e2m1_encode(float x); /* one code in the low nibble */
DSV4_API float dsv4_e2m1_decode(uint8_t code);
DSV4_API float dsv4_e8m0_decode(uint8_t byte);

typedef enum dsv4_scalar_format {
    DSV4_FMT_E4M3 = 0,
    DSV4_FMT_BF16 = 1, /* 2-byte codes */
    DSV4_FMT_E2M1 = 2, /* one code per byte */
    DSV4_FMT_E8M0 = 3  /* decode only */
} dsv4_scalar_format;

/* Element-wise array conversions on the context's backend. `codes` holds n codes (bytes, or
 * uint16 for BF16). Vectorized on the cpu backend, bit-identical to the scalar functions. */
DSV4_API dsv4_status dsv4_encode_array(dsv4_ctx *ctx, dsv4_scalar_format fmt, const float *x, int64_t n,
                                       void *codes);
DSV4_API dsv4_status dsv4_decode_array(dsv4_ctx *ctx, dsv4_scalar_format fmt, const void *codes, int64_t n,
                                       float *x);

typedef enum dsv4_qrule {
    DSV4_QRULE_KV64 = 0,
    DSV4_QRULE_ACT128 = 1,
    DSV4_QRULE_MX32 = 2,
    DSV4_QRULE_FP4_32 = 3,
    DSV4_QRULE_COUNT = 4
} dsv4_qrule;

DSV4_API int dsv4_qrule_group(dsv4_qrule rule);
DSV4_API const char *dsv4_qrule_name(dsv4_qrule rule);
/* The scale byte the rule gives a group with this amax (amax >= 0 or +Inf). */
DSV4_API uint8_t dsv4_qrule_scale_byte(dsv4_qrule rule, float amax);

/* Row-block quantization. x: F32 [rows, K] (unit inner stride, any row stride);
 * codes: F8_E4M3 or U8 [rows, K] (FP4_32: one E2M1 code per byte); scales: E8M0 or U8
 * [rows, K/G]. K must be a multiple of G. */
DSV4_API dsv4_status dsv4_quantize(dsv4_ctx *ctx, dsv4_qrule rule, const dsv4_tensor *x, dsv4_tensor *codes,
                                   dsv4_tensor *scales);
/* The inverse: x = decode(code) * 2^(byte-127), F32 [rows, K]. */
DSV4_API dsv4_status dsv4_dequantize(dsv4_ctx *ctx, dsv4_qrule rule, const dsv4_tensor *codes,
                                     const dsv4_tensor *scales, dsv4_tensor *x);

/* Weight dequantization to F32 [N, K]:
 *   w F8_E4M3 [N, K] with scale E8M0 [ceil(N/128), ceil(K/128)] (edge blocks allowed), or
 *   w FP4X2 [N, K/2] with scale E8M0 [N, K/32]. Scales may be any strided view. */
DSV4_API dsv4_status dsv4_dequantize_weight(dsv4_ctx *ctx, const dsv4_tensor *w, const dsv4_tensor *scale,
                                            dsv4_tensor *out);

/* FP4 nibble packing: n codes (n even) <-> n/2 bytes, low nibble = even element. */
DSV4_API dsv4_status dsv4_fp4_pack(const uint8_t *codes, int64_t n, uint8_t *packed);
DSV4_API dsv4_status dsv4_fp4_unpack(const uint8_t *packed, int64_t n, uint8_t *codes);

#ifdef __cplusplus
}
#endif
#endif
