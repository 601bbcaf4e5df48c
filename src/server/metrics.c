/* /metrics: counters and histograms in the Prometheus text format (docs/server.md §6). */
#include "server/server.h"
#include "server/output.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Upper bounds (seconds) of the latency buckets. */
static const double bucket_le[SRV_HIST_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                   0.25,  0.5,    1.0,   2.5,  5.0,   10.0, 30.0};
static const char *const endpoint_name[3] = {"chat", "completions", "other"};
static const char *const status_name[6] = {"2xx", "400", "413", "503", "4xx", "5xx"};

void srv_metrics_init(srv_metrics *m)
{
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    m->tok_window_t[0] = m->tok_window_t[1] = srv_now();
}

void srv_metrics_observe(srv_metrics *m, srv_hist *h, double v)
{
    pthread_mutex_lock(&m->mu);
    int b = 0;
    while (b < SRV_HIST_BUCKETS && v > bucket_le[b]) b++;
    h->count[b]++;
    h->sum += v;
    h->n++;
    pthread_mutex_unlock(&m->mu);
}

/* Two half-overlapping windows of >= 10 s: the rate is read from the older one. */
void srv_metrics_add_tokens(srv_metrics *m, uint64_t n)
{
    pthread_mutex_lock(&m->mu);
    m->generation_tokens += n;
    double now = srv_now();
    for (int w = 0; w < 2; w++) {
        if (now - m->tok_window_t[w] > 20.0) {
            m->tok_window_t[w] = now;
            m->tok_window_n[w] = 0;
        }
        m->tok_window_n[w] += n;
    }
    pthread_mutex_unlock(&m->mu);
}

static int addf(srv_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int addf(srv_buf *b, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    return n < 0 ? -1 : srv_buf_add(b, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

static void hist(srv_buf *b, const char *name, const char *help, const srv_hist *h)
{
    addf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < SRV_HIST_BUCKETS; i++) {
        cum += h->count[i];
        addf(b, "%s_bucket{le=\"%g\"} %llu\n", name, bucket_le[i], (unsigned long long)cum);
    }
    cum += h->count[SRV_HIST_BUCKETS];
    addf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)cum, name, h->sum, name,
         (unsigned long long)h->n);
}

char *srv_metrics_render(srv_metrics *m, int queue_depth, int active, int max_seqs)
{
    srv_buf b = {0};
    pthread_mutex_lock(&m->mu);
    addf(&b, "# HELP dsv4_requests_total HTTP requests by endpoint and status.\n# TYPE dsv4_requests_total counter\n");
    for (int e = 0; e < 3; e++)
        for (int s = 0; s < 6; s++)
            addf(&b, "dsv4_requests_total{endpoint=\"%s\",status=\"%s\"} %llu\n", endpoint_name[e], status_name[s],
                 (unsigned long long)m->requests[e][s]);
    double now = srv_now();
    int w = m->tok_window_t[0] < m->tok_window_t[1] ? 0 : 1; /* the older window */
    double span = now - m->tok_window_t[w];
    const struct {
        const char *name, *type, *help;
        double v;
    } one[] = {
        {"dsv4_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", (double)m->prompt_tokens},
        {"dsv4_prompt_tokens_cached_total", "counter", "Prompt tokens taken from a cached prefix.", (double)m->cached_tokens},
        {"dsv4_prefix_recomputed_tokens_total", "counter", "Tokens a reused prefix's truncation ran again.", (double)m->recomputed_tokens},
        {"dsv4_generation_tokens_total", "counter", "Tokens generated.", (double)m->generation_tokens},
        {"dsv4_requests_cancelled_total", "counter", "Requests cancelled (disconnect, stop string, shutdown).", (double)m->cancelled},
        {"dsv4_engine_steps_total", "counter", "Engine steps run.", (double)m->steps},
        {"dsv4_mtp_drafted_total", "counter", "MTP draft tokens proposed.", (double)m->mtp_drafted},
        {"dsv4_mtp_accepted_total", "counter", "MTP draft tokens accepted.", (double)m->mtp_accepted},
        {"dsv4_mtp_acceptance_ratio", "gauge", "Accepted over drafted MTP tokens.",
         m->mtp_drafted ? (double)m->mtp_accepted / (double)m->mtp_drafted : 0.0},
        {"dsv4_generation_tokens_per_second", "gauge", "Generated tokens per second (last 10-20 s).",
         span > 0 ? (double)m->tok_window_n[w] / span : 0.0},
        {"dsv4_queue_depth", "gauge", "Requests waiting for a slot.", queue_depth},
        {"dsv4_active_sequences", "gauge", "Sequences being prefilled or decoded.", active},
        {"dsv4_max_sequences", "gauge", "Slots.", max_seqs},
    };
    for (size_t i = 0; i < sizeof one / sizeof one[0]; i++)
        addf(&b, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", one[i].name, one[i].help, one[i].name, one[i].type, one[i].name, one[i].v);
    hist(&b, "dsv4_time_to_first_token_seconds", "From submission to the first token.", &m->ttft);
    hist(&b, "dsv4_inter_token_seconds", "Between consecutive tokens of one request.", &m->itl);
    hist(&b, "dsv4_request_seconds", "From submission to the last token.", &m->e2e);
    pthread_mutex_unlock(&m->mu);
    return b.p;
}
