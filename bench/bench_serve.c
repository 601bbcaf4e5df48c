/* dsv4 bench serve: `dsv4 serve` under load, next to the batched engine alone (BENCHMARKS.md,
 * "The server under load").
 *
 * For each checkpoint (the built-in tiny model with token ids, and the V4-Flash-shaped one of
 * `dsv4 bench run`) and each concurrency C in 1, 4, 16, 64:
 *   - engine alone: C sequences, each with its own 8-token prompt, prefilled in one
 *     dsv4_engine_forward_batch call, then one dsv4_engine_forward_batch call of C decode rows per
 *     step, each row sampled greedily with dsv4_engine_sample (the calls the server makes without
 *     MTP), until each has T tokens: aggregate tokens/s = C·T / wall time, TTFT = the prefill's time;
 *   - the server: `dsv4 serve` as a child process on 127.0.0.1 (same engine options, no prefix
 *     cache), C client threads each sending one streaming /v1/completions request with the same
 *     prompt ids over a raw socket at the same moment, and reading the SSE chunks as they come:
 *     aggregate tokens/s = C·T / (first send .. last token), TTFT per request, the gaps between a
 *     request's SSE events (one per engine step, unless the reader fell behind and took several).
 * Each pair (engine, then server, at one C) runs back to back while the other side idles, so the
 * two never share the cores and see the same machine; the best of --reps repetitions is shown with
 * the median of the pairs' ratios.
 *   --quick: the tiny model only; --tokens T (32; 8 on the V4-Flash shapes); --reps R (3; 1 on the
 *   V4-Flash shapes); --threads N; --model DIR: that checkpoint only; --keep: leave the V4-Flash-shaped
 *   checkpoint in /tmp. */
#define _GNU_SOURCE /* memmem */
#include "bench.h"
#include "dsv4.h"
#include "dsv4/engine.h"

#include <cjson/cJSON.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

enum { MAX_C = 64, PROMPT = 8, MAX_SEQS = 64, MAX_BATCH = 128, CONTEXT = 512 };
static const int concurrency[] = {1, 4, 16, 64};

typedef struct result {
    double tok_s, ttft_p50, ttft_p99, itl_p50, itl_p99;
    long tokens;
} result;

static void prompt_of(int client, int64_t vocab, int32_t *ids)
{
    ids[0] = 0;
    for (int k = 1; k < PROMPT; k++) ids[k] = (int32_t)(2 + (client * 131 + k * 17) % (vocab - 2));
}

static double pct(double *v, int n, double p)
{
    if (!n) return 0;
    bench_median(v, n); /* sorts */
    int i = (int)(p * (n - 1) + 0.5);
    return v[i];
}

/* ---- the engine alone -------------------------------------------------------------------------------- */
static int engine_alone(dsv4_engine *e, int C, int T, result *r)
{
    const dsv4_model_config *cfg = dsv4_engine_config(e);
    int seqs[MAX_C];
    int32_t prompts[MAX_C][PROMPT], next[MAX_C];
    dsv4_batch_entry ent[MAX_C];
    uint64_t rng[MAX_C][4];
    float *logits = malloc((size_t)C * (size_t)cfg->vocab_size * sizeof *logits);
    if (!logits) return 1;
    for (int i = 0; i < C; i++) {
        if (dsv4_engine_seq_create(e, &seqs[i]) != DSV4_OK) return 1;
        prompt_of(i, cfg->vocab_size, prompts[i]);
        ent[i] = (dsv4_batch_entry){seqs[i], prompts[i], PROMPT, 1, 0};
        dsv4_rng_seed(0, rng[i]);
    }
    dsv4_sampling greedy = {0.0f, 1.0f, 0};
    double t0 = bench_now();
    int rc = dsv4_engine_forward_batch(e, ent, C, logits, NULL) != DSV4_OK;
    for (int i = 0; i < C && !rc; i++)
        rc = dsv4_engine_sample(e, logits + (size_t)i * (size_t)cfg->vocab_size, &greedy, rng[i], &next[i]) != DSV4_OK;
    double ttft = bench_now() - t0;
    for (int t = 1; t < T && !rc; t++) { /* the calls the server makes without MTP */
        for (int i = 0; i < C; i++) ent[i] = (dsv4_batch_entry){seqs[i], &next[i], 1, 1, 0};
        rc = dsv4_engine_forward_batch(e, ent, C, logits, NULL) != DSV4_OK;
        for (int i = 0; i < C && !rc; i++)
            rc = dsv4_engine_sample(e, logits + (size_t)i * (size_t)cfg->vocab_size, &greedy, rng[i], &next[i]) != DSV4_OK;
    }
    double dt = bench_now() - t0;
    if (rc) fprintf(stderr, "bench serve: engine: %s\n", dsv4_last_error());
    for (int i = 0; i < C; i++) dsv4_engine_seq_free(e, seqs[i]);
    free(logits);
    *r = (result){.tok_s = (double)C * T / dt, .ttft_p50 = ttft, .ttft_p99 = ttft, .tokens = (long)C * T};
    return rc;
}

/* ---- the client ----------------------------------------------------------------------------------------- */
typedef struct client {
    int port, id, T;
    int64_t vocab;
    double t_send, t_first, t_last;
    double gaps[4096];
    int n_gaps, tokens, failed;
    char status[64]; /* the response's first line, for the failure message */
    pthread_barrier_t *go;
} client;

/* Token ids in one SSE event ("data: {...}"); -1 at [DONE]. */
static int event_tokens(const char *ev, size_t n)
{
    if (n < 6 || memcmp(ev, "data: ", 6)) return 0;
    if (n >= 12 && !memcmp(ev + 6, "[DONE]", 6)) return -1;
    cJSON *j = cJSON_ParseWithLength(ev + 6, n - 6);
    const cJSON *ids = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "token_ids");
    int k = cJSON_GetArraySize(ids);
    cJSON_Delete(j);
    return k;
}

static void *client_main(void *arg)
{
    client *c = arg;
    int32_t ids[PROMPT];
    prompt_of(c->id, c->vocab, ids);
    char body[512], req[1024];
    int bn = snprintf(body, sizeof body, "{\"prompt\": [%d", ids[0]);
    for (int k = 1; k < PROMPT; k++) bn += snprintf(body + bn, sizeof body - (size_t)bn, ", %d", ids[k]);
    bn += snprintf(body + bn, sizeof body - (size_t)bn, "], \"max_tokens\": %d, \"temperature\": 0, \"ignore_eos\": true, \"stream\": true}", c->T);
    int rn = snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      "Content-Length: %d\r\nConnection: close\r\n\r\n%s", bn, body);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)c->port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {1800, 0}; /* a loaded machine's V4-Flash prefill of 64 prompts takes minutes */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a)) {
        c->failed = 1;
        if (fd >= 0) close(fd);
        pthread_barrier_wait(c->go);
        return NULL;
    }
    pthread_barrier_wait(c->go);
    c->t_send = bench_now();
    if (write(fd, req, (size_t)rn) != rn) c->failed = 1;
    /* the raw bytes: headers, then chunked transfer coding; SSE events end with a blank line */
    static __thread char raw[1 << 16], bodybuf[1 << 16];
    size_t rlen = 0, blen = 0, pos = 0;
    int in_body = 0, done = 0, need_crlf = 0;
    long chunk_left = 0;
    while (!done && !c->failed) {
        ssize_t k = read(fd, raw + rlen, sizeof raw - rlen);
        if (k <= 0) break;
        rlen += (size_t)k;
        double now = bench_now();
        if (!in_body) {
            char *h = memmem(raw, rlen, "\r\n\r\n", 4);
            if (!h) continue;
            const char *cr = memchr(raw, '\r', rlen);
            size_t sl = cr ? (size_t)(cr - raw) : rlen;
            snprintf(c->status, sizeof c->status, "%.*s", (int)(sl < sizeof c->status ? sl : sizeof c->status - 1), raw);
            if (rlen < 12 || memcmp(raw + 9, "200", 3)) c->failed = 1;
            pos = (size_t)(h - raw) + 4;
            in_body = 1;
        }
        for (;;) { /* de-chunk what arrived: size line, data, CRLF */
            if (need_crlf) {
                if (rlen - pos < 2) break;
                pos += 2;
                need_crlf = 0;
            }
            if (chunk_left <= 0) {
                char *eol = memmem(raw + pos, rlen - pos, "\r\n", 2);
                if (!eol) break;
                chunk_left = strtol(raw + pos, NULL, 16);
                pos = (size_t)(eol - raw) + 2;
                if (chunk_left == 0) {
                    done = 1;
                    break;
                }
            }
            size_t take = rlen - pos < (size_t)chunk_left ? rlen - pos : (size_t)chunk_left;
            if (blen + take > sizeof bodybuf) {
                c->failed = 1;
                break;
            }
            memcpy(bodybuf + blen, raw + pos, take);
            blen += take;
            pos += take;
            chunk_left -= (long)take;
            if (chunk_left > 0) break;
            need_crlf = 1;
        }
        memmove(raw, raw + pos, rlen - pos);
        rlen -= pos;
        pos = 0;
        char *ev;
        while ((ev = memmem(bodybuf, blen, "\n\n", 2))) {
            size_t n = (size_t)(ev - bodybuf);
            int t = event_tokens(bodybuf, n);
            if (t < 0) done = 1;
            if (t > 0) { /* one gap per event: an event carries several tokens when the reader lagged */
                if (!c->tokens) c->t_first = now;
                else if (c->n_gaps < (int)(sizeof c->gaps / sizeof c->gaps[0])) c->gaps[c->n_gaps++] = now - c->t_last;
                c->tokens += t;
                c->t_last = now;
            }
            memmove(bodybuf, ev + 2, blen - n - 2);
            blen -= n + 2;
        }
    }
    close(fd);
    if (c->tokens != c->T) c->failed = 1;
    return NULL;
}

static int server_load(int port, int C, int T, int64_t vocab, result *r)
{
    static client cl[MAX_C];
    pthread_t th[MAX_C];
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, (unsigned)C);
    for (int i = 0; i < C; i++) {
        cl[i] = (client){.port = port, .id = i, .T = T, .vocab = vocab, .go = &go};
        pthread_create(&th[i], NULL, client_main, &cl[i]);
    }
    for (int i = 0; i < C; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&go);
    static double ttft[MAX_C], gaps[MAX_C * 4096];
    int ng = 0, failed = 0;
    double t0 = 1e300, t1 = 0;
    long tokens = 0;
    for (int i = 0; i < C; i++) {
        failed |= cl[i].failed;
        ttft[i] = cl[i].t_first - cl[i].t_send;
        if (cl[i].t_send < t0) t0 = cl[i].t_send;
        if (cl[i].t_last > t1) t1 = cl[i].t_last;
        for (int k = 0; k < cl[i].n_gaps; k++) gaps[ng++] = cl[i].gaps[k];
        tokens += cl[i].tokens;
    }
    for (int i = 0; i < C; i++)
        if (cl[i].failed) {
            fprintf(stderr, "bench serve: request %d of %d failed: '%s', %d of %d tokens\n", i, C, cl[i].status, cl[i].tokens, T);
            break;
        }
    *r = (result){.tok_s = (double)tokens / (t1 - t0), .ttft_p50 = pct(ttft, C, 0.5), .ttft_p99 = pct(ttft, C, 0.99),
                  .itl_p50 = pct(gaps, ng, 0.5), .itl_p99 = pct(gaps, ng, 0.99), .tokens = tokens};
    return failed;
}

/* ---- one checkpoint ------------------------------------------------------------------------------------- */
static int start_server(const char *dir, int threads, const char *port_file, pid_t *pid, int *port)
{
    char th[16], seqs[16], batch[16], ctx[16];
    snprintf(th, sizeof th, "%d", threads > 0 ? threads : dsv4_default_threads());
    snprintf(seqs, sizeof seqs, "%d", MAX_SEQS);
    snprintf(batch, sizeof batch, "%d", MAX_BATCH);
    snprintf(ctx, sizeof ctx, "%d", CONTEXT);
    char *argv[] = {"dsv4", "serve", "--model", (char *)dir, "--port", "0", "--port-file", (char *)port_file,
                    "--threads", th, "--max-seqs", seqs, "--max-batch", batch, "--max-context", ctx,
                    "--no-prefix-cache", "--max-queue", "0", NULL};
    remove(port_file);
    if (posix_spawn(pid, "/proc/self/exe", NULL, NULL, argv, environ)) return 1;
    for (int i = 0; i < 6000; i++) { /* up to 10 minutes for a large checkpoint to load */
        FILE *f = fopen(port_file, "r");
        if (f) {
            int ok = fscanf(f, "%d", port) == 1;
            fclose(f);
            if (ok) return 0;
        }
        int st;
        if (waitpid(*pid, &st, WNOHANG) == *pid) return 1;
        usleep(100000);
    }
    return 1;
}

/* Keeps the repetition with the higher aggregate rate. */
static void keep_best(result *best, const result *r, int first)
{
    if (first || r->tok_s > best->tok_s) *best = *r;
}

static int bench_one(const char *name, const char *dir, int T, int reps, int threads)
{
    result eng[4], srv[4], warm;
    double ratio[4][16];
    dsv4_ctx *ctx = NULL;
    dsv4_ctx_options co = {.threads = threads};
    if (threads && dsv4_ctx_create(&co, &ctx) != DSV4_OK) return 1;
    dsv4_engine_options eo = {CONTEXT, MAX_SEQS, MAX_BATCH, 0, 0, DSV4_LOAD_MAP, NULL, NULL};
    dsv4_engine *e = NULL;
    if (dsv4_engine_create(ctx, dir, &eo, &e) != DSV4_OK) {
        fprintf(stderr, "bench serve: %s\n", dsv4_last_error());
        dsv4_ctx_destroy(ctx);
        return 1;
    }
    int64_t vocab = dsv4_engine_config(e)->vocab_size;
    char port_file[64];
    snprintf(port_file, sizeof port_file, "/tmp/dsv4-bench-serve-%d.port", (int)getpid());
    pid_t pid = -1;
    int port = 0, rc = start_server(dir, threads, port_file, &pid, &port);
    if (rc) fprintf(stderr, "bench serve: the server did not start\n");
    /* both map in the weights the timed runs read; the idle server then sleeps */
    if (!rc) rc = engine_alone(e, 4, 2, &warm) || server_load(port, 4, 2, vocab, &warm);
    if (!rc) {
        printf("\n%s: %d-token prompts, %d tokens each, greedy, max_seqs %d, max_batch %d, best of %d\n", name, PROMPT, T,
               MAX_SEQS, MAX_BATCH, reps);
        printf("   C | engine tok/s | server tok/s | server/engine (median) | TTFT p50 (ms) engine, server p50 / p99 | "
               "inter-token p50 / p99 (ms)\n");
    }
    /* each concurrency on the engine and right after on the server, so that the pair sees the same
     * machine; the best of the repetitions, and the median of the pairs' ratios; a row as soon as it is known */
    for (int i = 0; i < 4 && !rc; i++) {
        for (int k = 0; k < reps && !rc; k++) {
            result re, rs;
            rc = engine_alone(e, concurrency[i], T, &re) || server_load(port, concurrency[i], T, vocab, &rs);
            keep_best(&eng[i], &re, k == 0);
            keep_best(&srv[i], &rs, k == 0);
            ratio[i][k] = rs.tok_s / re.tok_s;
        }
        if (rc) break;
        printf("  %2d | %12.1f | %12.1f | %22.2f | %8.1f, %8.1f / %8.1f | %8.1f / %8.1f\n", concurrency[i], eng[i].tok_s,
               srv[i].tok_s, bench_median(ratio[i], reps), 1e3 * eng[i].ttft_p50, 1e3 * srv[i].ttft_p50, 1e3 * srv[i].ttft_p99,
               1e3 * srv[i].itl_p50, 1e3 * srv[i].itl_p99);
        fflush(stdout);
    }
    if (pid > 0) {
        kill(pid, SIGTERM);
        int st;
        waitpid(pid, &st, 0);
    }
    remove(port_file);
    dsv4_engine_destroy(e);
    dsv4_ctx_destroy(ctx);
    return rc;
}

int dsv4_bench_serve(int argc, char **argv)
{
    int quick = bench_opt_flag(argc, argv, "--quick"), threads = bench_opt_int(argc, argv, "--threads", 0);
    int T = bench_opt_int(argc, argv, "--tokens", 32), reps = bench_opt_int(argc, argv, "--reps", 3);
    if (T < 2 || T > 256 || reps < 1 || reps > 16) {
        fprintf(stderr, "bench serve: --tokens %d --reps %d: use 2..256 and 1..16\n", T, reps);
        return 2;
    }
    printf("dsv4 bench serve: threads %d; the server runs as a child process on 127.0.0.1\n",
           threads > 0 ? threads : dsv4_default_threads());
    const char *model = bench_opt_str(argc, argv, "--model", NULL);
    if (model) return bench_one(model, model, T, reps, threads);
    int keep = bench_opt_flag(argc, argv, "--keep");
    char tiny[] = "/tmp/dsv4-bench-serve-tiny-XXXXXX", flash[] = "/tmp/dsv4-bench-serve-flash-XXXXXX";
    int rc = 1;
    if (mkdtemp(tiny) && dsv4_make_tiny(tiny, 1) == DSV4_OK) rc = bench_one("tiny (make-tiny, 512 ids)", tiny, T, reps, threads);
    bench_rm_tree(tiny);
    if (rc || quick) return rc;
    rc = 1;
    if (mkdtemp(flash) && bench_flash_like(flash))
        rc = bench_one("V4-Flash shapes, 3 blocks (SWA, CSA, HCA), zero weights but the routing", flash, T < 8 ? T : 8, 1, threads);
    if (keep) printf("kept %s (--model DIR runs it again)\n", flash);
    else bench_rm_tree(flash);
    return rc;
}
