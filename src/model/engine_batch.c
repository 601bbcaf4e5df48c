/* The batched forward (include/dsv4/engine.h): many sequences in one pass over the weights.
 *
 * A call's entries are checked first, then packed in order into chunks of at most max_batch rows
 * (an entry may span chunks; a chunk holds one segment per sequence). Each chunk runs the main
 * model over all its rows (forward.c), delivers the logits of the rows the entries asked for in
 * one pass of the head, then the MTP rows whose next token is now known. Outputs arrive in entry
 * order, so each chunk's wanted rows are a contiguous range of the caller's buffers. */
#include "model/engine_internal.h"

#include "core/error.h"

#include <stdio.h>
#include <string.h>

#define TRY DSV4_TRY

dsv4_status eng_check_rows(dsv4_engine *e, const char *op, int i, int seq, const int32_t *tokens, int64_t n, int64_t extra)
{
    TRY(eng_check_usable(e, seq, op));
    if (e->s.mark[seq]) return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: entry %d: sequence %d appears twice in the call", op, i, seq);
    e->s.mark[seq] = 1;
    DSV4_CHECK_ARG(tokens && n >= 1, "%s: entry %d: need n_tokens >= 1 tokens (got %lld)", op, i, (long long)n);
    for (int64_t j = 0; j < n; j++)
        if (tokens[j] < 0 || tokens[j] >= e->V)
            return dsv4_fail(DSV4_ERR_RANGE, "%s: entry %d: token %lld = %d is outside the vocabulary [0, %lld)", op, i,
                             (long long)j, tokens[j], (long long)e->V);
    const eng_seq *q = &e->seqs[seq];
    if (n + extra > e->opt.max_context - q->len)
        return dsv4_fail(DSV4_ERR_CAPACITY, "%s: entry %d: sequence %d: %lld + %lld tokens exceed max_context %lld", op, i, seq,
                         (long long)q->len, (long long)(n + extra), (long long)e->opt.max_context);
    return DSV4_OK;
}

void eng_clear_marks(dsv4_engine *e, const int *seqs, int n, size_t stride)
{
    for (int i = 0; i < n; i++) {
        int sq = *(const int *)((const char *)seqs + (size_t)i * stride);
        if (sq >= 0 && sq < e->opt.max_seqs) e->s.mark[sq] = 0;
    }
}

int64_t eng_mtp_first(const dsv4_engine *e, int seq, int32_t next)
{
    const eng_seq *q = &e->seqs[seq];
    /* a head row run for another next token is run again (pending holds its streams) */
    return q->mtp_len == q->len && q->len > 0 && q->head_tok != next ? q->len - 1 : q->mtp_len;
}

/* In place when the rows are consecutive, else gathered into s.Xm first. */
dsv4_status eng_logits_rows(dsv4_engine *e, const eng_layer *L, const uint16_t *X, const int64_t *rows, int64_t n,
                                  float *out)
{
    if (!n) return DSV4_OK;
    const int64_t rs = e->hc * e->D;
    int computed = !L && X == e->s.X && e->s.head_rows > 0; /* the shaped step ran the head of its rows */
    for (int64_t i = 0; i < n && computed; i++) computed = rows[i] >= 0 && rows[i] < e->s.head_rows;
    if (computed) return eng_step_logits(e, rows, n, out);
    int consecutive = 1;
    for (int64_t i = 1; i < n && consecutive; i++) consecutive = rows[i] == rows[0] + i;
    if (consecutive) return eng_logits(e, L, X + rows[0] * rs, n, out);
    for (int64_t i = 0; i < n; i++) DSV4_TRY(eng_gather_streams(e, i, X + rows[i] * rs, 1));
    return eng_logits(e, L, e->s.Xm, n, out);
}

dsv4_status eng_mtp_add(dsv4_engine *e, int *k, int64_t *m, const eng_seg *main, int64_t first, int64_t n,
                        const int32_t *next)
{
    if (n <= 0) return DSV4_OK;
    eng_scratch *s = &e->s;
    const eng_seq *q = &e->seqs[main->sq];
    const int64_t rs = e->hc * e->D, pre = first < main->start ? 1 : 0; /* position start-1: pending */
    if (pre) DSV4_TRY(eng_gather_streams(e, *m, q->pending + q->pend * rs, 1));
    DSV4_TRY(eng_gather_streams(e, *m + pre, s->X + (main->row + first + pre - main->start) * rs, n - pre));
    memcpy(s->mtok + *m, next, (size_t)n * sizeof *next);
    s->msegs[(*k)++] = (eng_seg){main->sq, 0, first, n, *m, main->src, main->start - main->off};
    *m += n;
    return DSV4_OK;
}

dsv4_status eng_mtp_catch_up(dsv4_engine *e, const eng_seg *g, int *k, int64_t *m)
{
    eng_seq *q = &e->seqs[g->sq];
    const int64_t rs = e->hc * e->D, first = q->mtp_len, n = g->start + g->T - 1 - first; /* first >= start - 1 */
    DSV4_TRY(eng_mtp_add(e, k, m, g, first, n, e->s.t.tokens + g->row + first + 1 - g->start));
    DSV4_TRY(eng_copy(e, q->pending + (1 - q->pend) * rs, e->s.X + (g->row + g->T - 1) * rs, rs * 2));
    q->pend = 1 - q->pend;
    q->mtp_len = first + (n > 0 ? n : 0);
    return DSV4_OK;
}

/* The chunks of a checked call; a failure here may leave the caches partly advanced. */
static dsv4_status run_chunks(dsv4_engine *e, const dsv4_batch_entry *en, int n_en, float *logits, float *mtp_logits)
{
    eng_scratch *s = &e->s;
    const int mtp = e->opt.max_mtp > 0;
    const int64_t V = e->V;
    int64_t lout = 0, mout = 0; /* output rows delivered so far */
    int ei = 0;
    int64_t off = 0; /* tokens of entry ei already run */
    while (ei < n_en) {
        /* pack a chunk */
        int k = 0;
        int64_t T = 0;
        while (ei < n_en && T < e->opt.max_batch) {
            const dsv4_batch_entry *b = &en[ei];
            int64_t take = b->n_tokens - off < e->opt.max_batch - T ? b->n_tokens - off : e->opt.max_batch - T;
            s->segs[k++] = (eng_seg){b->seq, 0, e->seqs[b->seq].len, take, T, ei, off};
            memcpy(s->t.tokens + T, b->tokens + off, (size_t)take * sizeof *s->t.tokens);
            T += take;
            off += take;
            if (off == b->n_tokens) ei++, off = 0;
        }
        TRY(eng_main_forward(e, s->segs, k, s->t.tokens, 0));
        /* rows whose logits were asked for: tokens >= n_tokens - n_logits of each entry */
        int64_t n_rows = 0;
        for (int i = 0; i < k; i++) {
            const eng_seg *g = &s->segs[i];
            const dsv4_batch_entry *b = &en[g->src];
            for (int64_t t = 0; t < g->T; t++)
                if (g->off + t >= b->n_tokens - b->n_logits) s->cslots[n_rows++] = g->row + t;
        }
        TRY(eng_logits_rows(e, NULL, s->X, s->cslots, n_rows, logits + lout * V));
        lout += n_rows;
        if (!mtp) continue;
        /* MTP rows of every position whose next token is known; those asked for are the last
         * n_mtp_logits before the entry's last position */
        int nm = 0;
        int64_t mrows = 0;
        for (int i = 0; i < k; i++) TRY(eng_mtp_catch_up(e, &s->segs[i], &nm, &mrows));
        if (nm) TRY(eng_mtp_rows(e, s->msegs, nm, s->mtok));
        n_rows = 0;
        for (int i = 0; i < nm; i++) {
            const eng_seg *g = &s->msegs[i];
            const dsv4_batch_entry *b = &en[g->src];
            int64_t last = g->off + b->n_tokens - 1; /* the entry's last position */
            for (int64_t t = 0; t < g->T; t++)
                if (g->start + t >= last - b->n_mtp_logits) s->cslots[n_rows++] = g->row + t;
        }
        TRY(eng_logits_rows(e, &e->layers[e->cfg->n_layers], s->X, s->cslots, n_rows, mtp_logits + mout * V));
        mout += n_rows;
    }
    return DSV4_OK;
}

dsv4_status dsv4_engine_forward_batch(dsv4_engine *e, const dsv4_batch_entry *en, int n_en, float *logits,
                                      float *mtp_logits)
{
    const char *op = "engine_forward_batch";
    DSV4_CHECK_ARG(e, "%s: null engine", op);
    DSV4_CHECK_ARG(en && n_en >= 1, "%s: need at least one entry", op);
    const int mtp = e->opt.max_mtp > 0;
    int64_t n_logits = 0, n_mtp = 0;
    dsv4_status st = DSV4_OK;
    int i = 0;
    for (; i < n_en; i++) {
        const dsv4_batch_entry *b = &en[i];
        st = eng_check_rows(e, op, i, b->seq, b->tokens, b->n_tokens, 0);
        if (st != DSV4_OK) break;
        const eng_seq *q = &e->seqs[b->seq];
        const int64_t mtp_rows = mtp ? q->len + b->n_tokens - 1 - eng_mtp_first(e, b->seq, b->tokens[0]) : 0;
        if (b->n_logits < 0 || b->n_logits > b->n_tokens) {
            st = dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: entry %d: n_logits %lld must be in [0, n_tokens = %lld]", op, i,
                           (long long)b->n_logits, (long long)b->n_tokens);
            break;
        }
        if (b->n_mtp_logits < 0 || b->n_mtp_logits > mtp_rows) {
            st = dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: entry %d: n_mtp_logits %lld must be in [0, %lld] (the MTP rows it runs)", op,
                           i, (long long)b->n_mtp_logits, (long long)mtp_rows);
            break;
        }
        n_logits += b->n_logits;
        n_mtp += b->n_mtp_logits;
    }
    eng_clear_marks(e, &en[0].seq, i < n_en ? i + 1 : n_en, sizeof *en);
    TRY(st);
    DSV4_CHECK_ARG(!n_logits || logits, "%s: %lld logits rows asked for without a buffer", op, (long long)n_logits);
    DSV4_CHECK_ARG(!n_mtp || mtp_logits, "%s: %lld MTP logits rows asked for without a buffer", op, (long long)n_mtp);
    /* everything that can be checked is; what fails from here on fails the call's sequences */
    if (mtp)
        for (i = 0; i < n_en; i++) e->seqs[en[i].seq].mtp_len = eng_mtp_first(e, en[i].seq, en[i].tokens[0]);
    st = run_chunks(e, en, n_en, logits, mtp_logits);
    return st == DSV4_OK ? st : eng_seqs_failed(e, &en[0].seq, n_en, sizeof *en, st, op);
}

dsv4_status eng_seqs_failed(dsv4_engine *e, const int *seqs, int n, size_t stride, dsv4_status st, const char *op)
{
    for (int i = 0; i < n; i++) e->seqs[*(const int *)((const char *)seqs + (size_t)i * stride)].failed = 1;
    char msg[480];
    snprintf(msg, sizeof msg, "%s", dsv4_last_error());
    return dsv4_fail(st, "%s: %s now unusable until reset or freed (caches partly updated): %s", op,
                     n > 1 ? "every sequence of the call is" : "the sequence is", msg);
}

dsv4_status dsv4_engine_forward(dsv4_engine *e, int seq, const int32_t *tokens, int64_t n, float *logits, int64_t n_logits,
                                float *mtp_logits, int64_t n_mtp_logits)
{
    const dsv4_batch_entry b = {seq, tokens, n, n_logits, n_mtp_logits};
    return dsv4_engine_forward_batch(e, &b, 1, logits, mtp_logits);
}
