/* dsv4 tokenize: text -> ids (and back) with a tokenizer.json. */
#include "dsv4.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: dsv4 tokenize [options] TEXT|-        text (or stdin) -> tokens\n"
               "       dsv4 tokenize [options] --decode ID...|-  ids (or stdin) -> text, decoded as a stream\n\n"
               "options:\n"
               "  --tokenizer PATH  tokenizer.json, or a folder holding one (default: $DSV4_TOKENIZER, else ./tokenizer.json)\n"
               "  --ids             print only the ids, on one line\n"
               "  --no-special      read special tokens in TEXT as plain text\n"
               "  --chat, --think   TEXT is a user message: print the DeepSeek-V4 prompt (chat / thinking mode)\n"
               "  --system TEXT     with --chat/--think: a system message first\n");
}

/* All of stdin, NUL-terminated. */
static char *read_stdin(size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - 1 - n, stdin);
        if (n < cap - 1) break;
        char *b = realloc(buf, cap *= 2);
        if (!b) free(buf);
        buf = b;
    }
    if (!buf || ferror(stdin)) {
        fprintf(stderr, "dsv4 tokenize: cannot read stdin\n");
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

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
    char *end;
    errno = 0;
    long v = strtol(word, &end, 10);
    if (*end || errno || v < INT32_MIN || v > INT32_MAX) {
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
        in = read_stdin(&len);
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
    const char *path = getenv("DSV4_TOKENIZER"), *system = NULL, *text = NULL;
    int ids_only = 0, no_special = 0, mode = -1, decode = 0, rest = argc;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--tokenizer") && i + 1 < argc) path = argv[++i];
        else if (!strcmp(a, "--system") && i + 1 < argc) system = argv[++i];
        else if (!strcmp(a, "--ids")) ids_only = 1;
        else if (!strcmp(a, "--no-special")) no_special = 1;
        else if (!strcmp(a, "--chat")) mode = DSV4_PROMPT_CHAT;
        else if (!strcmp(a, "--think")) mode = DSV4_PROMPT_THINKING;
        else if (!strcmp(a, "--decode")) {
            decode = 1;
            rest = i + 1;
            break;
        } else if (!text && (a[0] != '-' || !a[1])) text = a;
        else {
            fprintf(stderr, "dsv4 tokenize: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (decode ? rest >= argc : !text) {
        usage(stderr);
        return 2;
    }
    char file[4096];
    struct stat sb;
    if (!path) path = "tokenizer.json";
    if (!stat(path, &sb) && S_ISDIR(sb.st_mode)) {
        snprintf(file, sizeof file, "%s/tokenizer.json", path);
        path = file;
    }
    dsv4_tokenizer *tok = NULL;
    if (dsv4_tokenizer_load(path, &tok)) return fail("load");
    if (decode) {
        int rc = decode_ids(tok, argc - rest, argv + rest);
        dsv4_tokenizer_free(tok);
        return rc;
    }

    size_t len = strlen(text);
    char *owned = NULL;
    if (!strcmp(text, "-")) {
        owned = read_stdin(&len);
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
    int rc = 0;
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
