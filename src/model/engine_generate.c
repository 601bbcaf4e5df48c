/* Generation (include/dsv4/engine.h): prefill, then plain decode steps or MTP speculative steps
 * (architecture.md §8):
 *
 *   draft     the MTP block's row n-1 (main streams of position n-1, token x_n) gives d_1; each
 *             further draft feeds the block's own output streams back with the last draft token
 *   verify    one forward of [x_n, d_1 .. d_k] at positions n .. n+k: target logits of every row
 *   accept    greedy: the longest prefix with d_j == argmax; else min(1, p/q) per draft and a
 *             sample of max(0, p - q) at the first rejection; plus one token of the target model
 *   repair    rejected rows: the overlapping (CSA) compressor states go back to their snapshot
 *             and replay the kept tokens; rings and compressed caches need nothing (every entry a
 *             later query reads is rewritten first); then the MTP rows of the kept positions run
 *             with the target's streams, the last of them being the next step's first draft. */
#include "model/engine_internal.h"

#include "core/error.h"

#include <math.h>
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

static int32_t pick(gen *g, const float *logits)
{
    int32_t t = 0;
    dsv4_engine_sample(g->e, logits, &g->o->sampling, g->rng, &t);
    return t;
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
        int32_t x = pick(g, e->s.logits + (rows - 1) * e->V);
        g->st.prefill_seconds = now_s() - t0;
        emit(g, 0, &x, 1, 0, 0, t0, e->s.logits, rows, c0 + m - rows);
    }
    return DSV4_OK;
}

/* ---- speculative step -------------------------------------------------------------------------- */
/* Draft k tokens from the MTP block; the head row (n-1) is run here unless the previous step's
 * repair left it (its logits in qlogits[0], its streams at s->X + head_row). */
static dsv4_status draft(gen *g, int32_t x, int k, int *have_head, int64_t *head_row, int32_t *d)
{
    dsv4_engine *e = g->e;
    eng_seq *q = &e->seqs[g->sq];
    eng_scratch *s = &e->s;
    const eng_layer *M = &e->layers[e->cfg->n_layers];
    const int64_t row = e->hc * e->D, V = e->V, n = q->len;
    if (!*have_head) {
        DSV4_TRY(eng_mtp_rows(e, g->sq, n - 1, &x, 1, q->pending + q->pend * row, NULL));
        DSV4_TRY(eng_logits(e, M, s->X, 1, s->qlogits));
        q->mtp_len = n;
        *head_row = 0;
    }
    *have_head = 0;
    d[0] = pick(g, s->qlogits);
    for (int j = 1; j < k; j++) { /* the streams of the previous draft row feed the next */
        DSV4_TRY(eng_mtp_rows(e, g->sq, n - 1 + j, &d[j - 1], 1, s->X + (j == 1 ? *head_row : 0) * row, NULL));
        DSV4_TRY(eng_logits(e, M, s->X, 1, s->qlogits + j * V));
        d[j] = pick(g, s->qlogits + j * V);
    }
    return DSV4_OK;
}

/* Accepted drafts and the target's token (*bonus); p rows in s->logits, q rows in s->qlogits. */
static int accept(gen *g, const int32_t *d, int k, int32_t *bonus)
{
    dsv4_engine *e = g->e;
    eng_scratch *s = &e->s;
    const int64_t V = e->V;
    const dsv4_sampling *sp = &g->o->sampling;
    if (sp->temperature == 0.0f) {
        int i = 0;
        while (i < k && eng_argmax(s->logits + i * V, V) == d[i]) i++;
        *bonus = eng_argmax(s->logits + i * V, V);
        return i;
    }
    for (int i = 0; i < k; i++) {
        eng_probs(e, s->logits + i * V, sp, s->probs);
        eng_probs(e, s->qlogits + i * V, sp, s->probs2);
        double pd = s->probs[d[i]], qd = s->probs2[d[i]];
        if (qd > 0.0 && eng_rng_uniform(g->rng) * qd < pd) continue;
        double sum = 0.0;
        for (int64_t v = 0; v < V; v++) {
            float r = s->probs[v] - s->probs2[v];
            s->probs2[v] = r > 0.0f ? r : 0.0f;
            sum += s->probs2[v];
        }
        *bonus = eng_gumbel_pick(sum > 0.0 ? s->probs2 : s->probs, V, g->rng);
        return i;
    }
    *bonus = pick(g, s->logits + k * V);
    return k;
}

static dsv4_status spec_step(gen *g, int64_t step, int32_t *x, int k, int *have_head, int64_t *head_row)
{
    dsv4_engine *e = g->e;
    eng_seq *q = &e->seqs[g->sq];
    eng_scratch *s = &e->s;
    const int64_t row = e->hc * e->D, n = q->len;
    double t0 = now_s();
    int32_t toks[66];
    toks[0] = *x;
    DSV4_TRY(draft(g, *x, k, have_head, head_row, toks + 1));
    /* verify: the target model over [x, d_1..d_k], logits of every row, streams kept for the MTP */
    DSV4_TRY(eng_main_forward(e, g->sq, toks, k + 1, 1));
    DSV4_TRY(eng_logits(e, NULL, s->X, k + 1, s->logits)); /* s->X stays: the MTP rows read it */
    int32_t b;
    int i = accept(g, toks + 1, k, &b);
    if (i < k) DSV4_TRY(eng_rollback(e, g->sq, n, i + 1));
    /* the MTP rows of positions n .. n+i with the target's streams; the last is the next head */
    toks[i + 1] = b;
    DSV4_TRY(eng_mtp_rows(e, g->sq, n, toks + 1, i + 1, s->X, s->X + row));
    DSV4_TRY(eng_logits(e, &e->layers[e->cfg->n_layers], s->X + i * row, 1, s->qlogits));
    q->mtp_len = n + i + 1;
    *have_head = 1;
    *head_row = i;
    g->st.drafted += k;
    g->st.accepted += i;
    emit(g, step, toks + 1, i + 1, k, i, t0, s->logits, i + 1, n);
    *x = b;
    return DSV4_OK;
}

static dsv4_status plain_step(gen *g, int64_t step, int32_t *x, int *have_head)
{
    dsv4_engine *e = g->e;
    double t0 = now_s();
    int64_t n = e->seqs[g->sq].len;
    /* a head row made by the last repair is the MTP row of n-1 already: forward skips it */
    DSV4_TRY(dsv4_engine_forward(e, g->sq, x, 1, e->s.logits, 1, NULL, 0));
    *have_head = 0;
    int32_t t = pick(g, e->s.logits);
    emit(g, step, &t, 1, 0, 0, t0, e->s.logits, 1, n);
    *x = t;
    return DSV4_OK;
}

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
    DSV4_CHECK_ARG(e->seqs[seq].len == 0, "%s: sequence %d is not empty (length %lld)", op, seq,
                   (long long)e->seqs[seq].len);
    DSV4_CHECK_ARG(o->max_tokens >= 1 && cap >= 0 && (!cap || out_tokens), "%s: need max_tokens >= 1 and an output buffer", op);
    DSV4_CHECK_ARG(o->mtp >= 0 && o->mtp <= e->opt.max_mtp,
                   "%s: mtp %d not in [0, %d] (the engine's max_mtp; 0 when the checkpoint has no MTP block)", op, o->mtp,
                   e->opt.max_mtp);
    DSV4_CHECK_ARG(o->sampling.temperature >= 0.0f && isfinite(o->sampling.temperature) && o->sampling.top_p > 0.0f,
                   "%s: need temperature >= 0 and top_p > 0", op);
    if (n_prompt > e->opt.max_context || o->max_tokens - 1 > e->opt.max_context - n_prompt)
        return dsv4_fail(DSV4_ERR_CAPACITY, "%s: %lld prompt + %lld new tokens exceed max_context %lld", op,
                         (long long)n_prompt, (long long)o->max_tokens, (long long)e->opt.max_context);
    gen g = {.e = e, .sq = seq, .o = o, .out = out_tokens, .cap = cap, .max = o->max_tokens};
    dsv4_rng_seed(o->sampling.seed, g.rng);
    g.st.prompt_tokens = n_prompt;
    /* everything is checked: a failure from here on fails the sequence (forward marks its own) */
    dsv4_status st = prefill(&g, prompt, n_prompt);
    int32_t x = g.last;
    double t0 = now_s();
    int have_head = 0;
    int64_t head_row = 0, step = 1;
    while (!g.stop && st == DSV4_OK) {
        int64_t left = g.max - g.n_out, room = e->opt.max_context - e->seqs[seq].len - 1;
        int k = o->mtp;
        if (k > left - 1) k = (int)(left - 1);
        if (k > room) k = (int)room;
        if (k >= 1) st = spec_step(&g, step, &x, k, &have_head, &head_row);
        else st = plain_step(&g, step, &x, &have_head);
        step++;
    }
    if (st != DSV4_OK) return e->seqs[seq].failed ? st : eng_seq_failed(e, seq, st, op);
    g.st.decode_seconds = now_s() - t0;
    g.st.generated_tokens = g.n_out;
    g.st.steps = step;
    *n_out = g.n_out < cap ? g.n_out : cap;
    if (stats) *stats = g.st;
    return DSV4_OK;
}
