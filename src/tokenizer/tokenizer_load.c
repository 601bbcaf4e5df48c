/* Loading tokenizer.json: every section is checked against what the encoder implements; what it
 * does not implement is rejected with DSV4_ERR_UNSUPPORTED and the reason. */
#include "core/error.h"
#include "core/file.h"
#include "core/json.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/utf8.h"

#include <stdlib.h>
#include <string.h>

#define WHAT "tokenizer.json"
enum { TOK_MAX_IDS = 1 << 24, TOK_MAX_STEPS = 64 };
#define TOK_MAX_FILE ((size_t)1 << 31) /* the JSON reader's own limit */

/* ---- byte-level alphabet (GPT-2 bytes_to_unicode): the printable Latin-1 bytes 33-126,
 * 161-172 and 174-255 stand for themselves; the other 68 (0-32, 127-160, 173) take U+0100 ..
 * U+0143 in byte order ---- */
uint32_t tok_byte_char(int b)
{
    if (b <= 32) return 256u + (uint32_t)b;
    if (b >= 127 && b <= 160) return 256u + 33u + (uint32_t)(b - 127);
    if (b == 173) return 256u + 67u;
    return (uint32_t)b;
}

int tok_char_byte(uint32_t cp)
{
    if (cp < 256) return (cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || cp >= 174 ? (int)cp : -1;
    if (cp >= 256 + 68) return -1;
    int k = (int)cp - 256;
    return k < 33 ? k : k < 67 ? 127 + (k - 33) : 173;
}

uint64_t tok_hash(const uint8_t *s, size_t n)
{
    uint64_t h = 0x243F6A8885A308D3ull ^ (n * 0x9E3779B97F4A7C15ull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    h = (h ^ w) * 0x94D049BB133111EBull;
    return h ^ (h >> 29);
}

/* ---- small helpers ---- */
static dsv4_status oom(void) { return dsv4_fail(DSV4_ERR_NO_MEMORY, WHAT ": out of memory"); }

/* The document is a tape (core/json.h): a value is its node index, MJ_NONE when absent. */
static mj_type type_at(const mj_doc *d, uint32_t v) { return (mj_type)d->nodes[v].type; }
static int absent_or_null(const mj_doc *d, uint32_t v) { return v == MJ_NONE || type_at(d, v) == MJ_NULL; }
static int is_type(const mj_doc *d, uint32_t v, mj_type t) { return v != MJ_NONE && type_at(d, v) == t; }
static uint32_t len_at(const mj_doc *d, uint32_t v) { return d->nodes[v].count; }
static uint32_t next_at(const mj_doc *d, uint32_t v) { return d->nodes[v].end; }

static dsv4_status want_type(const mj_doc *d, uint32_t v, mj_type t, const char *where)
{
    if (v == MJ_NONE) return dsv4_fail(DSV4_ERR_FORMAT, WHAT ": %s is missing", where);
    if (type_at(d, v) != t)
        return dsv4_fail(DSV4_ERR_FORMAT, WHAT ": %s is a %s, expected a %s", where, mj_type_name(type_at(d, v)), mj_type_name(t));
    return DSV4_OK;
}

/* Optional boolean member (absent or null: dflt). */
static dsv4_status get_bool(const mj_doc *d, uint32_t obj, const char *key, int dflt, int *out, const char *where)
{
    uint32_t v = mj_get(d, obj, key);
    if (absent_or_null(d, v)) *out = dflt;
    else if (type_at(d, v) == MJ_TRUE || type_at(d, v) == MJ_FALSE) *out = type_at(d, v) == MJ_TRUE;
    else return dsv4_fail(DSV4_ERR_FORMAT, WHAT ": %s.%s is a %s, expected true or false", where, key, mj_type_name(type_at(d, v)));
    return DSV4_OK;
}

static const char *type_of(const mj_doc *d, uint32_t v)
{
    uint32_t t = mj_get(d, v, "type");
    return is_type(d, t, MJ_STRING) ? mj_str(d, t) : "";
}

/* ---- token table ---- */
typedef struct {
    dsv4_tokenizer *tok;
    size_t text_used, text_cap;
} builder;

static dsv4_status strmap_init(tok_strmap *m, size_t entries)
{
    size_t cap = 16;
    while (cap < entries * 2) cap *= 2;
    m->slot = malloc(cap * sizeof *m->slot);
    if (!m->slot) return oom();
    memset(m->slot, 0xFF, cap * sizeof *m->slot);
    m->mask = cap - 1;
    return DSV4_OK;
}

int32_t tok_strmap_get(const dsv4_tokenizer *tok, const char *s, size_t n)
{
    const tok_strmap *m = &tok->by_text;
    for (uint64_t h = tok_hash((const uint8_t *)s, n) & m->mask;; h = (h + 1) & m->mask) {
        int32_t id = m->slot[h];
        if (id < 0) return -1;
        if (tok->text_len[id] == n && !memcmp(tok->text + tok->text_off[id], s, n)) return id;
    }
}

static void strmap_put(dsv4_tokenizer *tok, int32_t id)
{
    tok_strmap *m = &tok->by_text;
    uint64_t h = tok_hash((const uint8_t *)tok->text + tok->text_off[id], tok->text_len[id]) & m->mask;
    while (m->slot[h] >= 0) h = (h + 1) & m->mask;
    m->slot[h] = id;
}

/* Record id -> text; the same text under two ids, or an id given two texts, is an error. */
static dsv4_status add_token(builder *b, int32_t id, const char *str, uint32_t n, uint8_t flags, const char *where)
{
    dsv4_tokenizer *tok = b->tok;
    int32_t other = tok_strmap_get(tok, str, n);
    if (tok->flags[id] & TOK_PRESENT) {
        if (other == id) {
            tok->flags[id] |= flags;
            return DSV4_OK;
        }
        return dsv4_fail(DSV4_ERR_FORMAT, WHAT ": %s: id %d is given to two different tokens", where, (int)id);
    }
    if (other >= 0)
        return dsv4_fail(DSV4_ERR_FORMAT, WHAT ": %s: token \"%s\" has two ids (%d and %d)", where, str, (int)other, (int)id);
    if (b->text_cap - b->text_used < (size_t)n + 1) {
        size_t cap = b->text_cap * 2 + n + 1;
        char *t = realloc(tok->text, cap);
        if (!t) return oom();
        tok->text = t;
        b->text_cap = cap;
    }
    memcpy(tok->text + b->text_used, str, (size_t)n + 1);
    tok->text_off[id] = (uint32_t)b->text_used;
    tok->text_len[id] = n;
    b->text_used += (size_t)n + 1;
    if (b->text_used > UINT32_MAX) return dsv4_fail(DSV4_ERR_FORMAT, WHAT ": token strings too large");
    tok->flags[id] = TOK_PRESENT | flags;
    strmap_put(tok, id);
    return DSV4_OK;
}

static dsv4_status get_id(const mj_doc *d, uint32_t v, const char *where, int32_t *id)
{
    if (!is_type(d, v, MJ_NUMBER) || !d->nodes[v].is_int || d->nodes[v].v.i < 0 || d->nodes[v].v.i >= TOK_MAX_IDS)
        return dsv4_fail(DSV4_ERR_FORMAT, WHAT ": %s: id must be an integer in [0, %d)", where, TOK_MAX_IDS);
    *id = (int32_t)d->nodes[v].v.i;
    return DSV4_OK;
}

/* ---- added-token trie ---- */
static dsv4_status trie_node(tok_trie *t, uint8_t byte, uint32_t *out)
{
    if (t->n_nodes == t->cap) {
        uint32_t cap = t->cap ? t->cap * 2 : 256;
        int32_t *token = realloc(t->token, cap * sizeof *token);
        if (token) t->token = token;
        uint32_t *child = realloc(t->child, cap * sizeof *child);
        if (child) t->child = child;
        uint32_t *sibling = realloc(t->sibling, cap * sizeof *sibling);
        if (sibling) t->sibling = sibling;
        uint8_t *bytes = realloc(t->byte, cap);
        if (bytes) t->byte = bytes;
        if (!token || !child || !sibling || !bytes) return oom();
        t->cap = cap;
    }
    uint32_t n = t->n_nodes++;
    t->token[n] = -1;
    t->child[n] = t->sibling[n] = 0;
    t->byte[n] = byte;
    *out = n;
    return DSV4_OK;
}

static dsv4_status trie_insert(tok_trie *t, const uint8_t *s, size_t n, int32_t id)
{
    if (!t->n_nodes) {
        uint32_t root;
        DSV4_TRY(trie_node(t, 0, &root));
    }
    uint32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t next = 0;
        if (node == 0) {
            next = t->root[s[i]];
        } else {
            for (uint32_t c = t->child[node]; c; c = t->sibling[c])
                if (t->byte[c] == s[i]) {
                    next = c;
                    break;
                }
        }
        if (!next) {
            DSV4_TRY(trie_node(t, s[i], &next));
            if (node == 0) {
                t->root[s[i]] = next;
            } else {
                t->sibling[next] = t->child[node];
                t->child[node] = next;
            }
        }
        node = next;
    }
    t->token[node] = id;
    return DSV4_OK;
}

int32_t tok_trie_match(const tok_trie *t, const uint8_t *s, size_t n, size_t *len)
{
    int32_t best = -1;
    uint32_t node = t->n_nodes ? t->root[s[0]] : 0;
    for (size_t i = 1; node; i++) {
        if (t->token[node] >= 0) {
            best = t->token[node];
            *len = i;
        }
        if (i == n) break;
        uint32_t c = t->child[node];
        while (c && t->byte[c] != s[i]) c = t->sibling[c];
        node = c;
    }
    return best;
}

static void trie_free(tok_trie *t)
{
    free(t->token);
    free(t->child);
    free(t->sibling);
    free(t->byte);
}

/* ---- sections ---- */
static dsv4_status load_model(builder *b, const mj_doc *d, uint32_t model, uint32_t *merges_out)
{
    uint32_t v = mj_get(d, model, "dropout");
    if (!absent_or_null(d, v) && !(type_at(d, v) == MJ_NUMBER && mj_num(d, v) == 0.0))
        return dsv4_fail(DSV4_ERR_UNSUPPORTED, WHAT ": BPE dropout is not supported (encoding would be random)");
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        v = mj_get(d, model, affixes[i]);
        if (!absent_or_null(d, v) && !(type_at(d, v) == MJ_STRING && len_at(d, v) == 0))
            return dsv4_fail(DSV4_ERR_UNSUPPORTED, WHAT ": BPE %s is not supported", affixes[i]);
    }
    DSV4_TRY(get_bool(d, model, "ignore_merges", 0, &b->tok->ignore_merges, "model"));
    uint32_t vocab = mj_get(d, model, "vocab");
    DSV4_TRY(want_type(d, vocab, MJ_OBJECT, "model.vocab"));
    uint32_t merges = mj_get(d, model, "merges");
    DSV4_TRY(want_type(d, merges, MJ_ARRAY, "model.merges"));
    for (uint32_t i = 0, k = vocab + 1; i < len_at(d, vocab); i++, k = next_at(d, k + 1)) { /* key k, value k + 1 */
        int32_t id = 0;
        DSV4_TRY(get_id(d, k + 1, "model.vocab", &id));
        DSV4_TRY(add_token(b, id, mj_str(d, k), len_at(d, k), 0, "model.vocab"));
    }
    *merges_out = merges;
    return DSV4_OK;
}

/* Added tokens, in file order. tokenizers does not take their "id" from the file: a token already
 * in the vocabulary keeps its id, a new one gets the vocabulary's entry count, or one past the
 * largest added id once that reaches it. A file whose ids disagree with that is refused. */
static dsv4_status load_added(builder *b, const mj_doc *d, uint32_t added, int64_t model_count)
{
    if (absent_or_null(d, added)) return DSV4_OK;
    DSV4_TRY(want_type(d, added, MJ_ARRAY, "added_tokens"));
    int64_t max_added = -1;
    for (uint32_t i = 0, a = added + 1; i < len_at(d, added); i++, a = next_at(d, a)) {
        DSV4_TRY(want_type(d, a, MJ_OBJECT, "added_tokens[]"));
        uint32_t content = mj_get(d, a, "content");
        DSV4_TRY(want_type(d, content, MJ_STRING, "added_tokens[].content"));
        const char *text = mj_str(d, content);
        uint32_t n = len_at(d, content);
        if (!n) return dsv4_fail(DSV4_ERR_FORMAT, WHAT ": added token %u has empty content", i);
        int32_t id = 0;
        DSV4_TRY(get_id(d, mj_get(d, a, "id"), "added_tokens[]", &id));
        static const char *const unsupported[] = {"single_word", "lstrip", "rstrip"};
        for (int k = 0; k < 3; k++) {
            int on = 0;
            DSV4_TRY(get_bool(d, a, unsupported[k], 0, &on, "added_tokens[]"));
            if (on)
                return dsv4_fail(DSV4_ERR_UNSUPPORTED, WHAT ": added token \"%s\" has %s=true, which is not supported",
                                 text, unsupported[k]);
        }
        int special = 0, normalized = 0;
        DSV4_TRY(get_bool(d, a, "special", 0, &special, "added_tokens[]"));
        DSV4_TRY(get_bool(d, a, "normalized", !special, &normalized, "added_tokens[]"));
        int64_t want = tok_strmap_get(b->tok, text, n);
        if (want < 0) want = max_added < 0 ? model_count : max_added >= model_count ? max_added + 1 : model_count;
        if (id != want)
            return dsv4_fail(DSV4_ERR_FORMAT, WHAT ": added token \"%s\" has id %d, but tokenizers gives it id %lld", text,
                             (int)id, (long long)want);
        if (want > max_added) max_added = want;
        DSV4_TRY(add_token(b, id, text, n, (uint8_t)(TOK_ADDED | (special ? TOK_SPECIAL : 0)), "added_tokens"));
        DSV4_TRY(trie_insert(&b->tok->added[normalized ? 1 : 0], (const uint8_t *)text, n, id));
    }
    return DSV4_OK;
}

static dsv4_status load_merges(dsv4_tokenizer *tok, const mj_doc *d, uint32_t merges)
{
    tok_merges *m = &tok->merges;
    size_t cap = 16;
    int shift = 60;
    while (cap < (size_t)len_at(d, merges) * 2 + 2) {
        cap *= 2;
        shift--;
    }
    m->key = calloc(cap, sizeof *m->key);
    m->rank = malloc(cap * sizeof *m->rank);
    m->id = malloc(cap * sizeof *m->id);
    if (!m->key || !m->rank || !m->id) return oom();
    m->mask = cap - 1;
    m->shift = shift;
    char *joined = NULL;
    size_t joined_cap = 0;
    dsv4_status st = DSV4_OK;
    for (uint32_t r = 0, e = merges + 1; r < len_at(d, merges) && st == DSV4_OK; r++, e = next_at(d, e)) {
        const char *pa, *pb;
        size_t na, nb;
        if (type_at(d, e) == MJ_STRING) { /* "left right" */
            const char *str = mj_str(d, e);
            uint32_t n = len_at(d, e);
            const char *sp = memchr(str, ' ', n);
            if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - str))) {
                st = dsv4_fail(DSV4_ERR_FORMAT, WHAT ": merge %u (\"%s\") is not two tokens separated by one space", r, str);
                break;
            }
            pa = str;
            na = (size_t)(sp - str);
            pb = sp + 1;
            nb = n - na - 1;
        } else if (type_at(d, e) == MJ_ARRAY && len_at(d, e) == 2 && type_at(d, e + 1) == MJ_STRING &&
                   type_at(d, e + 2) == MJ_STRING) { /* ["left", "right"]: two strings, one node each */
            pa = mj_str(d, e + 1);
            na = len_at(d, e + 1);
            pb = mj_str(d, e + 2);
            nb = len_at(d, e + 2);
        } else {
            st = dsv4_fail(DSV4_ERR_FORMAT, WHAT ": merge %u is neither \"a b\" nor [\"a\", \"b\"]", r);
            break;
        }
        if (na + nb + 1 > joined_cap) {
            joined_cap = (na + nb + 1) * 2;
            char *j = realloc(joined, joined_cap);
            if (!j) {
                st = oom();
                break;
            }
            joined = j;
        }
        memcpy(joined, pa, na);
        memcpy(joined + na, pb, nb);
        int32_t a = tok_strmap_get(tok, pa, na), bb = tok_strmap_get(tok, pb, nb);
        int32_t ab = tok_strmap_get(tok, joined, na + nb);
        if (a < 0 || bb < 0 || ab < 0) {
            st = dsv4_fail(DSV4_ERR_FORMAT, WHAT ": merge %u (\"%.*s\" + \"%.*s\"): %s is not in the vocabulary", r, (int)na, pa,
                           (int)nb, pb, a < 0 ? "the left token" : bb < 0 ? "the right token" : "the merged token");
            break;
        }
        /* a pair listed twice keeps its last rank, as tokenizers' map does */
        uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)bb) + 1;
        uint64_t h = (key * 0x9E3779B97F4A7C15ull) >> m->shift;
        while (m->key[h] && m->key[h] != key) h = (h + 1) & m->mask;
        m->key[h] = key;
        m->rank[h] = r;
        m->id[h] = ab;
    }
    free(joined);
    return st;
}

static dsv4_status load_normalizer(const mj_doc *d, uint32_t v)
{
    if (absent_or_null(d, v)) return DSV4_OK;
    DSV4_TRY(want_type(d, v, MJ_OBJECT, "normalizer"));
    const char *type = type_of(d, v);
    if (!strcmp(type, "Sequence")) {
        uint32_t list = mj_get(d, v, "normalizers");
        DSV4_TRY(want_type(d, list, MJ_ARRAY, "normalizer.normalizers"));
        for (uint32_t i = 0, e = list + 1; i < len_at(d, list); i++, e = next_at(d, e)) DSV4_TRY(load_normalizer(d, e));
        return DSV4_OK;
    }
    return dsv4_fail(DSV4_ERR_UNSUPPORTED, WHAT ": normalizer '%s' is not supported (only an empty one)", type);
}

static dsv4_status add_step(dsv4_tokenizer *tok, tok_step **out)
{
    if (tok->n_steps == TOK_MAX_STEPS)
        return dsv4_fail(DSV4_ERR_UNSUPPORTED, WHAT ": more than %d pre-tokenizer steps", TOK_MAX_STEPS);
    tok_step *s = realloc(tok->steps, (size_t)(tok->n_steps + 1) * sizeof *s);
    if (!s) return oom();
    tok->steps = s;
    s += tok->n_steps++;
    memset(s, 0, sizeof *s);
    s->behavior = SPLIT_ISOLATED;
    *out = s;
    return DSV4_OK;
}

static dsv4_status compile_re(tok_step *s, const char *pat, size_t len, int literal)
{
    char *tr = NULL;
    if (!literal) DSV4_TRY(tok_regex_translate(pat, len, &tr, &len));
    int err;
    PCRE2_SIZE off;
    s->re = pcre2_compile((PCRE2_SPTR)(tr ? tr : pat), len, PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP), &err, &off,
                          NULL);
    free(tr);
    if (!s->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return dsv4_fail(DSV4_ERR_FORMAT, WHAT ": pre-tokenizer pattern does not compile (at offset %zu of its PCRE2 form): %s",
                         (size_t)off, (char *)msg);
    }
    pcre2_jit_compile(s->re, PCRE2_JIT_COMPLETE); /* the interpreter runs it where there is no JIT */
    s->md = pcre2_match_data_create_from_pattern(s->re, NULL);
    return s->md ? DSV4_OK : oom();
}

static const char gpt2_pattern[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static dsv4_status load_pretok(dsv4_tokenizer *tok, const mj_doc *d, uint32_t v, int *byte_level)
{
    DSV4_TRY(want_type(d, v, MJ_OBJECT, "pre_tokenizer"));
    const char *type = type_of(d, v);
    if (*byte_level) return dsv4_fail(DSV4_ERR_UNSUPPORTED, WHAT ": pre-tokenizer '%s' after ByteLevel is not supported", type);
    if (!strcmp(type, "Sequence")) {
        uint32_t list = mj_get(d, v, "pretokenizers");
        DSV4_TRY(want_type(d, list, MJ_ARRAY, "pre_tokenizer.pretokenizers"));
        for (uint32_t i = 0, e = list + 1; i < len_at(d, list); i++, e = next_at(d, e)) DSV4_TRY(load_pretok(tok, d, e, byte_level));
        return DSV4_OK;
    }
    if (!strcmp(type, "Split")) {
        uint32_t pat = mj_get(d, v, "pattern");
        DSV4_TRY(want_type(d, pat, MJ_OBJECT, "Split.pattern"));
        uint32_t re = mj_get(d, pat, "Regex"), lit = mj_get(d, pat, "String");
        if (is_type(d, re, MJ_STRING) == is_type(d, lit, MJ_STRING))
            return dsv4_fail(DSV4_ERR_FORMAT, WHAT ": Split.pattern must hold one string, Regex or String");
        static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
        uint32_t beh = mj_get(d, v, "behavior");
        int behavior = -1;
        for (int i = 0; i < 5; i++)
            if (mj_is(d, beh, names[i])) behavior = i;
        if (behavior < 0) return dsv4_fail(DSV4_ERR_UNSUPPORTED, WHAT ": Split.behavior is not one of the five known behaviours");
        tok_step *s = NULL;
        DSV4_TRY(add_step(tok, &s));
        s->behavior = behavior;
        DSV4_TRY(get_bool(d, v, "invert", 0, &s->invert, "Split"));
        uint32_t p = is_type(d, re, MJ_STRING) ? re : lit;
        return compile_re(s, mj_str(d, p), len_at(d, p), p == lit);
    }
    if (!strcmp(type, "ByteLevel")) {
        int use_regex = 1;
        tok_step *s = NULL;
        DSV4_TRY(add_step(tok, &s));
        DSV4_TRY(get_bool(d, v, "add_prefix_space", 1, &s->prefix_space, "ByteLevel"));
        DSV4_TRY(get_bool(d, v, "use_regex", 1, &use_regex, "ByteLevel"));
        *byte_level = 1;
        tok->prefix_space = s->prefix_space;
        return use_regex ? compile_re(s, gpt2_pattern, sizeof gpt2_pattern - 1, 0) : DSV4_OK;
    }
    return dsv4_fail(DSV4_ERR_UNSUPPORTED, WHAT ": pre-tokenizer '%s' is not supported (Sequence, Split, ByteLevel)", type);
}

static dsv4_status check_byte_level_only(const mj_doc *d, uint32_t v, const char *section, int allow_null)
{
    if (absent_or_null(d, v) && allow_null) return DSV4_OK;
    if (!is_type(d, v, MJ_OBJECT) || strcmp(type_of(d, v), "ByteLevel"))
        return dsv4_fail(DSV4_ERR_UNSUPPORTED, WHAT ": %s '%s' is not supported (only ByteLevel)", section,
                         is_type(d, v, MJ_OBJECT) ? type_of(d, v) : v != MJ_NONE ? mj_type_name(type_at(d, v)) : "missing");
    return DSV4_OK;
}

/* Decoded bytes of each token, as tokenizers' ByteLevel decoder gives them: the byte of every
 * character when all characters belong to the alphabet, else the token's own UTF-8. */
static dsv4_status build_bytes(dsv4_tokenizer *tok)
{
    size_t total = 0;
    for (int32_t id = 0; id < tok->n_ids; id++) total += tok->text_len[id];
    tok->bytes = malloc(total + 1);
    tok->bytes_off = calloc((size_t)tok->n_ids, sizeof *tok->bytes_off);
    tok->bytes_len = calloc((size_t)tok->n_ids, sizeof *tok->bytes_len);
    if (!tok->bytes || !tok->bytes_off || !tok->bytes_len) return oom();
    size_t used = 0;
    for (int32_t id = 0; id < tok->n_ids; id++) {
        const uint8_t *s = (const uint8_t *)tok->text + tok->text_off[id];
        size_t n = tok->text_len[id], k = 0, start = used;
        tok->bytes_off[id] = (uint32_t)used;
        if (!(tok->flags[id] & TOK_PRESENT)) continue;
        while (k < n) {
            int len = utf8_check(s + k, n - k);
            int b = len > 0 ? tok_char_byte(utf8_decode(s + k, len)) : -1;
            if (b < 0) break;
            tok->bytes[used++] = (uint8_t)b;
            k += (size_t)len;
        }
        if (k < n) { /* not all in the alphabet: the token's UTF-8 as it is */
            used = start;
            memcpy(tok->bytes + used, s, n);
            used += n;
        }
        tok->bytes_len[id] = (uint32_t)(used - start);
        if (used - start > tok->max_token_bytes) tok->max_token_bytes = used - start;
    }
    return DSV4_OK;
}

static dsv4_status build(dsv4_tokenizer *tok, const mj_doc *d)
{
    const uint32_t root = 0;
    DSV4_TRY(want_type(d, root, MJ_OBJECT, "the top level"));
    static const char *const absent[] = {"truncation", "padding"};
    for (int i = 0; i < 2; i++)
        if (!absent_or_null(d, mj_get(d, root, absent[i])))
            return dsv4_fail(DSV4_ERR_UNSUPPORTED, WHAT ": %s is not supported (must be null)", absent[i]);
    DSV4_TRY(load_normalizer(d, mj_get(d, root, "normalizer")));
    DSV4_TRY(check_byte_level_only(d, mj_get(d, root, "decoder"), "decoder", 0));
    DSV4_TRY(check_byte_level_only(d, mj_get(d, root, "post_processor"), "post-processor", 1));
    uint32_t model = mj_get(d, root, "model"), added = mj_get(d, root, "added_tokens");
    DSV4_TRY(want_type(d, model, MJ_OBJECT, "model"));
    const char *type = type_of(d, model);
    if (*type && strcmp(type, "BPE"))
        return dsv4_fail(DSV4_ERR_UNSUPPORTED, WHAT ": model type '%s' is not supported (only BPE)", type);
    uint32_t vocab = mj_get(d, model, "vocab");
    DSV4_TRY(want_type(d, vocab, MJ_OBJECT, "model.vocab"));

    /* size the id space first */
    int64_t max_id = -1;
    size_t entries = len_at(d, vocab);
    for (uint32_t i = 0, k = vocab + 1; i < len_at(d, vocab); i++, k = next_at(d, k + 1)) {
        int32_t id = 0;
        DSV4_TRY(get_id(d, k + 1, "model.vocab", &id));
        if (id > max_id) max_id = id;
    }
    if (is_type(d, added, MJ_ARRAY)) {
        entries += len_at(d, added);
        for (uint32_t i = 0, a = added + 1; i < len_at(d, added); i++, a = next_at(d, a)) {
            int32_t id = 0;
            DSV4_TRY(get_id(d, mj_get(d, a, "id"), "added_tokens[]", &id));
            if (id > max_id) max_id = id;
        }
    }
    if (max_id < 0) return dsv4_fail(DSV4_ERR_FORMAT, WHAT ": the vocabulary is empty");
    if ((size_t)max_id >= 2 * entries + 65536) /* real files number their tokens densely */
        return dsv4_fail(DSV4_ERR_FORMAT, WHAT ": ids up to %lld for %zu tokens are too sparse", (long long)max_id, entries);
    tok->n_ids = (int32_t)(max_id + 1);
    tok->flags = calloc((size_t)tok->n_ids, 1);
    tok->text_off = calloc((size_t)tok->n_ids, sizeof *tok->text_off);
    tok->text_len = calloc((size_t)tok->n_ids, sizeof *tok->text_len);
    if (!tok->flags || !tok->text_off || !tok->text_len) return oom();
    DSV4_TRY(strmap_init(&tok->by_text, entries));

    builder b = {tok, 0, 0};
    uint32_t merges = MJ_NONE;
    DSV4_TRY(load_model(&b, d, model, &merges));
    DSV4_TRY(load_added(&b, d, added, len_at(d, vocab)));
    DSV4_TRY(load_merges(tok, d, merges));
    for (int byte = 0; byte < 256; byte++) {
        uint8_t ch[4];
        size_t n = utf8_put(ch, tok_byte_char(byte));
        tok->byte_id[byte] = tok_strmap_get(tok, (const char *)ch, n);
        if (tok->byte_id[byte] < 0 || (tok->flags[tok->byte_id[byte]] & TOK_ADDED))
            return dsv4_fail(DSV4_ERR_UNSUPPORTED, WHAT ": not a byte-level vocabulary: no token for byte 0x%02X", byte);
    }

    uint32_t pre = mj_get(d, root, "pre_tokenizer");
    int byte_level = 0;
    if (!absent_or_null(d, pre)) DSV4_TRY(load_pretok(tok, d, pre, &byte_level));
    if (!byte_level) return dsv4_fail(DSV4_ERR_UNSUPPORTED, WHAT ": the pre-tokenizer must end with ByteLevel");
    return build_bytes(tok);
}

void dsv4_tokenizer_free(dsv4_tokenizer *tok)
{
    if (!tok) return;
    free(tok->flags);
    free(tok->text_off);
    free(tok->text_len);
    free(tok->text);
    free(tok->bytes_off);
    free(tok->bytes_len);
    free(tok->bytes);
    free(tok->by_text.slot);
    free(tok->merges.key);
    free(tok->merges.rank);
    free(tok->merges.id);
    trie_free(&tok->added[0]);
    trie_free(&tok->added[1]);
    for (int i = 0; i < tok->n_steps; i++) {
        pcre2_match_data_free(tok->steps[i].md);
        pcre2_code_free(tok->steps[i].re);
    }
    free(tok->steps);
    pcre2_match_context_free(tok->mctx);
    pcre2_jit_stack_free(tok->jit_stack);
    free(tok->cache.slots);
    free(tok->cache.keys);
    free(tok->cache.ids);
    free(tok->scratch.sym);
    free(tok->scratch.heap);
    free(tok->scratch.prefix);
    free(tok->scratch.word);
    free(tok->scratch.out);
    pthread_mutex_destroy(&tok->lock);
    free(tok);
}

dsv4_status dsv4_tokenizer_load_json(const char *json, size_t len, dsv4_tokenizer **out)
{
    DSV4_CHECK_ARG(out && (json || !len), "tokenizer_load_json: null pointer");
    if (len >= 3 && !memcmp(json, "\xEF\xBB\xBF", 3)) { /* a UTF-8 byte order mark is allowed here */
        json += 3;
        len -= 3;
    }
    mj_doc doc;
    DSV4_TRY(mj_parse(json, len, WHAT, &doc));
    dsv4_tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok) {
        mj_free(&doc);
        return oom();
    }
    pthread_mutex_init(&tok->lock, NULL);
    dsv4_status s = build(tok, &doc);
    mj_free(&doc);
    if (s == DSV4_OK) { /* a larger JIT stack than PCRE2's default 32 KiB, for long pieces */
        tok->mctx = pcre2_match_context_create(NULL);
        tok->jit_stack = pcre2_jit_stack_create(32 << 10, 8 << 20, NULL);
        if (!tok->mctx || !tok->jit_stack) s = oom();
        else pcre2_jit_stack_assign(tok->mctx, NULL, tok->jit_stack);
    }
    if (s == DSV4_OK) s = tok_encode_prepare(tok);
    if (s != DSV4_OK) {
        dsv4_tokenizer_free(tok);
        return s;
    }
    *out = tok;
    return DSV4_OK;
}

dsv4_status dsv4_tokenizer_load(const char *path, dsv4_tokenizer **out)
{
    DSV4_CHECK_ARG(path && out, "tokenizer_load: null pointer");
    char *buf = NULL;
    size_t len = 0;
    dsv4_status s = dsv4_read_file(path, TOK_MAX_FILE, &buf, &len);
    if (s == DSV4_ERR_NOT_FOUND) s = DSV4_ERR_IO; /* a missing tokenizer.json is an i/o error, as it always was */
    if (s != DSV4_OK) return s;
    s = dsv4_tokenizer_load_json(buf, len, out);
    free(buf);
    return s;
}

/* ---- queries ---- */
int32_t dsv4_tokenizer_vocab_size(const dsv4_tokenizer *tok) { return tok ? tok->n_ids : 0; }
size_t dsv4_tokenizer_max_token_bytes(const dsv4_tokenizer *tok) { return tok ? tok->max_token_bytes : 0; }

size_t tok_max_ids(const dsv4_tokenizer *tok, size_t len) { return tok->prefix_space ? 2 * len : len; }
size_t dsv4_tokenizer_max_ids(const dsv4_tokenizer *tok, size_t len) { return tok ? tok_max_ids(tok, len) : 0; }

static int valid_id(const dsv4_tokenizer *tok, int32_t id)
{
    return id >= 0 && id < tok->n_ids && (tok->flags[id] & TOK_PRESENT);
}

dsv4_status dsv4_tokenizer_token_id(const dsv4_tokenizer *tok, const char *token, size_t len, int32_t *id)
{
    DSV4_CHECK_ARG(tok && id && (token || !len), "tokenizer_token_id: null pointer");
    int32_t r = tok_strmap_get(tok, token ? token : "", len);
    if (r < 0) return dsv4_fail(DSV4_ERR_NOT_FOUND, "tokenizer_token_id: no token \"%.*s\"", (int)(len > 200 ? 200 : len), token);
    *id = r;
    return DSV4_OK;
}

dsv4_status dsv4_tokenizer_token_text(const dsv4_tokenizer *tok, int32_t id, const char **text, size_t *len)
{
    DSV4_CHECK_ARG(tok && text && len, "tokenizer_token_text: null pointer");
    if (!valid_id(tok, id)) return dsv4_fail(DSV4_ERR_RANGE, "tokenizer_token_text: id %d is not in the vocabulary", (int)id);
    *text = tok->text + tok->text_off[id];
    *len = tok->text_len[id];
    return DSV4_OK;
}

int dsv4_tokenizer_is_special(const dsv4_tokenizer *tok, int32_t id)
{
    if (!tok || !valid_id(tok, id)) return -1;
    return (tok->flags[id] & TOK_SPECIAL) != 0;
}
