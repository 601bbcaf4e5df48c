/* Generation (include/dsv4/engine.h): prefill, then plain decode steps or MTP speculative steps
 * (docs/model.md §8, docs/engine.md):
 *
 *   draft     the MTP block's row n-1 (main streams of position n-1, token x_n) gives d_1; each
 *             further draft feeds the block's own output streams back with the last draft token
 *   verify    one forward of [x_n, d_1 .. d_k] at positions n .. n+k: target logits of every row
 *   accept    greedy: the longest prefix with d_j == argmax; else min(1, p/q) per draft and a
 *             sample of max(0, p - q) at the first rejection; plus one token of the target model
 *   repair    rejected rows: every compressed block's compressor states go back to their snapshot
 *             and replay the kept tokens; rings and compressed caches need nothing (every entry a
 *             later query reads is rewritten first); then the MTP rows of the kept positions run
 *             with the target's streams, the last of them being the next step's first draft.
 * A step (dsv4_engine_step) does this for many sequences at once, each phase one batched pass;
 * generate is a prefill and then a loop of one-request steps. */
#include "model/engine_internal.h"

#include "core/error.h"
#include "core/sample.h"
#include "dsv4/device.h"
#include "dsv4/tensor_ops.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct gen {
    dsv4_engine *e;
    int sq;
    const dsv4_generate_options *o;
    uint64_t rng[4];
    int32_t *out;
    int64_t cap, n_out, max;
    int32_t last; /* the last token produced (fed to the next step) */
    int stop;
    dsv4_generate_stats st;
} gen;

static int is_eos(const dsv4_engine *e, int32_t t)
{
    for (int i = 0; i < e->cfg->n_eos; i++)
        if (e->cfg->eos_token_ids[i] == t) return 1;
    return 0;
}

/* Record the tokens of one step (cut at max_tokens and at an EOS) and report it. */
static void emit(gen *g, int64_t step, const int32_t *toks, int64_t n, int drafted, int accepted, double t0,
                 const float *logits, int64_t n_logits, int64_t first_pos)
{
    int64_t k = 0;
    while (k < n && g->n_out < g->max) {
        int32_t t = toks[k++];
        if (g->n_out < g->cap) g->out[g->n_out] = t;
        g->n_out++;
        g->last = t;
        if (g->o->stop_at_eos && is_eos(g->e, t)) {
            g->stop = 1;
            break;
        }
    }
    if (g->n_out >= g->max) g->stop = 1;
    dsv4_gen_step s = {step, toks, k, drafted, accepted, now_s() - t0, logits, n_logits, first_pos};
    if (g->o->callback && g->o->callback(g->o->user, &s)) g->stop = 1;
}

static dsv4_status prefill(gen *g, const int32_t *prompt, int64_t n)
{
    dsv4_engine *e = g->e;
    double t0 = now_s();
    int64_t chunk = g->o->prompt_logits ? e->opt.logits_rows : n;
    for (int64_t c0 = 0; c0 < n; c0 += chunk) {
        int64_t m = n - c0 < chunk ? n - c0 : chunk, rows = g->o->prompt_logits ? m : 1;
        DSV4_TRY(dsv4_engine_forward(e, g->sq, prompt + c0, m, e->s.logits, rows, NULL, 0));
        if (c0 + m < n) {
            dsv4_gen_step s = {0, NULL, 0, 0, 0, now_s() - t0, e->s.logits, rows, c0};
            if (g->o->callback && g->o->callback(g->o->user, &s)) {
                g->stop = 1; /* the sequence holds the prompt up to here; nothing is generated */
                g->st.prefill_seconds = now_s() - t0;
                return DSV4_OK;
            }
            continue;
        }
        int32_t x = 0;
        char what[96];
        snprintf(what, sizeof what, "engine_generate: sequence %d, logits at position %lld", g->sq,
                 (long long)(e->seqs[g->sq].len - 1));
        DSV4_TRY(eng_check_logits(e, e->s.logits + (rows - 1) * e->V, what));
        DSV4_TRY(dsv4_engine_sample(e, e->s.logits + (rows - 1) * e->V, &g->o->sampling, g->rng, &x));
        g->st.prefill_seconds = now_s() - t0;
        emit(g, 0, &x, 1, 0, 0, t0, e->s.logits, rows, c0 + m - rows);
    }
    return DSV4_OK;
}

/* ---- one step of many sequences ------------------------------------------------------------ */
/* The logits rows a step samples, checked first (dsv4_sample_check_row): n rows from `pos` of the
 * request's sequence, of the main model or of the MTP block. */
/* The error of a row that cannot be sampled (its result code), naming the sequence and position. */
static dsv4_status row_failed(int32_t code, const dsv4_step_request *r, int64_t pos, const char *model)
{
    char what[128];
    snprintf(what, sizeof what, "engine_step: sequence %d, %slogits at position %lld", r->seq, model, (long long)pos);
    return dsv4_sample_result(code, what);
}

static dsv4_status check_rows(const dsv4_engine *e, const float *lg, int64_t n, const dsv4_step_request *r, int64_t pos,
                              const char *model)
{
    for (int64_t t = 0; t < n; t++) {
        const int32_t code = dsv4_sample_check_row(lg + t * e->V, e->V);
        if (code) return row_failed(code, r, pos + t, model);
    }
    return DSV4_OK;
}

static int32_t sample(dsv4_engine *e, const float *logits, const dsv4_step_request *r)
{
    int32_t t = 0;
    dsv4_engine_sample(e, logits, &r->sampling, r->rng, &t); /* arguments and the row were checked */
    return t;
}

/* Accepted drafts d[0..k-1] and the target's token (*bonus); p rows at lg, q rows at qg. */
static int accept(dsv4_engine *e, const dsv4_step_request *r, const int32_t *d, int k, const float *lg, float *qg,
                  int32_t *bonus)
{
    eng_scratch *s = &e->s;
    const int64_t V = e->V;
    const dsv4_sampling *sp = &r->sampling;
    if (sp->temperature == 0.0f) {
        int i = 0;
        while (i < k && dsv4_sample_argmax(lg + i * V, V) == d[i]) i++;
        *bonus = dsv4_sample_argmax(lg + i * V, V);
        return i;
    }
    for (int i = 0; i < k; i++) {
        dsv4_sample_probs(lg + i * V, V, sp->temperature, sp->top_p, s->probs, s->order);
        dsv4_sample_probs(qg + i * V, V, sp->temperature, sp->top_p, s->probs2, s->order);
        double pd = s->probs[d[i]], qd = s->probs2[d[i]];
        if (qd > 0.0 && dsv4_rng_uniform(r->rng) * qd < pd) continue;
        double sum = 0.0;
        for (int64_t v = 0; v < V; v++) {
            float x = s->probs[v] - s->probs2[v];
            s->probs2[v] = x > 0.0f ? x : 0.0f;
            sum += s->probs2[v];
        }
        *bonus = dsv4_sample_gumbel(sum > 0.0 ? s->probs2 : s->probs, V, r->rng);
        return i;
    }
    *bonus = sample(e, lg + k * V, r);
    return k;
}

/* Draft the requests' tokens with the MTP block, one draft position j at a time over all the
 * requests that want a j-th draft: the first from the main model's streams of position n-1 and
 * the request's token (or the head row a previous step left), the next ones from the block's own
 * output streams. Drafts go to s.vtok rows after each request's token. */
static dsv4_status draft(dsv4_engine *e, dsv4_step_request *rq, int n, int kmax)
{
    eng_scratch *s = &e->s;
    const eng_layer *M = &e->layers[e->cfg->n_layers];
    const int64_t rs = e->hc * e->D, V = e->V;
    for (int j = 0; j < kmax; j++) {
        int k = 0;
        for (int i = 0; i < n; i++) {
            if (rq[i].mtp <= j) continue;
            eng_seq *q = &e->seqs[rq[i].seq];
            const eng_seg *g = &s->segs[i];
            const uint16_t *src;
            if (j == 0) {
                if (q->mtp_len == q->len && q->head_tok == rq[i].tokens[0]) { /* the head row is there */
                    memcpy(s->qlogits + s->qrow[i] * V, q->head_logits, (size_t)V * 4); /* host */
                    s->xrow[i] = -1;
                    continue;
                }
                src = q->pending + q->pend * rs;
            } else {
                src = s->xrow[i] < 0 ? q->head_streams : s->X + s->xrow[i] * rs;
            }
            DSV4_TRY(eng_gather_streams(e, k, src, 1));
            s->mtok[k] = s->vtok[g->row + j];
            s->msegs[k] = (eng_seg){rq[i].seq, 0, g->start - 1 + j, 1, k, i, 0};
            s->xrow[i] = k++;
        }
        if (k) {
            DSV4_TRY(eng_mtp_rows(e, s->msegs, k, s->mtok));
            DSV4_TRY(eng_logits(e, M, s->X, k, s->logits));
            for (int r = 0; r < k; r++) {
                int i = s->msegs[r].src;
                memcpy(s->qlogits + (s->qrow[i] + j) * V, s->logits + r * V, (size_t)V * 4); /* host */
                if (j == 0) e->seqs[rq[i].seq].mtp_len = s->segs[i].start;
            }
        }
        for (int i = 0; i < n; i++)
            if (rq[i].mtp > j) {
                const float *q = s->qlogits + (s->qrow[i] + j) * V;
                DSV4_TRY(check_rows(e, q, 1, &rq[i], s->segs[i].start - 1 + j, "MTP "));
                s->vtok[s->segs[i].row + 1 + j] = sample(e, q, &rq[i]);
            }
    }
    return DSV4_OK;
}

/* A plain step on a device: the rows of the requests that sample are in s.dlogits (request i's
 * at s.lrow[i]); the sample op draws each there with its request's parameters and generator
 * state (the same tokens and states as on the host, include/dsv4/tensor_ops.h), and only the
 * tokens and the states come back. Layout of s.samp (engine.c): params [R] | rng [R, 4] | tokens [R]. */
static dsv4_status sample_on_device(dsv4_engine *e, dsv4_step_request *rq, int n, int64_t rows)
{
    eng_scratch *s = &e->s;
    const int64_t R = s->samp_rows;
    const size_t pb = (size_t)R * sizeof(dsv4_sampling), rb = (size_t)R * 32, tb = (size_t)R * 4;
    dsv4_sampling *hp = (dsv4_sampling *)s->hsamp;
    uint64_t *hr = (uint64_t *)(s->hsamp + pb);
    const int32_t *ht = (const int32_t *)(s->hsamp + pb + rb);
    for (int i = 0; i < n; i++) {
        if (!rq[i].sample) continue;
        hp[s->lrow[i]] = rq[i].sampling;
        memcpy(hr + 4 * s->lrow[i], rq[i].rng, 32);
    }
    DSV4_TRY(dsv4_device_upload(e->ctx, s->samp, s->hsamp, pb + rb));
    dsv4_tensor lg = eng_v2(e, s->dlogits, DSV4_F32, rows, e->V), tok = eng_v1(e, s->samp + pb + rb, DSV4_I32, rows);
    DSV4_TRY(dsv4_sample_rows(e->ctx, &lg, (const dsv4_sampling *)s->samp, (uint64_t *)(s->samp + pb), &tok, s->ws,
                              s->ws_bytes));
    DSV4_TRY(dsv4_device_download(e->ctx, s->hsamp + pb, s->samp + pb, rb + tb));
    for (int i = 0; i < n; i++) {
        dsv4_step_request *r = &rq[i];
        if (!r->sample) continue;
        const int32_t t = ht[s->lrow[i]];
        if (t < 0) return row_failed(t, r, s->segs[i].start + s->segs[i].T - 1, ""); /* as check_rows */
        memcpy(r->rng, hr + 4 * s->lrow[i], 32);
        r->out[r->n_out++] = t;
    }
    return DSV4_OK;
}

/* The rows in s.logits: accept the drafts (rolling back what was rejected) and sample. */
static dsv4_status sample_on_host(dsv4_engine *e, dsv4_step_request *rq, int n)
{
    eng_scratch *s = &e->s;
    const int64_t V = e->V;
    for (int i = 0; i < n; i++) {
        dsv4_step_request *r = &rq[i];
        const eng_seg *g = &s->segs[i];
        const float *lg = s->logits + s->lrow[i] * V;
        if (r->mtp) DSV4_TRY(check_rows(e, lg, r->mtp + 1, r, g->start, ""));
        else if (r->sample) DSV4_TRY(check_rows(e, lg, 1, r, g->start + g->T - 1, ""));
        if (!r->mtp) {
            if (r->sample) r->out[r->n_out++] = sample(e, lg, r);
            continue;
        }
        int32_t b;
        int a = accept(e, r, s->vtok + g->row + 1, r->mtp, lg, s->qlogits + s->qrow[i] * V, &b);
        if (a < r->mtp) DSV4_TRY(eng_rollback(e, r->seq, g->start, a + 1, g->row));
        memcpy(r->out, s->vtok + g->row + 1, (size_t)a * sizeof *r->out);
        r->out[a] = b;
        r->n_out = a + 1;
        r->drafted = r->mtp;
        r->accepted = a;
    }
    return DSV4_OK;
}

/* A checked step; a failure here may leave the caches partly advanced. */
static dsv4_status run_step(dsv4_engine *e, dsv4_step_request *rq, int n)
{
    eng_scratch *s = &e->s;
    const int64_t rs = e->hc * e->D, V = e->V;
    const int mtp = e->opt.max_mtp > 0;
    int64_t T = 0, qn = 0;
    int kmax = 0;
    for (int i = 0; i < n; i++) {
        dsv4_step_request *r = &rq[i];
        r->n_out = r->drafted = r->accepted = 0;
        s->segs[i] = (eng_seg){r->seq, r->mtp > 0, e->seqs[r->seq].len, r->n_tokens + r->mtp, T, i, 0};
        memcpy(s->vtok + T, r->tokens, (size_t)r->n_tokens * sizeof *s->vtok);
        s->qrow[i] = qn;
        qn += r->mtp;
        T += r->n_tokens + r->mtp;
        if (r->mtp > kmax) kmax = r->mtp;
    }
    if (kmax) DSV4_TRY(draft(e, rq, n, kmax));
    /* the target model over every request's tokens and drafts, in one pass */
    DSV4_TRY(eng_main_forward(e, s->segs, n, s->vtok, 0));
    int64_t nl = 0;
    for (int i = 0; i < n; i++) {
        const eng_seg *g = &s->segs[i];
        s->lrow[i] = nl;
        if (rq[i].mtp)
            for (int64_t t = 0; t < g->T; t++) s->cslots[nl++] = g->row + t;
        else if (rq[i].sample)
            s->cslots[nl++] = g->row + g->T - 1;
    }
    /* a plain step on a device samples there: its logits stay on the device (unless the
     * generation asks for them) */
    s->logits_on_host = !e->on_device || kmax || s->keep_logits;
    DSV4_TRY(eng_logits_rows(e, NULL, s->X, s->cslots, nl, s->logits_on_host ? s->logits : NULL));
    DSV4_TRY(s->logits_on_host ? sample_on_host(e, rq, n) : sample_on_device(e, rq, n, nl));
    if (!mtp) return DSV4_OK;
    /* MTP rows: every position whose next token is known now; for a verification, the kept
     * positions with the target's streams, the last of them the head row of the next step */
    int k = 0;
    int64_t m = 0;
    for (int i = 0; i < n; i++) {
        const eng_seg *g = &s->segs[i];
        eng_seq *q = &e->seqs[rq[i].seq];
        if (!rq[i].mtp) {
            DSV4_TRY(eng_mtp_catch_up(e, g, &k, &m));
            continue;
        }
        const int a = rq[i].accepted;
        DSV4_TRY(eng_mtp_add(e, &k, &m, g, g->start, a + 1, rq[i].out));
        DSV4_TRY(eng_copy(e, q->pending + q->pend * rs, s->X + (g->row + a) * rs, rs * 2));
        q->mtp_len = g->start + a + 1;
        q->head_tok = rq[i].out[a];
    }
    if (!k) return DSV4_OK;
    DSV4_TRY(eng_mtp_rows(e, s->msegs, k, s->mtok));
    int64_t nh = 0;
    for (int r = 0; r < k; r++)
        if (rq[s->msegs[r].src].mtp) s->cslots[nh++] = s->msegs[r].row + s->msegs[r].T - 1;
    const eng_layer *M = &e->layers[e->cfg->n_layers];
    DSV4_TRY(eng_logits_rows(e, M, s->X, s->cslots, nh, s->qlogits));
    for (int r = 0, h = 0; r < k; r++) {
        const eng_seg *g = &s->msegs[r];
        if (!rq[g->src].mtp) continue;
        eng_seq *q = &e->seqs[g->sq];
        memcpy(q->head_logits, s->qlogits + h++ * V, (size_t)V * 4); /* host */
        DSV4_TRY(eng_copy(e, q->head_streams, s->X + (g->row + g->T - 1) * rs, rs * 2));
    }
    return DSV4_OK;
}

static dsv4_status check_sampling(const char *op, int i, const dsv4_sampling *s)
{
    if (s->temperature >= 0.0f && isfinite(s->temperature) && s->top_p >= 0.0f) return DSV4_OK;
    return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: request %d: need temperature >= 0 and top_p >= 0 (0: 1)", op, i);
}

dsv4_status dsv4_engine_step(dsv4_engine *e, dsv4_step_request *rq, int n)
{
    const char *op = "engine_step";
    DSV4_CHECK_ARG(e, "%s: null engine", op);
    DSV4_CHECK_ARG(rq && n >= 1, "%s: need at least one request", op);
    dsv4_status st = DSV4_OK;
    int64_t rows = 0;
    int i = 0;
    for (; i < n; i++) {
        dsv4_step_request *r = &rq[i];
        st = eng_check_rows(e, op, i, r->seq, r->tokens, r->n_tokens, r->mtp > 0 ? r->mtp : 0);
        if (st != DSV4_OK) break;
        if (r->mtp < 0 || r->mtp > e->opt.max_mtp)
            st = dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: request %d: mtp %d not in [0, %d] (the engine's max_mtp)", op, i, r->mtp,
                           e->opt.max_mtp);
        else if (r->mtp && (r->n_tokens != 1 || !r->sample || e->seqs[r->seq].len == 0))
            st = dsv4_fail(DSV4_ERR_INVALID_ARG,
                           "%s: request %d: drafts follow one token of a non-empty sequence, and are sampled", op, i);
        else if (r->sample && (!r->out || !r->rng))
            st = dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: request %d: sampling needs an output buffer and a generator", op, i);
        else if (r->sample)
            st = check_sampling(op, i, &r->sampling);
        if (st != DSV4_OK) break;
        rows += r->n_tokens + r->mtp;
    }
    eng_clear_marks(e, &rq[0].seq, i < n ? i + 1 : n, sizeof *rq);
    DSV4_TRY(st);
    if (rows > e->opt.max_batch)
        return dsv4_fail(DSV4_ERR_CAPACITY, "%s: %lld rows (tokens and drafts) exceed max_batch %d", op, (long long)rows,
                         e->opt.max_batch);
    /* everything that can be checked is; what fails from here on fails the step's sequences */
    if (e->opt.max_mtp)
        for (i = 0; i < n; i++)
            if (!rq[i].mtp) e->seqs[rq[i].seq].mtp_len = eng_mtp_first(e, rq[i].seq, rq[i].tokens[0]);
    st = run_step(e, rq, n);
    return st == DSV4_OK ? st : eng_seqs_failed(e, &rq[0].seq, n, sizeof *rq, st, op);
}

/* ---- generation ------------------------------------------------------------------------------ */
dsv4_status dsv4_engine_generate(dsv4_engine *e, int seq, const int32_t *prompt, int64_t n_prompt,
                                 const dsv4_generate_options *o, int32_t *out_tokens, int64_t cap, int64_t *n_out,
                                 dsv4_generate_stats *stats)
{
    const char *op = "engine_generate";
    DSV4_TRY(eng_check_usable(e, seq, op));
    DSV4_CHECK_ARG(o && n_out && prompt && n_prompt >= 1, "%s: null argument or empty prompt", op);
    for (int64_t i = 0; i < n_prompt; i++) /* all of it before the first chunk runs */
        if (prompt[i] < 0 || prompt[i] >= e->V)
            return dsv4_fail(DSV4_ERR_RANGE, "%s: prompt token %lld = %d is outside the vocabulary [0, %lld)", op,
                             (long long)i, prompt[i], (long long)e->V);
    DSV4_CHECK_ARG(o->max_tokens >= 0 && cap >= 0 && (!cap || out_tokens),
                   "%s: need max_tokens >= 0 (0: up to max_context) and an output buffer", op);
    DSV4_CHECK_ARG(o->mtp >= 0 && o->mtp <= e->opt.max_mtp,
                   "%s: mtp %d not in [0, %d] (the engine's max_mtp; 0 when the checkpoint has no MTP block)", op, o->mtp,
                   e->opt.max_mtp);
    DSV4_TRY(check_sampling(op, 0, &o->sampling));
    const int64_t len0 = e->seqs[seq].len, room0 = e->opt.max_context - len0;
    /* the last token generated is not fed back, so n_prompt + max_tokens - 1 positions must fit */
    const int64_t max_tokens = o->max_tokens ? o->max_tokens : room0 - n_prompt + 1;
    if (n_prompt > room0 || max_tokens - 1 > room0 - n_prompt)
        return dsv4_fail(DSV4_ERR_CAPACITY, "%s: %lld held + %lld prompt + %lld new tokens exceed max_context %lld", op,
                         (long long)len0, (long long)n_prompt, (long long)max_tokens, (long long)e->opt.max_context);
    gen g = {.e = e, .sq = seq, .o = o, .out = out_tokens, .cap = cap, .max = max_tokens};
    dsv4_rng_seed(o->sampling.seed, g.rng);
    g.st.prompt_tokens = n_prompt;
    /* everything is checked: a failure from here on fails the sequence (forward marks its own) */
    e->s.keep_logits = o->prompt_logits || o->step_logits; /* on a device: every step's logits downloaded */
    dsv4_status st = prefill(&g, prompt, n_prompt);
    int32_t x = g.last;
    double t0 = now_s();
    int64_t step = 1;
    while (!g.stop && st == DSV4_OK) {
        double ts = now_s();
        const int64_t n = e->seqs[seq].len, left = g.max - g.n_out, room = e->opt.max_context - n - 1;
        int k = o->mtp;
        if (k > left - 1) k = (int)(left - 1);
        if (k > room) k = (int)room;
        int32_t toks[65];
        dsv4_step_request r = {seq, &x, 1, k > 0 ? k : 0, 1, o->sampling, g.rng, toks, 0, 0, 0};
        st = dsv4_engine_step(e, &r, 1);
        if (st != DSV4_OK) break;
        g.st.drafted += r.drafted;
        g.st.accepted += r.accepted;
        const int lh = e->s.logits_on_host; /* else sampled on the device: no logits to show */
        emit(&g, step, toks, r.n_out, r.drafted, r.accepted, ts, lh ? e->s.logits : NULL, lh ? r.n_out : 0, n);
        x = toks[r.n_out - 1];
        step++;
    }
    e->s.keep_logits = 0;
    if (st != DSV4_OK) return e->seqs[seq].failed ? st : eng_seq_failed(e, seq, st, op);
    g.st.decode_seconds = now_s() - t0;
    g.st.generated_tokens = g.n_out;
    g.st.steps = step;
    *n_out = g.n_out < cap ? g.n_out : cap;
    if (stats) *stats = g.st;
    return DSV4_OK;
}
