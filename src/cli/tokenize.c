/* dsv4 tokenize: text -> ids (and back) with a tokenizer.json. */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bytes as a quoted string: UTF-8 text as it is, control and ill-formed bytes escaped. */
static void print_quoted(const unsigned char *s, size_t n)
{
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = s[i];
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c == '\n') fputs("\\n", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c == '\r') fputs("\\r", stdout);
        else if (c < 0x20 || c == 0x7F) printf("\\x%02X", c);
        else if (c < 0x80) putchar(c);
        else {
            size_t k = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0, j = 1;
            while (k && j < k && i + j < n && (s[i + j] & 0xC0) == 0x80) j++;
            if (k && j == k) {
                fwrite(s + i, 1, k, stdout);
                i += k - 1;
            } else {
                printf("\\x%02X", c);
            }
        }
    }
    putchar('"');
}

static int fail(const char *what)
{
    fprintf(stderr, "dsv4 tokenize: %s: %s\n", what, dsv4_last_error());
    return 1;
}

static int decode_word(dsv4_tokenizer *tok, dsv4_decode_stream *st, const char *word, char *out, size_t cap)
{
    long long v;
    if (!cli_parse_int(word, INT32_MIN, INT32_MAX, &v)) {
        fprintf(stderr, "dsv4 tokenize: '%s' is not an id\n", word);
        return 2;
    }
    size_t len;
    if (dsv4_decode_stream_step(tok, st, (int32_t)v, out, cap, &len)) return fail("decode");
    fwrite(out, 1, len, stdout);
    fflush(stdout);
    return 0;
}

/* Ids from the arguments, or from stdin ("-": separated by spaces, commas, brackets). */
static int decode_ids(dsv4_tokenizer *tok, int n, char **args)
{
    dsv4_decode_stream st;
    dsv4_decode_stream_init(&st, 0);
    size_t cap = dsv4_tokenizer_max_token_bytes(tok) + 3, len;
    char *out = malloc(cap), *in = NULL;
    int rc = out ? 0 : 1;
    if (rc == 0 && n == 1 && !strcmp(args[0], "-")) {
        in = cli_read_file("tokenize", "-", &len);
        char *save = NULL;
        rc = in ? 0 : 1;
        for (char *w = in ? strtok_r(in, " \t\r\n,[]", &save) : NULL; w && !rc; w = strtok_r(NULL, " \t\r\n,[]", &save))
            rc = decode_word(tok, &st, w, out, cap);
    } else {
        for (int i = 0; i < n && !rc; i++) rc = decode_word(tok, &st, args[i], out, cap);
    }
    if (rc == 0 && !dsv4_decode_stream_flush(&st, out, cap, &len)) fwrite(out, 1, len, stdout);
    if (rc == 0) putchar('\n');
    free(out);
    free(in);
    return rc;
}

int dsv4_cmd_tokenize(int argc, char **argv)
{
    const char *path = NULL, *system = NULL;
    int ids_only = 0, no_special = 0, chat = 0, think = 0, decode = 0;
    const cli_opt own[] = {
        {"tokenizer", 0, CLI_STR, &path, 0, 0, "PATH", "tokenizer.json or its folder (default: $DSV4_TOKENIZER, else ./tokenizer.json)"},
        {"ids", 0, CLI_FLAG, &ids_only, 0, 0, NULL, "print only the ids, on one line"},
        {"no-special", 0, CLI_FLAG, &no_special, 0, 0, NULL, "read special tokens in TEXT as plain text"},
        {"chat", 0, CLI_FLAG, &chat, 0, 0, NULL, "TEXT is a user message: print the DeepSeek-V4 chat prompt"},
        {"think", 0, CLI_FLAG, &think, 0, 0, NULL, "the same in thinking mode"},
        {"system", 0, CLI_STR, &system, 0, 0, "TEXT", "with --chat/--think: a system message first"},
        {"decode", 0, CLI_FLAG, &decode, 0, 0, NULL, "the arguments are ids (or - : ids on stdin): print their text"},
        {0}};
    const cli_opt *tables[] = {own, NULL};
    const cli_cmd cmd = {"tokenize", "[options] TEXT|-   |   dsv4 tokenize [options] --decode ID...|-",
                         "Text (or standard input) -> tokens: id, token and its bytes on each line; or ids -> text,\n"
                         "decoded as a stream.",
                         1, -1, tables, NULL};
    int pos, rc = cli_parse(&cmd, argc, argv, &pos);
    if (rc != CLI_PARSED) return rc;
    rc = 0;
    int mode = think ? DSV4_PROMPT_THINKING : chat ? DSV4_PROMPT_CHAT : -1;
    if (!decode && argc - pos != 1) {
        fprintf(stderr, "dsv4 tokenize: one TEXT (or -) to encode; %d given (dsv4 tokenize --help)\n", argc - pos);
        return 2;
    }
    const char *text = argv[pos];
    dsv4_tokenizer *tok = NULL;
    if (cli_tokenizer_load("tokenize", path, NULL, 1, &tok)) return 1;
    if (decode) {
        rc = decode_ids(tok, argc - pos, argv + pos);
        dsv4_tokenizer_free(tok);
        return rc;
    }

    size_t len = strlen(text);
    char *owned = NULL;
    if (!strcmp(text, "-")) {
        owned = cli_read_file("tokenize", "-", &len);
        if (!owned) {
            dsv4_tokenizer_free(tok);
            return 1;
        }
        text = owned;
    }
    size_t cap = dsv4_tokenizer_max_ids(tok, len) + 64, n = 0;
    int32_t *ids = NULL;
    dsv4_status s;
    if (mode >= 0) {
        dsv4_chat_message msgs[2] = {{.role = DSV4_ROLE_SYSTEM, .content = system, .content_len = system ? strlen(system) : 0},
                                     {.role = DSV4_ROLE_USER, .content = text, .content_len = len}};
        dsv4_prompt_options opt = {(dsv4_prompt_mode)mode, 0};
        const dsv4_chat_message *m = system ? msgs : msgs + 1;
        size_t nm = system ? 2 : 1;
        s = dsv4_prompt_encode(tok, m, nm, &opt, NULL, 0, &cap);
        if (!s && (ids = malloc((cap ? cap : 1) * sizeof *ids))) s = dsv4_prompt_encode(tok, m, nm, &opt, ids, cap, &n);
    } else {
        ids = malloc(cap * sizeof *ids);
        s = ids ? dsv4_tokenizer_encode(tok, text, len, no_special ? DSV4_TOKENIZE_SPECIAL_AS_TEXT : 0, ids, cap, &n)
                : DSV4_ERR_NO_MEMORY;
    }
    if (s || !ids) {
        rc = ids ? fail("encode") : (fprintf(stderr, "dsv4 tokenize: out of memory\n"), 1);
    } else if (ids_only) {
        for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
        putchar('\n');
    } else {
        char *bytes = malloc(dsv4_tokenizer_max_token_bytes(tok) + 1);
        for (size_t i = 0; i < n && bytes; i++) {
            const char *t;
            size_t tl, bl;
            dsv4_tokenizer_token_text(tok, ids[i], &t, &tl);
            dsv4_tokenizer_decode(tok, &ids[i], 1, 0, bytes, dsv4_tokenizer_max_token_bytes(tok), &bl);
            printf("%d\t%s\t", ids[i], t);
            print_quoted((const unsigned char *)bytes, bl);
            putchar('\n');
        }
        free(bytes);
        fprintf(stderr, "%zu tokens, %zu bytes\n", n, len);
    }
    free(ids);
    free(owned);
    dsv4_tokenizer_free(tok);
    return rc;
}
