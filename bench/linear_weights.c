/* The linear shapes of a V4-Flash block (docs/model.md §9.2) and their weights as distinct copies,
 * shared by `dsv4 bench linear` and the ggml peer driver (bench/ggml_peer/). */
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Shapes that occur more than once are listed once: the compressors' wkv/wgate (r = 4) have wq_a's
 * shape, the indexer's compressor the router gate's. The LM head (1 GiB a BF16 copy) is apart,
 * bench_lshape_head: the benches that take it bound its formats by its size. */
const bench_lshape bench_lshapes[] = {
    {"wq_a 1024x4096", 1024, 4096, 1, DSV4_LINEAR_FP8_B128},
    {"wq_b 32768x1024", 32768, 1024, 1, DSV4_LINEAR_FP8_B128},
    {"wkv 512x4096", 512, 4096, 1, DSV4_LINEAR_FP8_B128},
    {"wo_a 8x(1024x4096)", 1024, 4096, 8, DSV4_LINEAR_FP8_B128},
    {"wo_b 4096x8192", 4096, 8192, 1, DSV4_LINEAR_FP8_B128},
    {"idx wq_b 8192x1024", 8192, 1024, 1, DSV4_LINEAR_FP8_B128},
    {"ffn w1/w3 2048x4096", 2048, 4096, 1, DSV4_LINEAR_FP4}, /* routed FP4; the shared expert's FP8 */
    {"ffn w2 4096x2048", 4096, 2048, 1, DSV4_LINEAR_FP4},
    {"gate 256x4096", 256, 4096, 1, DSV4_LINEAR_BF16},
};
const int bench_nlshapes = (int)(sizeof bench_lshapes / sizeof bench_lshapes[0]);
const bench_lshape bench_lshape_head = {"head 129280x4096", 129280, 4096, 1, DSV4_LINEAR_BF16};

void bench_wset_init(bench_wset *ws, const bench_lshape *c, dsv4_linear_format fmt, size_t min_total)
{
    ws->fmt = fmt;
    ws->rows = c->n * c->groups;
    ws->k = c->k;
    ws->wcols = fmt == DSV4_LINEAR_FP4 ? c->k / 2 : c->k;
    const int b128 = fmt == DSV4_LINEAR_FP8_B128;
    ws->srows = b128 ? (ws->rows + 127) / 128 : ws->rows;
    ws->scols = b128 ? (c->k + 127) / 128 : c->k / 32;
    const size_t es = fmt == DSV4_LINEAR_BF16 ? 2 : fmt == DSV4_LINEAR_F32 ? 4 : 1;
    ws->wbytes = (size_t)(ws->rows * ws->wcols) * es;
    ws->sbytes = fmt <= DSV4_LINEAR_FP4 ? (size_t)(ws->srows * ws->scols) : 0;
    const size_t one = ws->wbytes + ws->sbytes;
    ws->copies = (int)((min_total + one - 1) / one);
    if (ws->copies < 2) ws->copies = 2;
    const size_t nw = ws->wbytes * (size_t)ws->copies, ns = ws->sbytes * (size_t)ws->copies;
    ws->w = bench_alloc_or_die(nw);
    ws->s = bench_alloc_or_die(ns + 1);
    bench_fill_random_u8(ws->w, nw, 7);
    if (fmt == DSV4_LINEAR_BF16) { /* finite BF16 around 1: random sign and mantissa, exponent 120..127 */
        uint16_t *h = (uint16_t *)ws->w;
        for (size_t i = 0; i < nw / 2; i++) h[i] = (uint16_t)((h[i] & 0x807F) | (0x3C00 + ((h[i] >> 7) & 7) * 128));
    } else if (fmt == DSV4_LINEAR_F32) { /* finite F32 in [-1, 1) */
        bench_fill_random_f32((float *)ws->w, nw / 4, 7, 1.0f);
    } else if (fmt != DSV4_LINEAR_FP4) {
        for (size_t i = 0; i < nw; i++)
            if ((ws->w[i] & 0x7F) == 0x7F) ws->w[i] ^= 1; /* no NaN codes */
    }
    for (size_t i = 0; i < ns; i++) ws->s[i] = (uint8_t)(118 + i % 7);
}

void bench_wset_view(const bench_wset *ws, int copy, dsv4_tensor *w, dsv4_tensor *s)
{
    const int64_t wshape[2] = {ws->rows, ws->wcols}, sshape[2] = {ws->srows, ws->scols};
    static const dsv4_dtype wdt[DSV4_LINEAR_FORMAT_COUNT] = {DSV4_F8_E4M3, DSV4_F8_E4M3, DSV4_FP4X2, DSV4_BF16, DSV4_F32};
    dsv4_tensor_init(w, ws->w + ws->wbytes * (size_t)copy, wdt[ws->fmt], 2, wshape);
    dsv4_tensor_init(s, ws->s + ws->sbytes * (size_t)copy, DSV4_E8M0, 2, sshape);
}

float *bench_wset_f32(dsv4_ctx *ctx, const bench_wset *ws, int copies)
{
    const size_t n = (size_t)(ws->rows * ws->k);
    float *f = bench_alloc(n * 4 * (size_t)copies);
    if (!f) return NULL;
    dsv4_tensor w, s, o;
    bench_wset_view(ws, 0, &w, &s);
    const int64_t oshape[2] = {ws->rows, ws->k};
    dsv4_tensor_init(&o, f, DSV4_F32, 2, oshape);
    dsv4_status st = DSV4_OK;
    if (ws->fmt == DSV4_LINEAR_MXFP8) {
        st = dsv4_dequantize(ctx, DSV4_QRULE_MX32, &w, &s, &o);
    } else if (ws->fmt == DSV4_LINEAR_BF16) {
        st = dsv4_decode_array(ctx, DSV4_FMT_BF16, ws->w, (int64_t)n, f);
    } else if (ws->fmt == DSV4_LINEAR_F32) {
        memcpy(f, ws->w, n * 4);
    } else {
        st = dsv4_dequantize_weight(ctx, &w, &s, &o);
    }
    if (st) {
        free(f);
        return NULL;
    }
    for (int c = 1; c < copies; c++) memcpy(f + n * (size_t)c, f, n * 4);
    return f;
}

void bench_wset_free(bench_wset *ws)
{
    free(ws->w);
    free(ws->s);
    ws->w = ws->s = NULL;
}

void bench_lcall_init(bench_lcall *a, dsv4_ctx *ctx, const bench_lshape *c, const bench_wset *ws, int64_t m,
                      uint16_t *x, uint16_t *y, void *work, size_t wsb)
{
    *a = (bench_lcall){.ctx = ctx, .c = c, .ws = ws, .work = work, .wsb = wsb};
    const int64_t xs[3] = {m, c->groups, c->k}, ys[3] = {m, c->groups, c->n};
    const int64_t xs2[2] = {m, c->k}, ys2[2] = {m, c->n};
    const int nd = c->groups > 1 ? 3 : 2;
    dsv4_tensor_init(&a->x, x, DSV4_BF16, nd, nd == 3 ? xs : xs2);
    dsv4_tensor_init(&a->y, y, DSV4_BF16, nd, nd == 3 ? ys : ys2);
}

int bench_lcall_run(void *arg, int copy)
{
    bench_lcall *a = arg;
    dsv4_tensor tw, tsc;
    bench_wset_view(a->ws, copy, &tw, &tsc);
    const dsv4_tensor *sp = a->ws->fmt <= DSV4_LINEAR_FP4 ? &tsc : NULL;
    return a->c->groups > 1 ? dsv4_grouped_linear(a->ctx, a->ws->fmt, &a->x, &tw, sp, &a->y, a->work, a->wsb)
                            : dsv4_linear(a->ctx, a->ws->fmt, &a->x, &tw, sp, NULL, &a->y, a->work, a->wsb);
}
