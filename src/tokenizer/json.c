/* JSON reader for tokenizer.json (see json.h). */
#include "tokenizer/json.h"

#include "core/error.h"
#include "tokenizer/utf8.h"

#include <stdlib.h>
#include <string.h>

enum { TJ_MAX_DEPTH = 128 };

typedef struct tj_chunk {
    struct tj_chunk *next;
    size_t used, cap;
    max_align_t data[];
} tj_chunk;

struct tj_doc {
    tj_chunk *chunks;
    tj_val root;
};

typedef struct {
    const char *begin, *p, *end, *what;
    tj_doc *doc;
    tj_val *stack; /* members of the containers being read, innermost last */
    size_t sp, scap;
    int depth;
} tj_parser;

static void *arena_alloc(tj_doc *d, size_t bytes)
{
    bytes = (bytes + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    tj_chunk *c = d->chunks;
    if (!c || c->cap - c->used < bytes) {
        size_t cap = bytes > ((size_t)1 << 20) ? bytes : ((size_t)1 << 20);
        c = malloc(sizeof(tj_chunk) + cap);
        if (!c) return NULL;
        c->next = d->chunks;
        c->used = 0;
        c->cap = cap;
        d->chunks = c;
    }
    void *r = (char *)c->data + c->used;
    c->used += bytes;
    return r;
}

static dsv4_status perr(tj_parser *ps, const char *msg)
{
    int line = 1;
    for (const char *q = ps->begin; q < ps->p && q < ps->end; q++) line += *q == '\n';
    return dsv4_fail(DSV4_ERR_FORMAT, "%s: JSON error at line %d (byte %zu): %s", ps->what, line,
                     (size_t)(ps->p - ps->begin), msg);
}

static dsv4_status oom(void) { return dsv4_fail(DSV4_ERR_NO_MEMORY, "tokenizer JSON: out of memory"); }

static void skip_ws(tj_parser *ps)
{
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')) ps->p++;
}

static int hex4(const char *s, uint32_t *out)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return 0;
        v = v * 16 + (uint32_t)d;
    }
    *out = v;
    return 1;
}

static dsv4_status parse_string(tj_parser *ps, tj_val *v)
{
    ps->p++; /* opening quote */
    const char *s = ps->p;
    size_t raw = 0;
    while (s + raw < ps->end && s[raw] != '"') raw += s[raw] == '\\' ? 2 : 1;
    if (s + raw >= ps->end) return perr(ps, "unterminated string");
    char *out = arena_alloc(ps->doc, raw + 1);
    if (!out) return oom();
    size_t n = 0;
    const char *q = s, *e = s + raw;
    while (q < e) {
        unsigned char c = (unsigned char)*q;
        if (c < 0x20) {
            ps->p = q;
            return perr(ps, "control character in string");
        }
        if (c != '\\') {
            /* a run of plain text up to the next escape (UTF-8 never holds a '\\' byte) */
            const char *bs = memchr(q, '\\', (size_t)(e - q));
            size_t run = (size_t)((bs ? bs : e) - q);
            size_t k = utf8_valid_prefix((const uint8_t *)q, run);
            if (k < run) {
                ps->p = q + k;
                return perr(ps, "invalid UTF-8 in string");
            }
            for (size_t i = 0; i < run; i++)
                if ((unsigned char)q[i] < 0x20) {
                    ps->p = q + i;
                    return perr(ps, "control character in string");
                }
            memcpy(out + n, q, run);
            n += run;
            q += run;
            continue;
        }
        q++;
        char esc = *q++;
        uint32_t cp;
        switch (esc) {
        case '"': out[n++] = '"'; break;
        case '\\': out[n++] = '\\'; break;
        case '/': out[n++] = '/'; break;
        case 'b': out[n++] = '\b'; break;
        case 'f': out[n++] = '\f'; break;
        case 'n': out[n++] = '\n'; break;
        case 'r': out[n++] = '\r'; break;
        case 't': out[n++] = '\t'; break;
        case 'u':
            if (e - q < 4 || !hex4(q, &cp)) {
                ps->p = q;
                return perr(ps, "bad \\u escape");
            }
            q += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t lo;
                if (e - q < 6 || q[0] != '\\' || q[1] != 'u' || !hex4(q + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF) {
                    ps->p = q;
                    return perr(ps, "unpaired UTF-16 surrogate in \\u escape");
                }
                q += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                ps->p = q;
                return perr(ps, "unpaired UTF-16 surrogate in \\u escape");
            }
            n += utf8_put((uint8_t *)out + n, cp);
            break;
        default:
            ps->p = q - 1;
            return perr(ps, "bad escape in string");
        }
    }
    ps->p = e + 1;
    if (n > UINT32_MAX - 1) return perr(ps, "string too long");
    out[n] = '\0';
    v->type = TJ_STR;
    v->str = out;
    v->n = (uint32_t)n;
    return DSV4_OK;
}

static dsv4_status parse_number(tj_parser *ps, tj_val *v)
{
    const char *s = ps->p, *q = s;
    int neg = 0, is_int = 1;
    if (q < ps->end && *q == '-') {
        neg = 1;
        q++;
    }
    if (q >= ps->end || *q < '0' || *q > '9') return perr(ps, "bad number");
    if (*q == '0' && q + 1 < ps->end && q[1] >= '0' && q[1] <= '9') return perr(ps, "leading zero in number");
    uint64_t mag = 0;
    while (q < ps->end && *q >= '0' && *q <= '9') {
        if (mag > (UINT64_MAX - 9) / 10) is_int = 0;
        mag = mag * 10 + (uint64_t)(*q - '0');
        q++;
    }
    if (q < ps->end && *q == '.') {
        is_int = 0;
        q++;
        if (q >= ps->end || *q < '0' || *q > '9') return perr(ps, "bad fraction in number");
        while (q < ps->end && *q >= '0' && *q <= '9') q++;
    }
    if (q < ps->end && (*q == 'e' || *q == 'E')) {
        is_int = 0;
        q++;
        if (q < ps->end && (*q == '+' || *q == '-')) q++;
        if (q >= ps->end || *q < '0' || *q > '9') return perr(ps, "bad exponent in number");
        while (q < ps->end && *q >= '0' && *q <= '9') q++;
    }
    if (is_int && mag > (uint64_t)INT64_MAX) is_int = 0;
    v->type = TJ_NUM;
    v->is_int = is_int;
    if (is_int) {
        v->i = neg ? -(int64_t)mag : (int64_t)mag;
        v->num = (double)v->i;
    } else {
        char buf[64];
        size_t len = (size_t)(q - s);
        if (len >= sizeof buf) return perr(ps, "number too long");
        memcpy(buf, s, len);
        buf[len] = '\0';
        v->num = strtod(buf, NULL);
    }
    ps->p = q;
    return DSV4_OK;
}

static dsv4_status push(tj_parser *ps, const tj_val *v)
{
    if (ps->sp == ps->scap) {
        size_t cap = ps->scap ? ps->scap * 2 : 1024;
        tj_val *s = realloc(ps->stack, cap * sizeof *s);
        if (!s) return oom();
        ps->stack = s;
        ps->scap = cap;
    }
    ps->stack[ps->sp++] = *v;
    return DSV4_OK;
}

static int literal(tj_parser *ps, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n)) return 0;
    ps->p += n;
    return 1;
}

static dsv4_status parse_value(tj_parser *ps, tj_val *v);

/* Arrays and objects: members go to the stack, then move to the arena in one piece. */
static dsv4_status parse_container(tj_parser *ps, tj_val *v, int is_obj)
{
    if (++ps->depth > TJ_MAX_DEPTH) return perr(ps, "nesting too deep");
    char close = is_obj ? '}' : ']';
    size_t base = ps->sp;
    ps->p++;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
    } else {
        for (;;) {
            tj_val item;
            memset(&item, 0, sizeof item);
            skip_ws(ps);
            if (is_obj) {
                if (ps->p >= ps->end || *ps->p != '"') return perr(ps, "expected a string key");
                DSV4_TRY(parse_string(ps, &item));
                DSV4_TRY(push(ps, &item));
                skip_ws(ps);
                if (ps->p >= ps->end || *ps->p != ':') return perr(ps, "expected ':'");
                ps->p++;
                skip_ws(ps);
            }
            DSV4_TRY(parse_value(ps, &item));
            DSV4_TRY(push(ps, &item));
            skip_ws(ps);
            if (ps->p < ps->end && *ps->p == ',') {
                ps->p++;
                continue;
            }
            if (ps->p < ps->end && *ps->p == close) {
                ps->p++;
                break;
            }
            return perr(ps, is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
        }
    }
    size_t count = (ps->sp - base) / (is_obj ? 2 : 1);
    if (count > UINT32_MAX) return perr(ps, "container too large");
    memset(v, 0, sizeof *v);
    v->type = is_obj ? TJ_OBJ : TJ_ARR;
    v->n = (uint32_t)count;
    if (count) {
        v->items = arena_alloc(ps->doc, count * sizeof(tj_val));
        if (!v->items) return oom();
        if (is_obj) {
            v->keys = arena_alloc(ps->doc, count * sizeof(tj_val));
            if (!v->keys) return oom();
            for (size_t i = 0; i < count; i++) {
                v->keys[i] = ps->stack[base + 2 * i];
                v->items[i] = ps->stack[base + 2 * i + 1];
            }
        } else {
            memcpy(v->items, ps->stack + base, count * sizeof(tj_val));
        }
    }
    ps->sp = base;
    ps->depth--;
    return DSV4_OK;
}

static dsv4_status parse_value(tj_parser *ps, tj_val *v)
{
    memset(v, 0, sizeof *v);
    skip_ws(ps);
    if (ps->p >= ps->end) return perr(ps, "unexpected end of input");
    switch (*ps->p) {
    case '{': return parse_container(ps, v, 1);
    case '[': return parse_container(ps, v, 0);
    case '"': return parse_string(ps, v);
    case 't':
        v->type = TJ_TRUE;
        return literal(ps, "true") ? DSV4_OK : perr(ps, "bad literal");
    case 'f':
        v->type = TJ_FALSE;
        return literal(ps, "false") ? DSV4_OK : perr(ps, "bad literal");
    case 'n':
        v->type = TJ_NULL;
        return literal(ps, "null") ? DSV4_OK : perr(ps, "bad literal");
    default: return parse_number(ps, v);
    }
}

void tj_free(tj_doc *doc)
{
    if (!doc) return;
    for (tj_chunk *c = doc->chunks, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    free(doc);
}

dsv4_status tj_parse(const char *text, size_t len, const char *what, tj_doc **out)
{
    tj_doc *doc = calloc(1, sizeof *doc);
    if (!doc) return oom();
    tj_parser ps = {text, text, text + len, what, doc, NULL, 0, 0, 0};
    if (len >= 3 && !memcmp(text, "\xEF\xBB\xBF", 3)) ps.p += 3; /* UTF-8 byte order mark */
    dsv4_status s = parse_value(&ps, &doc->root);
    if (s == DSV4_OK) {
        skip_ws(&ps);
        if (ps.p != ps.end) s = perr(&ps, "trailing data after the JSON value");
    }
    free(ps.stack);
    if (s != DSV4_OK) {
        tj_free(doc);
        return s;
    }
    *out = doc;
    return DSV4_OK;
}

const tj_val *tj_root(const tj_doc *doc) { return &doc->root; }

const tj_val *tj_get(const tj_val *v, const char *key)
{
    if (!v || v->type != TJ_OBJ) return NULL;
    size_t n = strlen(key);
    for (uint32_t i = 0; i < v->n; i++)
        if (v->keys[i].n == n && !memcmp(v->keys[i].str, key, n)) return &v->items[i];
    return NULL;
}

int tj_is(const tj_val *v, const char *s)
{
    return v && v->type == TJ_STR && v->n == strlen(s) && !memcmp(v->str, s, v->n);
}

const char *tj_type_name(tj_type t)
{
    static const char *names[] = {"null", "false", "true", "number", "string", "array", "object"};
    return (unsigned)t <= TJ_OBJ ? names[t] : "?";
}
