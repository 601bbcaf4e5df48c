/* AVX2 linear kernels (no BF16 dot products): weights decoded to fp32 (exact), the staged
 * activations are F32 (exact; read by the FMAs straight from memory), fp32 FMAs; each 32- or
 * 128-element block sum is scaled by its scale with one FMA: activation codes times 2^119, weight
 * codes times 2^-120 (FP8, MXFP8) or E2M1 values times 2^-126 (FP4), the block sum scaled by
 * 2 * s_x * s_w or 2^7 * s_x * s_w (see pair_scales). Tiles of MT activation
 * rows x NT weight rows (1 x 4 at M = 1, up to 4 x 2 for batches, see shape) decode each 32
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

/* Weight decoding with in-lane moves only (vpshufb, shifts, logic: two a cycle or more on the cores
 * measured, where lane-crossing ones, vpmovzx/sx, vextracti128, vpermps, take 1-1.5 cycles, and
 * vcvtph2ps 1): codes go straight into fp32 bit patterns, with no conversion. E4M3 codes
 * (e4m3_quarter) and E2M1 ones (fp4x32) both land at a fixed power of two of their value. */
typedef struct dec_consts {
    __m256i pair, keep, keep4;
} dec_consts;

INLINE dec_consts dec_init(void)
{
    dec_consts d;
    /* bytes l and 8 + l (l = 0..3 in 128-bit lane 0, 4..7 in lane 1) of 16 to bytes 3 and 1 of word l */
    d.pair = _mm256_setr_epi8(-1, 8, -1, 0, -1, 9, -1, 1, -1, 10, -1, 2, -1, 11, -1, 3, -1, 12, -1, 4, -1, 13, -1, 5, -1, 14,
                              -1, 6, -1, 15, -1, 7);
    d.keep = _mm256_set1_epi32((int)0x87F00000);
    d.keep4 = _mm256_set1_epi32((int)0x81C00000);
    return d;
}

/* Quarter q of 32 E4M3 codes (elements 8q .. 8q + 7) -> 8 values times 2^-120, in K order: the
 * 16 codes of half q / 2 in both 128-bit lanes (vbroadcasti128), a vpshufb puts codes l and 8 + l
 * (l = 0..3 in 128-bit lane 0, 4..7 in lane 1) in bytes 3 and 1 of word l (dec_consts.pair, shared
 * with the E2M1 decoding), a 16-bit arithmetic shift right by 4 keeps each code's sign in the top
 * bit of its 16-bit half and puts the 4-bit exponent in the low end of fp32's 8-bit field and the
 * 3-bit mantissa on top of fp32's (for the bottom half once a 32-bit shift left by 16 has lifted
 * it: the odd quarter); clearing the sign's copies in bits 27-30 and the bits below 20 leaves the
 * fp32 number code * 2^-120 (subnormal codes land on fp32 subnormals, also exactly). The two
 * quarters of a half share the vpshufb and the shift (the compiler computes them once): 12
 * single-uop instructions per 32 weights, 6 of them shifts / shuffles (one vpshufb per quarter
 * took 8, and 5-9 % longer at M = 1 from L2 on the 2-core EPYC), no conversion. NaN codes
 * (magnitude 0x7F) would come out finite: e4m3_mag keeps the largest magnitude byte of each
 * position for the caller. */
INLINE __m256 e4m3_quarter(const dec_consts *d, const uint8_t *p, const int q)
{
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(p + 16 * (q / 2))));
    const __m256i w = _mm256_srai_epi16(_mm256_shuffle_epi8(b, d->pair), 4);
    return _mm256_castsi256_ps(_mm256_and_si256(q % 2 ? _mm256_slli_epi32(w, 16) : w, d->keep));
}

/* The running maximum *mag of the code magnitudes of 32 E4M3 codes, byte by byte (0x7F: a NaN). */
INLINE void e4m3_mag(const uint8_t *p, __m256i *mag)
{
    *mag = _mm256_max_epu8(*mag, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)p), _mm256_set1_epi8(0x7F)));
}

/* 32 E4M3 codes -> four vectors of 8 values times 2^-120 (e4m3_quarter: one vbroadcasti128,
 * vpshufb and 16-bit shift per half), and their magnitudes into *mag. */
INLINE void e4m3x32(const dec_consts *d, const uint8_t *p, __m256 v[4], __m256i *mag)
{
    e4m3_mag(p, mag);
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) v[q] = e4m3_quarter(d, p, q);
}

/* 16 packed bytes (32 E2M1 values, element 2b in the low nibble of byte b, 2b + 1 in the high one)
 * -> four vectors of 8 values times 2^-126, the even elements (low nibbles) giving the first two
 * vectors and the odd ones the last two: the order the FP4 staging puts its activations in
 * (fp4_pos), so no interleaving is needed. The bytes in both 128-bit lanes (vbroadcasti128), one
 * vpshufb puts bytes l and 8 + l in bytes 3 and 1 of word l; a high nibble (s e e m) is then at the
 * top of each 16-bit half, a low one after a 16-bit shift left by 4; a 16-bit arithmetic shift right
 * by 6 keeps the sign in the half's top bit and puts e e in the low end of fp32's exponent field and
 * m on top of its mantissa (the bottom half lifted by a 32-bit shift left by 16), and clearing the
 * other bits leaves value * 2^-126 (the subnormal E2M1 0.5 on the fp32 subnormal 2^-127, exactly).
 * 10 single-uop instructions per 32 weights (6 shifts / shuffles), where one vpshufb per 8 values
 * took 12 and the FP16 path (a table, 128-bit unpacks, F16C) 17. */
INLINE void fp4x32(const dec_consts *d, const uint8_t *p, __m256 v[4])
{
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    const __m256i w = _mm256_shuffle_epi8(b, d->pair);
    const __m256i hi = _mm256_srai_epi16(w, 6), lo = _mm256_srai_epi16(_mm256_slli_epi16(w, 4), 6);
    v[0] = _mm256_castsi256_ps(_mm256_and_si256(lo, d->keep4));
    v[1] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(lo, 16), d->keep4));
    v[2] = _mm256_castsi256_ps(_mm256_and_si256(hi, d->keep4));
    v[3] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(hi, 16), d->keep4));
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

#define ACT_UP 0x1p119f /* staged values: code * 2^119 (448 * 2^119 < 2^128) */

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

/* FP4 rows whose group scales all lie in [2^-109, 1] are staged with s_x folded into the values
 * (x_q * s_x * 2^119, exact, and their products with the decoded E2M1 values stay normal:
 * stage_values), marked by the sign bit of the row's first scale; the others as x_q * 2^119. */
#define FOLD_MIN 0x1p-109f
static inline int folded(const float *row, int64_t k) { return signbit(row_scales(row, k)[0]) != 0; }

/* The scale of block b0 + b of output (i, j), sc[i][j][b] = up * (s_x * s_w), the product rounded
 * as the contract's (s_x * s_w), up undoing the powers of two of the staged values and the decoded
 * weights: FP8 and MXFP8 2 (2^119 * 2^-120; one activation group per weight block), FP4 2^7
 * (2^119 * 2^-126; activation group b / 4 of 128; s_x = 1 for a folded row): (sum / up) * (up * s)
 * is then sum * s, both scalings exact. shared (FP4 tiles of folded rows only): the scales of row
 * 0 serve every row. When a product s_x * s_w of the chunk is 2^128 / up or more (up * s would
 * overflow) the scales stay s_x * s_w and the block sums are multiplied by up first (returns 1). */
INLINE int pair_scales(const float *const *act, int64_t k, const int MT, const int NT, const int fp4, int shared,
                       int64_t b0, int nb, const float sw[DSV4_LIN_NT][KC / 32],
                       float sc[DSV4_LIN_MT][DSV4_LIN_NT][KC / 32])
{
    const float upf = fp4 ? 0x1p7f : 2.0f;
    const __m256 lim = _mm256_set1_ps(fp4 ? 0x1p121f : 0x1p127f), up = _mm256_set1_ps(upf);
    const int rows = shared ? 1 : MT;
    __m256 bigv = _mm256_setzero_ps();
    int big = 0;
    for (int i = 0; i < rows; i++) {
        const float *sx = row_scales(act[i], k);
        const int one = fp4 && folded(act[i], k);
        for (int j = 0; j < NT; j++) {
            int b = 0;
            for (; b + 8 <= nb; b += 8) {
                const int64_t g = fp4 ? (b0 + b) / 4 : b0 + b; /* fp4: b0 and b are multiples of 8 */
                const __m256 x = one   ? _mm256_set1_ps(1.0f)
                                 : fp4 ? _mm256_set_m128(_mm_set1_ps(sx[g + 1]), _mm_set1_ps(sx[g]))
                                       : _mm256_loadu_ps(sx + g);
                const __m256 v = _mm256_mul_ps(x, _mm256_loadu_ps(sw[j] + b));
                bigv = _mm256_or_ps(bigv, _mm256_cmp_ps(v, lim, _CMP_GE_OQ));
                _mm256_storeu_ps(sc[i][j] + b, v);
            }
            for (; b < nb; b++) {
                sc[i][j][b] = (one ? 1.0f : sx[fp4 ? (b0 + b) / 4 : b0 + b]) * sw[j][b];
                big |= sc[i][j][b] >= (fp4 ? 0x1p121f : 0x1p127f);
            }
        }
    }
    big |= !_mm256_testz_ps(bigv, bigv);
    if (!big)
        for (int i = 0; i < rows; i++)
            for (int j = 0; j < NT; j++) {
                int b = 0;
                for (; b + 8 <= nb; b += 8) _mm256_storeu_ps(sc[i][j] + b, _mm256_mul_ps(_mm256_loadu_ps(sc[i][j] + b), up));
                for (; b < nb; b++) sc[i][j][b] *= upf;
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

/* One MXFP8 block (32 elements at b0) of an MT x NT tile, MT > 1, into the partial sums p: the same FMAs,
 * in the same order per output, as the other formats' loop in tile_blocks, taken quarter by
 * quarter so that each x vector is loaded once for the NT rows and each weight vector decoded once
 * for the MT rows: with the MT x vectors of the quarter in registers (tiles up to 2 x 4), else the
 * NT weight vectors (4 x 2: its partial sums, x vectors and constants would fill the 16 registers).
 * Measured on the 2-core EPYC (the runs of 2026-12-03 in BENCHMARKS.md, "Linear layers vs ggml"):
 * 2-8 % faster than that loop for MXFP8 at M = 8 and 32, where FP8 (a 128-block: the sums scaled
 * every fourth step) and FP4 gained nothing; not used at M = 1, where a 1 x 8 tile measured 7 %
 * slower with it. */
INLINE void mx_step(const dsv4_lin_tile *t, const uint8_t *const *w, const float *const *act, const dec_consts *dc,
                    int64_t b0, const int MT, const int NT, __m256 p[DSV4_LIN_MT][DSV4_LIN_NT], __m256i *mag)
{
    const int xs = MT + MT * NT + 4 < 16;
    if (b0 % 64 == 0) prefetch_rows(t, NT, b0, t->k);
    __m256i m = _mm256_setzero_si256(); /* one update of the tile's maximum per block */
#pragma GCC unroll 8
    for (int j = 0; j < NT; j++) e4m3_mag(w[j] + b0, &m);
    *mag = _mm256_max_epu8(*mag, m);
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) {
        __m256 x[DSV4_LIN_MT], v[DSV4_LIN_NT];
        if (xs) {
#pragma GCC unroll 8
            for (int i = 0; i < MT; i++) {
                x[i] = _mm256_loadu_ps(act[i] + b0 + 8 * q);
                __asm__("" : "+x"(x[i])); /* one load, not an FMA operand from memory per weight row */
            }
        }
#pragma GCC unroll 8
        for (int j = 0; j < NT; j++) {
            v[j] = e4m3_quarter(dc, w[j] + b0, q);
            if (xs) {
#pragma GCC unroll 8
                for (int i = 0; i < MT; i++) p[i][j] = _mm256_fmadd_ps(x[i], v[j], p[i][j]);
            }
        }
        if (!xs) {
#pragma GCC unroll 8
            for (int i = 0; i < MT; i++) {
                __m256 xi = _mm256_loadu_ps(act[i] + b0 + 8 * q);
                __asm__("" : "+x"(xi));
#pragma GCC unroll 8
                for (int j = 0; j < NT; j++) p[i][j] = _mm256_fmadd_ps(xi, v[j], p[i][j]);
            }
        }
    }
}

/* The block-scaled formats (FP8 128-blocks, MXFP8, FP4 32-blocks), MT activation rows x NT weight
 * rows: each 32 weights of a row are decoded once for the MT rows; per output, one 8-lane partial
 * sum per block over K in order (lane l: elements l, l + 8, l + 16, l + 24 of each 32; FP4: 2l,
 * 16 + 2l, 2l + 1, 17 + 2l, see fp4x32), taken at the scale 1 / up of pair_scales and scaled by
 * the block's scale into an 8-lane total, whatever the tile shape. The partial sums live in
 * registers, the totals too in tiles of up to 4 outputs (else in memory, one load and store per
 * block: the same operations); a NaN code anywhere in a weight row makes its outputs NaN (one
 * running maximum of the code magnitudes for the whole tile, the rows looked at again only when it
 * finds one). */
INLINE void tile_blocks(const dsv4_lin_tile *t, float out[DSV4_LIN_MT][DSV4_LIN_NT], const int MT, const int NT,
                        const dsv4_linear_format fmt)
{
    const int fp4 = fmt == DSV4_LINEAR_FP4, regs = MT * NT <= 4;
    const int64_t wb = fmt == DSV4_LINEAR_FP8_B128 ? 128 : 32, k = t->k;
    const int64_t row_bytes = fp4 ? k / 2 : k, line = fp4 ? 128 : 64; /* elements per 64-byte line */
    const float *const *act = (const float *const *)t->act;
    const uint8_t *const *w = (const uint8_t *const *)t->w;
    const dec_consts dc = dec_init();
    float acc[DSV4_LIN_MT][DSV4_LIN_NT][8] __attribute__((aligned(32)));
    __m256 racc[DSV4_LIN_MT][DSV4_LIN_NT]; /* the totals when regs */
#pragma GCC unroll 8
    for (int i = 0; i < MT; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NT; j++) {
            if (regs)
                racc[i][j] = _mm256_setzero_ps();
            else
                _mm256_store_ps(acc[i][j], _mm256_setzero_ps());
        }
    float sw[DSV4_LIN_NT][KC / 32], sc[DSV4_LIN_MT][DSV4_LIN_NT][KC / 32];
    __m256i mag = _mm256_setzero_si256(); /* FP8: the largest code magnitudes of the tile (0x7F: a NaN) */
    int shared = fp4; /* FP4 rows all folded: one scale per weight row and block (pair_scales) */
#pragma GCC unroll 8
    for (int i = 0; i < MT; i++) shared &= folded(act[i], k);
    for (int64_t c0 = 0; c0 < k; c0 += KC) {
        const int64_t ce = k - c0 < KC ? k : c0 + KC;
        const int nb = (int)((ce - c0 + wb - 1) / wb);
        chunk_scales(t, NT, c0 / wb, nb, sw);
        const int big = pair_scales(act, k, MT, NT, fp4, shared, c0 / wb, nb, sw, sc);
        const __m256 up = _mm256_set1_ps(fp4 ? 0x1p7f : 2.0f);
        for (int bi = 0; bi < nb; bi++) {
            const int64_t b0 = c0 + (int64_t)bi * wb;
            const int64_t end = wb == 32 || ce - b0 >= wb ? b0 + wb : ce; /* a 32-block: one step */
            __m256 p[DSV4_LIN_MT][DSV4_LIN_NT];
#pragma GCC unroll 8
            for (int i = 0; i < MT; i++)
#pragma GCC unroll 8
                for (int j = 0; j < NT; j++) p[i][j] = _mm256_setzero_ps();
            if (fmt == DSV4_LINEAR_MXFP8 && MT > 1)
                mx_step(t, w, act, &dc, b0, MT, NT, p, &mag);
            else
                for (int64_t kk = b0; kk < end; kk += 32) {
                    if (kk % line == 0) prefetch_rows(t, NT, fp4 ? kk / 2 : kk, row_bytes);
#pragma GCC unroll 8
                    for (int j = 0; j < NT; j++) {
                        __m256 v[4];
                        if (fp4)
                            fp4x32(&dc, w[j] + kk / 2, v);
                        else
                            e4m3x32(&dc, w[j] + kk, v, &mag);
                        /* with the totals in registers, the x row read again for each weight row
                         * (FMAs from memory): an empty asm hides that it was read already */
                        const float *x0 = act[0] + kk;
                        if (regs) __asm__ volatile("" : "+r"(x0));
#pragma GCC unroll 8
                        for (int q = 0; q < 4; q++)
#pragma GCC unroll 8
                            for (int i = 0; i < MT; i++)
                                p[i][j] = _mm256_fmadd_ps(_mm256_loadu_ps((regs && i == 0 ? x0 : act[i] + kk) + 8 * q), v[q], p[i][j]);
                    }
                }
#pragma GCC unroll 8
            for (int j = 0; j < NT; j++)
#pragma GCC unroll 8
                for (int i = 0; i < MT; i++) {
                    const __m256 v = !big ? p[i][j] : _mm256_mul_ps(p[i][j], up);
                    const __m256 s = _mm256_set1_ps(sc[shared ? 0 : i][j][bi]);
                    if (regs)
                        racc[i][j] = _mm256_fmadd_ps(v, s, racc[i][j]);
                    else
                        _mm256_store_ps(acc[i][j], _mm256_fmadd_ps(v, s, _mm256_load_ps(acc[i][j])));
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
            out[i][j] = has_nan ? NAN : hsum(regs ? racc[i][j] : _mm256_load_ps(acc[i][j]));
    }
}

/* BF16 / F32 weights, MT x NT: per output one 8-lane sum over K in order, as dot() does, the
 * MT * NT sums in registers. Each step of 8 reads every x row and weight row of the tile once:
 * the x rows (BF16 or F32) kept in registers while the weight rows stream past them, or, where
 * the registers do not hold both (4 x 3), the weight rows kept and the x rows streamed. */
INLINE void tile_plain(const dsv4_lin_tile *t, float out[DSV4_LIN_MT][DSV4_LIN_NT], const int MT, const int NT)
{
    const int keep_x = MT * NT + MT + 1 <= 16;
    __m256 acc[DSV4_LIN_MT][DSV4_LIN_NT];
#pragma GCC unroll 8
    for (int i = 0; i < MT; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NT; j++) acc[i][j] = _mm256_setzero_ps();
    for (int64_t k = 0; k < t->k; k += 8) {
        __m256 x[DSV4_LIN_MT], w[DSV4_LIN_NT];
        if (keep_x) {
#pragma GCC unroll 8
            for (int i = 0; i < MT; i++)
                x[i] = t->x_bf16 ? bf16x8((const uint16_t *)t->act[i] + k) : _mm256_loadu_ps((const float *)t->act[i] + k);
#pragma GCC unroll 8
            for (int j = 0; j < NT; j++) {
                const __m256 wj = plain8(t->fmt, t->w[j], k);
#pragma GCC unroll 8
                for (int i = 0; i < MT; i++) acc[i][j] = _mm256_fmadd_ps(x[i], wj, acc[i][j]);
            }
        } else {
#pragma GCC unroll 8
            for (int j = 0; j < NT; j++) w[j] = plain8(t->fmt, t->w[j], k);
#pragma GCC unroll 8
            for (int i = 0; i < MT; i++) {
                const __m256 xi = t->x_bf16 ? bf16x8((const uint16_t *)t->act[i] + k)
                                            : _mm256_loadu_ps((const float *)t->act[i] + k);
#pragma GCC unroll 8
                for (int j = 0; j < NT; j++) acc[i][j] = _mm256_fmadd_ps(xi, w[j], acc[i][j]);
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MT; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NT; j++) out[i][j] = hsum(acc[i][j]);
}

/* The BF16 / F32 tile shapes, MT x NT (one function per weight format and x type). */
#define PLAIN_SHAPES(X) X(1, 4) X(2, 6) X(3, 4) X(4, 3)

#define DEFINE_PLAIN(MT, NT)                                                                                  \
    static void plain_##MT##x##NT(const dsv4_lin_tile *t, float out[DSV4_LIN_MT][DSV4_LIN_NT])                \
    {                                                                                                         \
        tile_plain(t, out, MT, NT);                                                                           \
    }
PLAIN_SHAPES(DEFINE_PLAIN)

/* The tile shapes of the block-scaled formats, MT x NT. */
#define SHAPES(X) X(1, 4) X(2, 4) X(3, 2) X(4, 2)

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

/* Block-scaled formats: M = 1 one x four (the totals in registers; from memory one x eight, with
 * eight weight rows streaming and its totals in memory, took 25-35 % longer for FP8 and MXFP8 on
 * the 2-core EPYC, where both ran at the same speed from L2: the runs of 2026-12-03 in
 * BENCHMARKS.md, "Linear layers vs ggml"), M = 2 two x four, M = 3 three x two, then four x
 * two: the best of the shapes measured on that machine (BENCHMARKS.md, AVX2 path). BF16 / F32
 * weights: one x four, two x six, three x four, then four x three (12 sums in registers). */
static void shape(dsv4_linear_format fmt, int64_t m, int *mt, int *nt)
{
    if (fmt > DSV4_LINEAR_FP4) {
        *mt = m < 4 ? (int)m : 4;
        *nt = m == 1 ? 4 : m == 2 ? 6 : m == 3 ? 4 : 3;
        return;
    }
    *mt = m < 4 ? (int)m : 4;
    *nt = m == 1 || m == 2 ? 4 : 2;
}

static void tile(const dsv4_lin_tile *t, float out[DSV4_LIN_MT][DSV4_LIN_NT])
{
    if (t->fmt > DSV4_LINEAR_FP4) {
        switch (t->mt) {
        case 1: plain_1x4(t, out); break;
        case 2: plain_2x6(t, out); break;
        case 3: plain_3x4(t, out); break;
        default: plain_4x3(t, out);
        }
        return;
    }
    switch (t->mt * 10 + t->nt) {
    case 14: tile_1x4(t, out); break;
    case 24: tile_2x4(t, out); break;
    case 32: tile_3x2(t, out); break;
    default: tile_4x2(t, out);
    }
}

/* Where element e of a 32-block sits in an FP4 staged row (fp4x32's order): the even elements,
 * then the odd ones. */
static inline int fp4_pos(int e) { return (e & 1) * 16 + e / 2; }

/* The values of a staged row from its codes (and for a folded FP4 row its scales), arranged for
 * fmt: e4m3(code) * 2^119, times s_x for folded FP4 rows (see folded; s_x otherwise goes into the
 * block scale, pair_scales), exact; in K order for FP8 and MXFP8, each 32 in fp4_pos order for FP4.
 * Zeros from K to the next multiple of 128. */
static void stage_values(dsv4_linear_format fmt, float *row, int64_t k)
{
    const int64_t kp = (k + 127) / 128 * 128;
    const uint8_t *codes = row_codes(row, k);
    float *sx = (float *)row_scales(row, k);
    int fold = fmt == DSV4_LINEAR_FP4;
    sx[0] = fabsf(sx[0]);
    for (int64_t g = 0; g < (k + 127) / 128; g++) fold &= sx[g] >= FOLD_MIN && sx[g] <= 1.0f; /* NaN: no */
    for (int64_t i = 0; i < k; i += 32) {
        const __m256 s = _mm256_set1_ps(fold ? ACT_UP * sx[i / 128] : ACT_UP);
        float v[32];
        for (int q = 0; q < 32; q += 8) _mm256_storeu_ps(v + q, _mm256_mul_ps(v256_e4m3_decode(codes + i + q), s));
        if (fmt == DSV4_LINEAR_FP4)
            for (int e = 0; e < 32; e++) row[i + fp4_pos(e)] = v[e];
        else
            memcpy(row + i, v, sizeof v);
    }
    for (int64_t i = k; i < kp; i += 8) _mm256_storeu_ps(row + i, _mm256_setzero_ps());
    if (fold) sx[0] = -sx[0];
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
