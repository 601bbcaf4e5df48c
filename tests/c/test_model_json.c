/* The strict JSON reader and the safetensors header checks on in-memory inputs: every hostile
 * input gives DSV4_ERR_FORMAT with a message naming the file (and the tensor where there is
 * one), never a crash. */
#include "dsv4.h"
#include "core/json.h"
#include "model/safetensors.h"
#include "test_util.h"

static void test_json_valid(void)
{
    const char *text = " {\"a\": [1, -2.5e1, 0, -0, true, false, null, \"x\\u00e9\\ud83d\\ude00\\n\\\"\"],"
                       " \"big\": 9223372036854775807, \"neg\": -9223372036854775808, \"over\": 9223372036854775808,"
                       " \"nested\": {\"k\": {}}, \"e\": []} \n";
    mj_doc d;
    CHECK_STATUS(mj_parse(text, strlen(text), "t", &d), DSV4_OK);
    if (!d.nodes) return;
    CHECK(d.nodes[0].type == MJ_OBJECT && d.nodes[0].count == 6, "root object of 6 members");
    uint32_t a = mj_get(&d, 0, "a");
    CHECK(a != MJ_NONE && d.nodes[a].type == MJ_ARRAY && d.nodes[a].count == 8, "array of 8");
    uint32_t i = a + 1;
    CHECK(d.nodes[i].is_int && d.nodes[i].v.i == 1, "1");
    i = d.nodes[i].end;
    CHECK(!d.nodes[i].is_int && d.nodes[i].v.d == -25.0, "-2.5e1");
    i = d.nodes[i].end;
    CHECK(d.nodes[i].is_int && d.nodes[i].v.i == 0, "0");
    for (int k = 0; k < 5; k++) i = d.nodes[i].end;
    CHECK(d.nodes[i].type == MJ_STRING, "string");
    const char *want = "x\xc3\xa9\xf0\x9f\x98\x80\n\"";
    CHECK(d.nodes[i].count == strlen(want) && !memcmp(mj_str(&d, i), want, strlen(want)), "escapes and surrogates decoded");
    uint32_t b = mj_get(&d, 0, "big"), n = mj_get(&d, 0, "neg"), o = mj_get(&d, 0, "over");
    CHECK(d.nodes[b].is_int && d.nodes[b].v.i == INT64_MAX, "int64 max exact");
    CHECK(d.nodes[n].is_int && d.nodes[n].v.i == INT64_MIN, "int64 min exact");
    CHECK(!d.nodes[o].is_int && mj_num(&d, o) == 9223372036854775808.0, "beyond int64 becomes a double");
    uint32_t ne = mj_get(&d, 0, "nested");
    CHECK(mj_get(&d, ne, "k") != MJ_NONE && mj_get(&d, ne, "missing") == MJ_NONE, "nested lookup");
    CHECK(d.nodes[ne].end == mj_get(&d, 0, "e") - 1, "subtree end skips to the next key");
    mj_free(&d);
}

static void test_json_invalid(void)
{
    static const char *const bad[] = {
        "", " ", "{", "}", "{\"a\":1,}", "[1,]", "[,1]", "{'a':1}", "{\"a\" 1}", "{\"a\":}", "{1:2}", "01", "-01",
        "1.", ".5", "-", "1e", "1e+", "+1", "0x10", "\"abc", "\"\x01\"", "\"\\x\"", "\"\\u12\"", "\"\\u12g4\"",
        "\"\\ud800\"", "\"\\ud800\\u0041\"", "\"\\udc00\"", "\"\xff\"", "\"\xc0\xaf\"", "\"\xe0\x80\xaf\"",
        "\"\xed\xa0\x80\"", "\"\xf4\x90\x80\x80\"", "\"\xc3\"", "{\"a\":1,\"a\":2}", "[1] x", "[1][2]", "NaN",
        "Infinity", "-Infinity", "1e999", "-1e400", "tru", "nul", "falsey", "\xef\xbb\xbf{}", "/* c */ {}", "[1 2]",
        "{\"a\":1 \"b\":2}", "\"a\nb\"",
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        mj_doc d;
        dsv4_clear_error();
        dsv4_status st = mj_parse(bad[k], strlen(bad[k]), "bad.json", &d);
        CHECK(st == DSV4_ERR_FORMAT, "invalid JSON #%zu accepted (status %d)", k, (int)st);
        CHECK(strstr(dsv4_last_error(), "bad.json") != NULL, "#%zu: message does not name the input: %s", k, dsv4_last_error());
        if (st == DSV4_OK) mj_free(&d);
    }
    /* duplicate keys in a large object are found too (sorted check) */
    char big[8192];
    size_t o = (size_t)snprintf(big, sizeof big, "{");
    for (int k = 0; k < 300; k++) o += (size_t)snprintf(big + o, sizeof big - o, "\"k%d\":%d,", k % 299, k);
    big[o - 1] = '}';
    mj_doc d;
    CHECK_STATUS(mj_parse(big, o, "dups", &d), DSV4_ERR_FORMAT);
    CHECK(strstr(dsv4_last_error(), "duplicate key \"k0\"") != NULL, "duplicate named: %s", dsv4_last_error());
    /* nesting: 64 levels parse, 65 do not */
    char deep[200];
    for (int depth = 64; depth <= 65; depth++) {
        memset(deep, '[', (size_t)depth);
        memset(deep + depth, ']', (size_t)depth);
        dsv4_status st = mj_parse(deep, 2 * (size_t)depth, "deep", &d);
        CHECK(st == (depth <= 64 ? DSV4_OK : DSV4_ERR_FORMAT), "depth %d: status %d", depth, (int)st);
        if (st == DSV4_OK) mj_free(&d);
    }
    /* the message gives line and column */
    CHECK_STATUS(mj_parse("{\n  \"a\": tru\n}", 13, "pos.json", &d), DSV4_ERR_FORMAT);
    CHECK(strstr(dsv4_last_error(), "line 2, column 8") != NULL, "position: %s", dsv4_last_error());
}

/* ---- safetensors headers -------------------------------------------------------------------- */

/* A file image: 8-byte length, the header text, then `data` zero bytes. */
static uint8_t *image(const char *header, size_t data, uint64_t *size)
{
    size_t h = strlen(header);
    uint8_t *f = calloc(8 + h + data + 1, 1);
    for (int k = 0; k < 8; k++) f[k] = (uint8_t)((uint64_t)h >> (8 * k));
    memcpy(f + 8, header, h);
    *size = 8 + h + data;
    return f;
}

static dsv4_status parse_image(const uint8_t *f, uint64_t size, int64_t *n)
{
    st_tensor *t = NULL;
    char *arena = NULL;
    uint64_t ds = 0;
    dsv4_status st = st_parse(f, size, "shard.safetensors", 0, &t, n, &arena, &ds);
    free(t);
    free(arena);
    return st;
}

static void expect_bad(const char *header, size_t data, const char *needle)
{
    uint64_t size;
    uint8_t *f = image(header, data, &size);
    int64_t n;
    dsv4_clear_error();
    dsv4_status st = parse_image(f, size, &n);
    CHECK(st == DSV4_ERR_FORMAT, "accepted (%d): %s", (int)st, header);
    CHECK(strstr(dsv4_last_error(), "shard.safetensors") && strstr(dsv4_last_error(), needle),
          "message for %s lacks '%s': %s", header, needle, dsv4_last_error());
    free(f);
}

static void test_safetensors_headers(void)
{
    uint64_t size;
    int64_t n = -1;
    const char *good = "{\"__metadata__\":{\"format\":\"pt\"},\"b\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[16,28]},"
                       "\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                       "\"e\":{\"dtype\":\"I64\",\"shape\":[0,5],\"data_offsets\":[28,28]},"
                       "\"s\":{\"dtype\":\"F8_E8M0\",\"shape\":[],\"data_offsets\":[28,29]}}   ";
    uint8_t *f = image(good, 29, &size);
    st_tensor *t = NULL;
    char *arena = NULL;
    uint64_t ds = 0;
    CHECK_STATUS(st_parse(f, size, "shard.safetensors", 3, &t, &n, &arena, &ds), DSV4_OK);
    CHECK(n == 4 && t && !strcmp(t[0].name, "a") && !strcmp(t[1].name, "b") && t[3].ndim == 0 && t[0].file == 3,
          "tensors sorted by offset");
    CHECK(ds == 8 + strlen(good), "data start %llu", (unsigned long long)ds);
    free(t);
    free(arena);
    free(f);

    /* lengths and framing */
    uint8_t tiny[7] = {0};
    CHECK_STATUS(parse_image(tiny, 7, &n), DSV4_ERR_FORMAT);
    CHECK(strstr(dsv4_last_error(), "too short") != NULL, "%s", dsv4_last_error());
    f = image("{}", 0, &size);
    f[0] = 200; /* header length beyond the file */
    CHECK_STATUS(parse_image(f, size, &n), DSV4_ERR_FORMAT);
    CHECK(strstr(dsv4_last_error(), "runs past the end") != NULL, "%s", dsv4_last_error());
    memset(f, 0xFF, 8); /* a length near 2^64 must not wrap */
    CHECK_STATUS(parse_image(f, size, &n), DSV4_ERR_FORMAT);
    free(f);
    f = image("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16, &size);
    CHECK_STATUS(parse_image(f, size - 1, &n), DSV4_ERR_FORMAT); /* truncated data */
    CHECK(strstr(dsv4_last_error(), "'a'") && strstr(dsv4_last_error(), "truncated"), "%s", dsv4_last_error());
    free(f);
    static const struct {
        const char *header;
        size_t data;
        const char *needle;
    } bad[] = {
        {"[]", 0, "begin with '{'"},
        {" {}", 0, "begin with '{'"},
        {"{\"a\":1", 0, "invalid JSON"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 20, "4 bytes at the end"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[4,20]}}", 20, "before tensor 'a'"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16, "overlap"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,32]}}", 16, "outside"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,0]}}", 16, "outside"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,12]}}", 12, "needs 16 bytes"},
        {"{\"a\":{\"dtype\":\"F33\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16, "unknown dtype"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-4],\"data_offsets\":[0,16]}}", 16, "non-negative"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4.0],\"data_offsets\":[0,16]}}", 16, "non-negative"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "6 dims"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,-16]}}", 16, "non-negative"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0]}}", 16, "[begin, end]"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4]}}", 16, "needs \"dtype\""},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16],\"x\":1}}", 16, "unknown field"},
        {"{\"a\":[1]}", 0, "expected an object"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2199023255553],\"data_offsets\":[0,16]}}", 16, "too large"},
        {"{\"a\":{\"dtype\":\"F64\",\"shape\":[1099511627776,1099511627776],\"data_offsets\":[0,16]}}", 16, "too many elements"},
        {"{\"a\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,1]}}", 1, "whole number of bytes"},
        {"{\"la\xffyer\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16, "la\\xff"},
        {"{\"\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16, "empty name"},
        {"{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16, "U+0000"},
        {"{\"__metadata__\":{\"format\":1}}", 0, "__metadata__"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,32]}}", 32, "duplicate key"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) expect_bad(bad[k].header, bad[k].data, bad[k].needle);
}

static void test_names(void)
{
    static const char *const pairs[][2] = {
        {"model.embed_tokens.weight", "embed.weight"},
        {"lm_head.weight", "head.weight"},
        {"head.weight", "head.weight"},
        {"model.hc_head.hc_fn", "hc_head_fn"},
        {"model.layers.12.attn.norm.weight", "layers.12.attn.kv_norm.weight"},
        {"model.layers.2.attn.compressor.norm.weight", "layers.2.attn.compressor.norm.weight"},
        {"model.mtp.0.hc_head.hc_scale", "mtp.0.hc_head_scale"},
        {"layers.0.attn.wq_a.scale", "layers.0.attn.wq_a.scale"},
        {"layers.x.attn.norm.weight", "layers.x.attn.norm.weight"},
    };
    for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
        char out[128];
        st_canonical_name(pairs[k][0], out);
        CHECK(!strcmp(out, pairs[k][1]), "%s -> %s, expected %s", pairs[k][0], out, pairs[k][1]);
        if (strcmp(pairs[k][0], "lm_head.weight") && strcmp(pairs[k][1], "layers.x.attn.norm.weight")) {
            char back[160], again[160];
            st_layout_name(out, pairs[k][0][0] == 'm' ? DSV4_LAYOUT_HF : DSV4_LAYOUT_OFFICIAL, back, sizeof back);
            st_canonical_name(back, again);
            CHECK(!strcmp(again, out), "layout name %s of %s does not map back", back, out);
        }
    }
}

int main(void)
{
    test_json_valid();
    test_json_invalid();
    test_safetensors_headers();
    test_names();
    TEST_DONE();
}
