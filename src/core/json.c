#include "core/json.h"

#include "core/error.h"

#include <locale.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MJ_MAX_DEPTH 64
#define MJ_MAX_NUMBER 255

typedef struct mj_parser {
    const unsigned char *s;
    size_t len, pos;
    const char *what;
    mj_doc *doc;
    size_t arena_used;
    dsv4_status status;
} mj_parser;

const char *mj_type_name(mj_type t)
{
    static const char *const names[] = {"null", "false", "true", "number", "string", "array", "object"};
    return (unsigned)t <= MJ_OBJECT ? names[t] : "?";
}

void mj_quote(const char *s, size_t n, char *out, size_t cap)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    if (!cap) return;
    for (size_t i = 0; i < n && o + 5 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7F && c != '\\') {
            out[o++] = (char)c;
        } else {
            out[o++] = '\\';
            out[o++] = 'x';
            out[o++] = hex[c >> 4];
            out[o++] = hex[c & 15];
        }
    }
    out[o] = '\0';
}

/* Report a syntax error at byte `at` with its line and column. */
static dsv4_status fail_at(mj_parser *p, size_t at, const char *msg)
{
    size_t line = 1, col = 1;
    for (size_t i = 0; i < at && i < p->len; i++) {
        if (p->s[i] == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    p->status = dsv4_fail(DSV4_ERR_FORMAT, "%s: invalid JSON at line %zu, column %zu (byte %zu): %s", p->what,
                          line, col, at, msg);
    return p->status;
}

static void skip_ws(mj_parser *p)
{
    while (p->pos < p->len) {
        unsigned char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static uint32_t new_node(mj_parser *p, mj_type type)
{
    mj_doc *d = p->doc;
    if (d->count == d->cap) {
        if (d->cap >= (UINT32_MAX - 1) / 2) {
            fail_at(p, p->pos, "too many values");
            return MJ_NONE;
        }
        uint32_t cap = d->cap ? d->cap * 2 : 64;
        mj_node *n = realloc(d->nodes, (size_t)cap * sizeof *n);
        if (!n) {
            p->status = dsv4_fail(DSV4_ERR_NO_MEMORY, "%s: out of memory parsing JSON", p->what);
            return MJ_NONE;
        }
        d->nodes = n;
        d->cap = cap;
    }
    mj_node *n = &d->nodes[d->count];
    memset(n, 0, sizeof *n);
    n->type = (uint8_t)type;
    n->src = (uint32_t)p->pos;
    return d->count++;
}

/* Length of the valid UTF-8 sequence starting at s[0] (s[0] >= 0x80), or 0 if invalid
 * (Unicode Table 3-7: no overlongs, no surrogates, nothing above U+10FFFF). */
static size_t utf8_seq(const unsigned char *s, size_t avail)
{
    unsigned char c = s[0];
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c == 0xE0) { n = 3; lo = 0xA0; }
    else if (c >= 0xE1 && c <= 0xEC) n = 3;
    else if (c == 0xED) { n = 3; hi = 0x9F; }
    else if (c >= 0xEE && c <= 0xEF) n = 3;
    else if (c == 0xF0) { n = 4; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) n = 4;
    else if (c == 0xF4) { n = 4; hi = 0x8F; }
    else return 0;
    if (avail < n) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return n;
}

static int hex4(const unsigned char *s, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned c = s[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return 0;
        v = v * 16 + d;
    }
    *out = v;
    return 1;
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 63)); o[2] = (char)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18)); o[1] = (char)(0x80 | ((cp >> 12) & 63));
    o[2] = (char)(0x80 | ((cp >> 6) & 63)); o[3] = (char)(0x80 | (cp & 63));
    return 4;
}

/* A string at p->pos (the opening quote), decoded into the arena. */
static dsv4_status parse_string(mj_parser *p, uint32_t node)
{
    size_t start = p->pos++;
    char *out = p->doc->arena + p->arena_used;
    size_t o = 0;
    int has_nul = 0;
    for (;;) {
        if (p->pos >= p->len) return fail_at(p, start, "unterminated string");
        unsigned char c = p->s[p->pos];
        if (c == '"') {
            p->pos++;
            break;
        }
        if (c < 0x20) return fail_at(p, p->pos, "control character in a string (must be escaped)");
        if (c >= 0x80) {
            size_t n = utf8_seq(p->s + p->pos, p->len - p->pos);
            if (!n) {
                /* quote the string up to a few bytes past the bad one */
                char q[200];
                size_t bad = p->pos - start - 1, from = bad > 40 ? bad - 40 : 0;
                size_t show = bad + 4 - from, left = p->len - start - 1 - from;
                mj_quote((const char *)p->s + start + 1 + from, show < left ? show : left, q, sizeof q);
                char msg[256];
                snprintf(msg, sizeof msg, "invalid UTF-8 in the string \"%s%s...\"", from ? "..." : "", q);
                return fail_at(p, p->pos, msg);
            }
            memcpy(out + o, p->s + p->pos, n);
            o += n;
            p->pos += n;
            continue;
        }
        if (c != '\\') {
            out[o++] = (char)c;
            p->pos++;
            continue;
        }
        if (p->pos + 1 >= p->len) return fail_at(p, start, "unterminated string");
        unsigned char e = p->s[p->pos + 1];
        const char *simple = strchr("\"\\/bfnrt", e);
        if (e && simple) {
            static const char repl[] = "\"\\/\b\f\n\r\t";
            out[o++] = repl[simple - "\"\\/bfnrt"];
            p->pos += 2;
            continue;
        }
        if (e != 'u') return fail_at(p, p->pos, "invalid escape sequence");
        unsigned cp;
        if (p->pos + 6 > p->len || !hex4(p->s + p->pos + 2, &cp)) return fail_at(p, p->pos, "invalid \\u escape");
        p->pos += 6;
        if (cp >= 0xDC00 && cp <= 0xDFFF) return fail_at(p, p->pos - 6, "lone low surrogate in \\u escape");
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            unsigned lo;
            if (p->pos + 6 > p->len || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u' ||
                !hex4(p->s + p->pos + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                return fail_at(p, p->pos - 6, "high surrogate not followed by a low surrogate");
            p->pos += 6;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        if (cp == 0) has_nul = 1;
        o += put_utf8(out + o, cp);
    }
    out[o] = '\0';
    mj_node *n = &p->doc->nodes[node];
    n->v.str = (uint32_t)p->arena_used;
    n->count = (uint32_t)o;
    n->has_nul = (uint8_t)has_nul;
    p->arena_used += o + 1;
    return DSV4_OK;
}

static dsv4_status parse_number(mj_parser *p, uint32_t node)
{
    size_t start = p->pos, i = p->pos;
    const unsigned char *s = p->s;
    int is_int = 1;
    if (i < p->len && s[i] == '-') i++;
    if (i >= p->len || s[i] < '0' || s[i] > '9') return fail_at(p, start, "invalid number");
    if (s[i] == '0') {
        i++;
        if (i < p->len && s[i] >= '0' && s[i] <= '9') return fail_at(p, start, "number with a leading zero");
    } else {
        while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
    }
    if (i < p->len && s[i] == '.') {
        is_int = 0;
        i++;
        if (i >= p->len || s[i] < '0' || s[i] > '9') return fail_at(p, start, "digit expected after '.'");
        while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
    }
    if (i < p->len && (s[i] == 'e' || s[i] == 'E')) {
        is_int = 0;
        i++;
        if (i < p->len && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= p->len || s[i] < '0' || s[i] > '9') return fail_at(p, start, "digit expected in exponent");
        while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
    }
    size_t n = i - start;
    if (n > MJ_MAX_NUMBER) return fail_at(p, start, "number literal longer than 255 characters");
    p->pos = i;
    mj_node *nd = &p->doc->nodes[node];
    if (is_int) {
        int neg = s[start] == '-';
        uint64_t v = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
        int ok = 1;
        for (size_t k = start + (size_t)neg; k < i; k++) {
            unsigned dgt = s[k] - '0';
            if (v > (lim - dgt) / 10) {
                ok = 0;
                break;
            }
            v = v * 10 + dgt;
        }
        if (ok) {
            nd->is_int = 1;
            nd->v.i = neg ? (int64_t)(0 - v) : (int64_t)v;
            return DSV4_OK;
        }
    }
    /* strtod reads the locale's decimal point: give it that character. */
    char buf[MJ_MAX_NUMBER + 1];
    memcpy(buf, s + start, n);
    buf[n] = '\0';
    const char *dp = localeconv()->decimal_point;
    char *dot = strchr(buf, '.');
    if (dot && dp && dp[0] && dp[0] != '.' && !dp[1]) *dot = dp[0];
    char *end = NULL;
    double d = strtod(buf, &end);
    if (end != buf + n) return fail_at(p, start, "invalid number");
    if (!isfinite(d)) return fail_at(p, start, "number out of the range of a double");
    nd->v.d = d;
    return DSV4_OK;
}

typedef struct key_ref {
    const char *s;
    uint32_t n;
    uint32_t src;
} key_ref;

static int key_cmp(const void *a, const void *b)
{
    const key_ref *x = a, *y = b;
    uint32_t m = x->n < y->n ? x->n : y->n;
    int c = memcmp(x->s, y->s, m);
    if (c) return c;
    return (x->n > y->n) - (x->n < y->n);
}

/* Duplicate keys of object `obj` (all members parsed). */
static dsv4_status check_duplicate_keys(mj_parser *p, uint32_t obj)
{
    mj_doc *d = p->doc;
    uint32_t n = d->nodes[obj].count;
    if (n < 2) return DSV4_OK;
    key_ref *keys = malloc((size_t)n * sizeof *keys);
    if (!keys) return p->status = dsv4_fail(DSV4_ERR_NO_MEMORY, "%s: out of memory parsing JSON", p->what);
    uint32_t k = obj + 1;
    for (uint32_t m = 0; m < n; m++) {
        keys[m].s = d->arena + d->nodes[k].v.str;
        keys[m].n = d->nodes[k].count;
        keys[m].src = d->nodes[k].src;
        k = d->nodes[k + 1].end;
    }
    qsort(keys, n, sizeof *keys, key_cmp);
    dsv4_status st = DSV4_OK;
    for (uint32_t m = 1; m < n; m++) {
        if (key_cmp(&keys[m - 1], &keys[m]) == 0) {
            char q[96], msg[160];
            mj_quote(keys[m].s, keys[m].n, q, sizeof q);
            snprintf(msg, sizeof msg, "duplicate key \"%s\"", q);
            st = fail_at(p, keys[m - 1].src > keys[m].src ? keys[m - 1].src : keys[m].src, msg);
            break;
        }
    }
    free(keys);
    return st;
}

static dsv4_status parse_value(mj_parser *p, int depth);

static dsv4_status parse_container(mj_parser *p, uint32_t node, int is_obj, int depth)
{
    char close = is_obj ? '}' : ']';
    p->pos++;
    skip_ws(p);
    uint32_t count = 0;
    if (p->pos < p->len && p->s[p->pos] == close) {
        p->pos++;
    } else {
        for (;;) {
            skip_ws(p);
            if (is_obj) {
                if (p->pos >= p->len || p->s[p->pos] != '"') return fail_at(p, p->pos, "object key (a string) expected");
                uint32_t k = new_node(p, MJ_STRING);
                if (k == MJ_NONE) return p->status;
                DSV4_TRY(parse_string(p, k));
                p->doc->nodes[k].end = k + 1;
                skip_ws(p);
                if (p->pos >= p->len || p->s[p->pos] != ':') return fail_at(p, p->pos, "':' expected after an object key");
                p->pos++;
            }
            DSV4_TRY(parse_value(p, depth + 1));
            if (count == UINT32_MAX) return fail_at(p, p->pos, "too many members");
            count++;
            skip_ws(p);
            if (p->pos >= p->len) return fail_at(p, p->pos, is_obj ? "unterminated object" : "unterminated array");
            if (p->s[p->pos] == ',') {
                p->pos++;
                continue;
            }
            if (p->s[p->pos] == close) {
                p->pos++;
                break;
            }
            return fail_at(p, p->pos, is_obj ? "',' or '}' expected" : "',' or ']' expected");
        }
    }
    mj_node *n = &p->doc->nodes[node];
    n->count = count;
    n->end = p->doc->count;
    return is_obj ? check_duplicate_keys(p, node) : DSV4_OK;
}

static dsv4_status parse_literal(mj_parser *p, const char *word)
{
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0) return fail_at(p, p->pos, "unexpected character");
    p->pos += n;
    return DSV4_OK;
}

static dsv4_status parse_value(mj_parser *p, int depth)
{
    skip_ws(p);
    if (p->pos >= p->len) return fail_at(p, p->pos, "value expected, found the end of the text");
    unsigned char c = p->s[p->pos];
    mj_type t;
    switch (c) {
    case '{': t = MJ_OBJECT; break;
    case '[': t = MJ_ARRAY; break;
    case '"': t = MJ_STRING; break;
    case 't': t = MJ_TRUE; break;
    case 'f': t = MJ_FALSE; break;
    case 'n': t = MJ_NULL; break;
    default:
        if (c == '-' || (c >= '0' && c <= '9')) {
            t = MJ_NUMBER;
            break;
        }
        return fail_at(p, p->pos, "unexpected character");
    }
    if ((t == MJ_OBJECT || t == MJ_ARRAY) && depth >= MJ_MAX_DEPTH) return fail_at(p, p->pos, "nesting deeper than 64 levels");
    uint32_t node = new_node(p, t);
    if (node == MJ_NONE) return p->status;
    dsv4_status st;
    switch (t) {
    case MJ_OBJECT: return parse_container(p, node, 1, depth);
    case MJ_ARRAY: return parse_container(p, node, 0, depth);
    case MJ_STRING: st = parse_string(p, node); break;
    case MJ_NUMBER: st = parse_number(p, node); break;
    case MJ_TRUE: st = parse_literal(p, "true"); break;
    case MJ_FALSE: st = parse_literal(p, "false"); break;
    default: st = parse_literal(p, "null"); break;
    }
    p->doc->nodes[node].end = node + 1;
    return st;
}

void mj_free(mj_doc *doc)
{
    if (!doc) return;
    free(doc->nodes);
    free(doc->arena);
    memset(doc, 0, sizeof *doc);
}

dsv4_status mj_parse(const char *text, size_t len, const char *what, mj_doc *doc)
{
    DSV4_CHECK_ARG(doc && (text || !len), "json: null argument");
    mj_doc d = {0};
    if (len > ((size_t)1 << 31)) return dsv4_fail(DSV4_ERR_FORMAT, "%s: %zu bytes of JSON is too large", what, len);
    d.arena = malloc(len + 1);
    if (!d.arena) return dsv4_fail(DSV4_ERR_NO_MEMORY, "%s: out of memory parsing JSON", what);
    mj_parser p = {(const unsigned char *)text, len, 0, what, &d, 0, DSV4_OK};
    dsv4_status st;
    if (len >= 3 && !memcmp(text, "\xEF\xBB\xBF", 3)) st = fail_at(&p, 0, "byte-order mark before the value");
    else st = parse_value(&p, 0);
    if (st == DSV4_OK) {
        skip_ws(&p);
        if (p.pos != len) st = fail_at(&p, p.pos, "trailing data after the JSON value");
    }
    if (st != DSV4_OK) {
        mj_free(&d);
        return st;
    }
    d.arena_len = p.arena_used;
    *doc = d;
    return DSV4_OK;
}

uint32_t mj_get(const mj_doc *d, uint32_t obj, const char *key)
{
    if (obj == MJ_NONE || d->nodes[obj].type != MJ_OBJECT) return MJ_NONE;
    uint32_t k = obj + 1;
    for (uint32_t m = 0; m < d->nodes[obj].count; m++) {
        if (mj_is(d, k, key)) return k + 1;
        k = d->nodes[k + 1].end;
    }
    return MJ_NONE;
}

int mj_is(const mj_doc *d, uint32_t i, const char *s)
{
    if (i == MJ_NONE || d->nodes[i].type != MJ_STRING) return 0;
    size_t n = strlen(s);
    return d->nodes[i].count == n && !memcmp(mj_str(d, i), s, n);
}

double mj_num(const mj_doc *d, uint32_t i)
{
    const mj_node *n = &d->nodes[i];
    return n->is_int ? (double)n->v.i : n->v.d;
}
