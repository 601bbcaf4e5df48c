/* AVX2 linear kernels (no BF16 dot products): weights decoded to fp32 (exact), the staged
 * activations are F32 (exact; read by the FMAs straight from memory), fp32 FMAs; each 32- or
 * 128-element block sum is scaled by its scale with one FMA. FP8 and MXFP8: activation codes
 * times 2^119 and weight codes times 2^-120, the block sum scaled by 2 * s_x * s_w; FP4: x_q * s_x
 * and the E2M1 values, scaled by s_w (see stage_row). Tiles of MT activation
 * rows x NT weight rows (1 x 8 at M = 1, up to 4 x 2 for batches, see shape) decode each 32
 * weights of a row once for the MT rows; per output the operation sequence is fixed, so results
 * do not depend on the tiling, the other rows of the call or the thread count. */
#include "backends/cpu/cpu_formats.h"
#include "backends/cpu/cpu_linear.h"
#include "backends/cpu/simd_avx2.h"
#include "formats/codec.h"

#include <math.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))
/* Software prefetch of each weight row, as in linear_avx512.c: far ahead into L2 (running on into
 * the rows of the next tile), near ahead into L1, once per 64-byte line. */
#define PREFETCH_FAR 8192
#define PREFETCH_NEAR 512

static inline __m256 bf16x8(const uint16_t *p)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* 8 BF16 or F32 weights (the unscaled formats) as fp32. */
static inline __m256 plain8(dsv4_linear_format fmt, const void *w, int64_t k)
{
    return fmt == DSV4_LINEAR_BF16 ? bf16x8((const uint16_t *)w + k) : _mm256_loadu_ps((const float *)w + k);
}

static float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Weight decoding with in-lane moves only (vpshufb, 128-bit unpacks, shifts: two a cycle on the
 * cores measured, where lane-crossing ones, vpmovzx/sx, vextracti128, vpermps, take 1-1.5 cycles):
 * E4M3 codes straight into fp32 bit patterns (e4m3x32), E2M1 values into FP16 words, then F16C
 * (vcvtph2ps, exact; fp4x32). */
typedef struct dec_consts {
    __m128i nib, lut;
    __m256i place[2], keep;
} dec_consts;

INLINE dec_consts dec_init(void)
{
    dec_consts d;
    d.nib = _mm_set1_epi8(0x0F);
    /* codes 8e..8e+3 (128-bit lane 0) and 8e+4..8e+7 (lane 1) of 16 to the top bytes of the words */
    for (int e = 0; e < 2; e++)
        d.place[e] = _mm256_setr_epi8(-1, -1, -1, (char)(8 * e), -1, -1, -1, (char)(8 * e + 1), -1, -1, -1,
                                      (char)(8 * e + 2), -1, -1, -1, (char)(8 * e + 3), -1, -1, -1, (char)(8 * e + 4),
                                      -1, -1, -1, (char)(8 * e + 5), -1, -1, -1, (char)(8 * e + 6), -1, -1, -1,
                                      (char)(8 * e + 7));
    d.keep = _mm256_set1_epi32((int)0x87F00000);
    /* E2M1 nibble -> the high byte of its FP16 value (the low byte is zero for all of them) */
    d.lut = _mm_setr_epi8(0x00, 0x38, 0x3C, 0x3E, 0x40, 0x42, 0x44, 0x46, (char)0x80, (char)0xB8, (char)0xBC,
                          (char)0xBE, (char)0xC0, (char)0xC2, (char)0xC4, (char)0xC6);
    return d;
}

/* 32 E4M3 codes -> four vectors of 8 values times 2^-120, in K order: 16 codes in both 128-bit
 * lanes (vbroadcasti128), a vpshufb puts 8 of them in the top bytes of the 32-bit words, an
 * arithmetic shift right by 4 keeps the sign in bit 31 and puts the 4-bit exponent in the low end
 * of fp32's 8-bit field and the 3-bit mantissa on top of fp32's; clearing the sign's copies in bits
 * 27-30 leaves the fp32 number code * 2^-120 (subnormal codes land on fp32 subnormals, also
 * exactly). 3 single-uop instructions per 8 weights, no conversion. NaN codes (magnitude 0x7F)
 * would come out finite: *mag keeps the largest magnitude byte of each position for the caller. */
INLINE void e4m3x32(const dec_consts *d, const uint8_t *p, __m256 v[4], __m256i *mag)
{
    *mag = _mm256_max_epu8(*mag, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)p), _mm256_set1_epi8(0x7F)));
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(p + 16 * h)));
#pragma GCC unroll 2
        for (int e = 0; e < 2; e++)
            v[2 * h + e] = _mm256_castsi256_ps(
                _mm256_and_si256(_mm256_srai_epi32(_mm256_shuffle_epi8(b, d->place[e]), 4), d->keep));
    }
}

/* 16 packed bytes (32 E2M1 values) -> four vectors of 8 values: each nibble's FP16 high byte from a
 * 16-entry table (vpshufb), widened to words, the low nibbles (elements 0, 2, ..., 30) giving the
 * first two vectors and the high ones (1, 3, ..., 31) the last two: the order the FP4 staging
 * puts its activations in (fp4_pos), so no interleaving is needed. */
INLINE void fp4x32(const dec_consts *d, const uint8_t *p, __m256 v[4])
{
    const __m128i z = _mm_setzero_si128(), c = _mm_loadu_si128((const __m128i *)p);
    const __m128i lo = _mm_shuffle_epi8(d->lut, _mm_and_si128(c, d->nib));                     /* even elements */
    const __m128i hi = _mm_shuffle_epi8(d->lut, _mm_and_si128(_mm_srli_epi16(c, 4), d->nib)); /* odd elements */
    v[0] = _mm256_cvtph_ps(_mm_unpacklo_epi8(z, lo));
    v[1] = _mm256_cvtph_ps(_mm_unpackhi_epi8(z, lo));
    v[2] = _mm256_cvtph_ps(_mm_unpacklo_epi8(z, hi));
    v[3] = _mm256_cvtph_ps(_mm_unpackhi_epi8(z, hi));
}

/* Prefetch of the weight line at byte ob of each row (see PREFETCH_FAR); prefetches never fault. */
INLINE void prefetch_rows(const dsv4_lin_tile *t, const int NT, int64_t ob, int64_t row_bytes)
{
    const int64_t far = ob + PREFETCH_FAR < row_bytes ? PREFETCH_FAR : PREFETCH_FAR + t->w_next - row_bytes;
#pragma GCC unroll 8
    for (int j = 0; j < NT; j++) {
        _mm_prefetch((const char *)t->w[j] + ob + far, _MM_HINT_T1);
        _mm_prefetch((const char *)t->w[j] + ob + PREFETCH_NEAR, _MM_HINT_T0);
    }
}

#define KC 1024 /* K elements whose weight scales are decoded at once (multiple of 128) */

/* The staged activation row (dsv4_lin_row_bytes): the values, K rounded up to 128 floats (zeros
 * past K), then the scales s_x of its groups as floats, then its E4M3 codes (one byte each, from
 * the (K + 31) / 32-th float on), from which a staged call rearranges the values for another
 * format. */
static inline const float *row_scales(const float *row, int64_t k) { return row + (k + 127) / 128 * 128; }
static inline uint8_t *row_codes(float *row, int64_t k) { return (uint8_t *)(row + (k + 127) / 128 * 128 + (k + 31) / 32); }

#define ACT_UP 0x1p119f /* FP8 and MXFP8 staged values: code * 2^119 (448 * 2^119 < 2^128) */

/* Weight scales of blocks [b0, b0 + nb) of the NT rows as fp32 (contiguous scale rows decoded
 * eight at a time, v256_e8m0_decode). */
INLINE void chunk_scales(const dsv4_lin_tile *t, const int NT, int64_t b0, int nb, float sw[DSV4_LIN_NT][KC / 32])
{
    for (int j = 0; j < NT; j++) {
        const uint8_t *s = t->s[j] + b0 * t->ss1;
        int b = 0;
        if (t->ss1 == 1)
            for (; b + 8 <= nb; b += 8) _mm256_storeu_ps(sw[j] + b, v256_e8m0_decode(s + b));
        for (; b < nb; b++) sw[j][b] = dsv4_e8m0_to_f32(s[b * t->ss1]);
    }
}

/* FP8 and MXFP8 (one activation group per weight block): the scale of block b0 + b of output
 * (i, j), sc[i][j][b] = 2 * (s_x * s_w), the product rounded as the contract's (s_x * s_w), the 2
 * undoing the 2^119 * 2^-120 of the staged values: (sum * 2^-1) * (2 * s) is then sum * s. When a
 * product s_x * s_w of the chunk is 2^127 (2 * s would overflow) the scales stay s_x * s_w and
 * the block sums are doubled first (returns 1). */
INLINE int pair_scales(const float *const *act, int64_t k, const int MT, const int NT, int64_t b0, int nb,
                       const float sw[DSV4_LIN_NT][KC / 32], float sc[DSV4_LIN_MT][DSV4_LIN_NT][KC / 32])
{
    const __m256 lim = _mm256_set1_ps(0x1p127f), two = _mm256_set1_ps(2.0f);
    __m256 bigv = _mm256_setzero_ps();
    int big = 0;
    for (int i = 0; i < MT; i++) {
        const float *sx = row_scales(act[i], k) + b0;
        for (int j = 0; j < NT; j++) {
            int b = 0;
            for (; b + 8 <= nb; b += 8) {
                const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(sx + b), _mm256_loadu_ps(sw[j] + b));
                bigv = _mm256_or_ps(bigv, _mm256_cmp_ps(v, lim, _CMP_EQ_OQ));
                _mm256_storeu_ps(sc[i][j] + b, v);
            }
            for (; b < nb; b++) {
                sc[i][j][b] = sx[b] * sw[j][b];
                big |= sc[i][j][b] == 0x1p127f;
            }
        }
    }
    big |= !_mm256_testz_ps(bigv, bigv);
    if (!big)
        for (int i = 0; i < MT; i++)
            for (int j = 0; j < NT; j++) {
                int b = 0;
                for (; b + 8 <= nb; b += 8) _mm256_storeu_ps(sc[i][j] + b, _mm256_mul_ps(_mm256_loadu_ps(sc[i][j] + b), two));
                for (; b < nb; b++) sc[i][j][b] *= 2.0f;
            }
    return big;
}

/* Whether a row of n E4M3 codes holds a NaN code (magnitude 0x7F): the rare path of a tile whose
 * codes held one somewhere. */
static int row_has_nan(const uint8_t *w, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if ((w[i] & 0x7F) == 0x7F) return 1;
    return 0;
}

/* The block-scaled formats (FP8 128-blocks, MXFP8, FP4 32-blocks), MT activation rows x NT weight
 * rows: each 32 weights of a row are decoded once for the MT rows; per output, one 8-lane partial
 * sum per block over K in order (lane l: elements l, l + 8, l + 16, l + 24 of each 32; FP4: 2l,
 * 16 + 2l, 2l + 1, 17 + 2l, see fp4x32), scaled by the block's scale into
 * an 8-lane total, whatever the tile shape (FP8 and MXFP8 partial sums are taken at 2^-1
 * scale: see pair_scales). The totals live in memory (one load and store per block), the partial sums in
 * registers; a NaN code anywhere in a weight row makes its outputs NaN (one running maximum of
 * the code magnitudes for the whole tile, the rows looked at again only when it finds one). */
INLINE void tile_blocks(const dsv4_lin_tile *t, float out[DSV4_LIN_MT][DSV4_LIN_NT], const int MT, const int NT,
                        const dsv4_linear_format fmt)
{
    const int fp4 = fmt == DSV4_LINEAR_FP4;
    const int64_t wb = fmt == DSV4_LINEAR_FP8_B128 ? 128 : 32, k = t->k;
    const int64_t row_bytes = fp4 ? k / 2 : k, line = fp4 ? 128 : 64; /* elements per 64-byte line */
    const float *const *act = (const float *const *)t->act;
    const uint8_t *const *w = (const uint8_t *const *)t->w;
    const dec_consts dc = dec_init();
    float acc[DSV4_LIN_MT][DSV4_LIN_NT][8] __attribute__((aligned(32)));
#pragma GCC unroll 8
    for (int i = 0; i < MT; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NT; j++) _mm256_store_ps(acc[i][j], _mm256_setzero_ps());
    float sw[DSV4_LIN_NT][KC / 32], sc[DSV4_LIN_MT][DSV4_LIN_NT][KC / 32]; /* sc: FP8 and MXFP8 */
    __m256i mag = _mm256_setzero_si256(); /* FP8: the largest code magnitudes of the tile (0x7F: a NaN) */
    for (int64_t c0 = 0; c0 < k; c0 += KC) {
        const int64_t ce = k - c0 < KC ? k : c0 + KC;
        const int nb = (int)((ce - c0 + wb - 1) / wb);
        chunk_scales(t, NT, c0 / wb, nb, sw);
        const int big = fp4 ? 0 : pair_scales(act, k, MT, NT, c0 / wb, nb, sw, sc);
        const __m256 up = _mm256_set1_ps(2.0f);
        for (int bi = 0; bi < nb; bi++) {
            const int64_t b0 = c0 + (int64_t)bi * wb;
            const int64_t end = wb == 32 || ce - b0 >= wb ? b0 + wb : ce; /* a 32-block: one step */
            __m256 p[DSV4_LIN_MT][DSV4_LIN_NT];
#pragma GCC unroll 8
            for (int i = 0; i < MT; i++)
#pragma GCC unroll 8
                for (int j = 0; j < NT; j++) p[i][j] = _mm256_setzero_ps();
            for (int64_t kk = b0; kk < end; kk += 32) {
                if (kk % line == 0) prefetch_rows(t, NT, fp4 ? kk / 2 : kk, row_bytes);
#pragma GCC unroll 8
                for (int j = 0; j < NT; j++) {
                    __m256 v[4];
                    if (fp4)
                        fp4x32(&dc, w[j] + kk / 2, v);
                    else
                        e4m3x32(&dc, w[j] + kk, v, &mag);
#pragma GCC unroll 8
                    for (int q = 0; q < 4; q++)
#pragma GCC unroll 8
                        for (int i = 0; i < MT; i++)
                            p[i][j] = _mm256_fmadd_ps(_mm256_loadu_ps(act[i] + kk + 8 * q), v[q], p[i][j]);
                }
            }
#pragma GCC unroll 8
            for (int j = 0; j < NT; j++) {
                const __m256 s4 = _mm256_set1_ps(sw[j][bi]);
#pragma GCC unroll 8
                for (int i = 0; i < MT; i++) {
                    const __m256 v = fp4 || !big ? p[i][j] : _mm256_mul_ps(p[i][j], up);
                    const __m256 s = fp4 ? s4 : _mm256_set1_ps(sc[i][j][bi]);
                    _mm256_store_ps(acc[i][j], _mm256_fmadd_ps(v, s, _mm256_load_ps(acc[i][j])));
                }
            }
        }
    }
    const __m256i isnan = _mm256_cmpeq_epi8(mag, _mm256_set1_epi8(0x7F));
    const int tile_nan = !fp4 && !_mm256_testz_si256(isnan, isnan);
#pragma GCC unroll 8
    for (int j = 0; j < NT; j++) {
        const int has_nan = tile_nan && row_has_nan(w[j], k);
#pragma GCC unroll 8
        for (int i = 0; i < MT; i++) /* a NaN weight makes the row's products, so the output, NaN */
            out[i][j] = has_nan ? NAN : hsum(_mm256_load_ps(acc[i][j]));
    }
}

/* BF16 / F32 weights, MT x NT: the x rows (BF16 or F32) read once per tile; per output one 8-lane
 * sum over K in order, as dot() does. */
static inline __attribute__((always_inline)) void tile_plain(const dsv4_lin_tile *t,
                                                              float out[DSV4_LIN_MT][DSV4_LIN_NT], const int MT,
                                                              const int NT)
{
    __m256 acc[DSV4_LIN_MT][DSV4_LIN_NT];
    for (int i = 0; i < MT; i++)
        for (int j = 0; j < NT; j++) acc[i][j] = _mm256_setzero_ps();
    for (int64_t k = 0; k < t->k; k += 8) {
        __m256 x[DSV4_LIN_MT];
        for (int i = 0; i < MT; i++)
            x[i] = t->x_bf16 ? bf16x8((const uint16_t *)t->act[i] + k) : _mm256_loadu_ps((const float *)t->act[i] + k);
        for (int j = 0; j < NT; j++) {
            const __m256 w = plain8(t->fmt, t->w[j], k);
            for (int i = 0; i < MT; i++) acc[i][j] = _mm256_fmadd_ps(x[i], w, acc[i][j]);
        }
    }
    for (int i = 0; i < MT; i++)
        for (int j = 0; j < NT; j++) out[i][j] = hsum(acc[i][j]);
}

/* The tile shapes of the block-scaled formats, MT x NT. */
#define SHAPES(X) X(1, 8) X(1, 4) X(2, 4) X(3, 2) X(4, 2)

#define DEFINE_TILES(MT, NT)                                                                                  \
    static void tile_##MT##x##NT(const dsv4_lin_tile *t, float out[DSV4_LIN_MT][DSV4_LIN_NT])                 \
    {                                                                                                         \
        switch (t->fmt) {                                                                                     \
        case DSV4_LINEAR_FP8_B128: tile_blocks(t, out, MT, NT, DSV4_LINEAR_FP8_B128); break;                  \
        case DSV4_LINEAR_MXFP8: tile_blocks(t, out, MT, NT, DSV4_LINEAR_MXFP8); break;                        \
        default: tile_blocks(t, out, MT, NT, DSV4_LINEAR_FP4); break;                                         \
        }                                                                                                     \
    }
SHAPES(DEFINE_TILES)

/* Block-scaled formats: M = 1 one x eight weight rows (eight independent FMA chains; FP4, whose
 * decoding is the heavier part, one x four), M = 2 two x four, M = 3 three x two, then four x two:
 * the best of the shapes measured on the 2-core EPYC (BENCHMARKS.md, AVX2 path). BF16 / F32
 * weights: one x four, or two x two. */
static void shape(dsv4_linear_format fmt, int64_t m, int *mt, int *nt)
{
    if (fmt > DSV4_LINEAR_FP4) {
        *mt = m > 1 ? 2 : 1;
        *nt = m > 1 ? 2 : 4;
        return;
    }
    *mt = m < 4 ? (int)m : 4;
    *nt = m == 1 ? (fmt == DSV4_LINEAR_FP4 ? 4 : 8) : m == 2 ? 4 : 2;
}

static void tile(const dsv4_lin_tile *t, float out[DSV4_LIN_MT][DSV4_LIN_NT])
{
    if (t->fmt > DSV4_LINEAR_FP4) {
        t->mt == 1 ? tile_plain(t, out, 1, 4) : tile_plain(t, out, 2, 2);
        return;
    }
    switch (t->mt * 10 + t->nt) {
    case 18: tile_1x8(t, out); break;
    case 14: tile_1x4(t, out); break;
    case 24: tile_2x4(t, out); break;
    case 32: tile_3x2(t, out); break;
    default: tile_4x2(t, out);
    }
}

/* Where element e of a 32-block sits in an FP4 staged row (fp4x32's order): the even elements,
 * then the odd ones. */
static inline int fp4_pos(int e) { return (e & 1) * 16 + e / 2; }

/* The values of a staged row from its codes and scales, arranged for fmt: e4m3(code) * s_x for FP4
 * (the E2M1 products stay at their own scale), each 32 in fp4_pos order; e4m3(code) * 2^119 for
 * FP8 and MXFP8, in K order (s_x goes into the block scale, pair_scales); both exact. Zeros from
 * K to the next multiple of 128. */
static void stage_values(dsv4_linear_format fmt, float *row, int64_t k)
{
    const int64_t kp = (k + 127) / 128 * 128, g = fmt == DSV4_LINEAR_MXFP8 ? 32 : 128;
    const float *sx = row_scales(row, k);
    const uint8_t *codes = row_codes(row, k);
    for (int64_t i = 0; i < k; i += 32) {
        const __m256 s = _mm256_set1_ps(fmt == DSV4_LINEAR_FP4 ? sx[i / g] : ACT_UP);
        float v[32];
        for (int q = 0; q < 32; q += 8) _mm256_storeu_ps(v + q, _mm256_mul_ps(v256_e4m3_decode(codes + i + q), s));
        if (fmt == DSV4_LINEAR_FP4)
            for (int e = 0; e < 32; e++) row[i + fp4_pos(e)] = v[e];
        else
            memcpy(row + i, v, sizeof v);
    }
    for (int64_t i = k; i < kp; i += 8) _mm256_storeu_ps(row + i, _mm256_setzero_ps());
}

/* One row of x quantized group by group (act128 or mx32) with the AVX2 format kernels, as
 * linear_cpu.c's generic staging does, into codes and scales, then its values for fmt. */
static void stage_row(dsv4_linear_format fmt, const void *x, int x_bf16, int64_t k, uint16_t *dst)
{
    const dsv4_cpu_format_kernels *fk = &dsv4_cpu_format_kernels_avx2;
    const dsv4_qrule rule = fmt == DSV4_LINEAR_MXFP8 ? DSV4_QRULE_MX32 : DSV4_QRULE_ACT128;
    const dsv4_qrule_params *p = &dsv4_qrules[rule];
    float *row = (float *)dst, *sx = (float *)row_scales(row, k);
    uint8_t *codes = row_codes(row, k);
    float buf[128];
    for (int64_t k0 = 0, j = 0; k0 < k; k0 += p->group, j++) {
        const int len = (int)(k - k0 < p->group ? k - k0 : p->group);
        if (x_bf16)
            fk->decode_span(DSV4_FMT_BF16, (const uint16_t *)x + k0, len, buf);
        else
            memcpy(buf, (const float *)x + k0, (size_t)len * sizeof(float));
        uint8_t byte;
        if (len == p->group)
            fk->quantize_row(rule, buf, len, codes + k0, &byte);
        else /* the short last act128 group of a K with an edge block */
            byte = dsv4_quantize_group(p, buf, len, codes + k0);
        sx[j] = dsv4_e8m0_to_f32(byte);
    }
    stage_values(fmt, row, k);
}

/* A staged act128 row (FP8_B128 <-> FP4): the values again from the codes and scales. */
static void rearrange_row(dsv4_linear_format from, dsv4_linear_format to, uint16_t *row, int64_t k)
{
    (void)from;
    stage_values(to, (float *)row, k);
}

const dsv4_cpu_linear_kernels dsv4_cpu_linear_kernels_avx2 = {4, shape, tile, NULL, stage_row, rearrange_row};
