/* What every `dsv4` command shares: the one option parser (getopt_long over declared option
 * tables, which also writes each command's --help), the checks of the environment, the tokenizer
 * lookup, and the engine setup and text generation behind `run` and `chat` (generate.c). */
#ifndef DSV4_CLI_H
#define DSV4_CLI_H

#include "dsv4.h"
#include "dsv4/engine.h"

#include <stdint.h>
#include <stdio.h>

/* ---- options (options.c) ------------------------------------------------------------------- */
typedef enum cli_kind {
    CLI_FLAG, /* no value; *(int *)dst = 1 */
    CLI_STR,  /* *(const char **)dst = the value */
    CLI_INT,  /* *(long long *)dst: decimal digits (a leading '-' only where lo < 0), within [lo, hi] */
    CLI_F64,  /* *(double *)dst: a finite number within [lo, hi] */
} cli_kind;

typedef struct cli_opt {
    const char *name; /* long name without "--"; NULL ends a table */
    char short_name;  /* 0: none */
    cli_kind kind;
    void *dst;
    double lo, hi;    /* CLI_INT / CLI_F64 */
    const char *arg;  /* the value's name in the help: "N", "DIR" */
    const char *help; /* one line; the default belongs here */
} cli_opt;

typedef struct cli_cmd {
    const char *name;     /* as typed after "dsv4": "run", "bench run" */
    const char *synopsis; /* the usage line after the name */
    const char *about;    /* a paragraph under it (may be NULL) */
    int min_pos, max_pos; /* positional arguments allowed (max_pos -1: any number) */
    const cli_opt *const *tables; /* NULL-terminated list of option tables */
    int *seen; /* NULL, or one int per option of the tables in order: set to 1 when given */
} cli_cmd;

enum { CLI_PARSED = -1, CLI_EXIT_OK = 0, CLI_USAGE = 2 };

/* GNU long options (--opt=value, --opt value, -o value, "--" ends the options, options anywhere
 * among the positionals) plus -h/--help (the help on stdout) and --version for every command.
 * Returns CLI_PARSED with argv[*first_pos .. argc-1] the positionals; CLI_EXIT_OK after printing
 * the help or the version; CLI_USAGE after one line on stderr naming the unknown option, the
 * missing or the malformed value. */
int cli_parse(const cli_cmd *cmd, int argc, char **argv, int *first_pos);
void cli_help(const cli_cmd *cmd, FILE *f);
/* Strict integer: optional '-', then digits only (no spaces, no '+'). 1 when it parses within [lo, hi]. */
int cli_parse_int(const char *s, long long lo, long long hi, long long *v);

/* ---- the environment (options.c) ------------------------------------------------------------
 * Warnings on stderr for settings the library would otherwise ignore or take as they are:
 * DSV4_THREADS that is not a positive integer (dropped: the default is used) or beyond
 * CLI_MAX_THREADS (clamped to the cores), DSV4_CPU_ISA that names no ISA. */
#define CLI_MAX_THREADS 1024
void cli_check_env(void);
int cli_stderr_tty(void); /* progress lines only on a terminal */
/* All of a file ("-": standard input), NUL-terminated, malloc'd; NULL after a message. */
char *cli_read_file(const char *cmd, const char *path, size_t *len);

/* ---- the tokenizer (generate.c) ---------------------------------------------------------------
 * Which tokenizer.json: `given` (--tokenizer), else $DSV4_TOKENIZER, else `fallback`; each a file
 * or a folder holding tokenizer.json. *named says whether it came from the first two. */
const char *cli_tokenizer_path(const char *given, const char *fallback, char *buf, size_t cap, int *named);
/* Loads it (fallback_dir NULL: the current folder). With required 0 a missing file that was not
 * named gives *tok NULL and 0. Non-zero after a message naming the file. */
int cli_tokenizer_load(const char *cmd, const char *path, const char *fallback_dir, int required, dsv4_tokenizer **tok);

/* ---- generation shared by `run` and `chat` (generate.c) ------------------------------------- */
typedef struct cli_gen_args {
    const char *model, *backend, *tokenizer, *system;
    long long max_tokens, max_context, seed, mtp, max_batch, threads;
    int think, ignore_eos, special;
    double temperature, top_p;
} cli_gen_args;

/* The options of the engine and of sampling that both commands take, writing into `a` (which it
 * first sets to the defaults, max_tokens = default_max_tokens). */
const cli_opt *cli_gen_options(cli_gen_args *a, long long default_max_tokens);
/* Context + engine (a progress line while the weights load, on a terminal), the tokenizer
 * (required: the text paths), and the warnings on settings beyond the model. */
typedef struct cli_session {
    const char *cmd;
    dsv4_ctx *ctx;
    dsv4_engine *engine;
    dsv4_tokenizer *tok;
    const dsv4_model_config *cfg;
    uint64_t seed;    /* the seed in use (random unless --seed) */
    char *text_buf;   /* one token's bytes (max_token_bytes + 3) */
    size_t text_cap;
} cli_session;
int cli_session_open(cli_session *s, const char *cmd, const cli_gen_args *a, int64_t max_seqs, int64_t logits_rows,
                     int need_tokenizer);
void cli_session_close(cli_session *s);

/* Text streaming for one generation: ids to stdout as UTF-8 as they come (characters split
 * across tokens wait for the rest), special tokens left out unless `special`. */
typedef struct cli_text_out {
    const cli_session *s;
    dsv4_decode_stream stream;
    int failed;
} cli_text_out;
void cli_text_begin(cli_text_out *t, const cli_session *s, int special);
void cli_text_token(cli_text_out *t, int32_t id);
void cli_text_end(cli_text_out *t);

/* Generation with the prefill fed in max_batch chunks first when it is long and stderr is a
 * terminal (a progress line), then dsv4_engine_generate. Stats cover the whole prompt. */
dsv4_status cli_generate(cli_session *s, int seq, const cli_gen_args *a, const int32_t *prompt, int64_t n_prompt,
                         dsv4_gen_callback cb, void *user, int prompt_logits, int32_t *out, int64_t cap,
                         int64_t *n_out, dsv4_generate_stats *st);
/* One line on stderr: prefill and decode tokens/s, MTP acceptance (mtp > 0). */
void cli_speed_line(const dsv4_generate_stats *st, int mtp);

#endif
