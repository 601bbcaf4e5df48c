/* `dsv4 serve`: the OpenAI-compatible HTTP server (docs/server.md).
 *
 * Two sides meet in a job (one per request):
 *   - HTTP threads (libmicrohttpd, one per connection) parse the request, build its prompt, enqueue
 *     the job, then read the tokens the engine hands back and turn them into text, SSE chunks or
 *     one JSON response;
 *   - the engine thread owns the engine: it admits queued jobs into sequence slots (reusing a
 *     cached prompt prefix), runs chunked prefill next to the decode of the other jobs, samples,
 *     pushes tokens into each job's bounded ring and retires finished or cancelled jobs.
 * The HTTP side never touches the engine; the engine thread never waits on a client: a job whose
 * ring is full is left out of the next steps until its reader catches up. */
#ifndef DSV4_SERVER_H
#define DSV4_SERVER_H

#include "dsv4.h"
#include "dsv4/engine.h"
#include "dsv4/tokenizer.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct srv_options {
    const char *model;      /* checkpoint folder */
    const char *tokenizer;  /* tokenizer.json; NULL: MODEL/tokenizer.json when present */
    const char *host;       /* address to listen on (default 127.0.0.1) */
    const char *model_name; /* the id /v1/models reports (default: the folder's name) */
    const char *backend;
    const char *port_file;  /* write the bound port there once listening (for port 0) */
    int port;               /* 0: any free port */
    int threads;
    int max_seqs;           /* sequences decoding at once (slots) */
    int max_queue;          /* requests waiting for a slot; more get 503 */
    int64_t max_context;
    int max_batch;          /* rows per engine step */
    int prefill_chunk;      /* most prompt tokens of one request in one step */
    int mtp;                /* MTP draft length per decode step (0: off) */
    int64_t max_tokens_default;
    size_t max_body;        /* request bodies above this get 413 */
    int max_connections;
    int timeout_s;          /* idle connections are closed after this */
    int drain_s;            /* SIGTERM: in-flight requests get this long, then are cancelled */
    int prefix_min;         /* shortest shared prefix worth reusing (tokens) */
    int prefix_cache;       /* keep finished sequences' state for reuse */
    int test_hooks;         /* accept the test-only request field "dsv4_forced_tokens" */
} srv_options;

int srv_run(const srv_options *o);

/* ---- jobs ----------------------------------------------------------------------------------- */
enum { SRV_TOP_MAX = 20 };

typedef struct srv_token {
    int32_t id;
    float logprob;
    int n_top;
    int32_t top_id[SRV_TOP_MAX];
    float top_lp[SRV_TOP_MAX];
} srv_token;

typedef enum srv_finish {
    SRV_FIN_NONE = 0,
    SRV_FIN_EOS,    /* an end-of-sequence token */
    SRV_FIN_LENGTH, /* max_tokens or the context */
    SRV_FIN_CANCEL, /* the reader asked (disconnect, stop string) */
    SRV_FIN_ERROR
} srv_finish;

typedef struct srv_job {
    /* the request: filled by the HTTP side before srv_submit, read-only afterwards */
    int32_t *prompt;
    int64_t n_prompt;
    int64_t max_tokens;
    dsv4_sampling sampling;
    int stop_at_eos;
    int top_logprobs;      /* -1: no logprobs; 0..SRV_TOP_MAX */
    int32_t *forced;       /* test hook: these ids replace the sampled ones, in order */
    int64_t n_forced;
    double t_submit;

    /* engine thread only */
    int slot, state;
    int64_t fed;           /* prompt tokens in the sequence */
    int32_t next;          /* the token sampled last (not in the caches yet) */
    int64_t n_gen;
    uint64_t rng[4];
    double t_last;
    struct srv_job *qnext;

    /* shared, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    srv_token *ring;
    int ring_cap;
    int64_t r_written, r_read;
    int finished;          /* the engine is done with the job */
    srv_finish finish;
    int64_t cached_tokens; /* prompt tokens taken from a cached prefix */
    int drafted, accepted;
    char error[256];
    int refs;              /* 2 while queued or running (both sides), then 1 */
    atomic_int cancel;     /* set by the HTTP side; the engine retires the job at its next step */
} srv_job;

/* ---- the scheduler (engine thread) ---------------------------------------------------------- */
typedef struct srv_sched srv_sched;
struct srv_metrics;

dsv4_status srv_sched_start(const srv_options *o, dsv4_engine *e, struct srv_metrics *m, srv_sched **out);
/* Drain (finish everything queued and running) for up to drain_s seconds, cancel the rest, join
 * the engine thread. The HTTP side may still read its jobs until srv_sched_free. */
void srv_sched_stop(srv_sched *s, int drain_s);
void srv_sched_free(srv_sched *s);

srv_job *srv_job_new(int ring_cap);
void srv_job_release(srv_job *j); /* drop one reference */
/* 0 queued; -1 the queue is full or the server is stopping (job untouched, still the caller's). */
int srv_submit(srv_sched *s, srv_job *j);
/* Take up to `max` tokens; waits up to timeout_ms when there are none and the job is running.
 * Returns the count; *done is set once the job finished and every token was taken. */
int srv_job_take(srv_sched *s, srv_job *j, srv_token *out, int max, int timeout_ms, int *done);
void srv_job_cancel(srv_sched *s, srv_job *j);
int srv_sched_queue_depth(srv_sched *s);
int srv_sched_active(srv_sched *s);

double srv_now(void); /* monotonic seconds */

/* ---- metrics (Prometheus text) -------------------------------------------------------------- */
enum { SRV_HIST_BUCKETS = 14 };

typedef struct srv_hist {
    uint64_t count[SRV_HIST_BUCKETS + 1]; /* the last: +Inf */
    double sum;
    uint64_t n;
} srv_hist;

typedef struct srv_metrics {
    pthread_mutex_t mu;
    uint64_t requests[3][6]; /* endpoint (chat, completions, other) x status class (2xx..., 400, 413, 503, other 4xx, 5xx) */
    uint64_t prompt_tokens, generation_tokens, cached_tokens, recomputed_tokens, cancelled;
    uint64_t mtp_drafted, mtp_accepted;
    uint64_t steps;
    srv_hist ttft, itl, e2e;
    double tok_window_t[2];  /* generation-token rate over the last window */
    uint64_t tok_window_n[2];
} srv_metrics;

void srv_metrics_init(srv_metrics *m);
void srv_metrics_observe(srv_metrics *m, srv_hist *h, double seconds);
void srv_metrics_add_tokens(srv_metrics *m, uint64_t n);
/* The exposition text (malloc'd). */
char *srv_metrics_render(srv_metrics *m, int queue_depth, int active, int max_seqs);

#endif
