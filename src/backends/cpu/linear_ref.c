/* Scalar reference kernels of the linear family (backend "cpu-ref", and the cpu backend on a
 * CPU without AVX2). They evaluate include/dsv4/linear.h literally, one output at a time:
 *   quantized formats: acc += (sum over the block of x_code * w_code) * (s_x * s_w), block by
 *     block along K (128 for FP8_B128, 32 for MXFP8 and FP4), products and sums in fp32;
 *   BF16/F32: acc += x * w, k in order. */
#include "backends/cpu/cpu_linear.h"
#include "formats/codec.h"

static float weight_value(dsv4_linear_format fmt, const void *w, int64_t k)
{
    const uint8_t *b = w;
    switch (fmt) {
    case DSV4_LINEAR_FP4: return dsv4_e2m1_to_f32((k & 1) ? (uint8_t)(b[k / 2] >> 4) : (uint8_t)(b[k / 2] & 0xF));
    case DSV4_LINEAR_BF16: return dsv4_bf16_to_f32(((const uint16_t *)w)[k]);
    case DSV4_LINEAR_F32: return ((const float *)w)[k];
    default: return dsv4_e4m3_to_f32(b[k]);
    }
}

static float dot_float(const dsv4_lin_tile *t, const void *x, const void *w)
{
    float acc = 0.0f;
    for (int64_t k = 0; k < t->k; k++) {
        const float xv = t->x_bf16 ? dsv4_bf16_to_f32(((const uint16_t *)x)[k]) : ((const float *)x)[k];
        acc += xv * weight_value(t->fmt, w, k);
    }
    return acc;
}

/* act: k E4M3 codes, then the scale bytes of the activation groups (32 for MXFP8, else 128). */
static float dot_quantized(const dsv4_lin_tile *t, const uint8_t *act, const void *w, const uint8_t *s)
{
    const int64_t ag = t->fmt == DSV4_LINEAR_MXFP8 ? 32 : 128, wb = t->fmt == DSV4_LINEAR_FP8_B128 ? 128 : 32;
    const uint8_t *abytes = act + t->k;
    float acc = 0.0f;
    for (int64_t b0 = 0; b0 < t->k; b0 += wb) {
        const int64_t end = t->k - b0 < wb ? t->k : b0 + wb;
        float p = 0.0f;
        for (int64_t k = b0; k < end; k++) p += dsv4_e4m3_to_f32(act[k]) * weight_value(t->fmt, w, k);
        acc += p * (dsv4_e8m0_to_f32(abytes[b0 / ag]) * dsv4_e8m0_to_f32(s[(b0 / wb) * t->ss1]));
    }
    return acc;
}

static void shape(dsv4_linear_format fmt, int64_t m, int *mt, int *nt)
{
    *mt = 1;
    *nt = 1;
}

static void tile(const dsv4_lin_tile *t, float out[DSV4_LIN_MT][DSV4_LIN_NT])
{
    for (int i = 0; i < t->mt; i++)
        for (int j = 0; j < t->nt; j++)
            out[i][j] = t->fmt <= DSV4_LINEAR_FP4 ? dot_quantized(t, t->act[i], t->w[j], t->s[j])
                                                  : dot_float(t, t->act[i], t->w[j]);
}

const dsv4_cpu_linear_kernels dsv4_cpu_linear_kernels_scalar = {0, shape, tile, NULL, NULL, NULL};
