/* The indexer family of both cpu backends: drivers over a kernel set (scalar for cpu-ref, the
 * best ISA's for cpu), and the two op tables. Work is split into fixed chunks of candidates;
 * scores are per-candidate computations and top-k is a total order, so no result depends on
 * the thread count (nor on which thread ran which chunk: work is handed out dynamically, which
 * keeps a shared, oversubscribed machine from stalling on one descheduled thread). */
#include "backends/cpu/indexer_cpu.h"
#include "core/error.h"
#include "core/pool.h"

#include <string.h>

#define IX_CHUNK 2048 /* candidates per parallel work item */
#define IX_BLOCK 256  /* candidates scored between two top-k updates */

static const dsv4_ix_kernels *best_kernels(const dsv4_exec *ex)
{
    switch (ex->isa) {
    case DSV4_ISA_AVX512: return dsv4_cpu_isa_vnni(ex->isa) ? &dsv4_ix_kernels_avx512 : &dsv4_ix_kernels_avx2;
    case DSV4_ISA_AVX2: return &dsv4_ix_kernels_avx2;
    default: return &dsv4_ix_kernels_scalar;
    }
}

static int64_t position(const dsv4_ix_operands *o, int64_t t)
{
    return o->pos_i64 ? ((const int64_t *)o->positions)[t * o->ld_pos] : ((const int32_t *)o->positions)[t * o->ld_pos];
}

static int64_t n_candidates(const dsv4_ix_operands *o, int64_t t) { return (position(o, t) + 1) / o->ratio; }

typedef struct {
    const dsv4_ix_kernels *kn;
    const dsv4_ix_operands *o;
    float *scores;
    int64_t ld, chunks;
} scores_job;

/* Items it = token * chunks + chunk; a thread keeps the prepared query of its last token. */
static void score_items(void *v, dsv4_par_loop *l, int worker)
{
    const scores_job *j = v;
    const dsv4_ix_operands *o = j->o;
    const int64_t N = o->n_cache;
    dsv4_ix_qprep qp;
    int64_t prepped = -1, lo, hi;
    while (dsv4_par_next(l, &lo, &hi))
        for (int64_t it = lo; it < hi; it++) {
            const int64_t t = it / j->chunks, c0 = (it % j->chunks) * IX_CHUNK, c1 = c0 + IX_CHUNK < N ? c0 + IX_CHUNK : N;
            const int64_t nt = n_candidates(o, t), end = c1 < nt ? c1 : nt;
            float *row = j->scores + t * j->ld;
            if (c0 < end) {
                if (j->kn->needs_qprep && prepped != t) {
                    dsv4_ix_qprep_build(&qp, o, t);
                    prepped = t;
                }
                j->kn->score_run(o, t, &qp, c0, end - c0, row + c0);
            }
            for (int64_t c = c0 > nt ? c0 : nt; c < c1; c++) row[c] = -INFINITY;
        }
}

static dsv4_status scores_with(const dsv4_ix_kernels *kn, const dsv4_exec *ex, const dsv4_ix_operands *o, float *scores,
                               int64_t ld)
{
    const int64_t T = o->tokens, N = o->n_cache, chunks = (N + IX_CHUNK - 1) / IX_CHUNK;
    scores_job j = {kn, o, scores, ld, chunks};
    dsv4_par_team(ex, T * chunks, T * N > IX_CHUNK ? 1 : T * chunks, score_items, &j);
    return DSV4_OK;
}

/* Where the candidates' scores come from: computed (select) or given (topk). */
typedef struct {
    const dsv4_ix_kernels *kn;
    const dsv4_ix_operands *o;
    const float *scores;
    int64_t ld, n;
    const int32_t *n_valid;
    int64_t ld_valid;
} score_src;

static int64_t src_count(const score_src *s, int64_t t)
{
    if (s->o) return n_candidates(s->o, t);
    return s->n_valid ? s->n_valid[t * s->ld_valid] : s->n;
}

static void src_prep(const score_src *s, dsv4_ix_qprep *qp, int64_t t)
{
    if (s->o && s->kn->needs_qprep) dsv4_ix_qprep_build(qp, s->o, t);
}

static const float *src_block(const score_src *s, const dsv4_ix_qprep *qp, int64_t t, int64_t c0, int64_t n, float *buf)
{
    if (!s->o) return s->scores + t * s->ld + c0;
    s->kn->score_run(s->o, t, qp, c0, n, buf);
    return buf;
}

/* Stream candidates lo..hi-1 of token t into st. */
static void stream_range(const score_src *s, const dsv4_ix_qprep *qp, int64_t t, int64_t lo, int64_t hi,
                         dsv4_ix_stream *st)
{
    float buf[IX_BLOCK];
    for (int64_t c0 = lo; c0 < hi; c0 += IX_BLOCK) {
        int64_t n = hi - c0 < IX_BLOCK ? hi - c0 : IX_BLOCK;
        dsv4_ix_stream_push(st, src_block(s, qp, t, c0, n, buf), c0, n);
    }
}

/* Workspace: P counts, then P regions of 2k keys. */
static uint64_t *ws_keys(const dsv4_topk_out *out, int64_t **counts, int p)
{
    uintptr_t base = ((uintptr_t)out->workspace + 7) & ~(uintptr_t)7;
    *counts = (int64_t *)base;
    return (uint64_t *)(base + (size_t)p * sizeof(int64_t));
}

/* One selection on the pool: worker w streams into keys + w * 2k (P regions, P = the threads). */
typedef struct {
    const score_src *s;
    const dsv4_topk_out *out;
    uint64_t *keys;
    int64_t *counts;
    int64_t k, t, nt;
} select_job;

/* Whole tokens [lo, hi), each through this thread's buffer. */
static void select_tokens(void *v, dsv4_par_loop *l, int worker)
{
    const select_job *j = v;
    uint64_t *mine = j->keys + (size_t)worker * 2 * j->k;
    dsv4_ix_qprep qp;
    dsv4_ix_stream st;
    int64_t lo, hi;
    while (dsv4_par_next(l, &lo, &hi))
        for (int64_t t = lo; t < hi; t++) {
            dsv4_ix_stream_init(&st, mine, j->k);
            src_prep(j->s, &qp, t);
            stream_range(j->s, &qp, t, 0, src_count(j->s, t), &st);
            dsv4_ix_emit(mine, dsv4_ix_stream_finish(&st), j->out, t);
        }
}

/* Candidate chunks of token j->t, streamed into this thread's buffer; its count left in counts. */
static void select_chunks(void *v, dsv4_par_loop *l, int worker)
{
    const select_job *j = v;
    dsv4_ix_qprep qp;
    dsv4_ix_stream st;
    dsv4_ix_stream_init(&st, j->keys + (size_t)worker * 2 * j->k, j->k);
    src_prep(j->s, &qp, j->t);
    int64_t lo, hi;
    while (dsv4_par_next(l, &lo, &hi))
        for (int64_t ch = lo; ch < hi; ch++)
            stream_range(j->s, &qp, j->t, ch * IX_CHUNK, (ch + 1) * IX_CHUNK < j->nt ? (ch + 1) * IX_CHUNK : j->nt, &st);
    j->counts[worker] = dsv4_ix_stream_finish(&st);
}

static dsv4_status select_fast(const score_src *s, const dsv4_exec *ex, int64_t T, const dsv4_topk_out *out)
{
    const int p = ex->threads > 0 ? ex->threads : 1;
    select_job j = {s, out, NULL, NULL, out->topk, 0, 0};
    j.keys = ws_keys(out, &j.counts, p);
    const int64_t k = j.k;
    if (T >= p) { /* whole tokens per thread */
        dsv4_par_team(ex, T, 1, select_tokens, &j);
        return DSV4_OK;
    }
    for (int64_t t = 0; t < T; t++) { /* one token at a time, its candidates split in chunks */
        const int64_t nt = src_count(s, t), chunks = (nt + IX_CHUNK - 1) / IX_CHUNK;
        memset(j.counts, 0, (size_t)p * sizeof(int64_t));
        j.t = t;
        j.nt = nt;
        dsv4_par_team(ex, chunks, 1, select_chunks, &j); /* a thread without chunks leaves its count 0 */
        uint64_t *keys = j.keys;
        int64_t total = 0;
        for (int i = 0; i < p; i++) {
            if (j.counts[i] && total != (int64_t)i * 2 * k)
                memmove(keys + total, keys + (size_t)i * 2 * k, (size_t)j.counts[i] * sizeof(uint64_t));
            total += j.counts[i];
        }
        dsv4_ix_emit(keys, dsv4_ix_keep_best(keys, total, k), out, t);
    }
    return DSV4_OK;
}

/* Reference selection: every token's candidates through a min-heap of k keys, in order. */
static void select_ref_tokens(void *v, dsv4_par_loop *l, int worker)
{
    const select_job *j = v;
    const score_src *s = j->s;
    uint64_t *heap = j->keys + (size_t)worker * 2 * j->k;
    int64_t lo, hi;
    while (dsv4_par_next(l, &lo, &hi))
        for (int64_t t = lo; t < hi; t++) {
            int64_t size = 0, nt = src_count(s, t);
            for (int64_t c = 0; c < nt; c++) {
                float v = s->o ? dsv4_ix_ref_score(s->o, t, c) : s->scores[t * s->ld + c];
                dsv4_ix_heap_push(heap, &size, j->k, dsv4_ix_key(v, c));
            }
            dsv4_ix_emit(heap, size, j->out, t);
        }
}

static dsv4_status select_ref(const score_src *s, const dsv4_exec *ex, int64_t T, const dsv4_topk_out *out)
{
    const int p = ex->threads > 0 ? ex->threads : 1;
    select_job j = {s, out, NULL, NULL, out->topk, 0, 0};
    j.keys = ws_keys(out, &j.counts, p);
    dsv4_par_team(ex, T, 1, select_ref_tokens, &j);
    return DSV4_OK;
}

static dsv4_status head_weights(const dsv4_exec *ex, const void *proj, int proj_bf16, int64_t ld_proj, int64_t tokens,
                                int64_t heads, float scale, float *out, int64_t ld_out)
{
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t h = 0; h < heads; h++) {
            float v = proj_bf16 ? dsv4_bf16_to_f32(((const uint16_t *)proj)[t * ld_proj + h])
                                : ((const float *)proj)[t * ld_proj + h];
            out[t * ld_out + h] = dsv4_bf16_round(v * scale);
        }
    return DSV4_OK;
}

static dsv4_status ws_size_check(const dsv4_topk_out *out, const dsv4_exec *ex, int64_t T)
{
    if (out->workspace_bytes < dsv4_ix_workspace_size(ex, T, out->topk))
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "indexer: workspace too small");
    return DSV4_OK;
}

/* Two tables over the same drivers; the kernel set and the selection algorithm differ. */
#define DEFINE_INDEXER_OPS(prefix, kernels_expr, select_fn)                                                       \
    static dsv4_status prefix##_compress(const dsv4_exec *ex, const dsv4_cmp_call *c)                             \
    { return dsv4_cmp_run(kernels_expr, ex, c); }                                                                  \
    static dsv4_status prefix##_index_q(const dsv4_exec *ex, const dsv4_ixq_call *c)                              \
    { return dsv4_ixq_run(kernels_expr, ex, c); }                                                                  \
    static dsv4_status prefix##_scores(const dsv4_exec *ex, const dsv4_ix_operands *o, float *sc, int64_t ld)     \
    { return scores_with(kernels_expr, ex, o, sc, ld); }                                                           \
    static dsv4_status prefix##_select(const dsv4_exec *ex, const dsv4_ix_operands *o, const dsv4_topk_out *out)  \
    {                                                                                                              \
        DSV4_TRY(ws_size_check(out, ex, o->tokens));                                                               \
        score_src s = {.kn = kernels_expr, .o = o};                                                                \
        return select_fn(&s, ex, o->tokens, out);                                                                  \
    }                                                                                                              \
    static dsv4_status prefix##_topk(const dsv4_exec *ex, const float *sc, int64_t ld, int64_t tokens, int64_t n,  \
                                     const int32_t *nv, int64_t ldv, const dsv4_topk_out *out)                     \
    {                                                                                                              \
        DSV4_TRY(ws_size_check(out, ex, tokens));                                                                  \
        score_src s = {.scores = sc, .ld = ld, .n = n, .n_valid = nv, .ld_valid = ldv};                            \
        return select_fn(&s, ex, tokens, out);                                                                     \
    }                                                                                                              \
    const struct dsv4_indexer_ops prefix##_indexer_ops = {                                                        \
        .compress = prefix##_compress, .compress_reset = dsv4_cmp_reset, .index_q = prefix##_index_q,             \
        .head_weights = head_weights,                                                                              \
        .scores = prefix##_scores, .select = prefix##_select, .topk = prefix##_topk,                              \
        .workspace_size = dsv4_ix_workspace_size,                                                                  \
    };

DEFINE_INDEXER_OPS(dsv4_cpu_ref, &dsv4_ix_kernels_scalar, select_ref)
DEFINE_INDEXER_OPS(dsv4_cpu, best_kernels(ex), select_fast)
