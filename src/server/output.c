/* Splitting a streamed completion into reasoning, content and tool calls (output.h). */
#include "server/output.h"

#include "dsv4/tokenizer.h"
#include "tokenizer/utf8.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BAR "\xef\xbd\x9c" /* U+FF5C, the bar of DeepSeek's special tokens */
static const char think_end[] = "</think>";
static const char dsml_open[] = "<" BAR "DSML" BAR;
static const char dsml_calls[] = "\n\n<" BAR "DSML" BAR; /* the separator the format puts before the block */
static const char dsml_close[] = "</" BAR "DSML" BAR;
static const char eos_text[] = "<" BAR "end\xe2\x96\x81of\xe2\x96\x81sentence" BAR ">";

int srv_buf_add(srv_buf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->cap ? b->cap : 64);
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return -1;
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

void srv_buf_free(srv_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

void srv_out_init(srv_out *o, int thinking, int parse_tools, const char *const *stop, int n_stop)
{
    memset(o, 0, sizeof *o);
    o->section = thinking ? SRV_OUT_REASONING : SRV_OUT_CONTENT;
    o->parse_tools = parse_tools;
    o->stop = stop;
    o->n_stop = n_stop;
}

void srv_out_free(srv_out *o)
{
    srv_buf_free(&o->pending);
    srv_buf_free(&o->tools);
    srv_buf_free(&o->out[0]);
    srv_buf_free(&o->out[1]);
}

static void put(srv_out *o, int section, const char *s, size_t n)
{
    if (n && srv_buf_add(&o->out[section], s, n)) o->failed = 1;
}

static const char *find(const char *h, size_t hn, const char *nd, size_t nn)
{
    if (!nn || nn > hn) return NULL;
    for (size_t i = 0; i + nn <= hn; i++)
        if (h[i] == nd[0] && !memcmp(h + i, nd, nn)) return h + i;
    return NULL;
}

/* Longest suffix of s[0..n) that is a proper prefix of m. */
static size_t partial(const char *s, size_t n, const char *m, size_t mn)
{
    size_t k = mn - 1 < n ? mn - 1 : n;
    for (; k > 0; k--)
        if (!memcmp(s + n - k, m, k)) return k;
    return 0;
}

static void drop(srv_buf *b, size_t k)
{
    memmove(b->p, b->p + k, b->n - k);
    b->n -= k;
    b->p[b->n] = 0;
}

void srv_out_feed(srv_out *o, const char *s, size_t n)
{
    if (o->stopped) return;
    if (o->in_tools) {
        if (srv_buf_add(&o->tools, s, n)) o->failed = 1;
        return;
    }
    if (srv_buf_add(&o->pending, s, n)) {
        o->failed = 1;
        return;
    }
    srv_buf *p = &o->pending;
    while (p->n) {
        if (o->section == SRV_OUT_REASONING) {
            const char *m = find(p->p, p->n, think_end, sizeof think_end - 1);
            if (m) {
                put(o, SRV_OUT_REASONING, p->p, (size_t)(m - p->p));
                drop(p, (size_t)(m - p->p) + sizeof think_end - 1);
                o->section = SRV_OUT_CONTENT;
                continue;
            }
            size_t hold = partial(p->p, p->n, think_end, sizeof think_end - 1);
            put(o, SRV_OUT_REASONING, p->p, p->n - hold);
            drop(p, p->n - hold);
            return;
        }
        /* content: the earliest stop string or DSML marker */
        const char *first = NULL;
        int first_is_stop = 0;
        for (int i = 0; i < o->n_stop; i++) {
            const char *m = find(p->p, p->n, o->stop[i], strlen(o->stop[i]));
            if (m && (!first || m < first)) first = m, first_is_stop = 1;
        }
        int sep = 0;
        if (o->parse_tools) {
            const char *m = find(p->p, p->n, dsml_calls, sizeof dsml_calls - 1);
            sep = m != NULL;
            if (!m) m = find(p->p, p->n, dsml_open, sizeof dsml_open - 1);
            if (!m) m = find(p->p, p->n, dsml_close, sizeof dsml_close - 1);
            if (m && (!first || m < first)) first = m, first_is_stop = 0;
            else sep = 0;
        }
        if (first) {
            size_t at = (size_t)(first - p->p);
            put(o, SRV_OUT_CONTENT, p->p, at);
            if (first_is_stop) {
                o->stopped = 1;
            } else {
                if (sep) at += 2; /* the "\n\n" before the block belongs to the format */
                if (srv_buf_add(&o->tools, p->p + at, p->n - at)) o->failed = 1;
                o->in_tools = 1;
            }
            p->n = 0;
            return;
        }
        size_t hold = 0;
        for (int i = 0; i < o->n_stop; i++) {
            size_t h = partial(p->p, p->n, o->stop[i], strlen(o->stop[i]));
            if (h > hold) hold = h;
        }
        if (o->parse_tools) {
            size_t h = partial(p->p, p->n, dsml_calls, sizeof dsml_calls - 1);
            if (h > hold) hold = h;
            h = partial(p->p, p->n, dsml_open, sizeof dsml_open - 1);
            if (h > hold) hold = h;
            h = partial(p->p, p->n, dsml_close, sizeof dsml_close - 1);
            if (h > hold) hold = h;
        }
        put(o, SRV_OUT_CONTENT, p->p, p->n - hold);
        drop(p, p->n - hold);
        return;
    }
}

int srv_dsml_strip(const char *s, size_t n, srv_buf *out)
{
    size_t i = 0;
    while (i < n) {
        const char *a = find(s + i, n - i, dsml_open, sizeof dsml_open - 1);
        const char *b = find(s + i, n - i, dsml_close, sizeof dsml_close - 1);
        const char *m = a && (!b || a < b) ? a : b;
        if (!m) break;
        if (srv_buf_add(out, s + i, (size_t)(m - (s + i)))) return -1;
        const char *gt = memchr(m, '>', (size_t)(s + n - m));
        i = gt ? (size_t)(gt - s) + 1 : n; /* an unclosed tag runs to the end */
    }
    return srv_buf_add(out, s + i, n - i);
}

/* The calls of a complete block, as the JSON array text dsv4_completion_parse gives; NULL when
 * the block is not exactly the format. */
static char *parse_block(const srv_buf *t)
{
    srv_buf text = {0};
    char *res = NULL;
    if (srv_buf_add(&text, "\n\n", 2) || srv_buf_add(&text, t->p, t->n) || srv_buf_add(&text, eos_text, sizeof eos_text - 1))
        goto done;
    size_t len = 0;
    if (dsv4_completion_parse(text.p, text.n, DSV4_PROMPT_CHAT, NULL, 0, &len) != DSV4_OK) goto done;
    char *js = malloc(len + 1);
    if (!js) goto done;
    if (dsv4_completion_parse(text.p, text.n, DSV4_PROMPT_CHAT, js, len, &len) != DSV4_OK) {
        free(js);
        goto done;
    }
    js[len] = 0;
    res = js; /* the whole message object; the caller takes its tool_calls */
done:
    srv_buf_free(&text);
    return res;
}

void srv_out_finish(srv_out *o, char **tool_calls)
{
    *tool_calls = NULL;
    if (o->pending.n && !o->stopped) put(o, o->section, o->pending.p, o->pending.n);
    o->pending.n = 0;
    if (!o->in_tools) return;
    char *msg = o->tools.n ? parse_block(&o->tools) : NULL;
    if (msg) {
        *tool_calls = msg;
    } else { /* malformed DSML: its text without the markup, trimmed, joins the content after a blank line */
        srv_buf clean = {0};
        if (srv_dsml_strip(o->tools.p, o->tools.n, &clean)) o->failed = 1;
        size_t a = 0, b = clean.n;
        while (a < b && strchr(" \t\r\n", clean.p[a])) a++;
        while (b > a && strchr(" \t\r\n", clean.p[b - 1])) b--;
        if (b > a && o->out[SRV_OUT_CONTENT].n) put(o, SRV_OUT_CONTENT, "\n\n", 2);
        if (b > a) put(o, SRV_OUT_CONTENT, clean.p + a, b - a);
        srv_buf_free(&clean);
    }
    o->in_tools = 0;
}

int srv_utf8_clean(const char *s, size_t n, srv_buf *out)
{
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0;
    while (i < n) {
        size_t ok = utf8_valid_prefix(u + i, n - i);
        if (srv_buf_add(out, s + i, ok)) return -1;
        i += ok;
        if (i < n) { /* an ill-formed byte, or a sequence the end cuts short */
            if (srv_buf_add(out, "\xef\xbf\xbd", 3)) return -1;
            i += utf8_check(u + i, n - i) < 0 ? n - i : 1;
        }
    }
    return 0;
}
