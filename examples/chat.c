/* A two-turn chat with libdsv4: load a checkpoint, render each user turn in DeepSeek-V4's prompt
 * format, generate the reply, and continue the same sequence with the next turn (its caches keep
 * the conversation; only the new tokens run).
 *
 *   chat MODEL_DIR [TOKENIZER_JSON]
 *
 * The tokenizer defaults to MODEL_DIR/tokenizer.json. Without one the turns are token ids (a
 * checkpoint written with random weights has no text to speak of). Build it against an installed
 * libdsv4:  cc chat.c $(pkg-config --cflags --libs dsv4)  or with CMake (examples/CMakeLists.txt). */
#include <dsv4.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_IDS 4096
#define REPLY_TOKENS 16

static int fail(const char *what)
{
    fprintf(stderr, "chat: %s: %s\n", what, dsv4_last_error());
    return 1;
}

/* Append `n` ids of `prompt` to the sequence and generate up to REPLY_TOKENS (greedy, stop at the
 * end of the turn). Options not named take their defaults. */
static int reply(dsv4_engine *e, int seq, const int32_t *prompt, int64_t n, int32_t *out, int64_t *n_out)
{
    dsv4_generate_options go = {.max_tokens = REPLY_TOKENS, .stop_at_eos = 1};
    return dsv4_engine_generate(e, seq, prompt, n, &go, out, REPLY_TOKENS, n_out, NULL) == DSV4_OK ? 0 : fail("generate");
}

/* With a tokenizer: the whole conversation rendered, and only what the sequence does not hold yet
 * run (the sequence is cut back to the longest prefix the rendering shares with it, exactly). */
static int chat_text(dsv4_engine *e, int seq, dsv4_tokenizer *tok)
{
    static const char *const turns[] = {"Hello! Who are you?", "Say that again, shorter."};
    dsv4_chat_message msgs[4];
    char replies[2][1024];
    int32_t *ids = malloc(MAX_IDS * sizeof *ids), *held = malloc(MAX_IDS * sizeof *held), out[REPLY_TOKENS];
    if (!ids || !held) return 1;
    int rc = 0;
    size_t n_msgs = 0;
    for (int t = 0; t < 2 && !rc; t++) {
        msgs[n_msgs++] = (dsv4_chat_message){.role = DSV4_ROLE_USER, .content = turns[t], .content_len = strlen(turns[t])};
        size_t n_ids = 0;
        int64_t n_held = 0, n_out = 0;
        if (dsv4_prompt_encode(tok, msgs, n_msgs, NULL, ids, MAX_IDS, &n_ids) != DSV4_OK) {
            rc = fail("prompt_encode");
            break;
        }
        if (dsv4_engine_seq_tokens(e, seq, held, MAX_IDS, &n_held) != DSV4_OK) {
            rc = fail("seq_tokens");
            break;
        }
        int64_t k = 0;
        while (k < n_held && k < (int64_t)n_ids - 1 && held[k] == ids[k]) k++;
        if (k < n_held && dsv4_engine_seq_truncate(e, seq, k, NULL) != DSV4_OK) {
            rc = fail("seq_truncate");
            break;
        }
        if ((rc = reply(e, seq, ids + k, (int64_t)n_ids - k, out, &n_out))) break;
        size_t len = 0;
        if (dsv4_tokenizer_decode(tok, out, (size_t)n_out, DSV4_DECODE_SKIP_SPECIAL, replies[t], sizeof replies[t] - 1,
                                  &len) != DSV4_OK) {
            rc = fail("decode");
            break;
        }
        /* its exact bytes (random weights can stop inside a UTF-8 character) */
        printf("user: %s\nassistant: ", turns[t]);
        fwrite(replies[t], 1, len, stdout);
        printf("\n");
        msgs[n_msgs++] = (dsv4_chat_message){.role = DSV4_ROLE_ASSISTANT, .content = replies[t], .content_len = len};
    }
    free(ids);
    free(held);
    return rc;
}

/* Without one: each turn is a few ids; the second starts with the last token of the first reply
 * (a generation returns it without feeding it to the caches). */
static int chat_ids(dsv4_engine *e, int seq)
{
    const int32_t vocab = (int32_t)dsv4_engine_config(e)->vocab_size;
    int32_t prompt[8], out[REPLY_TOKENS];
    int64_t n_out = 0, n = 0;
    for (int t = 0; t < 2; t++) {
        n = 0;
        if (t) prompt[n++] = out[n_out - 1];
        for (int i = 0; i < 4; i++) prompt[n++] = (int32_t)((17 * t + 5 * i + 3) % vocab);
        if (reply(e, seq, prompt, n, out, &n_out)) return 1;
        printf("turn %d: %lld ids in, reply:", t + 1, (long long)n);
        for (int64_t i = 0; i < n_out; i++) printf(" %d", out[i]);
        printf("\n");
        if (n_out == 0) return 0;
    }
    printf("sequence holds %lld tokens\n", (long long)dsv4_engine_seq_length(e, seq));
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: chat MODEL_DIR [TOKENIZER_JSON]   (libdsv4 %s)\n", dsv4_version());
        return 2;
    }
    char tok_path[4096];
    snprintf(tok_path, sizeof tok_path, "%s", argc == 3 ? argv[2] : "");
    if (argc == 2) {
        snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", argv[1]);
        FILE *f = fopen(tok_path, "rb");
        if (f) fclose(f);
        else tok_path[0] = '\0';
    }
    dsv4_engine *e = NULL;
    dsv4_tokenizer *tok = NULL;
    /* NULL context and options: the default backend ($DSV4_BACKEND, else cpu) and every default */
    if (dsv4_engine_create(NULL, argv[1], NULL, &e) != DSV4_OK) return fail("engine_create");
    int seq = -1, rc = 0;
    if (dsv4_engine_seq_create(e, &seq) != DSV4_OK) rc = fail("seq_create");
    else if (tok_path[0] && dsv4_tokenizer_load(tok_path, &tok) != DSV4_OK) rc = fail("tokenizer_load");
    else rc = tok ? chat_text(e, seq, tok) : chat_ids(e, seq);
    dsv4_tokenizer_free(tok);
    dsv4_engine_destroy(e);
    return rc;
}
