/* Random linear-layer weights of every format in the checkpoint layout, with their float64
 * values: the cases of tests/c/test_linear.c, shared with tests/c/test_backend_ops.c. */
#ifndef DSV4_TEST_LINEAR_CASES_H
#define DSV4_TEST_LINEAR_CASES_H

#include "test_util.h"

/* Tolerance relative to sum_k |x_k w_k|: only the fp32 summation order differs. 96 ulps of
 * sum|terms| (~5.7e-6): the fp32 errors of these random-sign sums are a random walk of a few ulps
 * of sum|terms| whatever K (tests/python/test_linear.py says why); measured at most 12 ulps
 * (7.1e-7) over 38 seeds of this test, all formats and ISA paths: a margin of ~8x. */
#define TOL (96 * 0x1p-24)

typedef struct wcase {
    dsv4_linear_format fmt;
    int64_t n, k;
    uint8_t *w;       /* codes / BF16 / F32 bytes, rows of wld elements */
    int64_t wld;      /* row stride (elements) */
    uint8_t *s;       /* scale bytes, [srows, scols] row-major (transposed when s_t) */
    int64_t srows, scols;
    int s_t;          /* scale stored as the contiguous transpose (view strides (1, srows)) */
    double *wq;       /* dequantized [n, k] */
} wcase;

static inline size_t wsize(dsv4_linear_format f) { return f == DSV4_LINEAR_F32 ? 4 : f == DSV4_LINEAR_BF16 ? 2 : 1; }
static inline int64_t wcols(const wcase *c) { return c->fmt == DSV4_LINEAR_FP4 ? c->k / 2 : c->k; }

static inline double e8m0(uint8_t b) { return b == 255 ? NAN : ldexp(1.0, b - 127); }

static inline void wcase_make(wcase *c, dsv4_linear_format fmt, int64_t n, int64_t k, int pad, int s_t)
{
    memset(c, 0, sizeof *c);
    c->fmt = fmt;
    c->n = n;
    c->k = k;
    c->wld = wcols(c) + (pad ? 8 : 0);
    c->w = calloc((size_t)(n * c->wld), wsize(fmt));
    const int b128 = fmt == DSV4_LINEAR_FP8_B128;
    c->srows = b128 ? (n + 127) / 128 : n;
    c->scols = b128 ? (k + 127) / 128 : k / 32;
    c->s = malloc((size_t)(c->srows * c->scols) + 1);
    c->s_t = s_t;
    uint8_t *logical = malloc((size_t)(c->srows * c->scols) + 1); /* [srows, scols] */
    for (int64_t i = 0; i < c->srows * c->scols; i++) logical[i] = (uint8_t)(112 + test_rand_u64() % 16);
    for (int64_t i = 0; i < c->srows; i++)
        for (int64_t j = 0; j < c->scols; j++) c->s[s_t ? j * c->srows + i : i * c->scols + j] = logical[i * c->scols + j];
    c->wq = malloc(sizeof(double) * (size_t)(n * k));
    for (int64_t r = 0; r < n; r++)
        for (int64_t j = 0; j < k; j++) {
            double v;
            if (fmt == DSV4_LINEAR_F32) {
                float f = 0.05f * test_randn();
                memcpy(c->w + (size_t)(r * c->wld + j) * 4, &f, 4);
                v = f;
            } else if (fmt == DSV4_LINEAR_BF16) {
                uint16_t h = dsv4_bf16_encode(0.05f * test_randn());
                memcpy(c->w + (size_t)(r * c->wld + j) * 2, &h, 2);
                v = dsv4_bf16_decode(h);
            } else {
                const int64_t si = b128 ? (r / 128) * c->scols + j / 128 : r * c->scols + j / 32;
                uint8_t code = (uint8_t)(test_rand_u64() & 0xFF);
                if (fmt == DSV4_LINEAR_FP4) {
                    code &= 0xF;
                    uint8_t *b = c->w + r * c->wld + j / 2;
                    *b = (uint8_t)((j & 1) ? ((*b & 0x0F) | (code << 4)) : ((*b & 0xF0) | code));
                    v = dsv4_e2m1_decode(code);
                } else {
                    if ((code & 0x7F) == 0x7F) code ^= 1; /* no NaN */
                    c->w[r * c->wld + j] = code;
                    v = dsv4_e4m3_decode(code);
                }
                v *= e8m0(logical[si]);
            }
            c->wq[r * k + j] = v;
        }
    free(logical);
}

static inline void wcase_free(wcase *c)
{
    free(c->w);
    free(c->s);
    free(c->wq);
}

static const dsv4_dtype wdtype[DSV4_LINEAR_FORMAT_COUNT] = {DSV4_F8_E4M3, DSV4_F8_E4M3, DSV4_FP4X2, DSV4_BF16, DSV4_F32};

/* Views of the whole weight and its scale (canonical or transposed storage). */
static inline void wcase_views(const wcase *c, dsv4_tensor *w, dsv4_tensor *s)
{
    const int64_t ws[2] = {c->n, wcols(c)}, wst[2] = {c->wld, 1};
    dsv4_tensor_init_strided(w, c->w, wdtype[c->fmt], 2, ws, wst);
    const int64_t ss[2] = {c->srows, c->scols};
    const int64_t sst[2] = {c->s_t ? 1 : c->scols, c->s_t ? c->srows : 1};
    dsv4_tensor_init_strided(s, c->s, DSV4_E8M0, 2, ss, sst);
}

#endif
