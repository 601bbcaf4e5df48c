/* DeepSeek-V4 prompt format (chat and thinking modes, tools and tool calls), see include/dsv4/tokenizer.h. */
#include "core/error.h"
#include "core/json.h"
#include "tokenizer/tok_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FW_BAR "\xEF\xBD\x9C" /* U+FF5C FULLWIDTH VERTICAL LINE */
#define LOW_BAR "\xE2\x96\x81" /* U+2581 LOWER ONE EIGHTH BLOCK */
static const char bos[] = "<" FW_BAR "begin" LOW_BAR "of" LOW_BAR "sentence" FW_BAR ">";
static const char eos[] = "<" FW_BAR "end" LOW_BAR "of" LOW_BAR "sentence" FW_BAR ">";
static const char user_tag[] = "<" FW_BAR "User" FW_BAR ">";
static const char assistant_tag[] = "<" FW_BAR "Assistant" FW_BAR ">";
static const char think_start[] = "<think>";
static const char think_end[] = "</think>";

#define DSML "<" FW_BAR "DSML" FW_BAR
#define DSML_CLOSE "</" FW_BAR "DSML" FW_BAR
static const char tool_result_open[] = "<tool_result>";
static const char tool_result_close[] = "</tool_result>";
static const char tools_head[] =
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by writing "
    "a \"" DSML "tool_calls>\" block like the following:\n\n" DSML "tool_calls>\n" DSML "invoke name=\"$TOOL_NAME\">\n" DSML
    "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE" DSML_CLOSE "parameter>\n...\n" DSML_CLOSE
    "invoke>\n" DSML "invoke name=\"$TOOL_NAME2\">\n...\n" DSML_CLOSE "invoke>\n" DSML_CLOSE
    "tool_calls>\n\nString parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
    "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\nIf thinking_mode is enabled "
    "(triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or "
    "final response.\n\nOtherwise, output directly after </think> with tool calls or final response.\n\n### Available Tool "
    "Schemas\n\n";
static const char tools_tail[] =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

typedef struct {
    char *out; /* NULL: measure only */
    size_t n;
} writer;

static void put(writer *w, const char *s, size_t n)
{
    if (w->out && n) memcpy(w->out + w->n, s, n);
    w->n += n;
}
#define PUT_LIT(w, lit) put(w, lit, sizeof lit - 1)

/* ---- JSON as Python's json.dumps(value, ensure_ascii=False) writes it ------------------------ */
static void put_json_string(writer *w, const char *s, size_t n)
{
    PUT_LIT(w, "\"");
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)s[i];
        char esc[8];
        switch (c) {
        case '"': PUT_LIT(w, "\\\""); break;
        case '\\': PUT_LIT(w, "\\\\"); break;
        case '\n': PUT_LIT(w, "\\n"); break;
        case '\r': PUT_LIT(w, "\\r"); break;
        case '\t': PUT_LIT(w, "\\t"); break;
        case '\b': PUT_LIT(w, "\\b"); break;
        case '\f': PUT_LIT(w, "\\f"); break;
        default:
            if (c < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", c);
                put(w, esc, 6);
            } else {
                put(w, s + i, 1);
            }
        }
    }
    PUT_LIT(w, "\"");
}

/* repr() of a finite double: the shortest digits that read back to it, in fixed notation for
 * decimal exponents -4 .. 15 (with ".0" when integral), else d.ddde[+-]XX. */
static void put_py_float(writer *w, double x)
{
    if (x == 0.0) {
        if (signbit(x)) PUT_LIT(w, "-0.0");
        else PUT_LIT(w, "0.0");
        return;
    }
    char buf[40], dig[24];
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*e", p - 1, x);
        if (strtod(buf, NULL) == x) break;
    }
    const char *q = buf;
    if (*q == '-') {
        PUT_LIT(w, "-");
        q++;
    }
    int k = 0;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') dig[k++] = *q;
    const int e = atoi(q + 1);
    while (k > 1 && dig[k - 1] == '0') k--;
    if (e >= -4 && e < 16) {
        if (e < 0) {
            PUT_LIT(w, "0.");
            for (int i = 0; i < -e - 1; i++) PUT_LIT(w, "0");
            put(w, dig, (size_t)k);
        } else if (e >= k - 1) {
            put(w, dig, (size_t)k);
            for (int i = 0; i < e - (k - 1); i++) PUT_LIT(w, "0");
            PUT_LIT(w, ".0");
        } else {
            put(w, dig, (size_t)e + 1);
            PUT_LIT(w, ".");
            put(w, dig + e + 1, (size_t)(k - e - 1));
        }
    } else {
        put(w, dig, 1);
        if (k > 1) {
            PUT_LIT(w, ".");
            put(w, dig + 1, (size_t)k - 1);
        }
        snprintf(buf, sizeof buf, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
        put(w, buf, strlen(buf));
    }
}

/* Value node i of d (parsed from the `tn` bytes of text); returns the index after its subtree.
 * Integers keep their digits (Python's ints are exact), "-0" excepted. */
static uint32_t put_json_value(writer *w, const mj_doc *d, const char *text, size_t tn, uint32_t i)
{
    const mj_node *nd = mj_at(d, i);
    switch ((mj_type)nd->type) {
    case MJ_NULL: PUT_LIT(w, "null"); break;
    case MJ_FALSE: PUT_LIT(w, "false"); break;
    case MJ_TRUE: PUT_LIT(w, "true"); break;
    case MJ_STRING: put_json_string(w, mj_str(d, i), nd->count); break;
    case MJ_NUMBER: {
        const char *lex = text + nd->src;
        size_t n = 0;
        int integral = 1;
        for (; nd->src + n < tn && strchr("+-0123456789.eE", lex[n]) && lex[n]; n++) integral &= !strchr(".eE", lex[n]);
        if (!integral) put_py_float(w, nd->v.d);
        else if (n == 2 && lex[0] == '-' && lex[1] == '0') PUT_LIT(w, "0");
        else put(w, lex, n);
        break;
    }
    case MJ_ARRAY:
    case MJ_OBJECT: {
        const int obj = nd->type == MJ_OBJECT;
        put(w, obj ? "{" : "[", 1);
        for (uint32_t j = i + 1, first = 1; j < nd->end; first = 0) {
            if (!first) PUT_LIT(w, ", ");
            if (obj) {
                put_json_string(w, mj_str(d, j), mj_at(d, j)->count);
                PUT_LIT(w, ": ");
                j++;
            }
            j = put_json_value(w, d, text, tn, j);
        }
        put(w, obj ? "}" : "]", 1);
        break;
    }
    }
    return nd->end;
}

/* ---- tools and tool calls ---------------------------------------------------------------------- */
/* The Tools section of a system message: the "function" object of every tool, one per line. */
static dsv4_status put_tools(writer *w, const dsv4_chat_message *m)
{
    mj_doc d;
    DSV4_TRY(mj_parse(m->tools, m->tools_len, "tools", &d));
    PUT_LIT(w, "\n\n");
    PUT_LIT(w, tools_head);
    const mj_node *arr = mj_at(&d, 0);
    for (uint32_t j = 1, first = 1; j < arr->end; j = mj_at(&d, j)->end, first = 0) {
        if (!first) PUT_LIT(w, "\n");
        put_json_value(w, &d, m->tools, m->tools_len, mj_get(&d, j, "function"));
    }
    PUT_LIT(w, tools_tail);
    mj_free(&d);
    return DSV4_OK;
}

/* One call in DSML: a parameter per member of its arguments object. */
static dsv4_status put_tool_call(writer *w, const dsv4_tool_call *c)
{
    PUT_LIT(w, DSML "invoke name=\"");
    put(w, c->name, c->name_len);
    PUT_LIT(w, "\">\n");
    if (c->arguments_len) {
        mj_doc d;
        DSV4_TRY(mj_parse(c->arguments, c->arguments_len, "tool call arguments", &d));
        const mj_node *obj = mj_at(&d, 0);
        for (uint32_t j = 1, first = 1; j < obj->end; j = mj_at(&d, j + 1)->end, first = 0) {
            const int str = mj_at(&d, j + 1)->type == MJ_STRING;
            if (!first) PUT_LIT(w, "\n");
            PUT_LIT(w, DSML "parameter name=\"");
            put(w, mj_str(&d, j), mj_at(&d, j)->count);
            if (str) {
                PUT_LIT(w, "\" string=\"true\">");
                put(w, mj_str(&d, j + 1), mj_at(&d, j + 1)->count);
            } else {
                PUT_LIT(w, "\" string=\"false\">");
                put_json_value(w, &d, c->arguments, c->arguments_len, j + 1);
            }
            PUT_LIT(w, DSML_CLOSE "parameter>");
        }
        mj_free(&d);
    }
    PUT_LIT(w, "\n" DSML_CLOSE "invoke>");
    return DSV4_OK;
}

static int is_user_turn(dsv4_chat_role r) { return r == DSV4_ROLE_USER || r == DSV4_ROLE_TOOL; }

/* Order key of tool result t among the calls of the last assistant message before `at` that made
 * calls: the position of the (last) call with its id, 0 for none, as the reference's dict.get;
 * *any tells whether those calls carry ids at all. */
static size_t call_order(const dsv4_chat_message *m, size_t at, const dsv4_chat_message *t, int *any)
{
    size_t a = at;
    while (a > 0 && !(m[a - 1].role == DSV4_ROLE_ASSISTANT && m[a - 1].n_tool_calls)) a--;
    *any = 0;
    if (a == 0) return 0;
    const dsv4_chat_message *c = &m[a - 1];
    size_t key = 0;
    for (size_t i = 0; i < c->n_tool_calls; i++) {
        if (!c->tool_calls[i].id_len) continue;
        *any = 1;
        if (c->tool_calls[i].id_len == t->tool_call_id_len &&
            !memcmp(c->tool_calls[i].id, t->tool_call_id, t->tool_call_id_len))
            key = i;
    }
    return key;
}

/* The r-th tool result of the turn m[i0 .. i1) in the reference's order: a stable sort by call
 * order when the turn has two or more results and the calls carry ids; as given otherwise. */
static const dsv4_chat_message *nth_result(const dsv4_chat_message *m, size_t i0, size_t i1, size_t r)
{
    size_t count = 0;
    int any = 0;
    for (size_t i = i0; i < i1; i++) count += m[i].role == DSV4_ROLE_TOOL;
    call_order(m, i0, &m[i0], &any);
    for (size_t i = i0, seen = 0; i < i1; i++) {
        if (m[i].role != DSV4_ROLE_TOOL) continue;
        size_t rank = seen++;
        if (count > 1 && any) {
            int unused;
            const size_t ki = call_order(m, i0, &m[i], &unused);
            rank = 0;
            for (size_t j = i0; j < i1; j++) {
                if (m[j].role != DSV4_ROLE_TOOL || j == i) continue;
                const size_t kj = call_order(m, i0, &m[j], &unused);
                rank += kj < ki || (kj == ki && j < i);
            }
        }
        if (rank == r) return &m[i];
    }
    return &m[i0]; /* not reached: the ranks of the turn's results are 0 .. count-1 */
}

static dsv4_status render(const dsv4_chat_message *m, size_t n, const dsv4_prompt_options *opt, writer *w)
{
    int has_tools = 0;
    for (size_t i = 0; i < n; i++) has_tools |= m[i].tools_len > 0;
    /* a conversation with tools keeps all reasoning, as the reference does */
    const int thinking = opt->mode == DSV4_PROMPT_THINKING, drop = thinking && !opt->keep_reasoning && !has_tools;
    size_t last_user = (size_t)-1;
    for (size_t i = 0; i < n; i++)
        if (is_user_turn(m[i].role)) last_user = i;
    PUT_LIT(w, bos);
    for (size_t i = 0; i < n; i++) {
        switch (m[i].role) {
        case DSV4_ROLE_SYSTEM:
            put(w, m[i].content, m[i].content_len);
            if (m[i].tools_len) DSV4_TRY(put_tools(w, &m[i]));
            break;
        case DSV4_ROLE_USER:
        case DSV4_ROLE_TOOL: { /* one user turn: this message and the user and tool ones after it */
            size_t i1 = i + 1, results = 0;
            while (i1 < n && is_user_turn(m[i1].role)) i1++;
            PUT_LIT(w, user_tag);
            for (size_t j = i; j < i1; j++) {
                if (j > i) PUT_LIT(w, "\n\n");
                if (m[j].role == DSV4_ROLE_USER) {
                    put(w, m[j].content, m[j].content_len);
                } else {
                    const dsv4_chat_message *t = nth_result(m, i, i1, results++);
                    PUT_LIT(w, tool_result_open);
                    put(w, t->content, t->content_len);
                    PUT_LIT(w, tool_result_close);
                }
            }
            i = i1 - 1;
            break;
        }
        case DSV4_ROLE_ASSISTANT:
            /* reasoning survives only in thinking mode, and with dropping only after the last user turn */
            if (thinking && (!drop || last_user == (size_t)-1 || i > last_user)) {
                put(w, m[i].reasoning, m[i].reasoning_len);
                PUT_LIT(w, think_end);
            }
            put(w, m[i].content, m[i].content_len);
            if (m[i].n_tool_calls) {
                PUT_LIT(w, "\n\n" DSML "tool_calls>\n");
                for (size_t c = 0; c < m[i].n_tool_calls; c++) {
                    if (c) PUT_LIT(w, "\n");
                    DSV4_TRY(put_tool_call(w, &m[i].tool_calls[c]));
                }
                PUT_LIT(w, "\n" DSML_CLOSE "tool_calls>");
            }
            PUT_LIT(w, eos);
            break;
        }
        /* a user turn that the end or an assistant turn follows opens the assistant's turn */
        int opens = is_user_turn(m[i].role) && (i + 1 == n || m[i + 1].role == DSV4_ROLE_ASSISTANT);
        if (opens) {
            PUT_LIT(w, assistant_tag);
            if (thinking && (!drop || i >= last_user)) PUT_LIT(w, think_start);
            else PUT_LIT(w, think_end);
        }
    }
    return DSV4_OK;
}

/* JSON text that must parse and be of type `type`; a tools array must hold tools with a
 * "function" object. */
static dsv4_status check_json(const char *op, size_t i, const char *what, const char *text, size_t len, mj_type type)
{
    mj_doc d;
    char name[96];
    snprintf(name, sizeof name, "%s: message %zu: %s", op, i, what);
    DSV4_TRY(mj_parse(text, len, name, &d));
    dsv4_status s = DSV4_OK;
    if (mj_at(&d, 0)->type != type) {
        s = dsv4_fail(DSV4_ERR_INVALID_ARG, "%s is a JSON %s, not %s", name, mj_type_name((mj_type)mj_at(&d, 0)->type),
                      mj_type_name(type));
    } else if (type == MJ_ARRAY) {
        for (uint32_t j = 1; j < mj_at(&d, 0)->end && !s; j = mj_at(&d, j)->end) {
            uint32_t f = mj_get(&d, j, "function");
            if (f == MJ_NONE || mj_at(&d, f)->type != MJ_OBJECT)
                s = dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: tool %u has no \"function\" object", name, j);
        }
    }
    mj_free(&d);
    return s;
}

/* Checks the messages and the options; *optp NULL becomes the defaults (chat mode). */
static dsv4_status check_messages(const char *op, const dsv4_chat_message *m, size_t n, const dsv4_prompt_options **optp)
{
    static const dsv4_prompt_options defaults = {0};
    if (!*optp) *optp = &defaults;
    const dsv4_prompt_options *opt = *optp;
    DSV4_CHECK_ARG(m || !n, "%s: null pointer", op);
    DSV4_CHECK_ARG(opt->mode == DSV4_PROMPT_CHAT || opt->mode == DSV4_PROMPT_THINKING, "%s: mode %d is not chat (0) or thinking (1)",
                   op, (int)opt->mode);
    for (size_t i = 0; i < n; i++) {
        const dsv4_chat_message *x = &m[i];
        DSV4_CHECK_ARG((unsigned)x->role <= DSV4_ROLE_TOOL, "%s: message %zu has role %d (system 0, user 1, assistant 2, tool 3)", op,
                       i, (int)x->role);
        DSV4_CHECK_ARG(x->content || !x->content_len, "%s: message %zu: null content of %zu bytes", op, i, x->content_len);
        DSV4_CHECK_ARG(x->reasoning || !x->reasoning_len, "%s: message %zu: null reasoning of %zu bytes", op, i, x->reasoning_len);
        DSV4_CHECK_ARG(!x->reasoning_len || x->role == DSV4_ROLE_ASSISTANT, "%s: message %zu: only assistant messages carry reasoning",
                       op, i);
        DSV4_CHECK_ARG(x->tools || !x->tools_len, "%s: message %zu: null tools of %zu bytes", op, i, x->tools_len);
        DSV4_CHECK_ARG(!x->tools_len || x->role == DSV4_ROLE_SYSTEM, "%s: message %zu: only system messages carry tools", op, i);
        DSV4_CHECK_ARG(x->tool_calls || !x->n_tool_calls, "%s: message %zu: null tool_calls", op, i);
        DSV4_CHECK_ARG(!x->n_tool_calls || x->role == DSV4_ROLE_ASSISTANT, "%s: message %zu: only assistant messages carry tool calls",
                       op, i);
        DSV4_CHECK_ARG(x->tool_call_id || !x->tool_call_id_len, "%s: message %zu: null tool_call_id", op, i);
        DSV4_CHECK_ARG(!x->tool_call_id_len || x->role == DSV4_ROLE_TOOL, "%s: message %zu: only tool messages answer a call", op, i);
        if (x->tools_len) DSV4_TRY(check_json(op, i, "tools", x->tools, x->tools_len, MJ_ARRAY));
        for (size_t c = 0; c < x->n_tool_calls; c++) {
            const dsv4_tool_call *t = &x->tool_calls[c];
            DSV4_CHECK_ARG((t->name || !t->name_len) && (t->id || !t->id_len) && (t->arguments || !t->arguments_len),
                           "%s: message %zu: tool call %zu: null pointer", op, i, c);
            DSV4_CHECK_ARG(t->name_len, "%s: message %zu: tool call %zu has no name", op, i, c);
            if (t->arguments_len) DSV4_TRY(check_json(op, i, "tool call arguments", t->arguments, t->arguments_len, MJ_OBJECT));
        }
    }
    return DSV4_OK;
}

dsv4_status dsv4_prompt_render(const dsv4_chat_message *msgs, size_t n_msgs, const dsv4_prompt_options *opt, char *out, size_t cap,
                               size_t *len)
{
    const char *op = "prompt_render";
    DSV4_CHECK_ARG(len, "%s: null pointer", op);
    DSV4_TRY(check_messages(op, msgs, n_msgs, &opt));
    writer w = {NULL, 0};
    DSV4_TRY(render(msgs, n_msgs, opt, &w));
    if (out) {
        if (cap < w.n) return dsv4_fail(DSV4_ERR_CAPACITY, "%s: %zu bytes do not fit in a buffer of %zu", op, w.n, cap);
        w = (writer){out, 0};
        DSV4_TRY(render(msgs, n_msgs, opt, &w));
    }
    *len = w.n;
    return DSV4_OK;
}

dsv4_status dsv4_prompt_encode(dsv4_tokenizer *tok, const dsv4_chat_message *msgs, size_t n_msgs, const dsv4_prompt_options *opt,
                               int32_t *ids, size_t cap, size_t *n_ids)
{
    const char *op = "prompt_encode";
    DSV4_CHECK_ARG(tok && n_ids, "%s: null pointer", op);
    DSV4_TRY(check_messages(op, msgs, n_msgs, &opt));
    writer w = {NULL, 0};
    DSV4_TRY(render(msgs, n_msgs, opt, &w));
    char *text = malloc(w.n ? w.n : 1);
    if (!text) return dsv4_fail(DSV4_ERR_NO_MEMORY, "%s: out of memory for a %zu-byte prompt", op, w.n);
    w = (writer){text, 0};
    dsv4_status rs = render(msgs, n_msgs, opt, &w);
    if (rs) {
        free(text);
        return rs;
    }
    pthread_mutex_lock(&tok->lock);
    dsv4_status s = tok_encode_locked(tok, text, w.n, 0, ids, cap, n_ids);
    pthread_mutex_unlock(&tok->lock);
    free(text);
    return s;
}

/* ---- reading a completion (parse_message_from_completion_text) ------------------------------- */
typedef struct {
    const char *t;
    size_t n, i; /* text, length, read position */
} reader;

/* Read up to the earliest of the stops (NUL-terminated; n_stops of them): the text before it in
 * *seg / *seg_n, the position moves past it; returns the stop's index, or -1 (then everything
 * left was read). */
static int read_until(reader *r, const char *const *stops, int n_stops, const char **seg, size_t *seg_n)
{
    size_t best = r->n;
    int which = -1;
    for (int s = 0; s < n_stops; s++) {
        const size_t sl = strlen(stops[s]);
        for (size_t p = r->i; p + sl <= r->n && p < best; p++)
            if (!memcmp(r->t + p, stops[s], sl)) {
                best = p;
                which = s;
                break;
            }
    }
    *seg = r->t + r->i;
    *seg_n = best - r->i;
    r->i = which < 0 ? r->n : best + strlen(stops[which]);
    return which;
}

static int seg_is(const char *s, size_t n, const char *lit) { return n == strlen(lit) && !memcmp(s, lit, n); }
static int seg_has(const char *s, size_t n, const char *lit)
{
    const size_t l = strlen(lit);
    for (size_t p = 0; p + l <= n; p++)
        if (!memcmp(s + p, lit, l)) return 1;
    return 0;
}

#define BAD(...) dsv4_fail(DSV4_ERR_FORMAT, "completion_parse: " __VA_ARGS__)

/* One <｜DSML｜invoke ...> ... </｜DSML｜invoke> (the reader is past "<｜DSML｜invoke"): writes
 * {"type": "function", "function": {"name": ..., "arguments": "..."}}; the arguments text is
 * {"KEY": VALUE, ...} with string parameters quoted and the others as the model wrote them. */
static dsv4_status parse_invoke(reader *r, writer *w)
{
    static const char *const name_stops[] = {DSML "parameter", DSML_CLOSE "invoke"};
    static const char *const param_end[] = {"/" FW_BAR "DSML" FW_BAR "parameter"};
    const char *s;
    size_t n;
    int stop = read_until(r, name_stops, 2, &s, &n);
    /* ^\s*name="(.*?)">\n$ : the name runs to a final ">\n (a "\n" may follow, as $ allows) */
    while (n && (*s == ' ' || (*s >= '\t' && *s <= '\r'))) s++, n--;
    size_t tail = n >= 4 && !memcmp(s + n - 4, "\">\n\n", 4) ? 4 : 3;
    if (stop < 0 || n < 6 + tail || memcmp(s, "name=\"", 6) || memcmp(s + n - tail, "\">\n", 3))
        return BAD("tool name format error: '%.*s'", (int)(n < 80 ? n : 80), s);
    const char *name = s + 6;
    const size_t name_n = n - 6 - tail;
    /* the arguments text, built in a scratch writer (measured first) then quoted into w */
    writer args[2] = {{NULL, 0}, {NULL, 0}};
    dsv4_status st = DSV4_OK;
    struct span {
        const char *s;
        size_t n;
    } *keys = NULL;
    int nkeys_cap = 0;
    reader r0 = *r;
    int stop0 = stop;
    for (int pass = 0; pass < 2 && !st; pass++) {
        if (pass) {
            args[1].out = malloc(args[0].n + 1);
            if (!args[1].out) {
                free(keys);
                return dsv4_fail(DSV4_ERR_NO_MEMORY, "completion_parse: out of memory");
            }
            *r = r0;
            stop = stop0;
        }
        writer *aw = &args[pass];
        PUT_LIT(aw, "{");
        int count = 0;
        while (stop == 0 && !st) { /* <｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>\n */
            if (read_until(r, param_end, 1, &s, &n) < 0) {
                st = BAD("a parameter without its end");
                break;
            }
            /* ^ name="(.*?)" string="(true|false)">(.*?)<$ */
            const char *k = s + 7, *v = NULL;
            int is_str = 0;
            if (n >= 8 && !memcmp(s, " name=\"", 7) && s[n - 1] == '<') {
                for (const char *p = k; p + 16 <= s + n - 1; p++) {
                    if (!memcmp(p, "\" string=\"true\">", 16)) {
                        v = p + 16;
                        is_str = 1;
                    } else if (p + 17 <= s + n - 1 && !memcmp(p, "\" string=\"false\">", 17)) {
                        v = p + 17;
                    }
                    if (v) break;
                }
            }
            if (!v) {
                st = BAD("parameter format error: '%.*s'", (int)(n < 80 ? n : 80), s);
                break;
            }
            const char *kend = v - (is_str ? 16 : 17);
            const size_t vn = (size_t)(s + n - 1 - v);
            if (pass == 0) { /* a repeated name: the reference refuses it */
                const size_t kn = (size_t)(kend - k);
                for (int q = 0; q < count && !st; q++)
                    if (keys[q].n == kn && !memcmp(keys[q].s, k, kn))
                        st = BAD("duplicate parameter name '%.*s'", (int)(kn < 80 ? kn : 80), k);
                if (st) break;
                if (count == nkeys_cap) {
                    void *grown = realloc(keys, sizeof *keys * (nkeys_cap = nkeys_cap ? 2 * nkeys_cap : 8));
                    if (!grown) {
                        st = dsv4_fail(DSV4_ERR_NO_MEMORY, "completion_parse: out of memory");
                        break;
                    }
                    keys = grown;
                }
                keys[count] = (struct span){k, kn};
            }
            if (count++) PUT_LIT(aw, ", ");
            put_json_string(aw, k, (size_t)(kend - k));
            PUT_LIT(aw, ": ");
            if (is_str) put_json_string(aw, v, vn);
            else put(aw, v, vn);
            stop = read_until(r, name_stops, 2, &s, &n);
            if (!seg_is(s, n, ">\n")) st = BAD("parameter format error: expected '>\\n' after a parameter");
        }
        PUT_LIT(aw, "}");
        if (!st && stop != 1) st = BAD("an invoke without its end");
    }
    if (!st) {
        PUT_LIT(w, "{\"type\": \"function\", \"function\": {\"name\": ");
        put_json_string(w, name, name_n);
        PUT_LIT(w, ", \"arguments\": ");
        put_json_string(w, args[1].out, args[1].n);
        PUT_LIT(w, "}}");
    }
    free(args[1].out);
    free(keys);
    return st;
}

static dsv4_status parse_completion(const char *text, size_t len, int thinking, writer *w)
{
    static const char *const think_stops[] = {"</think>", "\n\n" DSML "tool_calls"};
    static const char *const content_stops[] = {"<" FW_BAR "end" LOW_BAR "of" LOW_BAR "sentence" FW_BAR ">",
                                                "\n\n" DSML "tool_calls"};
    static const char *const calls_stops[] = {DSML "invoke", DSML_CLOSE "tool_calls>"};
    static const char *const specials[] = {"<" FW_BAR "begin" LOW_BAR "of" LOW_BAR "sentence" FW_BAR ">",
                                           "<" FW_BAR "end" LOW_BAR "of" LOW_BAR "sentence" FW_BAR ">", "<think>",
                                           "</think>", FW_BAR "DSML" FW_BAR};
    reader r = {text, len, 0};
    const char *reasoning = "", *content, *s;
    size_t reasoning_n = 0, content_n, n;
    if (thinking && read_until(&r, think_stops, 2, &reasoning, &reasoning_n) != 0)
        return BAD("invalid thinking format: missing </think>");
    int stop = read_until(&r, content_stops, 2, &content, &content_n);
    if (stop < 0) return BAD("missing the end-of-sentence token");
    for (int k = 0; k < 5; k++)
        if (seg_has(content, content_n, specials[k]) || seg_has(reasoning, reasoning_n, specials[k]))
            return BAD("special token '%s' inside the content or the reasoning", specials[k]);
    PUT_LIT(w, "{\"role\": \"assistant\", \"content\": ");
    put_json_string(w, content, content_n);
    PUT_LIT(w, ", \"reasoning_content\": ");
    put_json_string(w, reasoning, reasoning_n);
    PUT_LIT(w, ", \"tool_calls\": [");
    if (stop == 1) { /* "\n\n<｜DSML｜tool_calls" then invokes, "</｜DSML｜tool_calls>", EOS */
        for (int calls = 0;; calls++) {
            stop = read_until(&r, calls_stops, 2, &s, &n);
            if (!seg_is(s, n, ">\n")) return BAD("tool call format error: expected '>\\n'");
            if (stop == 1) break;
            if (stop < 0) return BAD("tool calls without their end");
            if (calls) PUT_LIT(w, ", ");
            DSV4_TRY(parse_invoke(&r, w));
        }
        read_until(&r, content_stops, 1, &s, &n); /* the end-of-sentence token (or the end of the text) */
        if (n) return BAD("unexpected text after the tool calls");
    }
    if (r.i != len) return BAD("unexpected text after the end-of-sentence token");
    PUT_LIT(w, "]}");
    return DSV4_OK;
}
#undef BAD

dsv4_status dsv4_completion_parse(const char *text, size_t len, dsv4_prompt_mode mode, char *out, size_t cap, size_t *out_len)
{
    DSV4_CHECK_ARG(out_len && (text || !len), "completion_parse: null pointer");
    DSV4_CHECK_ARG(mode == DSV4_PROMPT_CHAT || mode == DSV4_PROMPT_THINKING, "completion_parse: mode %d is not chat (0) or thinking (1)",
                   (int)mode);
    writer w = {NULL, 0};
    DSV4_TRY(parse_completion(text, len, mode == DSV4_PROMPT_THINKING, &w));
    if (out) {
        if (cap < w.n) return dsv4_fail(DSV4_ERR_CAPACITY, "completion_parse: %zu bytes do not fit in a buffer of %zu", w.n, cap);
        w = (writer){out, 0};
        DSV4_TRY(parse_completion(text, len, mode == DSV4_PROMPT_THINKING, &w));
    }
    *out_len = w.n;
    return DSV4_OK;
}
