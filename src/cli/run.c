/* dsv4 run: load a checkpoint and generate (docs/engine.md).
 *
 * The prompt: token ids (--prompt-ids), plain text after BOS (--prompt, --prompt-file) or a user
 * message in DeepSeek-V4's chat format (--chat, --chat-file; --system, --think); "-" reads
 * standard input. Text streams to stdout as it is generated, the speed line goes to stderr; or one
 * JSON object with --output json. Any error is one line on stderr and exit status 1 (2 for the
 * command line). */
#include "cli.h"

#include <cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct run_args {
    cli_gen_args g;
    const char *prompt_ids, *prompt, *chat, *prompt_file, *chat_file, *output, *dump;
    long long max_seqs;
} run_args;

/* Everything the step callback collects. */
typedef struct run_state {
    int64_t n_ids;
    cJSON *steps; /* --output json: one object per step */
    FILE *dump;
    int64_t dump_rows, vocab;
    cli_text_out text;
    int text_out, failed;
} run_state;

static int fail(const char *what)
{
    fprintf(stderr, "dsv4 run: %s\n", what);
    return 1;
}

static int parse_args(int argc, char **argv, run_args *a)
{
    memset(a, 0, sizeof *a);
    a->max_seqs = 1;
    a->output = "text";
    const cli_opt own[] = {
        {"prompt-ids", 0, CLI_STR, &a->prompt_ids, 0, 0, "IDS", "the prompt as token ids: 0,17,42"},
        {"prompt", 'p', CLI_STR, &a->prompt, 0, 0, "TEXT", "the prompt as plain text after BOS (-: standard input)"},
        {"prompt-file", 'f', CLI_STR, &a->prompt_file, 0, 0, "FILE", "--prompt's text from FILE (-: standard input)"},
        {"chat", 'c', CLI_STR, &a->chat, 0, 0, "TEXT", "the prompt as a user message in the chat format (-: standard input)"},
        {"chat-file", 0, CLI_STR, &a->chat_file, 0, 0, "FILE", "--chat's message from FILE (-: standard input)"},
        {"output", 'o', CLI_STR, &a->output, 0, 0, "FORMAT", "text (default: streamed) or json (one object at the end)"},
        {"dump-logits", 0, CLI_STR, &a->dump, 0, 0, "FILE", "the logits of every position as float32 .npy"},
        {"max-seqs", 0, CLI_INT, &a->max_seqs, 1, 4096, "N", "sequences to plan for (default 1)"},
        {NULL, 0, CLI_FLAG, NULL, 0, 0, NULL, NULL},
    };
    const cli_opt *tables[] = {own, cli_gen_options(&a->g, 32), NULL};
    const cli_cmd cmd = {"run", "--model DIR (--prompt-ids IDS | --prompt TEXT | --chat TEXT | ...) [options]",
                         "Generate from a checkpoint. The weights of the built-in tiny model (dsv4 make-tiny) are random:\n"
                         "its text is noise, only the speed means something.",
                         0, 0, tables, NULL};
    int pos, rc = cli_parse(&cmd, argc, argv, &pos);
    if (rc != CLI_PARSED) return rc == CLI_EXIT_OK ? -1 : rc;
    if (!!a->prompt_ids + !!a->prompt + !!a->chat + !!a->prompt_file + !!a->chat_file != 1) {
        fprintf(stderr, "dsv4 run: give exactly one of --prompt-ids, --prompt, --prompt-file, --chat, --chat-file\n");
        return 2;
    }
    if ((a->g.think || a->g.system) && !a->chat && !a->chat_file) {
        fprintf(stderr, "dsv4 run: --think and --system format a chat: use them with --chat or --chat-file\n");
        return 2;
    }
    if (strcmp(a->output, "text") && strcmp(a->output, "json")) {
        fprintf(stderr, "dsv4 run: --output '%s': use text or json\n", a->output);
        return 2;
    }
    return 0;
}

/* "1,2,3" -> ids (malloc'd): decimal digits and commas only, every id inside the vocabulary. */
static int parse_ids(const char *s, int64_t vocab, int32_t **ids, int64_t *n)
{
    int64_t cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    int32_t *v = malloc((size_t)cap * sizeof *v);
    if (!v) return fail("out of memory");
    int64_t k = 0;
    for (const char *p = s;; p++) {
        char word[24];
        size_t len = strcspn(p, ",");
        long long x;
        snprintf(word, sizeof word, "%.*s", (int)(len < sizeof word ? len : sizeof word - 1), p);
        if (len >= sizeof word || !cli_parse_int(word, 0, vocab - 1, &x)) {
            free(v);
            fprintf(stderr, "dsv4 run: --prompt-ids: '%s' is not a list of ids in [0, %lld) separated by commas\n", s,
                    (long long)vocab);
            return 1;
        }
        v[k++] = (int32_t)x;
        p += len;
        if (!*p) break;
    }
    *ids = v;
    *n = k;
    return 0;
}

static int encode_prompt(const run_args *a, const cli_session *s, int32_t **ids, int64_t *n)
{
    int chat = a->chat || a->chat_file;
    const char *src = a->chat ? a->chat : a->prompt ? a->prompt : NULL;
    const char *file = src && strcmp(src, "-") ? NULL : src ? "-" : a->chat_file ? a->chat_file : a->prompt_file;
    size_t len = src ? strlen(src) : 0;
    char *owned = file ? cli_read_file("run", file, &len) : NULL;
    if (file && !owned) return 1;
    const char *text = owned ? owned : src;
    dsv4_chat_message msgs[2] = {
        {.role = DSV4_ROLE_SYSTEM, .content = a->g.system, .content_len = a->g.system ? strlen(a->g.system) : 0},
        {.role = DSV4_ROLE_USER, .content = text, .content_len = len}};
    const dsv4_chat_message *m = a->g.system ? msgs : msgs + 1;
    size_t nm = a->g.system ? 2 : 1, count = 0;
    dsv4_prompt_options po = {a->g.think ? DSV4_PROMPT_THINKING : DSV4_PROMPT_CHAT, 0};
    size_t cap = chat ? 0 : dsv4_tokenizer_max_ids(s->tok, len) + 1;
    dsv4_status st = chat ? dsv4_prompt_encode(s->tok, m, nm, &po, NULL, 0, &cap) : DSV4_OK;
    int32_t *v = st == DSV4_OK ? malloc((cap + 1) * sizeof *v) : NULL;
    if (st == DSV4_OK && !v) st = DSV4_ERR_NO_MEMORY;
    if (st == DSV4_OK && chat) {
        st = dsv4_prompt_encode(s->tok, m, nm, &po, v, cap, &count);
    } else if (st == DSV4_OK) { /* plain text after BOS; special tokens in it stay text */
        v[0] = (int32_t)s->cfg->bos_token_id;
        st = dsv4_tokenizer_encode(s->tok, text, len, DSV4_TOKENIZE_SPECIAL_AS_TEXT, v + 1, cap, &count);
        count++;
    }
    free(owned);
    if (st != DSV4_OK) {
        free(v);
        return fail(st == DSV4_ERR_NO_MEMORY ? "out of memory" : dsv4_last_error());
    }
    *ids = v;
    *n = (int64_t)count;
    return 0;
}

/* The bytes as UTF-8 for JSON: each maximal ill-formed subpart becomes U+FFFD (as Python's
 * errors="replace" decodes it). dst holds 3 bytes per byte of src, plus the NUL. */
static void utf8_clean(const unsigned char *src, size_t n, char *dst)
{
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        unsigned c = src[i];
        size_t need = c < 0x80 ? 0 : c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : 9;
        unsigned lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80, hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
        size_t j = 1;
        while (need != 9 && j <= need && i + j < n && src[i + j] >= (j == 1 ? lo : 0x80) && src[i + j] <= (j == 1 ? hi : 0xBF))
            j++;
        if (need != 9 && j == need + 1) {
            memcpy(dst + k, src + i, j);
            k += j;
        } else {
            memcpy(dst + k, "\xEF\xBF\xBD", 3);
            k += 3;
        }
        i += need == 9 ? 1 : j;
    }
    dst[k] = '\0';
}

/* A 64-bit count exactly (cJSON writes numbers as doubles, 1.5e+15 style past 2^31). */
static cJSON *add_u64(cJSON *o, const char *name, uint64_t v)
{
    char text[24];
    snprintf(text, sizeof text, "%llu", (unsigned long long)v);
    return cJSON_AddRawToObject(o, name, text);
}

static cJSON *int_array(const int32_t *v, int64_t n)
{
    cJSON *a = cJSON_CreateArray();
    for (int64_t i = 0; a && i < n; i++)
        if (!cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]))) return cJSON_Delete(a), NULL;
    return a;
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
    if (r->steps) {
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddItemToArray(r->steps, o) || !add_u64(o, "step", (uint64_t)s->step) ||
            !cJSON_AddItemToObject(o, "tokens", int_array(s->tokens, s->n_tokens)) ||
            !cJSON_AddNumberToObject(o, "drafted", s->drafted) || !cJSON_AddNumberToObject(o, "accepted", s->accepted) ||
            !cJSON_AddNumberToObject(o, "seconds", s->seconds))
            r->failed = 1;
    }
    for (int64_t i = 0; i < s->n_tokens; i++)
        if (r->text_out) cli_text_token(&r->text, s->tokens[i]);
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

static int print_json(const run_args *a, const cli_session *s, run_state *r, const int32_t *prompt, int64_t n_prompt,
                      const int32_t *out, int64_t n_out, const dsv4_generate_stats *st, const dsv4_engine_memory *mem)
{
    double pre = st->prefill_seconds, dec = st->decode_seconds;
    cJSON *o = cJSON_CreateObject(), *m = cJSON_CreateObject();
    int ok = o && m && cJSON_AddStringToObject(o, "model", a->g.model) &&
             cJSON_AddItemToObject(o, "prompt_ids", int_array(prompt, n_prompt)) &&
             cJSON_AddItemToObject(o, "generated_ids", int_array(out, n_out));
    if (ok && s->tok) { /* the text, special tokens as --special says */
        dsv4_decode_stream ds;
        size_t len = 0, total = 0;
        dsv4_decode_stream_init(&ds, a->g.special ? 0 : DSV4_DECODE_SKIP_SPECIAL);
        char *text = malloc((size_t)n_out * s->text_cap + 4);
        for (int64_t i = 0; text && i < n_out; i++, total += len)
            if (dsv4_decode_stream_step(s->tok, &ds, out[i], text + total, s->text_cap, &len)) len = 0;
        if (text && !dsv4_decode_stream_flush(&ds, text + total, 4, &len)) total += len;
        char *clean = text ? malloc(3 * total + 1) : NULL;
        if (clean) utf8_clean((const unsigned char *)text, total, clean);
        ok = clean && cJSON_AddStringToObject(o, "text", clean);
        free(clean);
        free(text);
    }
    ok = ok && add_u64(o, "seed", s->seed) && cJSON_AddItemToObject(o, "steps", r->steps);
    r->steps = NULL; /* owned by o now */
    ok = ok && cJSON_AddNumberToObject(o, "prefill_seconds", pre) && cJSON_AddNumberToObject(o, "decode_seconds", dec) &&
         cJSON_AddNumberToObject(o, "prefill_tokens_per_s", pre > 0 ? (double)n_prompt / pre : 0.0) &&
         cJSON_AddNumberToObject(o, "decode_tokens_per_s", dec > 0 ? (double)(st->generated_tokens - 1) / dec : 0.0) &&
         cJSON_AddNumberToObject(o, "mtp", (double)a->g.mtp) && add_u64(o, "drafted", (uint64_t)st->drafted) &&
         add_u64(o, "accepted", (uint64_t)st->accepted) &&
         (st->drafted ? cJSON_AddNumberToObject(o, "acceptance", (double)st->accepted / (double)st->drafted)
                      : cJSON_AddNullToObject(o, "acceptance")) &&
         cJSON_AddItemToObject(o, "memory", m);
    if (ok) m = NULL;
    const char *names[] = {"planned", "kv_cache", "kv_used", "state", "scratch", "weights_mapped", "weights_converted",
                           "weights_device"};
    const uint64_t vals[] = {mem->planned, mem->kv_cache, mem->kv_used, mem->state, mem->scratch, mem->weights_mapped,
                             mem->weights_converted, mem->weights_device};
    cJSON *mo = cJSON_GetObjectItem(o, "memory");
    for (int i = 0; ok && i < 8; i++) ok = add_u64(mo, names[i], vals[i]) != NULL;
    char *txt = ok ? cJSON_PrintUnformatted(o) : NULL;
    if (txt) printf("%s\n", txt);
    cJSON_free(txt);
    cJSON_Delete(o);
    cJSON_Delete(m);
    return txt ? 0 : fail("out of memory writing the JSON output");
}

static int generate(const run_args *a, cli_session *s, run_state *r, const int32_t *prompt, int64_t n_prompt)
{
    int seq;
    if (dsv4_engine_seq_create(s->engine, &seq) != DSV4_OK) return fail(dsv4_last_error());
    dsv4_generate_stats st;
    int64_t n_out = 0;
    int32_t *out = malloc((size_t)a->g.max_tokens * sizeof *out);
    if (!out) return fail("out of memory");
    if (r->text_out) cli_text_begin(&r->text, s, a->g.special);
    dsv4_status rs = cli_generate(s, seq, &a->g, prompt, n_prompt, on_step, r, a->dump != NULL, out, a->g.max_tokens,
                                  &n_out, &st);
    if (r->text_out) cli_text_end(&r->text);
    int rc = 0;
    if (rs != DSV4_OK) rc = fail(dsv4_last_error());
    else if (r->failed || r->text.failed) rc = fail("could not record the output (out of memory or a write error)");
    dsv4_engine_memory mem;
    dsv4_engine_memory_info(s->engine, &mem);
    if (!rc && r->text_out) printf("\n");
    else if (!rc) rc = print_json(a, s, r, prompt, n_prompt, out, n_out, &st, &mem);
    free(out);
    if (rc) return rc;
    fflush(stdout); /* the output before the speed line (stderr), also when both go to one file */
    const double mib = 1048576.0;
    cli_speed_line(&st, (int)a->g.mtp);
    fprintf(stderr, " | memory planned %.1f MiB (KV %.1f MiB, used %.2f MiB), weights mapped %.1f MiB",
            (double)mem.planned / mib, (double)mem.kv_cache / mib, (double)mem.kv_used / mib, (double)mem.weights_mapped / mib);
    if (mem.weights_device) fprintf(stderr, ", on the device %.1f MiB", (double)mem.weights_device / mib);
    fprintf(stderr, " | seed %llu%s\n", (unsigned long long)s->seed, a->g.seed >= 0 ? "" : " (random)");
    return 0;
}

int dsv4_cmd_run(int argc, char **argv)
{
    run_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
    int64_t rows = 0;
    if (a.dump) { /* the prompt's logits come in chunks of logits_rows */
        if (!a.g.max_batch) a.g.max_batch = 128;
        rows = a.g.max_batch;
    }
    cli_session s;
    run_state r;
    memset(&r, 0, sizeof r);
    int32_t *prompt = NULL;
    int64_t n_prompt = 0;
    if ((rc = cli_session_open(&s, "run", &a.g, a.max_seqs, rows, !a.prompt_ids))) goto done;
    r.vocab = s.cfg->vocab_size;
    r.text_out = !strcmp(a.output, "text");
    if (!r.text_out && !(r.steps = cJSON_CreateArray())) {
        rc = fail("out of memory");
        goto done;
    }
    if (a.prompt_ids) rc = parse_ids(a.prompt_ids, s.cfg->vocab_size, &prompt, &n_prompt);
    else rc = encode_prompt(&a, &s, &prompt, &n_prompt);
    if (rc) goto done;
    if (a.dump && !(r.dump = fopen(a.dump, "wb"))) {
        fprintf(stderr, "dsv4 run: cannot write %s: %s\n", a.dump, strerror(errno));
        rc = 1;
        goto done;
    }
    if (r.dump) npy_header(r.dump, 0, r.vocab);
    rc = generate(&a, &s, &r, prompt, n_prompt);
    if (r.dump) {
        npy_header(r.dump, r.dump_rows, r.vocab);
        if (fclose(r.dump) && !rc) rc = fail("error writing the logits file");
        r.dump = NULL;
    }
done:
    if (r.dump) fclose(r.dump);
    free(prompt);
    cJSON_Delete(r.steps);
    cli_session_close(&s);
    return rc;
}
