/* The engine session behind `dsv4 run` and `dsv4 chat`: options, loading, text streaming, the
 * prefill with progress, and the speed line (src/cli/cli.h). */
#include "cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

const char *cli_tokenizer_path(const char *given, const char *fallback, char *buf, size_t cap, int *named)
{
    const char *p = given && *given ? given : getenv("DSV4_TOKENIZER");
    *named = p && *p;
    if (!*named) p = fallback;
    struct stat sb;
    if (!stat(p, &sb) && S_ISDIR(sb.st_mode)) {
        snprintf(buf, cap, "%s/tokenizer.json", p);
        return buf;
    }
    return p;
}

int cli_tokenizer_load(const char *cmd, const char *given, const char *fallback_dir, int required, dsv4_tokenizer **tok)
{
    char file[4096];
    struct stat sb;
    int named;
    *tok = NULL;
    const char *path = cli_tokenizer_path(given, fallback_dir ? fallback_dir : ".", file, sizeof file, &named);
    if (!named && !required && stat(path, &sb)) return 0; /* no tokenizer beside the model: ids only */
    if (stat(path, &sb)) {
        fprintf(stderr, "dsv4 %s: %s: %s (give --tokenizer PATH or set DSV4_TOKENIZER)\n", cmd, path, strerror(errno));
        return 1;
    }
    if (dsv4_tokenizer_load(path, tok) != DSV4_OK) {
        fprintf(stderr, "dsv4 %s: %s\n", cmd, dsv4_last_error());
        return 1;
    }
    return 0;
}

const cli_opt *cli_gen_options(cli_gen_args *a, long long default_max_tokens)
{
    static cli_opt t[18];
    memset(a, 0, sizeof *a);
    a->max_tokens = default_max_tokens;
    a->top_p = 1.0;
    a->seed = -1;
    const cli_opt opts[] = {
        {"model", 'm', CLI_STR, &a->model, 0, 0, "DIR", "the checkpoint folder (config.json + safetensors); required"},
        {"tokenizer", 0, CLI_STR, &a->tokenizer, 0, 0, "PATH",
         "tokenizer.json or its folder (default: $DSV4_TOKENIZER, else the model folder's)"},
        {"system", 0, CLI_STR, &a->system, 0, 0, "TEXT", "a system message before the first user message"},
        {"think", 0, CLI_FLAG, &a->think, 0, 0, NULL, "thinking mode (the model reasons before it answers)"},
        {"max-tokens", 'n', CLI_INT, &a->max_tokens, 1, 1 << 24, "N", "tokens to generate at most"},
        {"ignore-eos", 0, CLI_FLAG, &a->ignore_eos, 0, 0, NULL, "go on after an end-of-sequence token"},
        {"special", 0, CLI_FLAG, &a->special, 0, 0, NULL, "print special tokens (BOS, EOS, role markers) as text"},
        {"temperature", 't', CLI_F64, &a->temperature, 0, 1e6, "T", "sampling temperature (default 0: greedy)"},
        {"top-p", 0, CLI_F64, &a->top_p, 1e-9, 1, "P", "nucleus sampling mass (default 1: every token)"},
        {"seed", 's', CLI_INT, &a->seed, 0, 9007199254740991.0, "S", "sampling seed (default: random, printed)"},
        {"mtp", 0, CLI_INT, &a->mtp, 0, 64, "K", "speculative decoding with K drafts of the MTP block per step"},
        {"max-context", 0, CLI_INT, &a->max_context, 1, 1 << 24, "N",
         "positions per sequence (default: min(4096, the model's max_position_embeddings))"},
        {"max-batch", 0, CLI_INT, &a->max_batch, 1, 65536, "N", "tokens per forward pass (default 128)"},
        {"threads", 0, CLI_INT, &a->threads, 1, CLI_MAX_THREADS, "N", "CPU threads (default: $DSV4_THREADS, else all cores)"},
        {"backend", 0, CLI_STR, &a->backend, 0, 0, "NAME", "cpu, cpu-ref or cuda (default: $DSV4_BACKEND, else cpu)"},
        {NULL, 0, CLI_FLAG, NULL, 0, 0, NULL, NULL},
    };
    memcpy(t, opts, sizeof opts);
    return t;
}

static uint64_t random_seed(void)
{
    uint64_t x = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f || fread(&x, sizeof x, 1, f) != 1) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        x = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec;
    }
    if (f) fclose(f);
    return x & ((1ull << 53) - 1); /* exact in any JSON reader */
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The engine's load progress (the weights' copy to a device), a line each on stderr. */
static void load_progress(void *user, const char *line)
{
    (void)user;
    if (cli_stderr_tty()) fprintf(stderr, "\n  %s", line); /* after "loading DIR ..." */
    else fprintf(stderr, "%s\n", line);
    fflush(stderr);
}

int cli_session_open(cli_session *s, const char *cmd, const cli_gen_args *a, int64_t max_seqs, int64_t logits_rows,
                     int need_tokenizer)
{
    memset(s, 0, sizeof *s);
    s->cmd = cmd;
    if (!a->model) {
        fprintf(stderr, "dsv4 %s: --model DIR is required (dsv4 %s --help)\n", cmd, cmd);
        return 2;
    }
    s->seed = a->seed >= 0 ? (uint64_t)a->seed : random_seed();
    char path[4096];
    dsv4_model_config cfg;
    snprintf(path, sizeof path, "%s/config.json", a->model);
    if (a->max_context && dsv4_config_load(path, &cfg) == DSV4_OK && a->max_context > cfg.max_position_embeddings)
        fprintf(stderr, "dsv4 %s: warning: --max-context %lld is beyond the model's max_position_embeddings (%lld): "
                "positions past it were never trained\n", cmd, a->max_context, (long long)cfg.max_position_embeddings);
    if (a->backend || a->threads) {
        dsv4_ctx_options co = {.backend = a->backend, .threads = (int)a->threads};
        if (dsv4_ctx_create(&co, &s->ctx) != DSV4_OK) goto fail;
    }
    dsv4_engine_options eo = {a->max_context, (int)max_seqs, (int)a->max_batch, (int)a->mtp, (int)logits_rows, DSV4_LOAD_MAP,
                              load_progress, NULL};
    int tty = cli_stderr_tty();
    double t0 = now();
    if (tty) fprintf(stderr, "loading %s ...", a->model), fflush(stderr);
    dsv4_status st = dsv4_engine_create(s->ctx, a->model, &eo, &s->engine);
    if (tty) fprintf(stderr, st == DSV4_OK ? " %.1f s\n" : "\n", now() - t0);
    if (st != DSV4_OK) goto fail;
    s->cfg = dsv4_engine_config(s->engine);
    if (a->mtp && dsv4_engine_get_options(s->engine).max_mtp < a->mtp) {
        fprintf(stderr, "dsv4 %s: --mtp: the checkpoint has no MTP block\n", cmd);
        return 1;
    }
    if (cli_tokenizer_load(cmd, a->tokenizer, a->model, need_tokenizer, &s->tok)) return 1;
    if (s->tok) {
        if (dsv4_tokenizer_vocab_size(s->tok) > s->cfg->vocab_size) {
            fprintf(stderr, "dsv4 %s: the tokenizer has %d tokens, the model's vocabulary %lld: not this model's tokenizer\n",
                    cmd, dsv4_tokenizer_vocab_size(s->tok), (long long)s->cfg->vocab_size);
            return 1;
        }
        s->text_cap = dsv4_tokenizer_max_token_bytes(s->tok) + 3;
        if (!(s->text_buf = malloc(s->text_cap))) {
            fprintf(stderr, "dsv4 %s: out of memory\n", cmd);
            return 1;
        }
    }
    return 0;
fail:
    fprintf(stderr, "dsv4 %s: %s\n", cmd, dsv4_last_error());
    return 1;
}

void cli_session_close(cli_session *s)
{
    free(s->text_buf);
    dsv4_tokenizer_free(s->tok);
    dsv4_engine_destroy(s->engine);
    dsv4_ctx_destroy(s->ctx);
    memset(s, 0, sizeof *s);
}

void cli_text_begin(cli_text_out *t, const cli_session *s, int special)
{
    t->s = s;
    t->failed = 0;
    dsv4_decode_stream_init(&t->stream, special ? 0 : DSV4_DECODE_SKIP_SPECIAL);
}

void cli_text_token(cli_text_out *t, int32_t id)
{
    size_t len = 0;
    if (!t->s->tok) {
        printf(" %d", id);
    } else if (dsv4_decode_stream_step(t->s->tok, &t->stream, id, t->s->text_buf, t->s->text_cap, &len) == DSV4_OK) {
        fwrite(t->s->text_buf, 1, len, stdout);
    } else {
        t->failed = 1;
    }
    fflush(stdout);
}

void cli_text_end(cli_text_out *t)
{
    size_t len = 0;
    if (t->s->tok && dsv4_decode_stream_flush(&t->stream, t->s->text_buf, t->s->text_cap, &len) == DSV4_OK)
        fwrite(t->s->text_buf, 1, len, stdout);
    fflush(stdout);
}

dsv4_status cli_generate(cli_session *s, int seq, const cli_gen_args *a, const int32_t *prompt, int64_t n_prompt,
                         dsv4_gen_callback cb, void *user, int prompt_logits, int32_t *out, int64_t cap,
                         int64_t *n_out, dsv4_generate_stats *st)
{
    /* A long prompt on a terminal: all but its last chunk through dsv4_engine_forward, a chunk at a
     * time with a progress line (the engine's state is the same however the tokens were batched). */
    int64_t chunk = dsv4_engine_get_options(s->engine).max_batch, done = 0;
    double t0 = now();
    if (!prompt_logits && cli_stderr_tty() && n_prompt > 2 * chunk) {
        while (n_prompt - done > chunk) {
            dsv4_status r = dsv4_engine_forward(s->engine, seq, prompt + done, chunk, NULL, 0, NULL, 0);
            if (r != DSV4_OK) {
                fprintf(stderr, "\n");
                return r;
            }
            done += chunk;
            double dt = now() - t0;
            fprintf(stderr, "\rprefill %lld/%lld tokens (%.1f tok/s)", (long long)done, (long long)n_prompt, (double)done / dt);
            fflush(stderr);
        }
        fprintf(stderr, "\r\033[K");
    }
    double t_chunks = now() - t0;
    dsv4_generate_options go = {a->max_tokens, (int)a->mtp, {(float)a->temperature, (float)a->top_p, s->seed},
                                !a->ignore_eos, prompt_logits, cb, user, 0};
    dsv4_status r = dsv4_engine_generate(s->engine, seq, prompt + done, n_prompt - done, &go, out, cap, n_out, st);
    if (r == DSV4_OK) {
        st->prompt_tokens += done;
        st->prefill_seconds += t_chunks;
    }
    return r;
}

void cli_speed_line(const dsv4_generate_stats *st, int mtp)
{
    double pre = st->prefill_seconds, dec = st->decode_seconds;
    long long n_dec = st->generated_tokens > 0 ? (long long)st->generated_tokens - 1 : 0;
    fprintf(stderr, "prefill %lld tokens %.3f s (%.1f tok/s) | decode %lld tokens %.3f s (%.1f tok/s)",
            (long long)st->prompt_tokens, pre, pre > 0 ? (double)st->prompt_tokens / pre : 0.0, n_dec, dec,
            dec > 0 ? (double)n_dec / dec : 0.0);
    if (mtp)
        fprintf(stderr, " | mtp %d: acceptance %.1f%% (%lld/%lld drafts, %.2f tokens/step)", mtp,
                st->drafted ? 100.0 * (double)st->accepted / (double)st->drafted : 0.0, (long long)st->accepted,
                (long long)st->drafted, st->steps > 1 ? (double)n_dec / (double)(st->steps - 1) : 0.0);
}
