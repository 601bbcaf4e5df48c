/* The DeepSeek-V4 forward pass (architecture.md §3-§8, §12) over T tokens of one sequence, as a
 * composition of the public ops, top to bottom:
 *
 *   X = 4 copies of embed[tok]                         streams [T, hc, D] BF16
 *   for each block: x = attn_norm(hc_pre(X)); X = hc_post(attention(x), X)
 *                   x = ffn_norm(hc_pre(X));  X = hc_post(moe(x), X)
 *   logits = head · norm(hc_head(X))
 *
 * Every step is batched over the T tokens (T = 1 is a decode step, T > 1 a prefill chunk or the
 * verification of MTP drafts); what a token sees (its SWA window, its causal compressed entries)
 * is exactly what token-by-token decoding shows it, so the caches end in the same state. */
#include "model/engine_internal.h"

#include "core/error.h"
#include "formats/codec.h"

#include <math.h>
#include <string.h>

#define TRY DSV4_TRY

/* One forward call. */
typedef struct fwd {
    dsv4_engine *e;
    eng_scratch *s;
    eng_seq *seq;
    int sq;
    int64_t T, start;  /* tokens, position of the first */
    dsv4_tensor pos;   /* I64 [T] */
    dsv4_tensor tok;   /* I32 [T] */
    int save_proj;     /* keep the CSA compressor inputs for a rollback */
    int has_extra;     /* the attention has a compressed scope this call */
    int have_window;   /* s->rslots, sidx, slen hold this call's ring slots and SWA scope */
    int64_t hca_width[ENG_MAX_RATIOS]; /* HCA pools: width of the scope row built this call (-1: none) */
} fwd;

/* ---- op wrappers ---------------------------------------------------------------------------- */
static dsv4_status linear(const dsv4_engine *e, const dsv4_linear_weight *w, const dsv4_tensor *x, dsv4_tensor *y)
{
    return dsv4_linear(e->ctx, eng_fmt(w), x, &w->weight, w->scale.data ? &w->scale : NULL, NULL, y, e->s.ws,
                       e->s.ws_bytes);
}

static dsv4_status linear_t(const dsv4_engine *e, const dsv4_tensor *w, const dsv4_tensor *x, dsv4_tensor *y)
{
    return dsv4_linear(e->ctx, eng_tfmt(w), x, w, NULL, NULL, y, e->s.ws, e->s.ws_bytes);
}

static dsv4_status rmsnorm(const dsv4_engine *e, const dsv4_tensor *x, const dsv4_tensor *w, dsv4_tensor *y)
{
    return dsv4_rms_norm(e->ctx, x, w, (float)e->cfg->norm_eps, y);
}

/* A 2-D view with row stride `ld` (elements). */
static dsv4_tensor rows_view(const void *p, dsv4_dtype dt, int64_t rows, int64_t cols, int64_t ld)
{
    dsv4_tensor t;
    memset(&t, 0, sizeof t);
    dsv4_tensor_init_strided(&t, (void *)p, dt, 2, (const int64_t[]){rows, cols}, (const int64_t[]){ld, 1});
    return t;
}

static dsv4_tensor workspace(const dsv4_engine *e) { return eng_t1(e->s.ws, DSV4_U8, (int64_t)e->s.ws_bytes); }

/* embed rows of `tok` -> out [T, D] BF16 (the table is BF16, converted at load if need be) */
static void embed(const dsv4_engine *e, const int32_t *tok, int64_t T, uint16_t *out)
{
    const int64_t D = e->D;
    for (int64_t t = 0; t < T; t++) memcpy(out + t * D, e->embed + (int64_t)tok[t] * D, (size_t)D * 2);
}

/* ---- attention (§5) ------------------------------------------------------------------------- */
/* What every block's ring needs, built once per call (all rings share the sequence's block
 * table): the slots of the call's positions p (ring entry p mod R), and the SWA scope: query t
 * sees positions max(0, p-W+1) .. p. */
static dsv4_status window_scope(fwd *f)
{
    if (f->have_window) return DSV4_OK;
    const dsv4_engine *e = f->e;
    eng_scratch *s = f->s;
    for (int64_t t = 0; t < f->T; t++) s->rslots[t] = (f->start + t) % e->R;
    TRY(dsv4_kv_seq_slots(f->seq->ring, s->rslots, f->T, s->rslots));
    int32_t *idx = s->sidx;
    for (int64_t t = 0; t < f->T; t++) {
        int64_t p = f->start + t, lo = p - e->W + 1 < 0 ? 0 : p - e->W + 1;
        for (int64_t j = 0; j < e->W; j++) idx[t * e->W + j] = lo + j <= p ? (int32_t)((lo + j) % e->R) : -1;
        s->slen[t] = (int32_t)(p - lo + 1);
    }
    TRY(dsv4_kv_seq_indices(f->seq->ring, idx, f->T * e->W, idx));
    f->have_window = 1;
    return DSV4_OK;
}

/* The HCA scope of a pool, built once per call for all its layers: one row of the slots of entries
 * 0 .. wmax-1 (wmax = (start+T)/r), which every query views (row stride 0) up to its own count
 * (p+1)/r. */
static dsv4_status hca_scope(fwd *f, const eng_layer *L, int64_t *width)
{
    eng_scratch *s = f->s;
    const int p = L->pool;
    const int64_t r = L->ratio, wmax = (f->start + f->T) / r;
    *width = wmax;
    if (!wmax || f->hca_width[p] == wmax) return DSV4_OK;
    int32_t *row = s->hidx[p];
    for (int64_t c = 0; c < wmax; c++) row[c] = (int32_t)c;
    for (int64_t t = 0; t < f->T; t++) s->hlen[p][t] = (int32_t)((f->start + t + 1) / r);
    TRY(dsv4_kv_seq_indices(f->seq->comp[p], row, wmax, row));
    f->hca_width[p] = wmax;
    return DSV4_OK;
}

/* Lightning indexer (§5.6): the indexer compressor appends its entries, then every query keeps
 * the top-k of its visible entries. Leaves entry numbers in cidx [T, topk], lengths in clen. */
static dsv4_status indexer(fwd *f, const eng_layer *L, const dsv4_tensor *x, const dsv4_tensor *qr, float *saved)
{
    const dsv4_engine *e = f->e;
    const dsv4_layer_weights *w = L->w;
    eng_scratch *s = f->s;
    const int64_t T = f->T, nI = e->cfg->index_n_heads, dI = e->cfg->index_head_dim, eb = e->index_entry_bytes;
    const int64_t topk = e->cfg->index_topk;
    /* queries: wq_b·qr, RoPE, Hadamard, FP4; head weights from weights_proj·x */
    dsv4_tensor qi = eng_t2(s->qi, DSV4_BF16, T, nI * dI), qi3 = eng_t3(s->qi, DSV4_BF16, T, nI, dI);
    dsv4_tensor qpk = eng_t3(s->qpk, DSV4_U8, T, nI, dI / 2), qsc = eng_t3(s->qsc, DSV4_U8, T, nI, dI / 32);
    TRY(linear(e, &w->index_wq_b, qr, &qi));
    TRY(dsv4_indexer_q(e->ctx, &qi3, &f->pos, &e->rope_compress, &qpk, &qsc));
    dsv4_tensor wp = eng_t2(s->wp, DSV4_BF16, T, nI), wts = eng_t2(s->wts, DSV4_F32, T, nI);
    TRY(linear_t(e, &w->index_weights_proj, x, &wp));
    TRY(dsv4_indexer_weights(e->ctx, &wp, (int)dI, &wts));
    /* keys: the indexer compressor writes its new entries straight into the MXFP4 cache rows */
    dsv4_tensor ikv = eng_t2(s->ikv, DSV4_F32, T, 2 * dI), ig = eng_t2(s->igate, DSV4_F32, T, 2 * dI);
    TRY(linear_t(e, &w->index_compressor.wkv, x, &ikv));
    TRY(linear_t(e, &w->index_compressor.wgate, x, &ig));
    if (saved) /* row t: main kv | main gate | indexer kv | indexer gate */
        for (int64_t t = 0; t < T; t++) {
            memcpy(saved + t * L->proj_ld + 4 * 512, s->ikv + t * 2 * dI, (size_t)(2 * dI) * 4);
            memcpy(saved + t * L->proj_ld + 4 * 512 + 2 * dI, s->igate + t * 2 * dI, (size_t)(2 * dI) * 4);
        }
    float *st = eng_state(e, L, f->sq) + 2 * (8 * 1024);
    dsv4_tensor skv = eng_t2(st, DSV4_F32, 8, 2 * dI), ssc = eng_t2(st + 8 * 2 * dI, DSV4_F32, 8, 2 * dI);
    uint8_t *cache = L->index_cache + (size_t)(f->sq * e->index_entries * eb);
    int64_t m = dsv4_compressor_emit_count(4, f->start, T), c0 = f->start / 4;
    dsv4_tensor oc = rows_view(cache + c0 * eb, DSV4_U8, m, dI / 2, eb);
    dsv4_tensor os = rows_view(cache + c0 * eb + dI / 2, DSV4_U8, m, dI / 32, eb);
    dsv4_compressor_desc desc = {DSV4_COMPRESSOR_INDEXER, 4, (int)dI, (float)e->cfg->norm_eps, 0};
    TRY(dsv4_compressor_forward(e->ctx, &desc, f->start, &ikv, &ig, &L->index_ape, &w->index_compressor.norm,
                                &e->rope_compress, &skv, &ssc, m ? &oc : NULL, m ? &os : NULL));
    /* scores over the visible entries and the streaming top-k */
    int64_t N = (f->start + T) / 4;
    dsv4_tensor idx = eng_t2(s->cidx, DSV4_I32, T, topk), len = eng_t1(s->clen, DSV4_I32, T);
    if (N == 0) {
        f->has_extra = 0;
        return DSV4_OK;
    }
    dsv4_tensor k = rows_view(cache, DSV4_U8, N, dI / 2, eb), ks = rows_view(cache + dI / 2, DSV4_U8, N, dI / 32, eb);
    dsv4_indexer_args args = {&qpk, &qsc, &wts, &k, &ks, &f->pos, 4};
    TRY(dsv4_indexer_select(e->ctx, &args, topk, &idx, &len, s->ws, s->ws_bytes));
    f->has_extra = 1;
    return dsv4_kv_seq_indices(f->seq->comp[L->pool], s->cidx, T * topk, s->cidx);
}

/* Main compressor (§5.5) and the compressed scope: CSA through the indexer, HCA all entries
 * c < (p+1)/r. Returns the scope's width in *width (0: no entry visible to any query). */
static dsv4_status compressed_scope(fwd *f, const eng_layer *L, const dsv4_tensor *x, const dsv4_tensor *qr, int64_t *width)
{
    const dsv4_engine *e = f->e;
    const dsv4_layer_weights *w = L->w;
    eng_scratch *s = f->s;
    const int64_t T = f->T, r = L->ratio, coff = L->kind == DSV4_ATTN_CSA ? 2 : 1, d = 512;
    dsv4_tensor ckv = eng_t2(s->ckv, DSV4_F32, T, coff * d), cg = eng_t2(s->cgate, DSV4_F32, T, coff * d);
    TRY(linear_t(e, &w->compressor.wkv, x, &ckv));
    TRY(linear_t(e, &w->compressor.wgate, x, &cg));
    float *saved = f->save_proj && L->saved_proj ? L->saved_proj : NULL;
    if (saved)
        for (int64_t t = 0; t < T; t++) {
            memcpy(saved + t * L->proj_ld, s->ckv + t * coff * d, (size_t)(coff * d) * 4);
            memcpy(saved + t * L->proj_ld + coff * d, s->cgate + t * coff * d, (size_t)(coff * d) * 4);
        }
    float *st = eng_state(e, L, f->sq);
    const int64_t rows = coff * r, cols = coff * d;
    dsv4_tensor skv = eng_t2(st, DSV4_F32, rows, cols), ssc = eng_t2(st + rows * cols, DSV4_F32, rows, cols);
    int64_t m = dsv4_compressor_emit_count((int)r, f->start, T);
    dsv4_tensor out = eng_t2(s->cout, DSV4_BF16, m, d);
    dsv4_compressor_desc desc = {DSV4_COMPRESSOR_MAIN, (int)r, (int)d, (float)e->cfg->norm_eps, 0};
    TRY(dsv4_compressor_forward(e->ctx, &desc, f->start, &ckv, &cg, &L->ape, &w->compressor.norm, &e->rope_compress, &skv,
                                &ssc, m ? &out : NULL, NULL));
    if (m) { /* new entries into the FP8 cache (the insert quantizes the nope dims, rule kv64) */
        for (int64_t i = 0; i < m; i++) s->cslots[i] = f->start / r + i;
        TRY(dsv4_kv_seq_slots(f->seq->comp[L->pool], s->cslots, m, s->cslots));
        dsv4_tensor slots = eng_t1(s->cslots, DSV4_I64, m);
        TRY(dsv4_kv_insert(e->ctx, &out, &L->comp, &slots, NULL, NULL));
    }
    if (L->kind == DSV4_ATTN_CSA) {
        TRY(indexer(f, L, x, qr, saved));
        *width = f->has_extra ? e->cfg->index_topk : 0;
        return DSV4_OK;
    }
    return hca_scope(f, L, width);
}

/* x = s->x [T, D] (the attention input after attn_norm) -> s->a [T, D]. */
static dsv4_status attention(fwd *f, const eng_layer *L)
{
    const dsv4_engine *e = f->e;
    const dsv4_model_config *c = e->cfg;
    const dsv4_layer_weights *w = L->w;
    eng_scratch *s = f->s;
    const int64_t T = f->T, D = e->D, H = e->H, G = c->o_groups;
    dsv4_tensor x = eng_t2(s->x, DSV4_BF16, T, D);
    /* query path (§5.1): qr = q_norm(wq_a·x), q = wq_b·qr */
    dsv4_tensor qr = eng_t2(s->qr, DSV4_BF16, T, c->q_lora_rank);
    dsv4_tensor q = eng_t3(s->q, DSV4_BF16, T, H, 512), qf = eng_t2(s->q, DSV4_BF16, T, H * 512);
    TRY(linear(e, &w->wq_a, &x, &qr));
    TRY(rmsnorm(e, &qr, &w->q_norm, &qr));
    TRY(linear(e, &w->wq_b, &qr, &qf));
    /* the shared KV latent (§5.2): kv = kv_norm(wkv·x) */
    dsv4_tensor kv = eng_t2(s->kv, DSV4_BF16, T, 512);
    TRY(linear(e, &w->wkv, &x, &kv));
    TRY(rmsnorm(e, &kv, &w->kv_norm, &kv));
    /* per-head q RMS + RoPE; kv RoPE + FP8 into the ring at entry p mod R */
    TRY(window_scope(f));
    dsv4_tensor slots = eng_t1(s->rslots, DSV4_I64, T);
    TRY(dsv4_qnorm_rope_kv_insert(e->ctx, &q, &kv, &L->ring, &slots, &f->pos, L->rope, (float)c->norm_eps));
    /* what each query attends to (§5.7): its window, and the compressed entries */
    int64_t cw = 0;
    if (L->ratio) TRY(compressed_scope(f, L, &x, &qr, &cw));
    dsv4_tensor sidx = eng_t2(s->sidx, DSV4_I32, T, e->W), slen = eng_t1(s->slen, DSV4_I32, T);
    const int hca = L->kind == DSV4_ATTN_HCA;
    dsv4_tensor cidx = hca ? rows_view(s->hidx[L->pool], DSV4_I32, T, cw, 0) : eng_t2(s->cidx, DSV4_I32, T, cw);
    dsv4_tensor clen = eng_t1(hca ? s->hlen[L->pool] : s->clen, DSV4_I32, T);
    dsv4_sparse_scope swa = {&L->ring, &sidx, &slen}, extra = {&L->comp, &cidx, &clen};
    /* sparse attention with sink, inverse RoPE at the query position (§5.7, §5.8) */
    dsv4_tensor o = eng_t3(s->o, DSV4_BF16, T, H, 512), ws = workspace(e);
    TRY(dsv4_sparse_mla_decode(e->ctx, &q, &swa, cw ? &extra : NULL, &L->sink, (float)(1.0 / sqrt(512.0)), &o, NULL,
                               e->s.ws_bytes ? &ws : NULL));
    TRY(dsv4_inv_rope(e->ctx, &o, &f->pos, L->rope));
    /* grouped wo_a over G groups of consecutive heads, then wo_b */
    dsv4_tensor og = eng_t3(s->o, DSV4_BF16, T, G, H * 512 / G), z = eng_t3(s->z, DSV4_BF16, T, G, c->o_lora_rank);
    TRY(dsv4_grouped_linear(e->ctx, eng_tfmt(&L->wo_a), &og, &L->wo_a, NULL, &z, e->s.ws, e->s.ws_bytes));
    dsv4_tensor zf = eng_t2(s->z, DSV4_BF16, T, G * c->o_lora_rank), a = eng_t2(s->a, DSV4_BF16, T, D);
    return linear(e, &w->wo_b, &zf, &a);
}

/* ---- MoE (§7) ------------------------------------------------------------------------------- */
static dsv4_status moe(fwd *f, const eng_layer *L)
{
    const dsv4_engine *e = f->e;
    const dsv4_model_config *c = e->cfg;
    const dsv4_layer_weights *w = L->w;
    eng_scratch *s = f->s;
    const int64_t T = f->T, k = c->n_activated_experts;
    dsv4_tensor x = eng_t2(s->x, DSV4_BF16, T, e->D), y = eng_t2(s->a, DSV4_BF16, T, e->D);
    dsv4_tensor ids = eng_t2(s->ids, DSV4_I32, T, k), rw = eng_t2(s->rw, DSV4_F32, T, k);
    TRY(dsv4_route(e->ctx, &x, &w->gate_weight, L->hash || !L->gate_bias.data ? NULL : &L->gate_bias,
                   L->hash ? &w->tid2eid : NULL, L->hash ? &f->tok : NULL, (float)c->route_scale, &ids, &rw));
    float limit = c->swiglu_limit > 0 ? (float)c->swiglu_limit : INFINITY;
    return dsv4_moe(e->ctx, &x, &ids, &rw, L->experts, (int)c->n_routed_experts, L->has_shared ? &L->shared : NULL, limit,
                    &y, e->s.ws, e->s.ws_bytes);
}

/* ---- a block (§3) --------------------------------------------------------------------------
 * On entry s->xin, post, comb hold hc_pre(attention site) of the streams s->X; on exit the
 * streams are updated and, when `next` is given, s->xin, post, comb hold hc_pre(next). */
static dsv4_status block(fwd *f, const eng_layer *L, const dsv4_hc_site *next)
{
    const dsv4_engine *e = f->e;
    eng_scratch *s = f->s;
    const int64_t T = f->T, D = e->D, hc = e->hc;
    dsv4_tensor X = eng_t3(s->X, DSV4_BF16, T, hc, D), xin = eng_t2(s->xin, DSV4_BF16, T, D);
    dsv4_tensor x = eng_t2(s->x, DSV4_BF16, T, D), a = eng_t2(s->a, DSV4_BF16, T, D);
    dsv4_tensor post = eng_t2(s->post, DSV4_F32, T, hc), comb = eng_t3(s->comb, DSV4_F32, T, hc, hc);
    TRY(rmsnorm(e, &xin, &L->w->attn_norm, &x));
    TRY(attention(f, L));
    TRY(dsv4_hc_post_pre(e->ctx, &a, &X, &post, &comb, &L->hc_ffn, &X, &xin, &post, &comb));
    TRY(rmsnorm(e, &xin, &L->w->ffn_norm, &x));
    TRY(moe(f, L));
    if (next) return dsv4_hc_post_pre(e->ctx, &a, &X, &post, &comb, next, &X, &xin, &post, &comb);
    return dsv4_hc_post(e->ctx, &a, &X, &post, &comb, &X);
}

static void begin(fwd *f, dsv4_engine *e, int sq, int64_t start, const int32_t *tokens, int64_t T)
{
    memset(f, 0, sizeof *f);
    f->e = e;
    f->s = &e->s;
    f->sq = sq;
    f->seq = &e->seqs[sq];
    f->T = T;
    f->start = start;
    for (int p = 0; p < ENG_MAX_RATIOS; p++) f->hca_width[p] = -1;
    for (int64_t t = 0; t < T; t++) {
        e->s.positions[t] = start + t;
        e->s.tokens[t] = tokens[t];
    }
    f->pos = eng_t1(e->s.positions, DSV4_I64, T);
    f->tok = eng_t1(e->s.tokens, DSV4_I32, T);
}

/* hc_pre of the first site over the streams s->X [T, hc, D] */
static dsv4_status first_hc_pre(fwd *f, const dsv4_hc_site *site)
{
    eng_scratch *s = f->s;
    const int64_t T = f->T, D = f->e->D, hc = f->e->hc;
    dsv4_tensor X = eng_t3(s->X, DSV4_BF16, T, hc, D), xin = eng_t2(s->xin, DSV4_BF16, T, D);
    dsv4_tensor post = eng_t2(s->post, DSV4_F32, T, hc), comb = eng_t3(s->comb, DSV4_F32, T, hc, hc);
    return dsv4_hc_pre(f->e->ctx, site, &X, &xin, &post, &comb);
}

dsv4_status eng_main_forward(dsv4_engine *e, int sq, const int32_t *tokens, int64_t T, int save_proj)
{
    fwd f;
    begin(&f, e, sq, e->seqs[sq].len, tokens, T);
    f.save_proj = save_proj;
    eng_scratch *s = &e->s;
    const int64_t D = e->D, hc = e->hc, nl = e->cfg->n_layers;
    /* the streams start as hc copies of the embedding */
    embed(e, tokens, T, s->xin);
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < hc; j++) memcpy(s->X + (t * hc + j) * D, s->xin + t * D, (size_t)D * 2);
    if (save_proj)
        for (int b = 0; b < nl; b++)
            if (e->layers[b].snapshot)
                memcpy(e->layers[b].snapshot, eng_state(e, &e->layers[b], sq), (size_t)e->layers[b].state_floats * 4);
    TRY(eng_wrap(first_hc_pre(&f, &e->layers[0].hc_attn), "block", 0));
    for (int64_t l = 0; l < nl; l++)
        TRY(eng_wrap(block(&f, &e->layers[l], l + 1 < nl ? &e->layers[l + 1].hc_attn : NULL), "block", (int)l));
    e->seqs[sq].len += T;
    return DSV4_OK;
}

dsv4_status eng_logits(dsv4_engine *e, const eng_layer *L, const uint16_t *X, int64_t n, float *logits)
{
    const int64_t D = e->D;
    dsv4_tensor Xv = eng_t3(X, DSV4_BF16, n, e->hc, D), y = eng_t2(e->s.xin, DSV4_BF16, n, D);
    dsv4_tensor lg = eng_t2(logits, DSV4_F32, n, e->V);
    TRY(dsv4_hc_head(e->ctx, L ? &L->hc_head : &e->hc_head, &Xv, &y));
    TRY(rmsnorm(e, &y, L ? &L->w->norm : &e->w->norm, &y));
    return linear_t(e, &e->w->head, &y, &lg);
}

/* ---- MTP (§8) ------------------------------------------------------------------------------- */
dsv4_status eng_mtp_rows(dsv4_engine *e, int sq, int64_t pos, const int32_t *tokens, int64_t T, const uint16_t *head,
                         const uint16_t *rest)
{
    const eng_layer *L = &e->layers[e->cfg->n_layers];
    const dsv4_layer_weights *w = L->w;
    eng_scratch *s = &e->s;
    const int64_t D = e->D, hc = e->hc;
    fwd f;
    begin(&f, e, sq, pos, tokens, T);
    /* X[t][j] = bf16(e_proj·enorm(embed[tok]) + h_proj·hnorm(streams[t][j])): hnorm reads the
     * input streams (out of place, into Xm) before h_proj writes X */
    dsv4_tensor x = eng_t2(s->x, DSV4_BF16, T, D), ep = eng_t2(s->a, DSV4_BF16, T, D);
    dsv4_tensor hh = eng_t2(s->Xm, DSV4_BF16, T * hc, D), hp = eng_t2(s->X, DSV4_BF16, T * hc, D);
    if (rest == head + hc * D || T == 1) {
        dsv4_tensor in = eng_t2(head, DSV4_BF16, T * hc, D);
        TRY(rmsnorm(e, &in, &w->hnorm, &hh));
    } else {
        dsv4_tensor in0 = eng_t2(head, DSV4_BF16, hc, D), in1 = eng_t2(rest, DSV4_BF16, (T - 1) * hc, D);
        dsv4_tensor out0 = eng_t2(s->Xm, DSV4_BF16, hc, D), out1 = eng_t2(s->Xm + hc * D, DSV4_BF16, (T - 1) * hc, D);
        TRY(rmsnorm(e, &in0, &w->hnorm, &out0));
        TRY(rmsnorm(e, &in1, &w->hnorm, &out1));
    }
    embed(e, tokens, T, s->x);
    TRY(rmsnorm(e, &x, &w->enorm, &x));
    TRY(linear(e, &w->e_proj, &x, &ep));
    TRY(linear(e, &w->h_proj, &hh, &hp));
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < hc; j++) {
            uint16_t *row = s->X + (t * hc + j) * D;
            const uint16_t *er = s->a + t * D;
            for (int64_t d = 0; d < D; d++) row[d] = dsv4_bf16_from_f32(dsv4_bf16_to_f32(row[d]) + dsv4_bf16_to_f32(er[d]));
        }
    TRY(first_hc_pre(&f, &L->hc_attn));
    return eng_wrap(block(&f, L, NULL), "MTP block", 0);
}

/* ---- rollback after rejected drafts ---------------------------------------------------------- */
/* Replay `keep` tokens from start through one compressor whose inputs are columns col.. of the
 * saved rows; the entries it emits are in the caches already, so they go to scratch. */
static dsv4_status replay(dsv4_engine *e, const eng_layer *L, int kind, int64_t start, int64_t keep, float *state)
{
    eng_scratch *s = &e->s;
    const int64_t dI = e->cfg->index_head_dim, d = kind == DSV4_COMPRESSOR_MAIN ? 512 : dI;
    const int r = kind == DSV4_COMPRESSOR_MAIN ? L->ratio : 4, coff = r == 4 ? 2 : 1;
    const int64_t w = coff * d, rows = coff * r, col = kind == DSV4_COMPRESSOR_MAIN ? 0 : 4 * 512;
    const dsv4_compressor_weights *cw = kind == DSV4_COMPRESSOR_MAIN ? &L->w->compressor : &L->w->index_compressor;
    dsv4_tensor kv = rows_view(L->saved_proj + col, DSV4_F32, keep, w, L->proj_ld);
    dsv4_tensor g = rows_view(L->saved_proj + col + w, DSV4_F32, keep, w, L->proj_ld);
    dsv4_tensor skv = eng_t2(state, DSV4_F32, rows, w), ssc = eng_t2(state + rows * w, DSV4_F32, rows, w);
    int64_t m = dsv4_compressor_emit_count(r, start, keep);
    dsv4_tensor out = eng_t2(kind == DSV4_COMPRESSOR_MAIN ? s->cout : s->qi, DSV4_BF16, m, d);
    dsv4_compressor_desc desc = {(dsv4_compressor_kind)kind, r, (int)d, (float)e->cfg->norm_eps, 0};
    return dsv4_compressor_forward(e->ctx, &desc, start, &kv, &g, kind == DSV4_COMPRESSOR_MAIN ? &L->ape : &L->index_ape,
                                   &cw->norm, &e->rope_compress, &skv, &ssc, m ? &out : NULL, NULL);
}

dsv4_status eng_rollback(dsv4_engine *e, int sq, int64_t start, int64_t keep)
{
    for (int64_t b = 0; b < e->cfg->n_layers; b++) {
        const eng_layer *L = &e->layers[b];
        if (!L->snapshot) continue;
        float *st = eng_state(e, L, sq);
        memcpy(st, L->snapshot, (size_t)L->state_floats * 4);
        if (!keep) continue;
        TRY(replay(e, L, DSV4_COMPRESSOR_MAIN, start, keep, st));
        if (L->kind == DSV4_ATTN_CSA)
            TRY(replay(e, L, DSV4_COMPRESSOR_INDEXER, start, keep, st + 2 * (8 * 1024)));
    }
    e->seqs[sq].len = start + keep;
    return DSV4_OK;
}

/* ---- the public forward ---------------------------------------------------------------------- */
/* MTP rows for every main position whose next token is known after the chunk at `start` of Tc
 * tokens (the main streams of the chunk in s->X); the last position's streams wait in `pending`
 * (the other half: the current one may be this call's first row). Returns the rows run in *rows. */
static dsv4_status mtp_catch_up(dsv4_engine *e, int sq, int64_t start, const int32_t *chunk, int64_t Tc, int64_t *rows)
{
    eng_seq *q = &e->seqs[sq];
    eng_scratch *s = &e->s;
    const int64_t row = e->hc * e->D;
    int64_t first = q->mtp_len, n = start + Tc - 1 - first; /* first >= start - 1 */
    const uint16_t *head = first < start ? q->pending + q->pend * row : s->X + (first - start) * row;
    const uint16_t *rest = first < start ? s->X : head + row;
    memcpy(q->pending + (1 - q->pend) * row, s->X + (Tc - 1) * row, (size_t)row * 2);
    *rows = n;
    if (n > 0) TRY(eng_mtp_rows(e, sq, first, chunk + (first + 1 - start), n, head, rest));
    q->pend = 1 - q->pend;
    q->mtp_len = first + n;
    return DSV4_OK;
}

/* The chunks of a checked call; a failure here may leave the caches partly advanced. */
static dsv4_status forward_chunks(dsv4_engine *e, int seq, const int32_t *tokens, int64_t n, float *logits,
                                  int64_t n_logits, float *mtp_logits, int64_t n_mtp_logits, int64_t mtp_rows)
{
    eng_seq *q = &e->seqs[seq];
    const int mtp = e->opt.max_mtp > 0;
    const int64_t V = e->V, hc_row = e->hc * e->D, first_logit = n - n_logits, first_mtp = mtp_rows - n_mtp_logits;
    const int64_t mtp_first = q->mtp_len;
    for (int64_t c0 = 0; c0 < n; c0 += e->opt.max_batch) {
        int64_t Tc = n - c0 < e->opt.max_batch ? n - c0 : e->opt.max_batch, start = q->len;
        TRY(eng_main_forward(e, seq, tokens + c0, Tc, 0));
        int64_t lo = c0 > first_logit ? c0 : first_logit;
        if (lo < c0 + Tc) TRY(eng_logits(e, NULL, e->s.X + (lo - c0) * hc_row, c0 + Tc - lo, logits + (lo - first_logit) * V));
        if (!mtp) continue;
        int64_t done = q->mtp_len - mtp_first, rows;
        TRY(mtp_catch_up(e, seq, start, tokens + c0, Tc, &rows));
        int64_t mlo = done > first_mtp ? done : first_mtp;
        if (mlo < done + rows)
            TRY(eng_logits(e, &e->layers[e->cfg->n_layers], e->s.X + (mlo - done) * hc_row, done + rows - mlo,
                           mtp_logits + (mlo - first_mtp) * V));
    }
    return DSV4_OK;
}

dsv4_status dsv4_engine_forward(dsv4_engine *e, int seq, const int32_t *tokens, int64_t n, float *logits, int64_t n_logits,
                                float *mtp_logits, int64_t n_mtp_logits)
{
    const char *op = "engine_forward";
    TRY(eng_check_usable(e, seq, op));
    eng_seq *q = &e->seqs[seq];
    DSV4_CHECK_ARG(tokens && n >= 1, "%s: need n >= 1 tokens (got %lld)", op, (long long)n);
    DSV4_CHECK_ARG(n_logits >= 0 && n_logits <= n && (!n_logits || logits),
                   "%s: n_logits %lld must be in [0, n = %lld] with a buffer", op, (long long)n_logits, (long long)n);
    const int mtp = e->opt.max_mtp > 0;
    const int64_t mtp_rows = mtp ? q->len + n - 1 - q->mtp_len : 0;
    DSV4_CHECK_ARG(n_mtp_logits >= 0 && n_mtp_logits <= mtp_rows && (!n_mtp_logits || mtp_logits),
                   "%s: n_mtp_logits %lld must be in [0, %lld] (the MTP rows this call runs) with a buffer", op,
                   (long long)n_mtp_logits, (long long)mtp_rows);
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= e->V)
            return dsv4_fail(DSV4_ERR_RANGE, "%s: token %lld = %d is outside the vocabulary [0, %lld)", op, (long long)i,
                             tokens[i], (long long)e->V);
    if (n > e->opt.max_context - q->len)
        return dsv4_fail(DSV4_ERR_CAPACITY, "%s: %lld + %lld tokens exceed max_context %lld", op, (long long)q->len,
                         (long long)n, (long long)e->opt.max_context);
    /* everything that can be checked is; what fails from here on fails the sequence */
    return eng_seq_failed(e, seq, forward_chunks(e, seq, tokens, n, logits, n_logits, mtp_logits, n_mtp_logits, mtp_rows),
                          op);
}
