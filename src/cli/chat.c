/* dsv4 chat: a conversation in the terminal. Each turn appends to the one engine sequence (the
 * engine continues a non-empty sequence, docs/engine.md), so a turn costs the prefill of its own
 * message only. Lines are read with libedit (editing, history) on a terminal, plainly otherwise. */
#include "cli.h"

#include <editline/readline.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct chat_state {
    cli_session s;
    const cli_gen_args *a;
    int seq, think, tty;
    int32_t pending;     /* the last token generated: not in the caches yet (-1: none) */
    int pending_eos;     /* it ends the assistant's message */
    int32_t end_id;      /* <｜end▁of▁sentence｜>, which closes an assistant message */
    int32_t *out;        /* [max_tokens] */
    cli_text_out text;
} chat_state;

static const char HELP[] = "commands: /reset (a new conversation), /think on|off (thinking mode), /help, /quit\n";

static int is_eos(const dsv4_model_config *c, int32_t id)
{
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_token_ids[i] == id) return 1;
    return 0;
}

static int on_step(void *user, const dsv4_gen_step *st)
{
    chat_state *c = user;
    for (int64_t i = 0; i < st->n_tokens; i++) cli_text_token(&c->text, st->tokens[i]);
    return 0;
}

/* The ids of one user turn: the whole prompt (BOS, system) when the sequence is empty; else the
 * token the last turn ended with, the end of that assistant message, and this user message with
 * its transition to the assistant (the prompt of this message alone, minus its BOS). */
static int turn_ids(chat_state *c, const char *line, int32_t **ids, int64_t *n)
{
    const cli_gen_args *a = c->a;
    int first = dsv4_engine_seq_length(c->s.engine, c->seq) == 0 && c->pending < 0;
    dsv4_chat_message msgs[2] = {
        {.role = DSV4_ROLE_SYSTEM, .content = a->system, .content_len = a->system ? strlen(a->system) : 0},
        {.role = DSV4_ROLE_USER, .content = line, .content_len = strlen(line)}};
    int sys = first && a->system;
    dsv4_prompt_options po = {c->think ? DSV4_PROMPT_THINKING : DSV4_PROMPT_CHAT, 0};
    size_t cap = 0, count = 0;
    if (dsv4_prompt_encode(c->s.tok, msgs + !sys, 1 + sys, &po, NULL, 0, &cap) != DSV4_OK) return 1;
    int32_t *v = malloc((cap + 2) * sizeof *v);
    if (!v) return 1;
    if (dsv4_prompt_encode(c->s.tok, msgs + !sys, 1 + sys, &po, v + 1, cap, &count) != DSV4_OK) {
        free(v);
        return 1;
    }
    int64_t k = 0;
    if (!first) { /* replace the BOS at v[1] */
        v[k++] = c->pending;
        if (!c->pending_eos) v[k++] = c->end_id;
        memmove(v + k, v + 2, (count - 1) * sizeof *v);
        k += (int64_t)count - 1;
    } else {
        memmove(v, v + 1, count * sizeof *v);
        k = (int64_t)count;
    }
    *ids = v;
    *n = k;
    return 0;
}

static void reset(chat_state *c)
{
    dsv4_engine_seq_reset(c->s.engine, c->seq);
    c->pending = -1;
}

static void turn(chat_state *c, const char *line)
{
    int32_t *ids = NULL;
    int64_t n = 0;
    if (turn_ids(c, line, &ids, &n)) {
        fprintf(stderr, "dsv4 chat: %s\n", dsv4_last_error());
        return;
    }
    int64_t len = dsv4_engine_seq_length(c->s.engine, c->seq);
    int64_t room = dsv4_engine_get_options(c->s.engine).max_context - len - n;
    if (room < 1) {
        fprintf(stderr, "dsv4 chat: the conversation fills the context (%lld of %lld positions): /reset starts a new one\n",
                (long long)len, (long long)dsv4_engine_get_options(c->s.engine).max_context);
        free(ids);
        return;
    }
    cli_gen_args a = *c->a;
    if (a.max_tokens > room) a.max_tokens = room;
    dsv4_generate_stats st = {0};
    int64_t n_out = 0;
    cli_text_begin(&c->text, &c->s, a.special);
    dsv4_status r = cli_generate(&c->s, c->seq, &a, ids, n, on_step, c, 0, c->out, a.max_tokens, &n_out, &st);
    cli_text_end(&c->text);
    free(ids);
    printf("\n");
    fflush(stdout);
    if (r != DSV4_OK) {
        fprintf(stderr, "dsv4 chat: %s; /reset starts a new conversation\n", dsv4_last_error());
        reset(c);
        return;
    }
    if (n_out) {
        c->pending = c->out[n_out - 1];
        c->pending_eos = is_eos(c->s.cfg, c->pending);
    }
    fprintf(stderr, "[");
    cli_speed_line(&st, (int)a.mtp);
    fprintf(stderr, " | context %lld/%lld]\n", (long long)dsv4_engine_seq_length(c->s.engine, c->seq) + 1,
            (long long)dsv4_engine_get_options(c->s.engine).max_context);
}

/* One line without its newline (malloc'd), or NULL at the end of the input. */
static char *read_line(const chat_state *c)
{
    if (c->tty) {
        char *l = readline(c->think ? "think> " : "> ");
        if (l && *l) add_history(l);
        return l;
    }
    char *l = NULL;
    size_t cap = 0;
    ssize_t n = getline(&l, &cap, stdin);
    if (n < 0) {
        free(l);
        return NULL;
    }
    if (n && l[n - 1] == '\n') l[--n] = '\0';
    if (n && l[n - 1] == '\r') l[--n] = '\0';
    return l;
}

/* A /command; 0 to go on, 1 to quit. */
static int command(chat_state *c, const char *l)
{
    if (!strcmp(l, "/quit") || !strcmp(l, "/exit")) return 1;
    if (!strcmp(l, "/reset")) {
        reset(c);
        fprintf(stderr, "(a new conversation)\n");
    } else if (!strcmp(l, "/think on") || !strcmp(l, "/think off")) {
        c->think = !strcmp(l, "/think on");
        fprintf(stderr, "(thinking %s from the next message)\n", c->think ? "on" : "off");
    } else if (!strcmp(l, "/help")) {
        fputs(HELP, stderr);
    } else {
        fprintf(stderr, "dsv4 chat: unknown command '%s'; %s", l, HELP);
    }
    return 0;
}

int dsv4_cmd_chat(int argc, char **argv)
{
    cli_gen_args a;
    const cli_opt *tables[] = {cli_gen_options(&a, 1024), NULL};
    const cli_cmd cmd = {"chat", "--model DIR [options]",
                         "A conversation with the model in the terminal: each line you type is a user message, the answer\n"
                         "streams back, then the speed of the turn. Each turn continues the sequence (only the new message\n"
                         "is prefilled). Standard input that is not a terminal is read line by line.\n"
                         "The built-in tiny model's weights are random: it answers noise.\n\n"
                         "In the conversation: /reset, /think on|off, /help, /quit.",
                         0, 0, tables, NULL};
    int pos, rc = cli_parse(&cmd, argc, argv, &pos);
    if (rc != CLI_PARSED) return rc;
    chat_state c;
    memset(&c, 0, sizeof c);
    c.a = &a;
    c.think = a.think;
    c.tty = isatty(STDIN_FILENO);
    c.pending = -1;
    if ((rc = cli_session_open(&c.s, "chat", &a, 1, 0, 1))) goto done;
    const char end[] = "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>";
    if (dsv4_tokenizer_token_id(c.s.tok, end, strlen(end), &c.end_id) != DSV4_OK) c.end_id = (int32_t)c.s.cfg->eos_token_ids[0];
    if (dsv4_engine_seq_create(c.s.engine, &c.seq) != DSV4_OK || !(c.out = malloc((size_t)a.max_tokens * sizeof *c.out))) {
        fprintf(stderr, "dsv4 chat: %s\n", c.out ? dsv4_last_error() : "out of memory");
        rc = 1;
        goto done;
    }
    fprintf(stderr, "dsv4 chat: %s, seed %llu%s. %s", a.model, (unsigned long long)c.s.seed,
            a.seed >= 0 ? "" : " (random)", HELP);
    for (char *l; (l = read_line(&c));) {
        int quit = 0;
        if (l[0] == '/') quit = command(&c, l);
        else if (l[0]) turn(&c, l);
        free(l);
        if (quit) break;
    }
done:
    free(c.out);
    cli_session_close(&c.s);
    return rc;
}
