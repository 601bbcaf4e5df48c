/* dsv4 run: load a checkpoint and generate (docs/engine.md).
 *
 *   dsv4 run --model DIR [--prompt-ids 1,2,3 | --prompt TEXT | --chat TEXT] --max-tokens N
 *            [--mtp K] [--temperature T] [--top-p P] [--seed S] [--stop-at-eos]
 *            [--max-context N] [--max-seqs N] [--max-batch N] [--threads N] [--backend NAME]
 *            [--output text|json] [--dump-logits FILE.npy]
 *
 * A progress line on stderr (prefill and decode tokens/s, MTP acceptance, memory planned and
 * used); the generated ids (and text when the model directory has a tokenizer.json) on stdout,
 * or one JSON object with --output json. Any error is one line on stderr and exit status 1. */
#include "dsv4.h"
#include "dsv4/engine.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct run_args {
    const char *model, *prompt_ids, *prompt, *chat, *output, *dump, *backend;
    long long max_tokens, max_context, seed;
    int mtp, max_seqs, max_batch, threads, stop_at_eos;
    double temperature, top_p;
} run_args;

/* Everything the step callback collects. */
typedef struct run_state {
    int64_t *ids;          /* generated ids */
    int64_t n_ids, cap_ids;
    char *steps_json;      /* per-step records for --output json */
    size_t steps_len, steps_cap;
    FILE *dump;
    int64_t dump_rows, vocab;
    dsv4_tokenizer *tok;
    dsv4_decode_stream stream;
    int text_out;
    int failed;
} run_state;

static int fail(const char *what)
{
    fprintf(stderr, "dsv4 run: %s\n", what);
    return 1;
}

static int usage(void)
{
    fprintf(stderr, "usage: dsv4 run --model DIR [--prompt-ids 1,2,3 | --prompt TEXT | --chat TEXT] --max-tokens N\n"
                    "                [--mtp K] [--temperature T] [--top-p P] [--seed S] [--stop-at-eos]\n"
                    "                [--max-context N] [--max-seqs N] [--max-batch N] [--threads N] [--backend NAME]\n"
                    "                [--output text|json] [--dump-logits FILE.npy]\n");
    return 2;
}

static int parse_ll(const char *opt, const char *s, long long lo, long long hi, long long *v)
{
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (errno || end == s || *end || x < lo || x > hi) {
        fprintf(stderr, "dsv4 run: %s %s is not an integer in [%lld, %lld]\n", opt, s, lo, hi);
        return 0;
    }
    *v = x;
    return 1;
}

static int parse_double(const char *opt, const char *s, double lo, double hi, double *v)
{
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    if (errno || end == s || *end || !(x >= lo && x <= hi)) {
        fprintf(stderr, "dsv4 run: %s %s is not a number in [%g, %g]\n", opt, s, lo, hi);
        return 0;
    }
    *v = x;
    return 1;
}

static int parse_args(int argc, char **argv, run_args *a)
{
    memset(a, 0, sizeof *a);
    a->max_tokens = 32;
    a->max_seqs = 1;
    a->top_p = 1.0;
    a->output = "text";
    for (int i = 0; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long x;
        int ok = 1;
        if (!strcmp(o, "--stop-at-eos")) {
            a->stop_at_eos = 1;
            continue;
        }
        if (!v) return usage();
        i++;
        if (!strcmp(o, "--model")) a->model = v;
        else if (!strcmp(o, "--prompt-ids")) a->prompt_ids = v;
        else if (!strcmp(o, "--prompt")) a->prompt = v;
        else if (!strcmp(o, "--chat")) a->chat = v;
        else if (!strcmp(o, "--output")) a->output = v;
        else if (!strcmp(o, "--dump-logits")) a->dump = v;
        else if (!strcmp(o, "--backend")) a->backend = v;
        else if (!strcmp(o, "--max-tokens")) ok = parse_ll(o, v, 1, 1 << 24, &a->max_tokens);
        else if (!strcmp(o, "--max-context")) ok = parse_ll(o, v, 1, 1 << 24, &a->max_context);
        else if (!strcmp(o, "--seed")) ok = parse_ll(o, v, 0, INT64_MAX, &a->seed);
        else if (!strcmp(o, "--mtp")) ok = parse_ll(o, v, 0, 64, &x) && ((a->mtp = (int)x), 1);
        else if (!strcmp(o, "--max-seqs")) ok = parse_ll(o, v, 1, 4096, &x) && ((a->max_seqs = (int)x), 1);
        else if (!strcmp(o, "--max-batch")) ok = parse_ll(o, v, 1, 65536, &x) && ((a->max_batch = (int)x), 1);
        else if (!strcmp(o, "--threads")) ok = parse_ll(o, v, 1, 4096, &x) && ((a->threads = (int)x), 1);
        else if (!strcmp(o, "--temperature")) ok = parse_double(o, v, 0.0, 1e6, &a->temperature);
        else if (!strcmp(o, "--top-p")) ok = parse_double(o, v, 1e-9, 1.0, &a->top_p);
        else return usage();
        if (!ok) return 1;
    }
    if (!a->model) return usage();
    if (!!a->prompt_ids + !!a->prompt + !!a->chat != 1) {
        fprintf(stderr, "dsv4 run: give exactly one of --prompt-ids, --prompt, --chat\n");
        return 1;
    }
    if (strcmp(a->output, "text") && strcmp(a->output, "json")) {
        fprintf(stderr, "dsv4 run: --output %s: use text or json\n", a->output);
        return 1;
    }
    return 0;
}

/* "1,2,3" -> ids (malloc'd); every id checked against the vocabulary. */
static int parse_ids(const char *s, int64_t vocab, int32_t **ids, int64_t *n)
{
    int64_t cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    int32_t *v = malloc((size_t)cap * sizeof *v);
    if (!v) return fail("out of memory");
    int64_t k = 0;
    const char *p = s;
    while (1) {
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (errno || end == p || x < 0 || x >= vocab || (*end && *end != ',')) {
            free(v);
            fprintf(stderr, "dsv4 run: --prompt-ids: '%s' is not a list of ids in [0, %lld)\n", s, (long long)vocab);
            return 1;
        }
        v[k++] = (int32_t)x;
        if (!*end) break;
        p = end + 1;
    }
    *ids = v;
    *n = k;
    return 0;
}

static int load_tokenizer(const char *dir, dsv4_tokenizer **tok, int required)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (!required) return 0;
        fprintf(stderr, "dsv4 run: %s not found: --prompt and --chat need the model's tokenizer (use --prompt-ids)\n", path);
        return 1;
    }
    fclose(f);
    if (dsv4_tokenizer_load(path, tok) != DSV4_OK) {
        fprintf(stderr, "dsv4 run: %s\n", dsv4_last_error());
        return required ? 1 : 0;
    }
    return 0;
}

static int encode_prompt(const run_args *a, dsv4_tokenizer *tok, int64_t bos, int32_t **ids, int64_t *n)
{
    size_t count = 0, len = strlen(a->prompt ? a->prompt : a->chat);
    dsv4_chat_message msg = {.role = DSV4_ROLE_USER, .content = a->chat, .content_len = a->chat ? len : 0};
    dsv4_prompt_options po = {DSV4_PROMPT_CHAT, 0};
    size_t cap = a->chat ? 0 : dsv4_tokenizer_max_ids(tok, len) + 1;
    if (a->chat && dsv4_prompt_encode(tok, &msg, 1, &po, NULL, 0, &cap) != DSV4_OK) return fail(dsv4_last_error());
    int32_t *v = malloc((cap + 1) * sizeof *v);
    if (!v) return fail("out of memory");
    dsv4_status st;
    if (a->chat) {
        st = dsv4_prompt_encode(tok, &msg, 1, &po, v, cap, &count);
    } else { /* plain text after BOS */
        v[0] = (int32_t)bos;
        st = dsv4_tokenizer_encode(tok, a->prompt, len, DSV4_TOKENIZE_SPECIAL_AS_TEXT, v + 1, cap, &count);
        count++;
    }
    if (st != DSV4_OK) {
        free(v);
        return fail(dsv4_last_error());
    }
    *ids = v;
    *n = (int64_t)count;
    return 0;
}

/* ---- the step callback --------------------------------------------------------------------- */
static void append(run_state *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void append(run_state *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (r->steps_len + (size_t)n + 1 > r->steps_cap) {
        size_t cap = (r->steps_cap + (size_t)n + 1) * 2;
        char *p = realloc(r->steps_json, cap);
        if (!p) {
            r->failed = 1;
            return;
        }
        r->steps_json = p;
        r->steps_cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(r->steps_json + r->steps_len, r->steps_cap - r->steps_len, fmt, ap);
    va_end(ap);
    r->steps_len += (size_t)n;
}

static int on_step(void *user, const dsv4_gen_step *s)
{
    run_state *r = user;
    if (r->dump && s->logits) { /* prompt rows, then the row behind each kept token */
        int64_t rows = s->step == 0 ? s->n_logits : (s->n_tokens < s->n_logits ? s->n_tokens : s->n_logits);
        if (fwrite(s->logits, sizeof(float) * (size_t)r->vocab, (size_t)rows, r->dump) != (size_t)rows) r->failed = 1;
        r->dump_rows += rows;
    }
    if (s->step == 0 && s->n_tokens == 0) return r->failed;
    append(r, "%s{\"step\": %lld, \"tokens\": [", r->steps_len ? ", " : "", (long long)s->step);
    for (int64_t i = 0; i < s->n_tokens; i++) {
        append(r, i ? ", %d" : "%d", s->tokens[i]);
        if (r->n_ids < r->cap_ids) r->ids[r->n_ids++] = s->tokens[i];
        if (r->text_out) {
            char buf[1024];
            size_t len = 0;
            if (r->tok && dsv4_decode_stream_step(r->tok, &r->stream, s->tokens[i], buf, sizeof buf, &len) == DSV4_OK) {
                fwrite(buf, 1, len, stdout);
            } else {
                printf("%s%d", r->n_ids > 1 ? " " : "", s->tokens[i]);
            }
            fflush(stdout);
        }
    }
    append(r, "], \"drafted\": %d, \"accepted\": %d, \"seconds\": %.6f}", s->drafted, s->accepted, s->seconds);
    return r->failed;
}

/* .npy header for float32 [rows, vocab], padded to 128 bytes. */
static void npy_header(FILE *f, int64_t rows, int64_t vocab)
{
    char h[128];
    memset(h, ' ', sizeof h);
    memcpy(h, "\x93NUMPY\x01\x00", 8);
    h[8] = (char)(128 - 10);
    h[9] = 0;
    int n = snprintf(h + 10, sizeof h - 10, "{'descr': '<f4', 'fortran_order': False, 'shape': (%lld, %lld), }",
                     (long long)rows, (long long)vocab);
    h[10 + n] = ' ';
    h[127] = '\n';
    fseek(f, 0, SEEK_SET);
    fwrite(h, 1, sizeof h, f);
}

static void print_json(const run_args *a, const run_state *r, const int32_t *prompt, int64_t n_prompt,
                       const dsv4_generate_stats *st, const dsv4_engine_memory *mem)
{
    printf("{\"model\": \"%s\", \"prompt_ids\": [", a->model);
    for (int64_t i = 0; i < n_prompt; i++) printf(i ? ", %d" : "%d", prompt[i]);
    printf("], \"generated_ids\": [");
    for (int64_t i = 0; i < r->n_ids; i++) printf(i ? ", %lld" : "%lld", (long long)r->ids[i]);
    double pre = st->prefill_seconds, dec = st->decode_seconds;
    printf("], \"steps\": [%s], \"prefill_seconds\": %.6f, \"decode_seconds\": %.6f, \"prefill_tokens_per_s\": %.3f, "
           "\"decode_tokens_per_s\": %.3f, \"mtp\": %d, \"drafted\": %lld, \"accepted\": %lld, \"acceptance\": ",
           r->steps_json ? r->steps_json : "", pre, dec, pre > 0 ? (double)n_prompt / pre : 0.0,
           dec > 0 ? (double)(st->generated_tokens - 1) / dec : 0.0, a->mtp, (long long)st->drafted, (long long)st->accepted);
    if (st->drafted) printf("%.6f", (double)st->accepted / (double)st->drafted);
    else printf("null");
    printf(", \"memory\": {\"planned\": %llu, \"kv_cache\": %llu, \"kv_used\": %llu, \"state\": %llu, \"scratch\": %llu, "
           "\"weights_mapped\": %llu, \"weights_converted\": %llu}}\n",
           (unsigned long long)mem->planned, (unsigned long long)mem->kv_cache, (unsigned long long)mem->kv_used,
           (unsigned long long)mem->state, (unsigned long long)mem->scratch, (unsigned long long)mem->weights_mapped,
           (unsigned long long)mem->weights_converted);
}

static void progress(const run_args *a, int64_t n_prompt, const dsv4_generate_stats *st, const dsv4_engine_memory *m)
{
    const double mib = 1048576.0;
    double pre = st->prefill_seconds, dec = st->decode_seconds;
    fprintf(stderr, "prefill %lld tokens %.3f s (%.1f tok/s) | decode %lld tokens %.3f s (%.1f tok/s)", (long long)n_prompt,
            pre, pre > 0 ? (double)n_prompt / pre : 0.0, (long long)(st->generated_tokens - 1), dec,
            dec > 0 ? (double)(st->generated_tokens - 1) / dec : 0.0);
    if (a->mtp)
        fprintf(stderr, " | mtp %d: acceptance %.1f%% (%lld/%lld drafts, %.2f tokens/step)", a->mtp,
                st->drafted ? 100.0 * (double)st->accepted / (double)st->drafted : 0.0, (long long)st->accepted,
                (long long)st->drafted, st->steps > 1 ? (double)(st->generated_tokens - 1) / (double)(st->steps - 1) : 0.0);
    fprintf(stderr, " | memory planned %.1f MiB (KV %.1f MiB, used %.2f MiB), weights mapped %.1f MiB\n",
            (double)m->planned / mib, (double)m->kv_cache / mib, (double)m->kv_used / mib, (double)m->weights_mapped / mib);
}

static int generate(const run_args *a, dsv4_engine *e, run_state *r, const int32_t *prompt, int64_t n_prompt)
{
    int seq;
    if (dsv4_engine_seq_create(e, &seq) != DSV4_OK) return fail(dsv4_last_error());
    dsv4_generate_options go = {a->max_tokens, a->mtp, {(float)a->temperature, (float)a->top_p, (uint64_t)a->seed},
                                a->stop_at_eos, a->dump != NULL, on_step, r};
    dsv4_generate_stats st;
    int64_t n_out = 0;
    int32_t *out = malloc((size_t)a->max_tokens * sizeof *out);
    r->ids = malloc((size_t)a->max_tokens * sizeof *r->ids);
    r->cap_ids = a->max_tokens;
    if (!out || !r->ids) {
        free(out);
        return fail("out of memory");
    }
    dsv4_status s = dsv4_engine_generate(e, seq, prompt, n_prompt, &go, out, a->max_tokens, &n_out, &st);
    free(out);
    if (s != DSV4_OK) return fail(dsv4_last_error());
    if (r->failed) return fail("could not record the output (out of memory or a write error)");
    dsv4_engine_memory mem;
    dsv4_engine_memory_info(e, &mem);
    if (r->text_out) {
        char buf[8];
        size_t len = 0;
        if (r->tok && dsv4_decode_stream_flush(&r->stream, buf, sizeof buf, &len) == DSV4_OK) fwrite(buf, 1, len, stdout);
        printf("\n");
    } else {
        print_json(a, r, prompt, n_prompt, &st, &mem);
    }
    fflush(stdout); /* the output before the progress line (stderr), also when both go to one file */
    progress(a, n_prompt, &st, &mem);
    return 0;
}

int dsv4_cmd_run(int argc, char **argv)
{
    run_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc;
    dsv4_ctx *ctx = NULL;
    if (a.backend || a.threads) {
        dsv4_ctx_options co = {.backend = a.backend, .threads = a.threads};
        if (dsv4_ctx_create(&co, &ctx) != DSV4_OK) return fail(dsv4_last_error());
    }
    dsv4_engine_options eo = {a.max_context, a.max_seqs, a.max_batch, a.mtp, 0, DSV4_LOAD_MAP};
    if (a.dump) { /* the prompt's logits come in chunks of logits_rows */
        if (!eo.max_batch) eo.max_batch = 128;
        eo.logits_rows = eo.max_batch;
    }
    dsv4_engine *e = NULL;
    run_state r;
    memset(&r, 0, sizeof r);
    int32_t *prompt = NULL;
    int64_t n_prompt = 0;
    if (dsv4_engine_create(ctx, a.model, &eo, &e) != DSV4_OK) {
        rc = fail(dsv4_last_error());
        goto done;
    }
    const dsv4_model_config *cfg = dsv4_engine_config(e);
    if (a.mtp && dsv4_engine_get_options(e).max_mtp < a.mtp) {
        rc = fail("--mtp: the checkpoint has no MTP block");
        goto done;
    }
    r.vocab = cfg->vocab_size;
    r.text_out = !strcmp(a.output, "text");
    if ((rc = load_tokenizer(a.model, &r.tok, a.prompt || a.chat))) goto done;
    dsv4_decode_stream_init(&r.stream, 0);
    if (a.prompt_ids) rc = parse_ids(a.prompt_ids, cfg->vocab_size, &prompt, &n_prompt);
    else rc = encode_prompt(&a, r.tok, cfg->bos_token_id, &prompt, &n_prompt);
    if (rc) goto done;
    if (a.dump && !(r.dump = fopen(a.dump, "wb"))) {
        fprintf(stderr, "dsv4 run: cannot write %s: %s\n", a.dump, strerror(errno));
        rc = 1;
        goto done;
    }
    if (r.dump) npy_header(r.dump, 0, r.vocab);
    rc = generate(&a, e, &r, prompt, n_prompt);
    if (r.dump) {
        npy_header(r.dump, r.dump_rows, r.vocab);
        if (fclose(r.dump) && !rc) rc = fail("error writing the logits file");
        r.dump = NULL;
    }
done:
    if (r.dump) fclose(r.dump);
    free(prompt);
    free(r.ids);
    free(r.steps_json);
    dsv4_tokenizer_free(r.tok);
    dsv4_engine_destroy(e);
    dsv4_ctx_destroy(ctx);
    return rc;
}
