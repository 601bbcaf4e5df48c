/* The DeepSeek-V4 forward pass (docs/model.md §3-§8, §12; docs/engine.md) over the rows of one call, as a
 * composition of the public ops, top to bottom:
 *
 *   X = 4 copies of embed[tok]                         streams [T, hc, D] BF16
 *   for each block: x = attn_norm(hc_pre(X)); X = hc_post(attention(x), X)
 *                   x = ffn_norm(hc_pre(X));  X = hc_post(moe(x), X)
 *   logits = head · norm(hc_head(X))
 *
 * The rows belong to one or more sequences (segments of consecutive positions). Every product,
 * norm and the MoE run once over all rows, so the weights are read once per call; what depends
 * on a sequence (its ring and compressed caches, its compressor states, its indexer keys) is
 * addressed per segment through the index tables built here. What a row sees (its SWA window, its
 * causal compressed entries) is exactly what token-by-token decoding of its sequence shows it,
 * and every op's result for a row is independent of the other rows, so each sequence ends as if
 * it had run alone. Bare § numbers are sections of docs/model.md. */
#include "model/engine_internal.h"

#include "core/error.h"
#include "dsv4/device.h"
#include "dsv4/tensor_ops.h"
#include "formats/codec.h"

#include <math.h>
#include <string.h>

#define TRY DSV4_TRY

/* One forward call. */
typedef struct fwd {
    dsv4_engine *e;
    eng_scratch *s;
    const eng_seg *seg;
    int n_seg;
    int64_t T;         /* rows */
    dsv4_tensor pos;   /* I64 [T] in the context's memory */
    dsv4_tensor hpos;  /* the same in host memory (the indexer's positions are host memory) */
    dsv4_tensor tok;   /* I32 [T] in the context's memory */
    int replay;        /* ENG_REPLAY: compressed entries are dropped */
    int save;          /* some segment snapshots its states: the compressor inputs are kept */
    int has_extra;     /* a CSA layer's indexer found entries for some row this call */
    int64_t hca_width[ENG_MAX_RATIOS]; /* HCA pools: widest scope row of the call */
    int shaped;        /* the graph-shaped decode step (docs/engine.md §2.2): once the tables are
                          built, seg holds no positions and every launch is a function of the
                          segments' count and sequences */
} fwd;

/* A shard that fails aborts its group (dsv4_comm_abort): the other shards then fail in their next
 * collective instead of waiting for this one. */
static dsv4_status shard_status(const dsv4_engine *e, dsv4_status st)
{
    if (st != DSV4_OK && e->comm) dsv4_comm_abort(e->comm);
    return st;
}

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
static dsv4_tensor rows_view(const dsv4_engine *e, const void *p, dsv4_dtype dt, int64_t rows, int64_t cols, int64_t ld)
{
    dsv4_tensor t;
    memset(&t, 0, sizeof t);
    dsv4_tensor_init_strided(&t, (void *)p, dt, 2, (const int64_t[]){rows, cols}, (const int64_t[]){ld, 1});
    t.device = e->device;
    return t;
}

static dsv4_tensor workspace(const dsv4_engine *e) { return eng_v1(e, e->s.ws, DSV4_U8, (int64_t)e->s.ws_bytes); }

static eng_seq *seq_of(const fwd *f, int i) { return &f->e->seqs[f->seg[i].sq]; }

/* the embedding rows of the call's tokens, `copies` times each -> out [T, copies, D] BF16 (the table
 * is BF16, converted at load if need be) */
static dsv4_status embed(const fwd *f, int64_t copies, uint16_t *out)
{
    const dsv4_engine *e = f->e;
    dsv4_tensor table = eng_v2(e, e->embed, DSV4_BF16, e->V, e->D), o = eng_v3(e, out, DSV4_BF16, f->T, copies, e->D);
    return dsv4_embed_rows(e->ctx, &table, &f->tok, &o);
}

/* rows [n, w] F32 of src (row stride w) into columns col.. of the saved rows (stride proj_ld) */
static dsv4_status save_rows(const fwd *f, const eng_layer *L, int64_t col, const float *src, int64_t w)
{
    const dsv4_engine *e = f->e;
    dsv4_tensor a = eng_v2(e, src, DSV4_F32, f->T, w), b = rows_view(e, L->saved_proj + col, DSV4_F32, f->T, w, L->proj_ld);
    return dsv4_copy_rows(f->e->ctx, &a, NULL, &b);
}

dsv4_status eng_gather_streams(dsv4_engine *e, int64_t row, const uint16_t *src, int64_t rows)
{
    const int64_t n = e->hc * e->D;
    return eng_copy(e, e->s.Xm + row * n, src, rows * n * 2);
}

/* ---- the call's index tables ------------------------------------------------------------------
 * Built once per call, before its first op, in host memory (s->t), then in one upload to the
 * twins the ops read (s->dt; nothing to move on a CPU backend, where they are the same memory). */

/* What every block's ring needs (all rings of a sequence share its block table): the slots of the
 * rows' positions p (ring entry p mod R), and the SWA scope: row t sees positions
 * max(0, p-W+1) .. p. */
static dsv4_status window_scope(fwd *f)
{
    const dsv4_engine *e = f->e;
    eng_tables *t = &f->s->t;
    for (int i = 0; i < f->n_seg; i++) {
        const eng_seg *g = &f->seg[i];
        int64_t *slots = t->rslots + g->row;
        int32_t *idx = t->sidx + g->row * e->W;
        for (int64_t r = 0; r < g->T; r++) {
            int64_t p = g->start + r, lo = p - e->W + 1 < 0 ? 0 : p - e->W + 1;
            slots[r] = p % e->R;
            for (int64_t j = 0; j < e->W; j++) idx[r * e->W + j] = lo + j <= p ? (int32_t)((lo + j) % e->R) : -1;
            t->slen[g->row + r] = (int32_t)(p - lo + 1);
        }
        TRY(dsv4_kv_seq_slots(seq_of(f, i)->ring, slots, g->T, slots));
        TRY(dsv4_kv_seq_indices(seq_of(f, i)->ring, idx, g->T * e->W, idx));
    }
    return DSV4_OK;
}

/* The HCA scope width of the shaped step: the most entries any position of the context sees. */
static int64_t shaped_hca_width(const dsv4_engine *e, int p) { return e->opt.max_context / e->pool_ratio[p]; }

/* Pool p: the cache slots of the entries the call's segments emit, in segment order (the order
 * compressed_scope writes them; in the shaped step one per segment, -1 where it emits none), and
 * for an HCA pool its scope: per segment one row of the slots of entries 0 .. w-1
 * (w = (start+T)/r), which each of its rows views (row stride 0) up to its own count (p+1)/r. */
static dsv4_status pool_tables(fwd *f, int p)
{
    const dsv4_engine *e = f->e;
    eng_scratch *s = f->s;
    eng_tables *t = &s->t;
    const int64_t r = e->pool_ratio[p];
    int64_t mo = 0, wmax = 0;
    for (int i = 0; i < f->n_seg; i++) {
        const eng_seg *g = &f->seg[i];
        const int64_t m = dsv4_compressor_emit_count((int)r, g->start, g->T);
        for (int64_t j = 0; j < m; j++) t->pslots[p][mo + j] = g->start / r + j;
        TRY(dsv4_kv_seq_slots(seq_of(f, i)->comp[p], t->pslots[p] + mo, m, t->pslots[p] + mo));
        if (f->shaped && !m) t->pslots[p][mo] = -1; /* a slot per segment: -1 = nothing to insert */
        mo += f->shaped ? 1 : m;
        if (!e->pool_hca[p]) continue;
        const int64_t w = (g->start + g->T) / r;
        int32_t *row = t->hidx[p] + i * e->hrow[p];
        for (int64_t c = 0; c < w; c++) row[c] = (int32_t)c;
        for (int64_t q = 0; q < g->T; q++) t->hlen[p][g->row + q] = (int32_t)((g->start + q + 1) / r);
        TRY(dsv4_kv_seq_indices(seq_of(f, i)->comp[p], row, w, row));
        if (w > wmax) wmax = w;
    }
    s->pslot_n[p] = mo;
    f->hca_width[p] = f->shaped ? shaped_hca_width(e, p) : wmax;
    return DSV4_OK;
}

/* The shaped step uploads its tables inside its launches (upload_tables). */
static dsv4_status build_tables(fwd *f)
{
    TRY(window_scope(f));
    for (int p = 0; p < f->e->n_pools; p++) TRY(pool_tables(f, p));
    eng_scratch *s = f->s;
    if (s->dtab == s->tab || f->shaped) return DSV4_OK;
    return dsv4_device_upload(f->e->ctx, s->dtab, s->tab, s->tab_bytes);
}

/* The shaped step's first launch: the tables from the pinned host block, without a wait (the
 * host writes the block again only after the stream has passed this copy: begin). */
static dsv4_status upload_tables(fwd *f)
{
    eng_scratch *s = f->s;
    if (s->dtab == s->tab) return DSV4_OK;
    TRY(dsv4_device_upload_async(f->e->ctx, s->dtab, s->tab, s->tab_bytes));
    s->tab_inflight = 1;
    return DSV4_OK;
}

/* ---- attention (§5) ------------------------------------------------------------------------- */

/* The shaped step's indexer for segment g (one row, position on the device): the indexer
 * compressor writes its entry (if the row emits one) into the cache row of its number, and the
 * selection runs over the cache's capacity with n_t = (p+1)/r read on the device (none yet: the
 * lengths are 0 and the indices -1, as the plain step's memset leaves them). */
static dsv4_status shaped_indexer_rows(fwd *f, const eng_layer *L, dsv4_compressor_desc *desc, const eng_seg *g)
{
    const dsv4_engine *e = f->e;
    const dsv4_layer_weights *w = L->w;
    eng_scratch *s = f->s;
    const int64_t nI = e->cfg->index_n_heads, dI = e->cfg->index_head_dim, eb = e->index_entry_bytes;
    const int64_t topk = e->cfg->index_topk, N = e->index_entries;
    const int r = L->ratio;
    float *st = eng_state(e, L, g->sq) + eng_main_state_floats(L);
    dsv4_tensor skv = eng_v2(e, st, DSV4_F32, 2 * r, 2 * dI), ssc = eng_v2(e, st + 2 * r * 2 * dI, DSV4_F32, 2 * r, 2 * dI);
    dsv4_tensor gkv = eng_v2(e, s->ikv + g->row * 2 * dI, DSV4_F32, 1, 2 * dI);
    dsv4_tensor gg = eng_v2(e, s->igate + g->row * 2 * dI, DSV4_F32, 1, 2 * dI);
    uint8_t *cache = L->index_cache + (size_t)(g->sq * N * eb);
    dsv4_tensor k = rows_view(e, cache, DSV4_U8, N, dI / 2, eb), ks = rows_view(e, cache + dI / 2, DSV4_U8, N, dI / 32, eb);
    dsv4_tensor gp = eng_v1(e, s->dt.positions + g->row, DSV4_I64, 1);
    desc->position = &gp;
    TRY(dsv4_compressor_forward(e->ctx, desc, 0, &gkv, &gg, &L->index_ape, &w->index_compressor.norm, &e->rope_compress,
                                &skv, &ssc, &k, &ks));
    desc->position = NULL;
    int32_t *gidx = s->cidx + g->row * topk, *glen = s->clen + g->row;
    dsv4_tensor gq = eng_v3(e, s->qpk + g->row * nI * dI / 2, DSV4_U8, 1, nI, dI / 2);
    dsv4_tensor gqs = eng_v3(e, s->qsc + g->row * nI * dI / 32, DSV4_U8, 1, nI, dI / 32);
    dsv4_tensor gw = eng_v2(e, s->wts + g->row * nI, DSV4_F32, 1, nI);
    dsv4_tensor idx = eng_v2(e, gidx, DSV4_I32, 1, topk), len = eng_v1(e, glen, DSV4_I32, 1);
    dsv4_indexer_args args = {&gq, &gqs, &gw, &k, &ks, &gp, r};
    TRY(dsv4_indexer_select(e->ctx, &args, topk, &idx, &len, s->ws, s->ws_bytes));
    const eng_seq *q = &e->seqs[g->sq];
    dsv4_tensor bt = eng_v1(e, q->btab[L->pool], DSV4_I32, q->btab_n[L->pool]), ent = eng_v1(e, gidx, DSV4_I32, topk);
    TRY(dsv4_paged_slots(e->ctx, &bt, L->comp.block_size, &ent, &ent));
    f->has_extra = 1;
    return DSV4_OK;
}

/* Lightning indexer (§5.6): the indexer compressor appends each sequence's entries to its cache,
 * then every row keeps the top-k of its sequence's visible entries. Leaves slots in cidx [T, topk],
 * lengths in clen. */
static dsv4_status indexer(fwd *f, const eng_layer *L, const dsv4_tensor *x, const dsv4_tensor *qr, float *saved)
{
    const dsv4_engine *e = f->e;
    const dsv4_layer_weights *w = L->w;
    eng_scratch *s = f->s;
    const int64_t T = f->T, nI = e->cfg->index_n_heads, dI = e->cfg->index_head_dim, eb = e->index_entry_bytes;
    const int64_t topk = e->cfg->index_topk;
    /* queries: wq_b·qr, RoPE, Hadamard, FP4; head weights from weights_proj·x */
    dsv4_tensor qi = eng_v2(e, s->qi, DSV4_BF16, T, nI * dI), qi3 = eng_v3(e, s->qi, DSV4_BF16, T, nI, dI);
    dsv4_tensor qpk = eng_v3(e, s->qpk, DSV4_U8, T, nI, dI / 2), qsc = eng_v3(e, s->qsc, DSV4_U8, T, nI, dI / 32);
    TRY(linear(e, &w->index_wq_b, qr, &qi));
    TRY(dsv4_indexer_q(e->ctx, &qi3, f->shaped ? &f->pos : &f->hpos, &e->rope_compress, &qpk, &qsc));
    dsv4_tensor wp = eng_v2(e, s->wp, DSV4_BF16, T, nI), wts = eng_v2(e, s->wts, DSV4_F32, T, nI);
    TRY(linear_t(e, &w->index_weights_proj, x, &wp));
    TRY(dsv4_indexer_weights(e->ctx, &wp, (int)dI, &wts));
    /* keys: the indexer compressor writes its new entries straight into the MXFP4 cache rows */
    dsv4_tensor ikv = eng_v2(e, s->ikv, DSV4_F32, T, 2 * dI), ig = eng_v2(e, s->igate, DSV4_F32, T, 2 * dI);
    TRY(linear_t(e, &w->index_compressor.wkv, x, &ikv));
    TRY(linear_t(e, &w->index_compressor.wgate, x, &ig));
    if (saved) { /* row t: main kv | main gate | indexer kv | indexer gate */
        TRY(save_rows(f, L, 4 * 512, s->ikv, 2 * dI));
        TRY(save_rows(f, L, 4 * 512 + 2 * dI, s->igate, 2 * dI));
    }
    const int r = L->ratio; /* the indexer pools the windows of its layer's compressor */
    dsv4_compressor_desc desc = {.kind = DSV4_COMPRESSOR_INDEXER, .ratio = r, .dim = (int)dI,
                                 .eps = (float)e->cfg->norm_eps, .overlap = 1};
    f->has_extra = 0;
    for (int i = 0; i < f->n_seg; i++) {
        const eng_seg *g = &f->seg[i];
        if (f->shaped) {
            TRY(shaped_indexer_rows(f, L, &desc, g));
            continue;
        }
        float *st = eng_state(e, L, g->sq) + eng_main_state_floats(L);
        dsv4_tensor skv = eng_v2(e, st, DSV4_F32, 2 * r, 2 * dI), ssc = eng_v2(e, st + 2 * r * 2 * dI, DSV4_F32, 2 * r, 2 * dI);
        dsv4_tensor gkv = eng_v2(e, s->ikv + g->row * 2 * dI, DSV4_F32, g->T, 2 * dI);
        dsv4_tensor gg = eng_v2(e, s->igate + g->row * 2 * dI, DSV4_F32, g->T, 2 * dI);
        uint8_t *cache = L->index_cache + (size_t)(g->sq * e->index_entries * eb);
        int64_t m = dsv4_compressor_emit_count(r, g->start, g->T), c0 = g->start / r;
        /* a replay's entries are in the cache already: they go to scratch (s->qi is free again) */
        dsv4_tensor oc = f->replay ? eng_v2(e, s->qi, DSV4_BF16, m, dI) : rows_view(e, cache + c0 * eb, DSV4_U8, m, dI / 2, eb);
        dsv4_tensor os = rows_view(e, cache + c0 * eb + dI / 2, DSV4_U8, m, dI / 32, eb);
        TRY(dsv4_compressor_forward(e->ctx, &desc, g->start, &gkv, &gg, &L->index_ape, &w->index_compressor.norm,
                                    &e->rope_compress, &skv, &ssc, m ? &oc : NULL, m && !f->replay ? &os : NULL));
        /* scores over the sequence's visible entries and the streaming top-k */
        int64_t N = (g->start + g->T) / r;
        int32_t *gidx = s->cidx + g->row * topk, *glen = s->clen + g->row;
        if (N == 0) { /* no entry yet: -1 (all bits set) and lengths 0 */
            TRY(dsv4_device_memset(e->ctx, gidx, 0xFF, (size_t)(g->T * topk) * 4));
            TRY(dsv4_device_memset(e->ctx, glen, 0, (size_t)g->T * 4));
            continue;
        }
        dsv4_tensor gq = eng_v3(e, s->qpk + g->row * nI * dI / 2, DSV4_U8, g->T, nI, dI / 2);
        dsv4_tensor gqs = eng_v3(e, s->qsc + g->row * nI * dI / 32, DSV4_U8, g->T, nI, dI / 32);
        dsv4_tensor gw = eng_v2(e, s->wts + g->row * nI, DSV4_F32, g->T, nI), gp = eng_t1(s->t.positions + g->row, DSV4_I64, g->T);
        dsv4_tensor k = rows_view(e, cache, DSV4_U8, N, dI / 2, eb), ks = rows_view(e, cache + dI / 2, DSV4_U8, N, dI / 32, eb);
        dsv4_tensor idx = eng_v2(e, gidx, DSV4_I32, g->T, topk), len = eng_v1(e, glen, DSV4_I32, g->T);
        dsv4_indexer_args args = {&gq, &gqs, &gw, &k, &ks, &gp, r};
        TRY(dsv4_indexer_select(e->ctx, &args, topk, &idx, &len, s->ws, s->ws_bytes));
        const eng_seq *q = seq_of(f, i);
        dsv4_tensor bt = eng_v1(e, q->btab[L->pool], DSV4_I32, q->btab_n[L->pool]), ent = eng_v1(e, gidx, DSV4_I32, g->T * topk);
        TRY(dsv4_paged_slots(e->ctx, &bt, L->comp.block_size, &ent, &ent));
        f->has_extra = 1;
    }
    return DSV4_OK;
}

/* Main compressor (§5.5) and the compressed scope: CSA through the indexer, HCA all entries
 * c < (p+1)/r. Returns the scope's width in *width (0: no entry visible to any row). */
static dsv4_status compressed_scope(fwd *f, const eng_layer *L, const dsv4_tensor *x, const dsv4_tensor *qr, int64_t *width)
{
    const dsv4_engine *e = f->e;
    const dsv4_layer_weights *w = L->w;
    eng_scratch *s = f->s;
    const int64_t T = f->T, r = L->ratio, coff = eng_overlap(L) ? 2 : 1, d = 512;
    dsv4_tensor ckv = eng_v2(e, s->ckv, DSV4_F32, T, coff * d), cg = eng_v2(e, s->cgate, DSV4_F32, T, coff * d);
    TRY(linear_t(e, &w->compressor.wkv, x, &ckv));
    TRY(linear_t(e, &w->compressor.wgate, x, &cg));
    float *saved = f->save ? L->saved_proj : NULL;
    if (saved) {
        TRY(save_rows(f, L, 0, s->ckv, coff * d));
        TRY(save_rows(f, L, coff * d, s->cgate, coff * d));
    }
    const int64_t rows = coff * r, cols = coff * d;
    dsv4_compressor_desc desc = {.kind = DSV4_COMPRESSOR_MAIN, .ratio = (int)r, .dim = (int)d,
                                 .eps = (float)e->cfg->norm_eps, .overlap = eng_overlap(L)};
    int64_t mo = 0; /* entries emitted by the segments so far: rows of s->cout */
    for (int i = 0; i < f->n_seg; i++) {
        const eng_seg *g = &f->seg[i];
        float *st = eng_state(e, L, g->sq);
        dsv4_tensor skv = eng_v2(e, st, DSV4_F32, rows, cols), ssc = eng_v2(e, st + rows * cols, DSV4_F32, rows, cols);
        dsv4_tensor gkv = eng_v2(e, s->ckv + g->row * cols, DSV4_F32, g->T, cols);
        dsv4_tensor gg = eng_v2(e, s->cgate + g->row * cols, DSV4_F32, g->T, cols);
        /* shaped: the position on the device, the entry (if any) in the segment's row of cout */
        dsv4_tensor gp = eng_v1(e, s->dt.positions + g->row, DSV4_I64, 1);
        desc.position = f->shaped ? &gp : NULL;
        int64_t m = f->shaped ? 1 : dsv4_compressor_emit_count((int)r, g->start, g->T);
        dsv4_tensor out = eng_v2(e, s->cout + mo * d, DSV4_BF16, m, d);
        TRY(dsv4_compressor_forward(e->ctx, &desc, f->shaped ? 0 : g->start, &gkv, &gg, &L->ape, &w->compressor.norm,
                                    &e->rope_compress, &skv, &ssc, m ? &out : NULL, NULL));
        if (!m || f->replay) continue; /* a replay's entries are in the cache already */
        mo += m;
    }
    if (mo) { /* new entries into the FP8 cache (the insert quantizes the nope dims, rule kv64) at the
               * slots the tables hold for the pool, in the same segment order */
        dsv4_tensor out = eng_v2(e, s->cout, DSV4_BF16, mo, d), slots = eng_v1(e, s->dt.pslots[L->pool], DSV4_I64, mo);
        TRY(dsv4_kv_insert(e->ctx, &out, &L->comp, &slots, NULL, NULL));
    }
    if (L->kind == DSV4_ATTN_CSA) {
        TRY(indexer(f, L, x, qr, saved));
        *width = f->has_extra ? e->cfg->index_topk : 0;
        return DSV4_OK;
    }
    *width = f->hca_width[L->pool];
    return DSV4_OK;
}

/* Sparse attention with sink over rows r0 .. r0+n-1 (one call for every row, or per segment for
 * the HCA scope rows), then inverse RoPE at the query position (§5.7, §5.8). */
static dsv4_status sparse_attention(fwd *f, const eng_layer *L, int64_t r0, int64_t n, const dsv4_tensor *cidx,
                                    const dsv4_tensor *clen)
{
    const dsv4_engine *e = f->e;
    eng_scratch *s = f->s;
    const int64_t H = e->H;
    dsv4_tensor q = eng_v3(e, s->q + r0 * H * 512, DSV4_BF16, n, H, 512), o = eng_v3(e, s->o + r0 * H * 512, DSV4_BF16, n, H, 512);
    dsv4_tensor sidx = eng_v2(e, s->dt.sidx + r0 * e->W, DSV4_I32, n, e->W), slen = eng_v1(e, s->dt.slen + r0, DSV4_I32, n);
    dsv4_sparse_scope swa = {&L->ring, &sidx, &slen}, extra = {&L->comp, cidx, clen};
    dsv4_tensor ws = workspace(e), pos = eng_v1(e, s->dt.positions + r0, DSV4_I64, n);
    TRY(dsv4_sparse_mla_decode(e->ctx, &q, &swa, cidx ? &extra : NULL, &L->sink, (float)(1.0 / sqrt(512.0)), &o, NULL,
                               e->s.ws_bytes ? &ws : NULL));
    return dsv4_inv_rope(e->ctx, &o, &pos, L->rope);
}

/* x = s->x [T, D] (the attention input after attn_norm) -> s->a [T, D]. */
static dsv4_status attention(fwd *f, const eng_layer *L)
{
    const dsv4_engine *e = f->e;
    const dsv4_model_config *c = e->cfg;
    const dsv4_layer_weights *w = L->w;
    eng_scratch *s = f->s;
    const int64_t T = f->T, D = e->D, H = e->H, G = c->o_groups;
    dsv4_tensor x = eng_v2(e, s->x, DSV4_BF16, T, D);
    /* query path (§5.1): qr = q_norm(wq_a·x), q = wq_b·qr */
    dsv4_tensor qr = eng_v2(e, s->qr, DSV4_BF16, T, c->q_lora_rank);
    dsv4_tensor q = eng_v3(e, s->q, DSV4_BF16, T, H, 512), qf = eng_v2(e, s->q, DSV4_BF16, T, H * 512);
    TRY(linear(e, &w->wq_a, &x, &qr));
    TRY(rmsnorm(e, &qr, &w->q_norm, &qr));
    TRY(linear(e, &w->wq_b, &qr, &qf));
    /* the shared KV latent (§5.2): kv = kv_norm(wkv·x) */
    dsv4_tensor kv = eng_v2(e, s->kv, DSV4_BF16, T, 512);
    TRY(linear(e, &w->wkv, &x, &kv));
    TRY(rmsnorm(e, &kv, &w->kv_norm, &kv));
    /* per-head q RMS + RoPE; kv RoPE + FP8 into the ring at entry p mod R */
    dsv4_tensor slots = eng_v1(e, s->dt.rslots, DSV4_I64, T);
    TRY(dsv4_qnorm_rope_kv_insert(e->ctx, &q, &kv, &L->ring, &slots, &f->pos, L->rope, (float)c->norm_eps));
    /* what each query attends to (§5.7): its window, and the compressed entries */
    int64_t cw = 0;
    if (L->ratio) TRY(compressed_scope(f, L, &x, &qr, &cw));
    if (L->kind == DSV4_ATTN_HCA && cw) { /* each segment views its own scope row */
        for (int i = 0; i < f->n_seg; i++) {
            const eng_seg *g = &f->seg[i];
            int64_t gw = f->shaped ? cw : (g->start + g->T) / L->ratio; /* shaped: the capacity, lengths per row */
            dsv4_tensor cidx = rows_view(e, s->dt.hidx[L->pool] + i * e->hrow[L->pool], DSV4_I32, g->T, gw, 0);
            dsv4_tensor clen = eng_v1(e, s->dt.hlen[L->pool] + g->row, DSV4_I32, g->T);
            TRY(sparse_attention(f, L, g->row, g->T, gw ? &cidx : NULL, gw ? &clen : NULL));
        }
    } else {
        dsv4_tensor cidx = eng_v2(e, s->cidx, DSV4_I32, T, cw), clen = eng_v1(e, s->clen, DSV4_I32, T);
        TRY(sparse_attention(f, L, 0, T, cw ? &cidx : NULL, cw ? &clen : NULL));
    }
    /* grouped wo_a over G groups of consecutive heads, then wo_b */
    dsv4_tensor og = eng_v3(e, s->o, DSV4_BF16, T, G, H * 512 / G), z = eng_v3(e, s->z, DSV4_BF16, T, G, c->o_lora_rank);
    TRY(dsv4_grouped_linear(e->ctx, eng_tfmt(&L->wo_a), &og, &L->wo_a, NULL, &z, e->s.ws, e->s.ws_bytes));
    dsv4_tensor zf = eng_v2(e, s->z, DSV4_BF16, T, G * c->o_lora_rank), a = eng_v2(e, s->a, DSV4_BF16, T, D);
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
    dsv4_tensor x = eng_v2(e, s->x, DSV4_BF16, T, e->D), y = eng_v2(e, s->a, DSV4_BF16, T, e->D);
    dsv4_tensor ids = eng_v2(e, s->ids, DSV4_I32, T, k), rw = eng_v2(e, s->rw, DSV4_F32, T, k);
    TRY(dsv4_route(e->ctx, &x, &w->gate_weight, L->hash || !L->gate_bias.data ? NULL : &L->gate_bias,
                   L->hash ? &w->tid2eid : NULL, L->hash ? &f->tok : NULL, (float)c->route_scale, &ids, &rw));
    float limit = c->swiglu_limit > 0 ? (float)c->swiglu_limit : INFINITY;
    if (!e->comm)
        return dsv4_moe(e->ctx, &x, &ids, &rw, L->experts, (int)c->n_routed_experts, L->has_shared ? &L->shared : NULL,
                        limit, &y, e->s.ws, e->s.ws_bytes);
    /* a shard (docs/engine.md §9): its experts' sum (the last shard adds the shared expert), the
     * sums of all shards added in rank order, then the one rounding dsv4_moe does (RNE, in host
     * memory: a sharded engine runs on a CPU backend) */
    const int last = e->rank == e->n_ranks - 1;
    dsv4_tensor acc = eng_v2(e, s->moe_sum, DSV4_F32, T, e->D);
    TRY(dsv4_moe_partial(e->ctx, &x, &ids, &rw, L->experts + e->e_lo, (int)c->n_routed_experts, e->e_lo, e->e_n,
                         L->has_shared && last ? &L->shared : NULL, limit, &acc, e->s.ws, e->s.ws_bytes));
    TRY(dsv4_comm_all_reduce_f32(e->comm, s->moe_sum, T * e->D));
    for (int64_t i = 0; i < T * e->D; i++) s->a[i] = dsv4_bf16_from_f32(s->moe_sum[i]);
    return DSV4_OK;
}

/* ---- a block (§3) --------------------------------------------------------------------------
 * On entry s->xin, post, comb hold hc_pre(attention site) of the streams s->X; on exit the
 * streams are updated and, when `next` is given, s->xin, post, comb hold hc_pre(next). */
static dsv4_status block(fwd *f, const eng_layer *L, const dsv4_hc_site *next)
{
    const dsv4_engine *e = f->e;
    eng_scratch *s = f->s;
    const int64_t T = f->T, D = e->D, hc = e->hc;
    dsv4_tensor X = eng_v3(e, s->X, DSV4_BF16, T, hc, D), xin = eng_v2(e, s->xin, DSV4_BF16, T, D);
    dsv4_tensor x = eng_v2(e, s->x, DSV4_BF16, T, D), a = eng_v2(e, s->a, DSV4_BF16, T, D);
    dsv4_tensor post = eng_v2(e, s->post, DSV4_F32, T, hc), comb = eng_v3(e, s->comb, DSV4_F32, T, hc, hc);
    TRY(rmsnorm(e, &xin, &L->w->attn_norm, &x));
    TRY(attention(f, L));
    TRY(dsv4_hc_post_pre(e->ctx, &a, &X, &post, &comb, &L->hc_ffn, &X, &xin, &post, &comb));
    TRY(rmsnorm(e, &xin, &L->w->ffn_norm, &x));
    TRY(moe(f, L));
    if (next) return dsv4_hc_post_pre(e->ctx, &a, &X, &post, &comb, next, &X, &xin, &post, &comb);
    return dsv4_hc_post(e->ctx, &a, &X, &post, &comb, &X);
}

/* The call's rows, positions, tokens and index tables (in the context's memory once this returns,
 * or for the shaped step once its first launch has run). */
static dsv4_status begin(fwd *f, dsv4_engine *e, const eng_seg *segs, int n_seg, const int32_t *tokens, int shaped)
{
    memset(f, 0, sizeof *f);
    f->e = e;
    f->s = &e->s;
    f->seg = segs;
    f->n_seg = n_seg;
    f->shaped = shaped;
    eng_tables *t = &e->s.t;
    if (e->s.tab_inflight) { /* a shaped step's upload may still read the host tables */
        TRY(dsv4_device_sync(e->ctx));
        e->s.tab_inflight = 0;
    }
    e->s.head_rows = 0;
    for (int i = 0; i < n_seg; i++) {
        const eng_seg *g = &segs[i];
        for (int64_t r = 0; r < g->T; r++) t->positions[g->row + r] = g->start + r;
        f->T += g->T;
        f->save |= g->save;
    }
    if (tokens != t->tokens) memcpy(t->tokens, tokens, (size_t)f->T * sizeof *tokens);
    f->pos = eng_v1(e, e->s.dt.positions, DSV4_I64, f->T);
    f->hpos = eng_t1(t->positions, DSV4_I64, f->T); /* host memory */
    f->tok = eng_v1(e, e->s.dt.tokens, DSV4_I32, f->T);
    return build_tables(f);
}

/* hc_pre of the first site over the streams s->X [T, hc, D] */
static dsv4_status first_hc_pre(fwd *f, const dsv4_hc_site *site)
{
    const dsv4_engine *e = f->e;
    eng_scratch *s = f->s;
    const int64_t T = f->T, D = f->e->D, hc = f->e->hc;
    dsv4_tensor X = eng_v3(e, s->X, DSV4_BF16, T, hc, D), xin = eng_v2(e, s->xin, DSV4_BF16, T, D);
    dsv4_tensor post = eng_v2(e, s->post, DSV4_F32, T, hc), comb = eng_v3(e, s->comb, DSV4_F32, T, hc, hc);
    return dsv4_hc_pre(f->e->ctx, site, &X, &xin, &post, &comb);
}

/* The head of a shard (docs/engine.md §9), n <= s.head_part_rows: its vocabulary rows into its part
 * [n, v_slice] of s.head_parts, the parts all-gathered, then every part's columns into out [n, V]. */
static dsv4_status shard_head(dsv4_engine *e, const dsv4_tensor *y, int64_t n, float *out)
{
    const int64_t V = e->V, vs = e->v_slice;
    float *parts = e->s.head_parts;
    if (e->v_n) {
        const dsv4_tensor *w = &e->dw->head;
        dsv4_tensor rows = *w;
        rows.data = (char *)w->data + (size_t)(e->v_lo * w->stride[0]) * dsv4_dtype_size(w->dtype);
        rows.shape[0] = e->v_n;
        dsv4_tensor lg = rows_view(e, parts + e->rank * n * vs, DSV4_F32, n, e->v_n, vs);
        TRY(linear_t(e, &rows, y, &lg));
    }
    TRY(dsv4_comm_all_gather(e->comm, parts, (size_t)(n * vs) * 4));
    for (int r = 0; r < e->n_ranks; r++) {
        const int64_t lo = r * vs < V ? r * vs : V, w = (lo + vs < V ? lo + vs : V) - lo;
        for (int64_t i = 0; i < n && w; i++) memcpy(out + i * V + lo, parts + (r * n + i) * vs, (size_t)w * 4);
    }
    return DSV4_OK;
}

/* The head of the streams X [n, hc, D] (L: as eng_logits) into out [n, V] in the context's memory. */
static dsv4_status head(dsv4_engine *e, const eng_layer *L, const uint16_t *X, int64_t n, float *out)
{
    dsv4_tensor Xv = eng_v3(e, X, DSV4_BF16, n, e->hc, e->D), y = eng_v2(e, e->s.xin, DSV4_BF16, n, e->D);
    dsv4_tensor lg = eng_v2(e, out, DSV4_F32, n, e->V);
    TRY(dsv4_hc_head(e->ctx, L ? &L->hc_head : &e->hc_head, &Xv, &y));
    TRY(rmsnorm(e, &y, L ? &L->w->norm : &e->dw->norm, &y));
    return e->comm ? shard_head(e, &y, n, out) : linear_t(e, &e->dw->head, &y, &lg);
}

/* ---- the shaped decode step (docs/engine.md §2.2) ---------------------------------------------
 * A call of decode rows only (T = 1 per segment, nothing saved or replayed) on the device path:
 * its launches read every position-dependent value from the tables (positions, slots or -1,
 * lengths) and use the engine's capacities for the widths, so they are a function of the segments'
 * count and sequences alone. By construction: once the tables are built, the launches see segments
 * whose positions are erased. On CUDA the launches are recorded once per such shape as a graph
 * and replayed (DSV4_CUDA_GRAPH=0: the plain launches; =shaped: these launches, not recorded). */
static int shapeable(const dsv4_engine *e, const eng_seg *segs, int n_seg, int flags)
{
    if (e->step_mode == ENG_STEP_PLAIN || flags) return 0;
    for (int i = 0; i < n_seg; i++)
        if (segs[i].T != 1 || segs[i].save) return 0;
    return 1;
}

static dsv4_status blocks(fwd *f)
{
    dsv4_engine *e = f->e;
    const int64_t nl = e->cfg->n_layers;
    TRY(shard_status(e, eng_wrap(first_hc_pre(f, &e->layers[0].hc_attn), "block", 0)));
    for (int64_t l = 0; l < nl; l++) {
        const dsv4_hc_site *next = l + 1 < nl ? &e->layers[l + 1].hc_attn : NULL;
        TRY(shard_status(e, eng_wrap(block(f, &e->layers[l], next), "block", (int)l)));
    }
    return DSV4_OK;
}

/* tables -> embedding -> blocks -> the head of every row into s.dlogits (when they fit there) */
static dsv4_status shaped_launches(fwd *f)
{
    dsv4_engine *e = f->e;
    eng_scratch *s = f->s;
    TRY(upload_tables(f));
    TRY(embed(f, e->hc, s->X));
    TRY(blocks(f));
    return f->T <= s->dlogits_rows ? head(e, NULL, s->X, f->T, s->dlogits) : DSV4_OK;
}

static eng_graph *find_graph(dsv4_engine *e, const eng_seg *plan, int n)
{
    for (int k = 0; k < ENG_GRAPHS; k++) {
        eng_graph *g = &e->graphs[k];
        if (!g->graph || g->n != n) continue;
        int same = 1;
        for (int i = 0; i < n && same; i++) same = g->sq[i] == plan[i].sq;
        if (same) return g;
    }
    return NULL;
}

/* Record the launches as a graph in a free (or the oldest) place of the cache, then launch it. */
static dsv4_status capture(fwd *f)
{
    dsv4_engine *e = f->e;
    TRY(dsv4_device_graph_begin(e->ctx));
    dsv4_status st = shaped_launches(f);
    dsv4_device_graph *gr = NULL;
    dsv4_status end = dsv4_device_graph_end(e->ctx, &gr); /* ends the capture whatever happened in it */
    if (st == DSV4_OK) st = end;
    if (st != DSV4_OK) {
        dsv4_device_graph_destroy(gr);
        return st;
    }
    eng_graph *g = &e->graphs[e->graph_next];
    e->graph_next = (e->graph_next + 1) % ENG_GRAPHS;
    dsv4_device_graph_destroy(g->graph);
    g->graph = gr;
    g->n = f->n_seg;
    for (int i = 0; i < f->n_seg; i++) g->sq[i] = f->seg[i].sq;
    return dsv4_device_graph_launch(gr);
}

static dsv4_status shaped_step(fwd *f)
{
    dsv4_engine *e = f->e;
    eng_scratch *s = f->s;
    eng_seg *plan = s->plan;
    for (int i = 0; i < f->n_seg; i++) plan[i] = (eng_seg){f->seg[i].sq, 0, -1, 1, i, f->seg[i].src, 0};
    f->seg = plan; /* positions erased */
    const int record = e->step_mode == ENG_STEP_GRAPH && f->n_seg <= ENG_GRAPH_SEGS;
    if (record) {
        const eng_graph *g = find_graph(e, plan, f->n_seg);
        dsv4_status st = g ? dsv4_device_graph_launch(g->graph) : capture(f);
        if (st != DSV4_OK && !g) { /* not capturable here: eager launches from now on */
            dsv4_warn("engine: the decode step runs without a CUDA graph (its capture failed: %s)", dsv4_last_error());
            e->step_mode = ENG_STEP_SHAPED;
        } else {
            TRY(st);
            s->tab_inflight = 1;
        }
    }
    if (!record || e->step_mode != ENG_STEP_GRAPH) TRY(shaped_launches(f));
    s->head_rows = f->T <= s->dlogits_rows ? f->T : 0;
    return DSV4_OK;
}

dsv4_status eng_main_forward(dsv4_engine *e, const eng_seg *segs, int n_seg, const int32_t *tokens, int flags)
{
    fwd f;
    const int shaped = shapeable(e, segs, n_seg, flags);
    TRY(begin(&f, e, segs, n_seg, tokens, shaped));
    eng_scratch *s = &e->s;
    if (shaped) {
        TRY(shaped_step(&f));
        for (int i = 0; i < n_seg; i++) {
            eng_seq *q = &e->seqs[segs[i].sq];
            q->hist[segs[i].start] = s->t.tokens[segs[i].row];
            q->len = segs[i].start + 1;
        }
        return DSV4_OK;
    }
    f.replay = (flags & ENG_REPLAY) != 0;
    const int64_t nl = e->cfg->n_layers;
    TRY(embed(&f, e->hc, s->X)); /* the streams start as hc copies of the embedding */
    for (int i = 0; i < n_seg; i++) {
        if (!segs[i].save) continue;
        for (int b = 0; b < nl; b++) {
            const eng_layer *L = &e->layers[b];
            if (L->snapshot)
                TRY(eng_copy(e, L->snapshot + (size_t)segs[i].sq * (size_t)L->state_floats, eng_state(e, L, segs[i].sq),
                             L->state_floats * 4));
        }
    }
    TRY(blocks(&f));
    for (int i = 0; i < n_seg; i++) {
        eng_seq *q = &e->seqs[segs[i].sq];
        memcpy(q->hist + segs[i].start, s->t.tokens + segs[i].row, (size_t)segs[i].T * sizeof *q->hist);
        q->len = segs[i].start + segs[i].T;
    }
    return DSV4_OK;
}

/* logits is host memory: on a device the head writes s.dlogits, downloaded in pieces of its rows;
 * logits NULL (a device, n <= dlogits_rows): they stay there, for the sampling on the device. */
dsv4_status eng_logits(dsv4_engine *e, const eng_layer *L, const uint16_t *X, int64_t n, float *logits)
{
    const int64_t D = e->D, V = e->V, piece = e->on_device ? e->s.dlogits_rows : e->comm ? e->s.head_part_rows : n;
    if (!logits && (!e->on_device || n > piece))
        return dsv4_fail(DSV4_ERR_CAPACITY, "engine: %lld logits rows kept on the device (room for %lld)", (long long)n,
                         (long long)piece);
    for (int64_t r0 = 0; r0 < n; r0 += piece) {
        const int64_t m = n - r0 < piece ? n - r0 : piece;
        float *out = e->on_device ? e->s.dlogits : logits + r0 * V;
        TRY(shard_status(e, head(e, L, X + r0 * e->hc * D, m, out)));
        if (e->on_device && logits) TRY(dsv4_device_download(e->ctx, logits + r0 * V, out, (size_t)(m * V) * 4));
    }
    return DSV4_OK;
}

dsv4_status eng_step_logits(dsv4_engine *e, const int64_t *rows, int64_t n, float *logits)
{
    const int64_t V = e->V;
    if (!logits) { /* kept on the device for its sampling, as rows 0..n-1 (rows[i] >= i increase:
                    * each row moves down onto one no later row reads) */
        for (int64_t i = 0; i < n; i++)
            if (rows[i] != i) TRY(eng_copy(e, e->s.dlogits + i * V, e->s.dlogits + rows[i] * V, V * 4));
        return DSV4_OK;
    }
    for (int64_t i = 0; i < n;) {
        int64_t k = 1; /* a run of consecutive rows: one download */
        while (i + k < n && rows[i + k] == rows[i] + k) k++;
        TRY(dsv4_device_download(e->ctx, logits + i * V, e->s.dlogits + rows[i] * V, (size_t)(k * V) * 4));
        i += k;
    }
    return DSV4_OK;
}

/* ---- MTP (§8) ------------------------------------------------------------------------------- */
dsv4_status eng_mtp_rows(dsv4_engine *e, const eng_seg *segs, int n_seg, const int32_t *tokens)
{
    const eng_layer *L = &e->layers[e->cfg->n_layers];
    const dsv4_layer_weights *w = L->w;
    eng_scratch *s = &e->s;
    const int64_t D = e->D, hc = e->hc;
    fwd f;
    TRY(begin(&f, e, segs, n_seg, tokens, 0));
    const int64_t T = f.T;
    /* X[t][j] = bf16(e_proj·enorm(embed[tok]) + h_proj·hnorm(streams[t][j])) */
    dsv4_tensor x = eng_v2(e, s->x, DSV4_BF16, T, D), ep = eng_v2(e, s->a, DSV4_BF16, T, D);
    dsv4_tensor hh = eng_v2(e, s->Xm, DSV4_BF16, T * hc, D), hp = eng_v2(e, s->X, DSV4_BF16, T * hc, D);
    TRY(rmsnorm(e, &hh, &w->hnorm, &hh));
    TRY(embed(&f, 1, s->x));
    TRY(rmsnorm(e, &x, &w->enorm, &x));
    TRY(linear(e, &w->e_proj, &x, &ep));
    TRY(linear(e, &w->h_proj, &hh, &hp));
    dsv4_tensor X = eng_v3(e, s->X, DSV4_BF16, T, hc, D);
    TRY(dsv4_add_bf16(e->ctx, &X, &ep, &X));
    TRY(first_hc_pre(&f, &L->hc_attn));
    return shard_status(e, eng_wrap(block(&f, L, NULL), "MTP block", 0));
}

/* ---- rollback after rejected drafts ---------------------------------------------------------- */
/* Replay `keep` tokens from start through one compressor whose inputs are columns col.. of the
 * saved rows from `row`; the entries it emits are in the caches already, so they go to scratch. */
static dsv4_status replay(dsv4_engine *e, const eng_layer *L, int kind, int64_t start, int64_t keep, int64_t row,
                          float *state)
{
    eng_scratch *s = &e->s;
    const int64_t dI = e->cfg->index_head_dim, d = kind == DSV4_COMPRESSOR_MAIN ? 512 : dI;
    const int r = L->ratio, ov = kind == DSV4_COMPRESSOR_MAIN ? eng_overlap(L) : 1, coff = ov ? 2 : 1;
    const int64_t w = coff * d, rows = coff * r, col = kind == DSV4_COMPRESSOR_MAIN ? 0 : 4 * 512;
    const dsv4_compressor_weights *cw = kind == DSV4_COMPRESSOR_MAIN ? &L->w->compressor : &L->w->index_compressor;
    const float *saved = L->saved_proj + row * L->proj_ld;
    dsv4_tensor kv = rows_view(e, saved + col, DSV4_F32, keep, w, L->proj_ld);
    dsv4_tensor g = rows_view(e, saved + col + w, DSV4_F32, keep, w, L->proj_ld);
    dsv4_tensor skv = eng_v2(e, state, DSV4_F32, rows, w), ssc = eng_v2(e, state + rows * w, DSV4_F32, rows, w);
    int64_t m = dsv4_compressor_emit_count(r, start, keep);
    dsv4_tensor out = eng_v2(e, kind == DSV4_COMPRESSOR_MAIN ? s->cout : s->qi, DSV4_BF16, m, d);
    dsv4_compressor_desc desc = {.kind = (dsv4_compressor_kind)kind, .ratio = r, .dim = (int)d,
                                 .eps = (float)e->cfg->norm_eps, .overlap = ov};
    return dsv4_compressor_forward(e->ctx, &desc, start, &kv, &g, kind == DSV4_COMPRESSOR_MAIN ? &L->ape : &L->index_ape,
                                   &cw->norm, &e->rope_compress, &skv, &ssc, m ? &out : NULL, NULL);
}

dsv4_status eng_rollback(dsv4_engine *e, int sq, int64_t start, int64_t keep, int64_t row)
{
    for (int64_t b = 0; b < e->cfg->n_layers; b++) {
        const eng_layer *L = &e->layers[b];
        if (!L->snapshot) continue;
        float *st = eng_state(e, L, sq);
        TRY(eng_copy(e, st, L->snapshot + (size_t)sq * (size_t)L->state_floats, L->state_floats * 4));
        if (!keep) continue;
        TRY(replay(e, L, DSV4_COMPRESSOR_MAIN, start, keep, row, st));
        if (L->kind == DSV4_ATTN_CSA)
            TRY(replay(e, L, DSV4_COMPRESSOR_INDEXER, start, keep, row, st + eng_main_state_floats(L)));
    }
    e->seqs[sq].len = start + keep;
    return DSV4_OK;
}
