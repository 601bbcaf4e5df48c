/* AVX-512 linear kernels (needs AVX512-BF16). FP8 and FP4 weight codes convert exactly to BF16
 * (byte tables built from formats/codec.h), the staged activations are exact BF16 (code times
 * its power-of-two scale), so vdpbf16ps forms exact products summed in fp32; each block sum
 * (32 elements for MXFP8 and FP4, 128 for FP8_B128) is then scaled by its weight scale with one
 * fp32 FMA. vdpbf16ps flushes subnormals, but none occurs: activation scales are >= 2^-33 and
 * weight codes unscaled, so every product and partial sum is a multiple of 2^-51 (or zero).
 * BF16/F32 weights: fp32 FMAs on the unrounded x.
 *
 * The weight bytes are turned into BF16 words with in-lane unpacks, so the words of a step come
 * out in a fixed permutation of K; the staged activations are stored in the same permutation
 * (arrange_row), and since every fp32 lane of a dot product then holds elements of one scale
 * block only, a block's scale is one vector (FP8: 64 elements per step, lanes 0-7 = first block
 * of 32, 8-15 = second; FP4: 128 elements per step, lanes 4L..4L+3 = block L).
 *
 * Per output element the sequence of vector operations is fixed (16 lanes over K in order,
 * then _mm512_reduce_add_ps), whatever the tile shape, so results do not depend on the tiling
 * or the thread count. */
#include "backends/cpu/cpu_linear.h"
#include "backends/cpu/simd_avx512.h"
#include "formats/codec.h"

#include <pthread.h>

#define INLINE static inline __attribute__((always_inline))
#define KC 1024 /* K elements whose weight scales are decoded at once (multiple of 128) */
/* Software prefetch of each weight row: far ahead into L2 (running on into the rows of the next
 * tile), near ahead into L1. Measured on the 2-core EPYC: +15-25 % over the hardware prefetchers
 * alone at M = 1; 8192/512 was the best of the pairs tried (2048-8192 / 256-1024). */
#define PREFETCH_FAR 8192
#define PREFETCH_NEAR 512

/* ---- tables (from the codec) ---------------------------------------------------------------- */
static uint8_t fp8_lo[128], fp8_hi[128], fp4_lo[64], fp4_hi[64];
static uint16_t perm_fp8[2][32], perm_fp4[4][32];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void init_tables(void)
{
    for (int c = 0; c < 128; c++) { /* E4M3 magnitude -> BF16 low / high byte */
        const uint16_t b = dsv4_bf16_from_f32(dsv4_e4m3_to_f32((uint8_t)c));
        fp8_lo[c] = (uint8_t)(b & 0xFF);
        fp8_hi[c] = (uint8_t)(b >> 8);
    }
    for (int c = 0; c < 64; c++) { /* E2M1 nibble -> BF16 bytes, repeated every 16 entries */
        const uint16_t b = dsv4_bf16_from_f32(dsv4_e2m1_to_f32((uint8_t)(c & 15)));
        fp4_lo[c] = (uint8_t)(b & 0xFF);
        fp4_hi[c] = (uint8_t)(b >> 8);
    }
    /* Word 8L+i of step vector h holds element
     *   FP8 (64 per step):  16L + 8h + i            (unpack lo/hi of the bytes)
     *   FP4 (128 per step): 32L + 16(h&1) + 2i + (h>>1)  (low/high nibbles, unpack lo/hi);
     * perm_fp4 is the position inside the 32 elements of lane L. */
    for (int h = 0; h < 4; h++)
        for (int lane = 0; lane < 4; lane++)
            for (int i = 0; i < 8; i++) {
                if (h < 2) perm_fp8[h][8 * lane + i] = (uint16_t)(16 * lane + 8 * h + i);
                perm_fp4[h][8 * lane + i] = (uint16_t)(16 * (h & 1) + 2 * i + (h >> 1));
            }
}

typedef struct tables {
    __m512i lo0, lo1, hi0, hi1, sign, f4lo, f4hi;
} tables;

static void load_tables(tables *T)
{
    pthread_once(&tables_once, init_tables);
    T->lo0 = _mm512_loadu_si512(fp8_lo);
    T->lo1 = _mm512_loadu_si512(fp8_lo + 64);
    T->hi0 = _mm512_loadu_si512(fp8_hi);
    T->hi1 = _mm512_loadu_si512(fp8_hi + 64);
    T->sign = _mm512_set1_epi8((char)0x80);
    T->f4lo = _mm512_loadu_si512(fp4_lo);
    T->f4hi = _mm512_loadu_si512(fp4_hi);
}

/* ---- weight decoding ------------------------------------------------------------------------ */
/* 64 E4M3 codes -> 64 BF16 words in the step permutation. */
INLINE void dec_fp8(const tables *T, __m512i c, __m512i W[2])
{
    __m512i hi = _mm512_permutex2var_epi8(T->hi0, c, T->hi1); /* index bits 0-6: the magnitude */
    hi = _mm512_ternarylogic_epi32(hi, c, T->sign, 0xF8);      /* hi | (c & 0x80): the sign */
    const __m512i lo = _mm512_permutex2var_epi8(T->lo0, c, T->lo1);
    W[0] = _mm512_unpacklo_epi8(lo, hi);
    W[1] = _mm512_unpackhi_epi8(lo, hi);
}

/* 64 packed bytes (128 E2M1 values) -> 128 BF16 words in the step permutation. The byte tables
 * repeat every 16 entries, so vpermb's 6-bit index needs no masking of the other nibble. */
INLINE void dec_fp4(const tables *T, __m512i c, __m512i W[4])
{
    const __m512i hn = _mm512_srli_epi16(c, 4); /* high nibble in bits 0-3 of each byte */
    const __m512i llo = _mm512_permutexvar_epi8(c, T->f4lo), lhi = _mm512_permutexvar_epi8(c, T->f4hi);
    const __m512i hlo = _mm512_permutexvar_epi8(hn, T->f4lo), hhi = _mm512_permutexvar_epi8(hn, T->f4hi);
    W[0] = _mm512_unpacklo_epi8(llo, lhi);
    W[1] = _mm512_unpackhi_epi8(llo, lhi);
    W[2] = _mm512_unpacklo_epi8(hlo, hhi);
    W[3] = _mm512_unpackhi_epi8(hlo, hhi);
}

INLINE __m512 dp(__m512 acc, __m512i w, const uint16_t *a)
{
    return _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)_mm512_loadu_si512(a));
}

static inline __mmask64 low_bytes(int64_t n) { return n >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << n) - 1); }

/* Weight scales of one chunk of K: sw[i][j] for block j of the chunk starting at block b0,
 * zeros after the nb blocks (steps past K then add 0 * 0). */
#define SW_LEN (KC / 32 + 16)
INLINE void chunk_scales(const dsv4_lin_tile *t, const int NT, int64_t b0, int nb, float sw[][SW_LEN])
{
    uint8_t bytes[KC / 32];
    for (int i = 0; i < NT; i++) {
        const uint8_t *s = t->s[i] + b0 * t->ss1;
        if (t->ss1 != 1) { /* a strided view, e.g. the transposed [K/32, N] buffer */
            for (int j = 0; j < nb; j++) bytes[j] = s[j * t->ss1];
            s = bytes;
        }
        for (int j = 0; j < nb; j += 16) {
            const __mmask64 m = low_bytes(nb - j);
            const __m512i b = _mm512_cvtepu8_epi32(_mm512_castsi512_si128(_mm512_maskz_loadu_epi8(m, s + j)));
            _mm512_storeu_ps(&sw[i][j], v512_e8m0_decode_epi32(b));
        }
        _mm512_storeu_ps(&sw[i][nb], _mm512_setzero_ps());
    }
}

/* Prefetch of the cache line at byte ob of each weight row: PREFETCH_FAR ahead into L2 (running
 * on into the rows of the next tile near the end of the rows) and PREFETCH_NEAR ahead into L1.
 * Prefetches never fault, so addresses past the weights are harmless. */
INLINE void prefetch_rows(const dsv4_lin_tile *t, const int NT, const void *const *w, int64_t ob, int64_t row_bytes)
{
    const int64_t far = ob + PREFETCH_FAR < row_bytes ? PREFETCH_FAR : PREFETCH_FAR + t->w_next - row_bytes;
#pragma GCC unroll 8
    for (int i = 0; i < NT; i++) {
        _mm_prefetch((const char *)w[i] + ob + far, _MM_HINT_T1);
        _mm_prefetch((const char *)w[i] + ob + PREFETCH_NEAR, _MM_HINT_T0);
    }
}

INLINE void reduce_out(const int MT, const int NT, __m512 acc[DSV4_LIN_MT][DSV4_LIN_NT],
                       float out[DSV4_LIN_MT][DSV4_LIN_NT])
{
#pragma GCC unroll 8
    for (int m = 0; m < MT; m++)
#pragma GCC unroll 8
        for (int i = 0; i < NT; i++) out[m][i] = _mm512_reduce_add_ps(acc[m][i]);
}

/* ---- quantized weights ------------------------------------------------------------------------
 * fmt FP8_B128: steps of 64, two per block of 128 (the last block may be short);
 * MXFP8: steps of 64 = two blocks of 32; FP4: steps of 128 (64 bytes) = four blocks of 32. */
INLINE void tile_q(const dsv4_lin_tile *t, float out[DSV4_LIN_MT][DSV4_LIN_NT], const int MT, const int NT,
                   const dsv4_linear_format fmt)
{
    tables T;
    load_tables(&T);
    const int fp4 = fmt == DSV4_LINEAR_FP4, b128 = fmt == DSV4_LINEAR_FP8_B128;
    const int step = fp4 ? 128 : 64, bs = b128 ? 128 : 32;
    const int64_t k = t->k;
    const uint16_t *act[DSV4_LIN_MT];
    const uint8_t *w[DSV4_LIN_NT];
#pragma GCC unroll 8
    for (int m = 0; m < MT; m++) act[m] = t->act[m];
#pragma GCC unroll 8
    for (int i = 0; i < NT; i++) w[i] = t->w[i];
    const __m512i idx_mx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i idx_fp4 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    __m512 acc[DSV4_LIN_MT][DSV4_LIN_NT], p[DSV4_LIN_MT][DSV4_LIN_NT];
#pragma GCC unroll 8
    for (int m = 0; m < MT; m++)
#pragma GCC unroll 8
        for (int i = 0; i < NT; i++) acc[m][i] = p[m][i] = _mm512_setzero_ps();
    float sw[DSV4_LIN_NT][SW_LEN];
    const int64_t row_bytes = fp4 ? k / 2 : k;
    for (int64_t k0 = 0; k0 < k; k0 += KC) {
        const int64_t kc = k - k0 < KC ? k - k0 : KC;
        chunk_scales(t, NT, k0 / bs, (int)((kc + bs - 1) / bs), sw);
        for (int64_t kk = 0; kk < kc; kk += step) {
            const __mmask64 mask = low_bytes(fp4 ? (kc - kk) / 2 : kc - kk);
            const int64_t off = k0 + kk, ob = fp4 ? off / 2 : off; /* element, byte offset in the row */
            __m512i W[DSV4_LIN_NT][4];
            __m512 S[DSV4_LIN_NT];
            prefetch_rows(t, NT, t->w, ob, row_bytes);
#pragma GCC unroll 8
            for (int i = 0; i < NT; i++) {
                const __m512i c = _mm512_maskz_loadu_epi8(mask, w[i] + ob);
                if (fp4) {
                    dec_fp4(&T, c, W[i]);
                    S[i] = _mm512_permutexvar_ps(idx_fp4, _mm512_castps128_ps512(_mm_loadu_ps(&sw[i][kk / 32])));
                } else {
                    dec_fp8(&T, c, W[i]);
                    if (!b128) /* lanes 0-7: first block of 32, 8-15: second */
                        S[i] = _mm512_permutexvar_ps(
                            idx_mx, _mm512_castpd_ps(_mm512_broadcastsd_pd(_mm_load_sd((const double *)&sw[i][kk / 32]))));
                }
            }
#pragma GCC unroll 8
            for (int m = 0; m < MT; m++) {
                const uint16_t *a = act[m] + off;
#pragma GCC unroll 8
                for (int i = 0; i < NT; i++) {
                    __m512 d = dp(b128 ? p[m][i] : _mm512_setzero_ps(), W[i][0], a);
                    d = dp(d, W[i][1], a + 32);
                    if (fp4) d = dp(dp(d, W[i][2], a + 64), W[i][3], a + 96);
                    if (b128)
                        p[m][i] = d;
                    else
                        acc[m][i] = _mm512_fmadd_ps(d, S[i], acc[m][i]);
                }
            }
            if (b128 && ((kk & 64) || kk + 64 >= kc)) { /* end of a block of 128 (or of K) */
#pragma GCC unroll 8
                for (int m = 0; m < MT; m++)
#pragma GCC unroll 8
                    for (int i = 0; i < NT; i++) {
                        acc[m][i] = _mm512_fmadd_ps(p[m][i], _mm512_set1_ps(sw[i][kk / 128]), acc[m][i]);
                        p[m][i] = _mm512_setzero_ps();
                    }
            }
        }
    }
    reduce_out(MT, NT, acc, out);
}

/* A staged row (kp values in K order) put in the step permutation, in place. */
static void arrange_row(dsv4_linear_format fmt, uint16_t *row, int64_t kp)
{
    if (fmt == DSV4_LINEAR_FP4) {
        const __m512i i0 = _mm512_loadu_si512(perm_fp4[0]), i1 = _mm512_loadu_si512(perm_fp4[1]);
        const __m512i i2 = _mm512_loadu_si512(perm_fp4[2]), i3 = _mm512_loadu_si512(perm_fp4[3]);
        for (int64_t s = 0; s < kp; s += 128) {
            __m512i z0 = _mm512_setzero_si512(), z1 = z0, z2 = z0, z3 = z0;
            for (int lane = 0; lane < 4; lane++) { /* lane L of each output comes from elements 32L.. */
                const __m512i src = _mm512_loadu_si512(row + s + 32 * lane);
                const __mmask32 lm = (__mmask32)0xFFu << (8 * lane);
                z0 = _mm512_mask_permutexvar_epi16(z0, lm, i0, src);
                z1 = _mm512_mask_permutexvar_epi16(z1, lm, i1, src);
                z2 = _mm512_mask_permutexvar_epi16(z2, lm, i2, src);
                z3 = _mm512_mask_permutexvar_epi16(z3, lm, i3, src);
            }
            _mm512_storeu_si512(row + s, z0);
            _mm512_storeu_si512(row + s + 32, z1);
            _mm512_storeu_si512(row + s + 64, z2);
            _mm512_storeu_si512(row + s + 96, z3);
        }
        return;
    }
    const __m512i i0 = _mm512_loadu_si512(perm_fp8[0]), i1 = _mm512_loadu_si512(perm_fp8[1]);
    for (int64_t s = 0; s < kp; s += 64) {
        const __m512i n0 = _mm512_loadu_si512(row + s), n1 = _mm512_loadu_si512(row + s + 32);
        _mm512_storeu_si512(row + s, _mm512_permutex2var_epi16(n0, i0, n1));
        _mm512_storeu_si512(row + s + 32, _mm512_permutex2var_epi16(n0, i1, n1));
    }
}

/* One row of x quantized per act128 / mx32 group (the rules of formats/codec.h, the codecs of
 * simd_avx512.h), dequantized to BF16 (exact), zero-padded and arranged. */
static void stage_row(dsv4_linear_format fmt, const void *x, int x_bf16, int64_t k, uint16_t *dst)
{
    pthread_once(&tables_once, init_tables);
    const dsv4_qrule_params *p = &dsv4_qrules[fmt == DSV4_LINEAR_MXFP8 ? DSV4_QRULE_MX32 : DSV4_QRULE_ACT128];
    const __m512 absmask = _mm512_castsi512_ps(V512_I(0x7FFFFFFF));
    const int64_t kp = (k + 127) / 128 * 128;
    for (int64_t k0 = 0; k0 < k; k0 += p->group) {
        const int n = (int)(k - k0 < p->group ? k - k0 : p->group) / 16; /* a multiple of 32 values */
        __m512 v[8], m = _mm512_setzero_ps();
        for (int j = 0; j < n; j++) {
            v[j] = x_bf16 ? v512_bf16_decode((const uint16_t *)x + k0 + 16 * j) : _mm512_loadu_ps((const float *)x + k0 + 16 * j);
            m = _mm512_max_ps(_mm512_and_ps(v[j], absmask), m); /* NaN elements do not raise amax */
        }
        const int e = dsv4_qrule_exponent(p, _mm512_reduce_max_ps(m));
        const __m512 inv = _mm512_set1_ps(dsv4_pow2f(-e)), s = _mm512_set1_ps(dsv4_e8m0_to_f32((uint8_t)(e + 127)));
        for (int j = 0; j < n; j++) {
            /* x_q * s_x has at most 4 significant bits: its BF16 is its top half, exactly */
            const __m512 q = _mm512_mul_ps(v512_e4m3_round(_mm512_mul_ps(v[j], inv)), s);
            _mm256_storeu_si256((__m256i *)(dst + k0 + 16 * j),
                                _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(q), 16)));
        }
    }
    for (int64_t j = k; j < kp; j += 32) _mm512_storeu_si512(dst + j, _mm512_setzero_si512());
    arrange_row(fmt, dst, kp);
}

/* ---- BF16 / F32 weights: fp32 FMAs, two accumulators (elements 0-15 and 16-31 of each 32) -- */
INLINE __m512 load_f32(const void *p, int64_t k, const int bf16)
{
    return bf16 ? v512_bf16_decode((const uint16_t *)p + k) : _mm512_loadu_ps((const float *)p + k);
}

INLINE void tile_float(const dsv4_lin_tile *t, float out[DSV4_LIN_MT][DSV4_LIN_NT], const int MT, const int NT,
                       const int w_bf16, const int x_bf16)
{
    __m512 acc0[DSV4_LIN_MT][DSV4_LIN_NT], acc1[DSV4_LIN_MT][DSV4_LIN_NT];
#pragma GCC unroll 8
    for (int m = 0; m < MT; m++)
#pragma GCC unroll 8
        for (int i = 0; i < NT; i++) acc0[m][i] = acc1[m][i] = _mm512_setzero_ps();
    const int64_t row_bytes = t->k * (w_bf16 ? 2 : 4);
    for (int64_t kk = 0; kk < t->k; kk += 32) {
        prefetch_rows(t, NT, t->w, kk * (w_bf16 ? 2 : 4), row_bytes);
        if (!w_bf16) prefetch_rows(t, NT, t->w, kk * 4 + 64, row_bytes); /* 128 bytes a step */
        __m512 W0[DSV4_LIN_NT], W1[DSV4_LIN_NT];
#pragma GCC unroll 8
        for (int i = 0; i < NT; i++) {
            W0[i] = load_f32(t->w[i], kk, w_bf16);
            W1[i] = load_f32(t->w[i], kk + 16, w_bf16);
        }
#pragma GCC unroll 8
        for (int m = 0; m < MT; m++) {
            const __m512 x0 = load_f32(t->act[m], kk, x_bf16), x1 = load_f32(t->act[m], kk + 16, x_bf16);
#pragma GCC unroll 8
            for (int i = 0; i < NT; i++) {
                acc0[m][i] = _mm512_fmadd_ps(W0[i], x0, acc0[m][i]);
                acc1[m][i] = _mm512_fmadd_ps(W1[i], x1, acc1[m][i]);
            }
        }
    }
#pragma GCC unroll 8
    for (int m = 0; m < MT; m++)
#pragma GCC unroll 8
        for (int i = 0; i < NT; i++) acc0[m][i] = _mm512_add_ps(acc0[m][i], acc1[m][i]);
    reduce_out(MT, NT, acc0, out);
}

/* ---- shapes and dispatch ----------------------------------------------------------------- */
#define SHAPES(X) X(1, 4) X(2, 4) X(4, 2)

#define DEFINE_TILES(MT, NT)                                                                                  \
    static void tile_##MT##x##NT(const dsv4_lin_tile *t, float out[DSV4_LIN_MT][DSV4_LIN_NT])                 \
    {                                                                                                         \
        switch (t->fmt) {                                                                                     \
        case DSV4_LINEAR_FP8_B128: tile_q(t, out, MT, NT, DSV4_LINEAR_FP8_B128); break;                       \
        case DSV4_LINEAR_MXFP8: tile_q(t, out, MT, NT, DSV4_LINEAR_MXFP8); break;                             \
        case DSV4_LINEAR_FP4: tile_q(t, out, MT, NT, DSV4_LINEAR_FP4); break;                                 \
        case DSV4_LINEAR_BF16:                                                                                \
            if (t->x_bf16) tile_float(t, out, MT, NT, 1, 1);                                                  \
            else tile_float(t, out, MT, NT, 1, 0);                                                            \
            break;                                                                                            \
        default:                                                                                              \
            if (t->x_bf16) tile_float(t, out, MT, NT, 0, 1);                                                  \
            else tile_float(t, out, MT, NT, 0, 0);                                                            \
        }                                                                                                     \
    }
SHAPES(DEFINE_TILES)

static void shape(dsv4_linear_format fmt, int64_t m, int *mt, int *nt)
{
    *mt = m >= 3 ? 4 : (int)m; /* 3 rows: a 4-row tile with one repeated */
    *nt = *mt == 4 ? 2 : 4;
}

static void tile(const dsv4_lin_tile *t, float out[DSV4_LIN_MT][DSV4_LIN_NT])
{
    if (t->mt == 1) tile_1x4(t, out);
    else if (t->mt == 2) tile_2x4(t, out);
    else tile_4x2(t, out);
}

/* dst[i] = bf16(e4m3(codes[i]) * scale); len is a multiple of 32. */
static void stage_group(const uint8_t *codes, int len, float scale, void *dst)
{
    const __m512 s = _mm512_set1_ps(scale);
    for (int i = 0; i < len; i += 16)
        _mm256_storeu_si256((__m256i *)((uint16_t *)dst + i), v512_bf16_encode(_mm512_mul_ps(v512_e4m3_decode(codes + i), s)));
}

/* Element held at position p (< 128) of a block of 128 staged values arranged for fmt (see
 * arrange_row): FP8 in steps of 64, FP4 in one step of 128. */
static int arranged_element(dsv4_linear_format fmt, int p)
{
    if (fmt == DSV4_LINEAR_FP4) return 32 * (p % 32 / 8) + perm_fp4[p / 32][p % 32];
    return 64 * (p / 64) + perm_fp8[p % 64 / 32][p % 32];
}

/* An act128 staged row arranged for `from` rewritten in the arrangement of `to` (the FP8_B128 and
 * FP4 stagings differ only there): both are permutations inside each block of 128. */
static void rearrange_row(dsv4_linear_format from, dsv4_linear_format to, uint16_t *row, int64_t k)
{
    if ((from == DSV4_LINEAR_FP4) == (to == DSV4_LINEAR_FP4)) return;
    pthread_once(&tables_once, init_tables);
    const int64_t kp = (k + 127) / 128 * 128;
    for (int64_t s = 0; s < kp; s += 128) {
        uint16_t nat[128];
        for (int p = 0; p < 128; p++) nat[arranged_element(from, p)] = row[s + p];
        for (int p = 0; p < 128; p++) row[s + p] = nat[arranged_element(to, p)];
    }
}

const dsv4_cpu_linear_kernels dsv4_cpu_linear_kernels_avx512 = {2, shape, tile, stage_group, stage_row, rearrange_row};
