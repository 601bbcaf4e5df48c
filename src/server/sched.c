/* The engine thread: admission, prefix reuse, chunked prefill interleaved with decode, sampling,
 * retirement (docs/server.md §2-§3). Everything here runs on that one thread except the small
 * functions at the end (submit, take, cancel), which only touch the queue and a job's ring. */
#include "server/server.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { JOB_QUEUED, JOB_PREFILL, JOB_DECODE };
enum { SLOT_FREE, SLOT_ACTIVE, SLOT_CACHED };

typedef struct srv_slot {
    int seq, state;
    int32_t *tokens; /* SLOT_CACHED: the ids the sequence holds */
    int64_t len;
    uint64_t used;   /* last use, for LRU eviction */
} srv_slot;

struct srv_sched {
    dsv4_engine *e;
    srv_metrics *m;
    int vocab, max_seqs, max_batch, prefill_chunk, mtp, max_queue, prefix_min, prefix_cache;
    int64_t max_context;
    int64_t restart_m, restart_v; /* truncation's restart rule: lcm of the ratios, the CSA window */
    const dsv4_model_config *cfg;

    pthread_t th;
    pthread_mutex_t mu; /* queue, stopping, counts */
    pthread_cond_t cv;
    srv_job *q_head, *q_tail;
    int q_len, n_active_pub;
    int stopping;       /* 1: no new jobs, finish the rest; 2: cancel everything */
    int joined;

    /* engine thread only, planned at start */
    srv_slot *slots;
    srv_job **active;
    int n_active;
    uint64_t clock;
    float *logits;      /* [max_seqs, vocab] */
    double *lp;         /* [vocab] log-softmax of one row */
    dsv4_batch_entry *entries;
    srv_job **entry_job;
    dsv4_step_request *reqs;
    int32_t *outs;      /* [max_seqs, 1 + mtp] */
};

double srv_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- jobs ------------------------------------------------------------------------------------ */
srv_job *srv_job_new(int ring_cap)
{
    srv_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->ring = calloc((size_t)ring_cap, sizeof *j->ring);
    if (!j->ring) {
        free(j);
        return NULL;
    }
    j->ring_cap = ring_cap;
    j->top_logprobs = -1;
    j->refs = 1;
    j->slot = -1;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    atomic_init(&j->cancel, 0);
    return j;
}

void srv_job_release(srv_job *j)
{
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left) return;
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j->ring);
    free(j->prompt);
    free(j->forced);
    free(j);
}

/* ---- engine thread ----------------------------------------------------------------------------- */
static int ring_room(srv_job *j)
{
    pthread_mutex_lock(&j->mu);
    int room = j->ring_cap - (int)(j->r_written - j->r_read);
    pthread_mutex_unlock(&j->mu);
    return room;
}

static void ring_push(srv_job *j, const srv_token *t)
{
    pthread_mutex_lock(&j->mu);
    j->ring[j->r_written % j->ring_cap] = *t;
    j->r_written++;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static int64_t common_prefix(const int32_t *a, int64_t na, const int32_t *b, int64_t nb)
{
    int64_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

/* Prompt tokens a cached sequence of `len` tokens saves when the job keeps its first `keep`
 * (docs/server.md §3): all of them when it continues as it is; after a cut, truncation recomputes
 * from the restart point (the last multiple of M = lcm of the compression ratios at or before the
 * cut, less V, the overlapping CSA window), so only the tokens before it are saved. */
static int64_t saving(const srv_sched *s, int64_t len, int64_t keep)
{
    if (keep == len) return keep;
    int64_t restart = keep / s->restart_m * s->restart_m - s->restart_v;
    return restart > 0 ? restart : 0;
}

/* The slot a job starts in: the cached sequence saving the most prompt tokens (at least
 * prefix_min), else an empty slot, else the least recently used cached one. */
static int pick_slot(srv_sched *s, const srv_job *j, int64_t *keep)
{
    int best = -1, empty = -1, lru = -1;
    int64_t best_save = 0, best_keep = 0;
    for (int i = 0; i < s->max_seqs; i++) {
        srv_slot *sl = &s->slots[i];
        if (sl->state == SLOT_FREE && empty < 0) empty = i;
        if (sl->state != SLOT_CACHED) continue;
        if (lru < 0 || sl->used < s->slots[lru].used) lru = i;
        int64_t l = common_prefix(sl->tokens, sl->len, j->prompt, j->n_prompt);
        if (l > j->n_prompt - 1) l = j->n_prompt - 1; /* the last prompt token runs to give logits */
        int64_t sv = saving(s, sl->len, l);
        if (sv >= s->prefix_min && sv > best_save) best = i, best_save = sv, best_keep = l;
    }
    *keep = 0;
    if (best >= 0) {
        *keep = best_keep;
        return best;
    }
    return empty >= 0 ? empty : lru;
}

static void finish_job(srv_sched *s, srv_job *j, srv_finish f, const char *err)
{
    pthread_mutex_lock(&j->mu);
    j->finished = 1;
    j->finish = f;
    if (err) snprintf(j->error, sizeof j->error, "%s", err);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    if (f == SRV_FIN_CANCEL) {
        pthread_mutex_lock(&s->m->mu);
        s->m->cancelled++;
        pthread_mutex_unlock(&s->m->mu);
    }
    srv_job_release(j);
}

/* The job leaves its slot: the sequence stays as a cached prefix (its tokens read back from the
 * engine), or is emptied. A failed sequence is always emptied. */
static void retire(srv_sched *s, int idx, srv_finish f, const char *err)
{
    srv_job *j = s->active[idx];
    srv_slot *sl = &s->slots[j->slot];
    int64_t len = 0;
    if (f != SRV_FIN_ERROR && s->prefix_cache &&
        dsv4_engine_seq_tokens(s->e, sl->seq, sl->tokens, s->max_context, &len) == DSV4_OK && len > 0) {
        sl->state = SLOT_CACHED;
        sl->len = len;
    } else {
        dsv4_engine_seq_reset(s->e, sl->seq);
        sl->state = SLOT_FREE;
        sl->len = 0;
    }
    sl->used = ++s->clock;
    s->active[idx] = s->active[--s->n_active];
    pthread_mutex_lock(&s->mu);
    s->n_active_pub = s->n_active;
    pthread_mutex_unlock(&s->mu);
    finish_job(s, j, f, err);
}

/* Move queued jobs into free slots. Returns 0, or -1 when a slot's sequence could not be set up. */
static void admit(srv_sched *s)
{
    while (s->n_active < s->max_seqs) {
        pthread_mutex_lock(&s->mu);
        srv_job *j = s->q_head;
        if (j) {
            s->q_head = j->qnext;
            if (!s->q_head) s->q_tail = NULL;
            s->q_len--;
        }
        pthread_mutex_unlock(&s->mu);
        if (!j) return;
        if (atomic_load(&j->cancel)) {
            finish_job(s, j, SRV_FIN_CANCEL, NULL);
            continue;
        }
        int64_t keep = 0, recomputed = 0;
        int slot = pick_slot(s, j, &keep);
        srv_slot *sl = &s->slots[slot];
        dsv4_status st = DSV4_OK;
        if (keep > 0 && keep < sl->len) st = dsv4_engine_seq_truncate(s->e, sl->seq, keep, &recomputed);
        else if (keep == 0 && sl->state != SLOT_FREE) st = dsv4_engine_seq_reset(s->e, sl->seq);
        if (st != DSV4_OK) { /* the truncation failed the sequence: start from nothing */
            keep = recomputed = 0;
            st = dsv4_engine_seq_reset(s->e, sl->seq);
        }
        if (recomputed > keep) recomputed = keep;
        sl->state = SLOT_ACTIVE;
        sl->used = ++s->clock;
        j->slot = slot;
        j->fed = keep;
        j->state = JOB_PREFILL;
        dsv4_rng_seed(j->sampling.seed, j->rng);
        pthread_mutex_lock(&j->mu);
        j->cached_tokens = keep - recomputed;
        pthread_mutex_unlock(&j->mu);
        s->active[s->n_active++] = j;
        pthread_mutex_lock(&s->mu);
        s->n_active_pub = s->n_active;
        pthread_mutex_unlock(&s->mu);
        pthread_mutex_lock(&s->m->mu);
        s->m->prompt_tokens += (uint64_t)j->n_prompt;
        s->m->cached_tokens += (uint64_t)(keep - recomputed);
        s->m->recomputed_tokens += (uint64_t)recomputed;
        pthread_mutex_unlock(&s->m->mu);
        if (st != DSV4_OK) {
            retire(s, s->n_active - 1, SRV_FIN_ERROR, dsv4_last_error());
        }
    }
}

static int is_eos(const srv_sched *s, int32_t t)
{
    for (int i = 0; i < s->cfg->n_eos; i++)
        if (s->cfg->eos_token_ids[i] == t) return 1;
    return 0;
}

/* log-softmax of one row in double, the chosen token's value and the top-k. */
static void logprobs(srv_sched *s, const float *row, srv_token *t, int k)
{
    double mx = -INFINITY, sum = 0.0;
    for (int i = 0; i < s->vocab; i++)
        if (row[i] > mx) mx = row[i];
    for (int i = 0; i < s->vocab; i++) sum += exp((double)row[i] - mx);
    double lse = mx + log(sum);
    t->logprob = (float)((double)row[t->id] - lse);
    t->n_top = 0;
    for (int r = 0; r < k; r++) { /* k passes; ties to the lower id */
        int best = -1;
        for (int i = 0; i < s->vocab; i++) {
            int taken = 0;
            for (int q = 0; q < r && !taken; q++) taken = t->top_id[q] == i;
            if (taken) continue;
            if (best < 0 || row[i] > row[best]) best = i;
        }
        t->top_id[r] = best;
        t->top_lp[r] = (float)((double)row[best] - lse);
        t->n_top = r + 1;
    }
}

/* One produced token: into the ring (with logprobs when asked); returns the finish reason it
 * causes, or SRV_FIN_NONE. An EOS token is not handed out, it only ends the job. */
static srv_finish emit(srv_sched *s, srv_job *j, int32_t tok, const float *row, double now)
{
    if (j->n_forced > j->n_gen) tok = j->forced[j->n_gen];
    j->next = tok;
    j->n_gen++;
    if (j->n_gen == 1) srv_metrics_observe(s->m, &s->m->ttft, now - j->t_submit);
    else srv_metrics_observe(s->m, &s->m->itl, now - j->t_last);
    j->t_last = now;
    srv_metrics_add_tokens(s->m, 1);
    if (j->stop_at_eos && is_eos(s, tok)) return SRV_FIN_EOS;
    srv_token t = {.id = tok};
    if (row && j->top_logprobs >= 0) logprobs(s, row, &t, j->top_logprobs);
    ring_push(j, &t);
    if (j->n_gen >= j->max_tokens || j->n_prompt + j->n_gen >= s->max_context) return SRV_FIN_LENGTH;
    return SRV_FIN_NONE;
}

/* Room a decoding job needs in its ring this step. */
static int decode_width(const srv_sched *s, const srv_job *j)
{
    int k = s->mtp;
    if (j->n_forced > j->n_gen || j->top_logprobs >= 0) k = 0;
    int64_t left = j->max_tokens - j->n_gen - 1;            /* drafts beyond max_tokens are wasted */
    int64_t ctx = s->max_context - (j->n_prompt + j->n_gen) - 1; /* and must fit the context */
    if (left < k) k = (int)(left > 0 ? left : 0);
    if (ctx < k) k = (int)(ctx > 0 ? ctx : 0);
    return k;
}

/* Prompt rows of the job this step, given the rows still free. */
static int64_t prefill_rows(const srv_sched *s, const srv_job *j, int64_t free_rows)
{
    int64_t n = j->n_prompt - j->fed;
    if (n > s->prefill_chunk) n = s->prefill_chunk;
    if (n > free_rows) n = free_rows;
    return n;
}

static void fail_all(srv_sched *s, srv_job **jobs, int n, const char *why)
{
    char msg[256];
    snprintf(msg, sizeof msg, "%s", why);
    fprintf(stderr, "dsv4 serve: an engine step failed (%d requests end with an error): %s\n", n, msg);
    for (int i = 0; i < n; i++)
        for (int a = 0; a < s->n_active; a++)
            if (s->active[a] == jobs[i]) {
                retire(s, a, SRV_FIN_ERROR, msg);
                break;
            }
}

/* One engine call over every runnable job. Returns the number of jobs that ran. */
static int step(srv_sched *s)
{
    for (int a = 0; a < s->n_active;) /* cancellations first: their slots free now */
        if (atomic_load(&s->active[a]->cancel) || s->stopping == 2) retire(s, a, SRV_FIN_CANCEL, NULL);
        else a++;
    int n = 0;
    int64_t rows = 0;
    /* decode rows first (1 + drafts each), so a long prompt never stalls the streams */
    for (int a = 0; a < s->n_active; a++) {
        srv_job *j = s->active[a];
        if (j->state != JOB_DECODE) continue;
        int k = decode_width(s, j);
        if (ring_room(j) < k + 1 || rows + 1 + k > s->max_batch) continue; /* a slow reader waits */
        dsv4_step_request *r = &s->reqs[n];
        *r = (dsv4_step_request){.seq = s->slots[j->slot].seq, .tokens = &j->next, .n_tokens = 1, .mtp = k,
                                 .sample = 1, .sampling = j->sampling, .rng = j->rng,
                                 .out = s->outs + (size_t)n * (size_t)(1 + s->mtp)};
        s->entries[n] = (dsv4_batch_entry){r->seq, r->tokens, 1, 1, 0};
        s->entry_job[n++] = j;
        rows += 1 + k;
    }
    for (int a = 0; a < s->n_active && rows < s->max_batch; a++) {
        srv_job *j = s->active[a];
        if (j->state != JOB_PREFILL) continue;
        int64_t c = prefill_rows(s, j, s->max_batch - rows);
        int last = j->fed + c == j->n_prompt;
        dsv4_step_request *r = &s->reqs[n];
        *r = (dsv4_step_request){.seq = s->slots[j->slot].seq, .tokens = j->prompt + j->fed, .n_tokens = c,
                                 .sample = last, .sampling = j->sampling, .rng = j->rng,
                                 .out = s->outs + (size_t)n * (size_t)(1 + s->mtp)};
        s->entries[n] = (dsv4_batch_entry){r->seq, r->tokens, c, last, 0};
        s->entry_job[n++] = j;
        rows += c;
    }
    if (!n) return 0;
    /* Without MTP every row's logits come back (logprobs, the test hook); with MTP the step
     * drafts and verifies, and a request with mtp 0 in it is a plain sampled step. */
    dsv4_status st = s->mtp ? dsv4_engine_step(s->e, s->reqs, n) : dsv4_engine_forward_batch(s->e, s->entries, n, s->logits, NULL);
    if (st != DSV4_OK) {
        fail_all(s, s->entry_job, n, dsv4_last_error());
        return n;
    }
    double now = srv_now();
    int64_t row = 0;
    uint64_t drafted = 0, accepted = 0;
    for (int i = 0; i < n; i++) {
        srv_job *j = s->entry_job[i];
        dsv4_step_request *r = &s->reqs[i];
        srv_finish f = SRV_FIN_NONE;
        if (j->state == JOB_PREFILL) j->fed += r->n_tokens;
        if (r->sample) {
            if (j->state == JOB_PREFILL) j->state = JOB_DECODE;
            if (s->mtp) {
                for (int t = 0; t < r->n_out && f == SRV_FIN_NONE; t++) f = emit(s, j, r->out[t], NULL, now);
                drafted += (uint64_t)r->drafted;
                accepted += (uint64_t)r->accepted;
                pthread_mutex_lock(&j->mu);
                j->drafted += r->drafted;
                j->accepted += r->accepted;
                pthread_mutex_unlock(&j->mu);
            } else {
                const float *lrow = s->logits + (size_t)row * (size_t)s->vocab;
                int32_t tok = 0;
                if (dsv4_engine_sample(s->e, lrow, &j->sampling, j->rng, &tok) != DSV4_OK) {
                    fail_all(s, &j, 1, dsv4_last_error());
                    row++;
                    continue;
                }
                f = emit(s, j, tok, lrow, now);
            }
            row++;
        }
        if (f != SRV_FIN_NONE)
            for (int a = 0; a < s->n_active; a++)
                if (s->active[a] == j) {
                    retire(s, a, f, NULL);
                    break;
                }
    }
    pthread_mutex_lock(&s->m->mu);
    s->m->steps++;
    s->m->mtp_drafted += drafted;
    s->m->mtp_accepted += accepted;
    pthread_mutex_unlock(&s->m->mu);
    return n;
}

static void *engine_main(void *arg)
{
    srv_sched *s = arg;
    for (;;) {
        admit(s);
        int ran = step(s);
        pthread_mutex_lock(&s->mu);
        int quit = s->stopping && !s->n_active && !s->q_head;
        if (!ran && !quit) { /* idle, or every job waits on its reader: sleep until woken */
            struct timespec t;
            clock_gettime(CLOCK_REALTIME, &t);
            t.tv_nsec += 50 * 1000000L;
            if (t.tv_nsec >= 1000000000L) t.tv_sec++, t.tv_nsec -= 1000000000L;
            if (!s->q_head || s->n_active >= s->max_seqs) pthread_cond_timedwait(&s->cv, &s->mu, &t);
        }
        pthread_mutex_unlock(&s->mu);
        if (quit) break;
    }
    return NULL;
}

/* ---- set-up and the HTTP side's entry points ---------------------------------------------------- */
dsv4_status srv_sched_start(const srv_options *o, dsv4_engine *e, srv_metrics *m, srv_sched **out)
{
    srv_sched *s = calloc(1, sizeof *s);
    if (!s) return DSV4_ERR_NO_MEMORY;
    dsv4_engine_options eo = dsv4_engine_get_options(e);
    s->e = e;
    s->m = m;
    s->cfg = dsv4_engine_config(e);
    s->vocab = (int)s->cfg->vocab_size;
    s->max_seqs = eo.max_seqs;
    s->max_batch = eo.max_batch;
    s->max_context = eo.max_context;
    s->mtp = o->mtp;
    s->prefill_chunk = o->prefill_chunk > 0 ? o->prefill_chunk : eo.max_batch;
    s->max_queue = o->max_queue;
    s->prefix_min = o->prefix_min > 0 ? o->prefix_min : 1;
    s->prefix_cache = o->prefix_cache;
    s->restart_m = 1;
    for (int64_t b = 0; b < s->cfg->n_layers + s->cfg->n_mtp_layers && b < DSV4_MAX_LAYERS; b++) {
        int64_t r = s->cfg->compress_ratio[b], x = s->restart_m, y = r;
        if (r <= 0) continue;
        while (y) { /* gcd */
            int64_t t = x % y;
            x = y;
            y = t;
        }
        s->restart_m = s->restart_m / x * r;
        if (s->cfg->attn_kind[b] == DSV4_ATTN_CSA && r > s->restart_v) s->restart_v = r;
    }
    s->slots = calloc((size_t)s->max_seqs, sizeof *s->slots);
    s->active = calloc((size_t)s->max_seqs, sizeof *s->active);
    s->logits = malloc((size_t)s->max_seqs * (size_t)s->vocab * sizeof *s->logits);
    s->entries = calloc((size_t)s->max_seqs, sizeof *s->entries);
    s->entry_job = calloc((size_t)s->max_seqs, sizeof *s->entry_job);
    s->reqs = calloc((size_t)s->max_seqs, sizeof *s->reqs);
    s->outs = calloc((size_t)s->max_seqs * (size_t)(1 + s->mtp), sizeof *s->outs);
    int ok = s->slots && s->active && s->logits && s->entries && s->entry_job && s->reqs && s->outs;
    for (int i = 0; ok && i < s->max_seqs; i++) {
        s->slots[i].tokens = malloc((size_t)s->max_context * sizeof(int32_t));
        ok = s->slots[i].tokens && dsv4_engine_seq_create(e, &s->slots[i].seq) == DSV4_OK;
    }
    if (!ok) {
        for (int i = 0; s->slots && i < s->max_seqs; i++) free(s->slots[i].tokens);
        free(s->slots), free(s->active), free(s->logits), free(s->entries), free(s->entry_job), free(s->reqs), free(s->outs);
        free(s);
        return DSV4_ERR_NO_MEMORY;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->th, NULL, engine_main, s)) {
        s->joined = 1;
        srv_sched_free(s);
        return DSV4_ERR_NO_MEMORY;
    }
    *out = s;
    return DSV4_OK;
}

void srv_sched_stop(srv_sched *s, int drain_s)
{
    if (!s || s->joined) return;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    double end = srv_now() + drain_s;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        int busy = s->n_active_pub || s->q_head;
        if (busy && srv_now() >= end) s->stopping = 2; /* the engine cancels what is left */
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        if (!busy || s->stopping == 2) break;
        struct timespec t = {0, 20 * 1000000L};
        nanosleep(&t, NULL);
    }
    pthread_join(s->th, NULL);
    s->joined = 1;
}

void srv_sched_free(srv_sched *s)
{
    if (!s) return;
    for (srv_job *j = s->q_head, *nx; j; j = nx) { /* only when the thread never ran */
        nx = j->qnext;
        finish_job(s, j, SRV_FIN_CANCEL, NULL);
    }
    for (int i = 0; i < s->max_seqs; i++) free(s->slots[i].tokens);
    free(s->slots), free(s->active), free(s->logits), free(s->entries), free(s->entry_job), free(s->reqs), free(s->outs);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

int srv_submit(srv_sched *s, srv_job *j)
{
    pthread_mutex_lock(&s->mu);
    if (s->stopping || s->q_len >= s->max_queue + (s->max_seqs - s->n_active_pub)) {
        pthread_mutex_unlock(&s->mu);
        return -1;
    }
    j->t_submit = srv_now();
    j->state = JOB_QUEUED;
    j->refs = 2;
    j->qnext = NULL;
    if (s->q_tail) s->q_tail->qnext = j;
    else s->q_head = j;
    s->q_tail = j;
    s->q_len++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int srv_job_take(srv_sched *s, srv_job *j, srv_token *out, int max, int timeout_ms, int *done)
{
    pthread_mutex_lock(&j->mu);
    if (j->r_written == j->r_read && !j->finished && timeout_ms > 0) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        t.tv_sec += timeout_ms / 1000;
        t.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (t.tv_nsec >= 1000000000L) t.tv_sec++, t.tv_nsec -= 1000000000L;
        while (j->r_written == j->r_read && !j->finished)
            if (pthread_cond_timedwait(&j->cv, &j->mu, &t)) break;
    }
    int was_full = j->r_written - j->r_read == j->ring_cap, n = 0;
    while (n < max && j->r_read < j->r_written) out[n++] = j->ring[j->r_read++ % j->ring_cap];
    *done = j->finished && j->r_read == j->r_written;
    pthread_mutex_unlock(&j->mu);
    if (was_full && n) { /* the engine left this job out while its ring was full */
        pthread_mutex_lock(&s->mu);
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
    }
    return n;
}

void srv_job_cancel(srv_sched *s, srv_job *j)
{
    atomic_store(&j->cancel, 1);
    pthread_mutex_lock(&s->mu);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

int srv_sched_queue_depth(srv_sched *s)
{
    pthread_mutex_lock(&s->mu);
    int n = s->q_len;
    pthread_mutex_unlock(&s->mu);
    return n;
}

int srv_sched_active(srv_sched *s)
{
    pthread_mutex_lock(&s->mu);
    int n = s->n_active_pub;
    pthread_mutex_unlock(&s->mu);
    return n;
}
