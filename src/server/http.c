/* The HTTP side of `dsv4 serve` (docs/server.md): libmicrohttpd, one thread per connection; JSON
 * through cJSON. Requests are checked field by field (400 naming the field), turned into a job,
 * and answered from the tokens the engine thread hands back, as one JSON object or as SSE. */
#define _GNU_SOURCE /* POLLRDHUP: a client that hung up */
#include "server/output.h"
#include "server/server.h"

#include "tokenizer/utf8.h"

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { RING_CAP = 256, MAX_STOP = 4, EP_CHAT = 0, EP_COMPLETIONS = 1, EP_OTHER = 2 };

typedef struct srv_server {
    srv_options o;
    dsv4_engine *e;
    const dsv4_model_config *cfg;
    int64_t max_context;
    dsv4_tokenizer *tok;
    srv_sched *sched;
    srv_metrics m;
    struct MHD_Daemon *d;
    char model_id[256];
    time_t created;
    atomic_int stopping;
    atomic_ullong counter;
} srv_server;

typedef struct conn_ctx {
    srv_buf body;
    int too_big;
    int endpoint;
} conn_ctx;

/* ---- responses --------------------------------------------------------------------------------- */
static int status_class(unsigned code)
{
    if (code < 300) return 0;
    if (code == 400) return 1;
    if (code == 413) return 2;
    if (code == 503) return 3;
    return code < 500 ? 4 : 5;
}

static void count(srv_server *S, int endpoint, unsigned code)
{
    pthread_mutex_lock(&S->m.mu);
    S->m.requests[endpoint][status_class(code)]++;
    pthread_mutex_unlock(&S->m.mu);
}

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned code, const char *type, char *text, size_t len,
                                 int retry_after)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    if (retry_after) MHD_add_response_header(r, "Retry-After", "1");
    enum MHD_Result res = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return res;
}

static enum MHD_Result send_json(srv_server *S, conn_ctx *cc, struct MHD_Connection *c, unsigned code, cJSON *j)
{
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!s) return MHD_NO;
    count(S, cc ? cc->endpoint : EP_OTHER, code);
    return send_text(c, code, "application/json", s, strlen(s), code == 503);
}

/* An OpenAI error object: {"error": {"message", "type", "param", "code"}}. */
static enum MHD_Result send_error(srv_server *S, conn_ctx *cc, struct MHD_Connection *c, unsigned code, const char *param,
                                  const char *code_name, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static enum MHD_Result send_error(srv_server *S, conn_ctx *cc, struct MHD_Connection *c, unsigned code, const char *param,
                                  const char *code_name, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    srv_buf clean = {0};
    srv_utf8_clean(msg, strlen(msg), &clean);
    cJSON *root = cJSON_CreateObject(), *err = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(err, "message", clean.p ? clean.p : "error");
    srv_buf_free(&clean);
    cJSON_AddStringToObject(err, "type", code == 503 ? "server_busy" : code >= 500 ? "server_error" : "invalid_request_error");
    if (param) cJSON_AddStringToObject(err, "param", param);
    else cJSON_AddNullToObject(err, "param");
    if (code_name) cJSON_AddStringToObject(err, "code", code_name);
    else cJSON_AddNullToObject(err, "code");
    return send_json(S, cc, c, code, root);
}

/* A string for JSON output: ill-formed UTF-8 (a token cut inside a character) becomes U+FFFD. */
static cJSON *add_text(cJSON *obj, const char *key, const char *s, size_t n)
{
    srv_buf b = {0};
    if (srv_utf8_clean(s, n, &b)) return NULL;
    cJSON *r = cJSON_AddStringToObject(obj, key, b.p ? b.p : "");
    srv_buf_free(&b);
    return r;
}

/* ---- request fields -------------------------------------------------------------------------------- */
typedef struct req {
    int chat, stream, include_usage, thinking, has_tools, logprobs, top_logprobs, ignore_eos;
    int64_t max_tokens;
    dsv4_sampling sampling;
    const char *stop[MAX_STOP];
    int n_stop;
    int32_t *ids;
    int64_t n_ids;
    int32_t *forced;
    int64_t n_forced;
} req;

typedef struct bad {
    const char *param;
    char msg[400];
} bad;

/* Records what is wrong with which field; returns -1. */
static int BAD(bad *b, const char *field, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int BAD(bad *b, const char *field, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->msg, sizeof b->msg, fmt, ap);
    va_end(ap);
    b->param = field;
    return -1;
}

static int get_int(const cJSON *root, const char *key, int64_t lo, int64_t hi, int64_t *v, bad *b)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!x || cJSON_IsNull(x)) return 0;
    if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < (double)lo ||
        x->valuedouble > (double)hi)
        return BAD(b, key, "'%s' must be an integer in [%lld, %lld]", key, (long long)lo, (long long)hi);
    *v = (int64_t)x->valuedouble;
    return 1;
}

static int get_num(const cJSON *root, const char *key, double lo, double hi, double *v, bad *b)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!x || cJSON_IsNull(x)) return 0;
    if (!cJSON_IsNumber(x) || !(x->valuedouble >= lo && x->valuedouble <= hi))
        return BAD(b, key, "'%s' must be a number in [%g, %g]", key, lo, hi);
    *v = x->valuedouble;
    return 1;
}

static int get_bool(const cJSON *root, const char *key, int *v, bad *b)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!x || cJSON_IsNull(x)) return 0;
    if (!cJSON_IsBool(x)) return BAD(b, key, "'%s' must be a boolean", key);
    *v = cJSON_IsTrue(x);
    return 1;
}

static int get_ids(const cJSON *arr, const char *key, int64_t vocab, int32_t **ids, int64_t *n, bad *b)
{
    int64_t k = cJSON_GetArraySize(arr);
    int32_t *v = malloc((size_t)(k ? k : 1) * sizeof *v);
    if (!v) return BAD(b, key, "out of memory");
    int64_t i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, arr)
    {
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < 0 || x->valuedouble >= (double)vocab) {
            free(v);
            return BAD(b, key, "'%s' must be an array of token ids in [0, %lld)", key, (long long)vocab);
        }
        v[i++] = (int32_t)x->valuedouble;
    }
    *ids = v;
    *n = i;
    return 0;
}

/* The fields both endpoints share. */
static int parse_common(srv_server *S, const cJSON *root, req *r, bad *b)
{
    int64_t v = 0;
    double d = 0;
    int rc;
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (x && !cJSON_IsString(x)) return BAD(b, "model", "'model' must be a string");
    r->max_tokens = S->o.max_tokens_default;
    if ((rc = get_int(root, "max_tokens", 1, 1 << 24, &v, b)) < 0) return -1;
    if (rc) r->max_tokens = v;
    if ((rc = get_int(root, "max_completion_tokens", 1, 1 << 24, &v, b)) < 0) return -1;
    if (rc) r->max_tokens = v;
    r->sampling.temperature = 1.0f;
    r->sampling.top_p = 1.0f;
    if ((rc = get_num(root, "temperature", 0.0, 2.0, &d, b)) < 0) return -1;
    if (rc) r->sampling.temperature = (float)d;
    if ((rc = get_num(root, "top_p", 1e-9, 1.0, &d, b)) < 0) return -1;
    if (rc) r->sampling.top_p = (float)d;
    if ((rc = get_int(root, "seed", INT64_MIN / 2, INT64_MAX / 2, &v, b)) < 0) return -1;
    if (rc) r->sampling.seed = (uint64_t)v;
    else r->sampling.seed = (uint64_t)time(NULL) ^ (atomic_fetch_add(&S->counter, 1) * 0x9E3779B97F4A7C15ull);
    if ((rc = get_int(root, "n", 1, 1, &v, b)) < 0) return BAD(b, "n", "'n': only 1 choice per request is served");
    for (const char *const *k = (const char *const[]){"presence_penalty", "frequency_penalty", NULL}; *k; k++)
        if ((rc = get_num(root, *k, 0.0, 0.0, &d, b)) < 0) return BAD(b, *k, "'%s': only 0 is supported", *k);
    if (get_bool(root, "stream", &r->stream, b) < 0) return -1;
    if (get_bool(root, "ignore_eos", &r->ignore_eos, b) < 0) return -1;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so)) return BAD(b, "stream_options", "'stream_options' must be an object");
        if (get_bool(so, "include_usage", &r->include_usage, b) < 0) return BAD(b, "stream_options.include_usage", "'include_usage' must be a boolean");
    }
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(root, "stop");
    if (cJSON_IsString(st)) {
        if (st->valuestring[0]) r->stop[r->n_stop++] = st->valuestring;
    } else if (cJSON_IsArray(st)) {
        if (cJSON_GetArraySize(st) > MAX_STOP) return BAD(b, "stop", "'stop' takes at most %d strings", MAX_STOP);
        cJSON_ArrayForEach(x, st)
        {
            if (!cJSON_IsString(x)) return BAD(b, "stop", "'stop' must be a string or an array of strings");
            if (x->valuestring[0]) r->stop[r->n_stop++] = x->valuestring;
        }
    } else if (st && !cJSON_IsNull(st)) {
        return BAD(b, "stop", "'stop' must be a string or an array of strings");
    }
    if (r->n_stop && !S->tok) return BAD(b, "stop", "'stop' needs the model's tokenizer, which this server has not loaded");
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, "dsv4_forced_tokens");
    if (f) {
        if (!S->o.test_hooks) return BAD(b, "dsv4_forced_tokens", "'dsv4_forced_tokens' is a test hook (serve --test-hooks)");
        if (!cJSON_IsArray(f)) return BAD(b, "dsv4_forced_tokens", "'dsv4_forced_tokens' must be an array of token ids");
        if (get_ids(f, "dsv4_forced_tokens", S->cfg->vocab_size, &r->forced, &r->n_forced, b)) return -1;
    }
    return 0;
}

/* content: a string, null, or an array of {"type": "text", "text": ...} parts (joined). */
static int get_content(const cJSON *m, const char *where, srv_buf *out, bad *b)
{
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content"), *p;
    if (!c || cJSON_IsNull(c)) return 0;
    if (cJSON_IsString(c)) return srv_buf_add(out, c->valuestring, strlen(c->valuestring)) ? BAD(b, where, "out of memory") : 0;
    if (!cJSON_IsArray(c)) return BAD(b, where, "'%s' must be a string or an array of text parts", where);
    cJSON_ArrayForEach(p, c)
    {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "type"), *tx = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsString(t) || strcmp(t->valuestring, "text") || !cJSON_IsString(tx))
            return BAD(b, where, "'%s': only parts of type \"text\" are supported", where);
        if (srv_buf_add(out, tx->valuestring, strlen(tx->valuestring))) return BAD(b, where, "out of memory");
    }
    return 0;
}

typedef struct chat_in {
    dsv4_chat_message *msgs;
    srv_buf *texts; /* owned content of each message */
    dsv4_tool_call *calls;
    char **call_args;
    size_t n_msgs, n_texts, n_calls;
    char *tools_json;
} chat_in;

static void chat_in_free(chat_in *ci)
{
    for (size_t i = 0; ci->texts && i < ci->n_texts; i++) srv_buf_free(&ci->texts[i]);
    for (size_t i = 0; ci->call_args && i < ci->n_calls; i++) free(ci->call_args[i]);
    free(ci->texts);
    free(ci->msgs);
    free(ci->calls);
    free(ci->call_args);
    free(ci->tools_json);
}

static int parse_thinking(const cJSON *root, int *thinking, bad *b)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "thinking");
    if (t && !cJSON_IsNull(t)) { /* DeepSeek's API: {"type": "enabled" | "disabled"} */
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(t, "type");
        if (!cJSON_IsObject(t) || !cJSON_IsString(ty) || (strcmp(ty->valuestring, "enabled") && strcmp(ty->valuestring, "disabled")))
            return BAD(b, "thinking", "'thinking' must be {\"type\": \"enabled\"} or {\"type\": \"disabled\"}");
        *thinking = !strcmp(ty->valuestring, "enabled");
    }
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(root, "chat_template_kwargs");
    if (k && !cJSON_IsNull(k)) {
        if (!cJSON_IsObject(k)) return BAD(b, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
        if (get_bool(k, "thinking", thinking, b) < 0) return BAD(b, "chat_template_kwargs.thinking", "'thinking' must be a boolean");
    }
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(root, "reasoning_effort");
    if (re && !cJSON_IsNull(re)) {
        if (!cJSON_IsString(re)) return BAD(b, "reasoning_effort", "'reasoning_effort' must be a string");
        *thinking = strcmp(re->valuestring, "none") != 0;
    }
    return 0;
}

/* messages, tools, tool_choice -> the prompt's ids. */
static int parse_chat(srv_server *S, const cJSON *root, req *r, bad *b)
{
    if (!S->tok) return BAD(b, "messages", "chat completions need the model's tokenizer (tokenizer.json), which this server has not loaded");
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages"), *m;
    if (!cJSON_IsArray(msgs) || !cJSON_GetArraySize(msgs)) return BAD(b, "messages", "'messages' must be a non-empty array");
    if (parse_thinking(root, &r->thinking, b)) return -1;
    int lp = 0;
    if (get_bool(root, "logprobs", &lp, b) < 0) return -1;
    int64_t top = 0;
    if (get_int(root, "top_logprobs", 0, SRV_TOP_MAX, &top, b) < 0) return -1;
    r->logprobs = lp;
    r->top_logprobs = lp ? (int)top : -1;

    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools"), *tc = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    int use_tools = 0;
    const char *only = NULL; /* tool_choice naming one function: only that one is offered */
    if (tools && !cJSON_IsNull(tools)) {
        if (!cJSON_IsArray(tools)) return BAD(b, "tools", "'tools' must be an array");
        const cJSON *t;
        cJSON_ArrayForEach(t, tools)
        {
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(t, "type"), *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
            if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "function") || !cJSON_IsObject(fn) || !cJSON_IsString(nm) || !nm->valuestring[0])
                return BAD(b, "tools", "'tools': every tool must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
        }
        use_tools = cJSON_GetArraySize(tools) > 0;
    }
    if (tc && !cJSON_IsNull(tc)) {
        if (cJSON_IsString(tc)) {
            if (!strcmp(tc->valuestring, "none")) use_tools = 0;
            else if (strcmp(tc->valuestring, "auto") && strcmp(tc->valuestring, "required"))
                return BAD(b, "tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or a function");
        } else {
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function"), *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
            if (!cJSON_IsString(nm)) return BAD(b, "tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or a function");
            only = nm->valuestring;
        }
        if (use_tools == 0 && only) return BAD(b, "tool_choice", "'tool_choice' names a function but 'tools' is empty");
    }
    r->has_tools = use_tools;

    chat_in ci = {0};
    size_t n = (size_t)cJSON_GetArraySize(msgs), n_calls = 0;
    cJSON_ArrayForEach(m, msgs) n_calls += (size_t)cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(m, "tool_calls"));
    ci.msgs = calloc(n + 1, sizeof *ci.msgs);
    ci.texts = calloc(n, sizeof *ci.texts);
    ci.n_texts = ci.texts ? n : 0;
    ci.calls = calloc(n_calls + 1, sizeof *ci.calls);
    ci.call_args = calloc(n_calls + 1, sizeof *ci.call_args);
    int rc = -1;
    if (!ci.msgs || !ci.texts || !ci.calls || !ci.call_args) {
        BAD(b, "messages", "out of memory");
        goto done;
    }
    if (use_tools) {
        cJSON *list = cJSON_CreateArray();
        const cJSON *t;
        cJSON_ArrayForEach(t, tools)
        {
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "name");
            if (!only || !strcmp(only, nm->valuestring)) cJSON_AddItemToArray(list, cJSON_Duplicate(t, 1));
        }
        if (!cJSON_GetArraySize(list)) {
            cJSON_Delete(list);
            BAD(b, "tool_choice", "'tool_choice' names a function that is not in 'tools'");
            goto done;
        }
        ci.tools_json = cJSON_PrintUnformatted(list);
        cJSON_Delete(list);
    }
    size_t k = 0, i = 0; /* k: the prompt's messages (one more with a system message for the tools), i: the request's */
    int first = 1;
    cJSON_ArrayForEach(m, msgs)
    {
        char where[64];
        snprintf(where, sizeof where, "messages[%zu]", i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
            BAD(b, "messages", "'%s' must be an object with a string 'role'", where);
            goto done;
        }
        dsv4_chat_message *x = &ci.msgs[k];
        const char *ro = role->valuestring;
        if (!strcmp(ro, "system") || !strcmp(ro, "developer")) x->role = DSV4_ROLE_SYSTEM;
        else if (!strcmp(ro, "user")) x->role = DSV4_ROLE_USER;
        else if (!strcmp(ro, "assistant")) x->role = DSV4_ROLE_ASSISTANT;
        else if (!strcmp(ro, "tool")) x->role = DSV4_ROLE_TOOL;
        else {
            BAD(b, "messages", "'%s.role' must be system, developer, user, assistant or tool", where);
            goto done;
        }
        if (get_content(m, "messages", &ci.texts[i], b)) goto done;
        x->content = ci.texts[i].p;
        x->content_len = ci.texts[i].n;
        i++;
        if (first && use_tools && x->role != DSV4_ROLE_SYSTEM) { /* the tools go to a system message */
            memmove(&ci.msgs[1], &ci.msgs[0], sizeof *x);
            x = &ci.msgs[1];
            ci.msgs[0] = (dsv4_chat_message){.role = DSV4_ROLE_SYSTEM};
            k++;
        }
        if (first && use_tools) {
            ci.msgs[0].tools = ci.tools_json;
            ci.msgs[0].tools_len = strlen(ci.tools_json);
        }
        first = 0;
        if (x->role == DSV4_ROLE_ASSISTANT) {
            const cJSON *rc2 = cJSON_GetObjectItemCaseSensitive(m, "reasoning_content");
            if (cJSON_IsString(rc2)) x->reasoning = rc2->valuestring, x->reasoning_len = strlen(rc2->valuestring);
            const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls"), *c;
            if (calls && !cJSON_IsNull(calls)) {
                if (!cJSON_IsArray(calls)) {
                    BAD(b, "messages", "'%s.tool_calls' must be an array", where);
                    goto done;
                }
                x->tool_calls = &ci.calls[ci.n_calls];
                cJSON_ArrayForEach(c, calls)
                {
                    const cJSON *id = cJSON_GetObjectItemCaseSensitive(c, "id"), *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
                    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name"), *ar = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
                    if (!cJSON_IsString(nm) || (ar && !cJSON_IsString(ar) && !cJSON_IsNull(ar))) {
                        BAD(b, "messages", "'%s.tool_calls': each needs function.name and function.arguments (a JSON string)", where);
                        goto done;
                    }
                    dsv4_tool_call *t = &ci.calls[ci.n_calls];
                    if (cJSON_IsString(id)) t->id = id->valuestring, t->id_len = strlen(id->valuestring);
                    t->name = nm->valuestring;
                    t->name_len = strlen(nm->valuestring);
                    if (cJSON_IsString(ar)) t->arguments = ar->valuestring, t->arguments_len = strlen(ar->valuestring);
                    ci.n_calls++;
                    x->n_tool_calls++;
                }
            }
        }
        if (x->role == DSV4_ROLE_TOOL) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(m, "tool_call_id");
            if (cJSON_IsString(id)) x->tool_call_id = id->valuestring, x->tool_call_id_len = strlen(id->valuestring);
        }
        k++;
    }
    ci.n_msgs = k;
    dsv4_prompt_options po = {r->thinking ? DSV4_PROMPT_THINKING : DSV4_PROMPT_CHAT, 0};
    size_t n_ids = 0;
    if (dsv4_prompt_encode(S->tok, ci.msgs, ci.n_msgs, &po, NULL, 0, &n_ids) != DSV4_OK) {
        BAD(b, "messages", "%s", dsv4_last_error());
        goto done;
    }
    r->ids = malloc((n_ids ? n_ids : 1) * sizeof *r->ids);
    if (!r->ids || dsv4_prompt_encode(S->tok, ci.msgs, ci.n_msgs, &po, r->ids, n_ids, &n_ids) != DSV4_OK) {
        BAD(b, "messages", "%s", r->ids ? dsv4_last_error() : "out of memory");
        goto done;
    }
    r->n_ids = (int64_t)n_ids;
    rc = 0;
done:
    chat_in_free(&ci);
    return rc;
}

/* prompt: a string, an array of ids, or an array holding one of those. */
static int parse_completion(srv_server *S, const cJSON *root, req *r, bad *b)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && !cJSON_IsNumber(cJSON_GetArrayItem(p, 0))) p = cJSON_GetArrayItem(p, 0);
    int64_t lp = -1;
    if (get_int(root, "logprobs", 0, 5, &lp, b) < 0) return -1;
    r->top_logprobs = (int)lp;
    r->logprobs = lp >= 0;
    int echo = 0;
    if (get_bool(root, "echo", &echo, b) < 0) return -1;
    if (echo) return BAD(b, "echo", "'echo' is not supported");
    const cJSON *sfx = cJSON_GetObjectItemCaseSensitive(root, "suffix");
    if (sfx && !cJSON_IsNull(sfx)) return BAD(b, "suffix", "'suffix' is not supported");
    if (cJSON_IsString(p)) {
        if (!S->tok) return BAD(b, "prompt", "a text prompt needs the model's tokenizer, which this server has not loaded (send token ids)");
        size_t len = strlen(p->valuestring), cap = dsv4_tokenizer_max_ids(S->tok, len) + 1, n = 0;
        r->ids = malloc(cap * sizeof *r->ids);
        if (!r->ids) return BAD(b, "prompt", "out of memory");
        r->ids[0] = (int32_t)S->cfg->bos_token_id; /* BOS, then the text, as `dsv4 run --prompt` */
        if (dsv4_tokenizer_encode(S->tok, p->valuestring, len, DSV4_TOKENIZE_SPECIAL_AS_TEXT, r->ids + 1, cap - 1, &n) != DSV4_OK)
            return BAD(b, "prompt", "%s", dsv4_last_error());
        r->n_ids = (int64_t)n + 1;
        return 0;
    }
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) > 0) return get_ids(p, "prompt", S->cfg->vocab_size, &r->ids, &r->n_ids, b);
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) > 1)
        return BAD(b, "prompt", "'prompt': one prompt per request (a string or an array of token ids)");
    return BAD(b, "prompt", "'prompt' must be a string or a non-empty array of token ids");
}

/* ---- generation: the tokens of a job into the response ------------------------------------------------- */
typedef struct gen {
    srv_server *S;
    srv_job *j;
    struct MHD_Connection *conn;
    req r;
    cJSON *root; /* the request (its stop strings are used until the end) */
    int fd;      /* the client's socket: a hang-up cancels */
    char id[64];
    time_t created;
    srv_out out;
    dsv4_decode_stream ds;
    int32_t *ids;
    int64_t n_ids, n_sent; /* taken from the engine; sent in stream chunks */
    cJSON *lp;   /* logprob entries not yet sent (stream) or all of them */
    srv_finish fin;
    int done, stop_hit, sent_head, sent_tail, cancelled;
    char *message;  /* the parsed tool-call message, if any */
    srv_buf sse;
    size_t sse_off;
    int64_t cached, drafted, accepted;
    char error[256];
} gen;

static int client_gone(int fd)
{
    if (fd < 0) return 0;
    struct pollfd p = {fd, POLLIN | POLLRDHUP, 0};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return 1;
    char ch;
    ssize_t k = recv(fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT);
    return k == 0;
}

static void token_text(const srv_server *S, int32_t id, srv_buf *out)
{
    char buf[512];
    size_t len = 0;
    if (S->tok && dsv4_tokenizer_decode(S->tok, &id, 1, 0, buf, sizeof buf, &len) == DSV4_OK) srv_buf_add(out, buf, len);
    else {
        int n = snprintf(buf, sizeof buf, "token_id:%d", id);
        srv_buf_add(out, buf, (size_t)n);
    }
}

static cJSON *lp_entry(const srv_server *S, int32_t id, float logprob)
{
    cJSON *e = cJSON_CreateObject();
    srv_buf t = {0};
    token_text(S, id, &t);
    add_text(e, "token", t.p ? t.p : "", t.n);
    cJSON_AddNumberToObject(e, "logprob", logprob);
    cJSON *bytes = cJSON_AddArrayToObject(e, "bytes");
    for (size_t i = 0; i < t.n; i++) cJSON_AddItemToArray(bytes, cJSON_CreateNumber((unsigned char)t.p[i]));
    srv_buf_free(&t);
    return e;
}

static void add_logprob(gen *g, const srv_token *t)
{
    if (!g->lp) g->lp = cJSON_CreateArray();
    cJSON *e = lp_entry(g->S, t->id, t->logprob);
    cJSON *top = cJSON_AddArrayToObject(e, "top_logprobs");
    for (int i = 0; i < t->n_top; i++) cJSON_AddItemToArray(top, lp_entry(g->S, t->top_id[i], t->top_lp[i]));
    cJSON_AddItemToArray(g->lp, e);
}

/* Take what the engine produced (waiting up to timeout_ms). */
static void gen_pull(gen *g, int timeout_ms)
{
    srv_token t[32];
    int done = 0;
    if (g->done) return;
    int n = srv_job_take(g->S->sched, g->j, t, 32, timeout_ms, &done);
    for (int i = 0; i < n && !g->stop_hit; i++) {
        g->ids[g->n_ids++] = t[i].id;
        if (g->r.logprobs) add_logprob(g, &t[i]);
        if (g->S->tok) {
            char buf[1024];
            size_t len = 0;
            if (dsv4_decode_stream_step(g->S->tok, &g->ds, t[i].id, buf, sizeof buf, &len) == DSV4_OK) srv_out_feed(&g->out, buf, len);
        }
        if (g->out.stopped) { /* a stop string: nothing after it is returned, the job ends */
            g->stop_hit = 1;
            srv_job_cancel(g->S->sched, g->j);
        }
    }
    if (!g->stop_hit && !done) return;
    if (!done) { /* after a stop string the engine retires the job at its next step */
        while (!done) srv_job_take(g->S->sched, g->j, t, 32, 100, &done);
    }
    pthread_mutex_lock(&g->j->mu);
    g->fin = g->j->finish;
    g->cached = g->j->cached_tokens;
    g->drafted = g->j->drafted;
    g->accepted = g->j->accepted;
    snprintf(g->error, sizeof g->error, "%s", g->j->error);
    pthread_mutex_unlock(&g->j->mu);
    if (g->S->tok && !g->stop_hit) {
        char buf[8];
        size_t len = 0;
        if (dsv4_decode_stream_flush(&g->ds, buf, sizeof buf, &len) == DSV4_OK) srv_out_feed(&g->out, buf, len);
    }
    srv_out_finish(&g->out, &g->message);
    srv_metrics_observe(&g->S->m, &g->S->m.e2e, srv_now() - g->j->t_submit);
    g->done = 1;
}

static const char *finish_reason(const gen *g)
{
    if (g->message) return "tool_calls";
    if (g->stop_hit || g->fin == SRV_FIN_EOS) return "stop";
    if (g->fin == SRV_FIN_LENGTH) return "length";
    return "stop"; /* cancelled by a shutdown */
}

static cJSON *usage(const gen *g)
{
    cJSON *u = cJSON_CreateObject();
    int64_t out = g->n_ids + (g->fin == SRV_FIN_EOS && !g->stop_hit);
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)g->j->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)out);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(g->j->n_prompt + out));
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "prompt_tokens_details"), "cached_tokens", (double)g->cached);
    return u;
}

/* The tool calls of the parsed message, with ids and indices added. */
static cJSON *tool_calls(const gen *g, int with_index)
{
    cJSON *msg = cJSON_Parse(g->message), *calls = cJSON_DetachItemFromObjectCaseSensitive(msg, "tool_calls"), *c;
    cJSON_Delete(msg);
    int i = 0;
    cJSON_ArrayForEach(c, calls)
    {
        char id[96];
        snprintf(id, sizeof id, "call_%s_%d", g->id + 9, i);
        if (with_index) cJSON_AddNumberToObject(c, "index", i);
        cJSON_AddStringToObject(c, "id", id);
        i++;
    }
    return calls;
}

static cJSON *completion_logprobs(const gen *g)
{
    /* the legacy shape: tokens, token_logprobs, top_logprobs (token -> logprob), text_offset */
    cJSON *o = cJSON_CreateObject(), *tk = cJSON_AddArrayToObject(o, "tokens"), *tl = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs"), *off = cJSON_AddArrayToObject(o, "text_offset"), *e;
    double at = 0;
    cJSON_ArrayForEach(e, g->lp)
    {
        const char *t = cJSON_GetObjectItem(e, "token")->valuestring;
        cJSON_AddItemToArray(tk, cJSON_CreateString(t));
        cJSON_AddItemToArray(tl, cJSON_CreateNumber(cJSON_GetObjectItem(e, "logprob")->valuedouble));
        cJSON *m = cJSON_CreateObject(), *x;
        cJSON_ArrayForEach(x, cJSON_GetObjectItem(e, "top_logprobs"))
            cJSON_AddNumberToObject(m, cJSON_GetObjectItem(x, "token")->valuestring, cJSON_GetObjectItem(x, "logprob")->valuedouble);
        cJSON_AddItemToArray(tops, m);
        cJSON_AddItemToArray(off, cJSON_CreateNumber(at));
        at += (double)cJSON_GetArraySize(cJSON_GetObjectItem(e, "bytes"));
    }
    return o;
}

/* The text split out since the last call, under key (left out when empty unless `always`). */
static void take_text(gen *g, int section, cJSON *obj, const char *key, int always)
{
    srv_buf *t = &g->out.out[section];
    if (t->n || always) add_text(obj, key, t->p ? t->p : "", t->n);
    t->n = 0;
}

/* The logprobs gathered since the last call: the chat shape {"content": [...]} or the legacy one of
 * completions; null when there are none. */
static void take_logprobs(gen *g, cJSON *choice)
{
    if (!g->lp) {
        cJSON_AddNullToObject(choice, "logprobs");
        return;
    }
    if (g->r.chat) {
        cJSON_AddItemToObject(cJSON_AddObjectToObject(choice, "logprobs"), "content", g->lp);
    } else {
        cJSON_AddItemToObject(choice, "logprobs", completion_logprobs(g));
        cJSON_Delete(g->lp);
    }
    g->lp = NULL;
}

/* dsv4's addition to a choice: the generated ids behind the text (without the EOS). */
static void add_ids(cJSON *choice, const gen *g)
{
    cJSON *ids = cJSON_AddArrayToObject(choice, "token_ids");
    for (int64_t i = 0; i < g->n_ids; i++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(g->ids[i]));
}

static cJSON *response_body(gen *g)
{
    cJSON *root = cJSON_CreateObject(), *choices, *ch;
    cJSON_AddStringToObject(root, "id", g->id);
    cJSON_AddStringToObject(root, "object", g->r.chat ? "chat.completion" : "text_completion");
    cJSON_AddNumberToObject(root, "created", (double)g->created);
    cJSON_AddStringToObject(root, "model", g->S->model_id);
    choices = cJSON_AddArrayToObject(root, "choices");
    cJSON_AddItemToArray(choices, ch = cJSON_CreateObject());
    cJSON_AddNumberToObject(ch, "index", 0);
    if (g->r.chat) {
        cJSON *m = cJSON_AddObjectToObject(ch, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        if (g->out.out[SRV_OUT_CONTENT].n || !g->message) take_text(g, SRV_OUT_CONTENT, m, "content", 1);
        else cJSON_AddNullToObject(m, "content");
        if (g->r.thinking) take_text(g, SRV_OUT_REASONING, m, "reasoning_content", 1);
        if (g->message) cJSON_AddItemToObject(m, "tool_calls", tool_calls(g, 0));
    } else {
        take_text(g, SRV_OUT_CONTENT, ch, "text", 1);
    }
    add_ids(ch, g);
    take_logprobs(g, ch);
    cJSON_AddStringToObject(ch, "finish_reason", finish_reason(g));
    cJSON_AddItemToObject(root, "usage", usage(g));
    return root;
}

/* ---- SSE ----------------------------------------------------------------------------------------------- */
static void sse_event(gen *g, cJSON *chunk)
{
    char *s = cJSON_PrintUnformatted(chunk);
    cJSON_Delete(chunk);
    if (!s) return;
    srv_buf_add(&g->sse, "data: ", 6);
    srv_buf_add(&g->sse, s, strlen(s));
    srv_buf_add(&g->sse, "\n\n", 2);
    free(s);
}

static cJSON *chunk_base(gen *g, cJSON **choice)
{
    cJSON *c = cJSON_CreateObject(), *choices;
    cJSON_AddStringToObject(c, "id", g->id);
    cJSON_AddStringToObject(c, "object", g->r.chat ? "chat.completion.chunk" : "text_completion");
    cJSON_AddNumberToObject(c, "created", (double)g->created);
    cJSON_AddStringToObject(c, "model", g->S->model_id);
    choices = cJSON_AddArrayToObject(c, "choices");
    if (choice) {
        cJSON_AddItemToArray(choices, *choice = cJSON_CreateObject());
        cJSON_AddNumberToObject(*choice, "index", 0);
    }
    return c;
}

/* New text (and logprobs) as chunks; at the end the finish chunk, usage, [DONE]. */
static void sse_fill(gen *g)
{
    cJSON *ch;
    if (g->r.chat && !g->sent_head) {
        cJSON *c = chunk_base(g, &ch), *d = cJSON_AddObjectToObject(ch, "delta");
        cJSON_AddStringToObject(d, "role", "assistant");
        cJSON_AddStringToObject(d, "content", "");
        cJSON_AddNullToObject(ch, "logprobs");
        cJSON_AddNullToObject(ch, "finish_reason");
        sse_event(g, c);
        g->sent_head = 1;
    }
    int have = g->out.out[0].n || g->out.out[1].n || g->lp || g->n_ids > g->n_sent;
    if (have) {
        cJSON *c = chunk_base(g, &ch), *ids = cJSON_CreateArray();
        for (; g->n_sent < g->n_ids; g->n_sent++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(g->ids[g->n_sent]));
        cJSON_AddItemToObject(ch, "token_ids", ids); /* as in the whole response: the ids of this chunk */
        if (g->r.chat) {
            cJSON *d = cJSON_AddObjectToObject(ch, "delta");
            take_text(g, SRV_OUT_REASONING, d, "reasoning_content", 0);
            take_text(g, SRV_OUT_CONTENT, d, "content", 0);
        } else {
            take_text(g, SRV_OUT_CONTENT, ch, "text", 1);
        }
        take_logprobs(g, ch);
        cJSON_AddNullToObject(ch, "finish_reason");
        sse_event(g, c);
    }
    if (!g->done || g->sent_tail) return;
    if (g->fin == SRV_FIN_ERROR) { /* the status line went out long ago: an error event ends the stream */
        cJSON *c = cJSON_CreateObject(), *err = cJSON_AddObjectToObject(c, "error");
        char msg[320];
        snprintf(msg, sizeof msg, "generation failed: %s", g->error);
        add_text(err, "message", msg, strlen(msg));
        cJSON_AddStringToObject(err, "type", "server_error");
        sse_event(g, c);
        srv_buf_add(&g->sse, "data: [DONE]\n\n", 14);
        g->sent_tail = 1;
        return;
    }
    if (g->message) { /* the calls, each complete, as one delta */
        cJSON *c = chunk_base(g, &ch), *d = cJSON_AddObjectToObject(ch, "delta");
        cJSON_AddItemToObject(d, "tool_calls", tool_calls(g, 1));
        cJSON_AddNullToObject(ch, "finish_reason");
        sse_event(g, c);
    }
    cJSON *c = chunk_base(g, &ch);
    if (g->r.chat) cJSON_AddObjectToObject(ch, "delta");
    else cJSON_AddStringToObject(ch, "text", "");
    cJSON_AddNullToObject(ch, "logprobs");
    cJSON_AddStringToObject(ch, "finish_reason", finish_reason(g));
    sse_event(g, c);
    if (g->r.include_usage) {
        c = chunk_base(g, NULL);
        cJSON_AddItemToObject(c, "usage", usage(g));
        sse_event(g, c);
    }
    srv_buf_add(&g->sse, "data: [DONE]\n\n", 14);
    g->sent_tail = 1;
}

static void gen_free(gen *g)
{
    if (!g) return;
    if (g->j) {
        if (!g->done) srv_job_cancel(g->S->sched, g->j);
        srv_job_release(g->j);
    }
    srv_out_free(&g->out);
    srv_buf_free(&g->sse);
    cJSON_Delete(g->lp);
    cJSON_Delete(g->root);
    free(g->message);
    free(g->ids);
    free(g->r.ids);
    free(g->r.forced);
    free(g);
}

/* libmicrohttpd closes a connection idle for --timeout seconds, counting the time spent in our
 * callbacks: while the engine works on a request (a long prefill, a long non-streamed answer) the
 * timeout is off; it is back on (from now) whenever control returns to libmicrohttpd, so a client
 * that stops reading is still dropped. */
static void engine_wait(gen *g, int waiting)
{
    MHD_set_connection_option(g->conn, MHD_CONNECTION_OPTION_TIMEOUT, waiting ? 0u : (unsigned)g->S->o.timeout_s);
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    gen *g = cls;
    engine_wait(g, 1);
    while (g->sse_off == g->sse.n) {
        g->sse.n = g->sse_off = 0;
        if (g->sent_tail) return MHD_CONTENT_READER_END_OF_STREAM;
        if (client_gone(g->fd)) {
            srv_job_cancel(g->S->sched, g->j);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        gen_pull(g, 200);
        sse_fill(g);
    }
    size_t n = g->sse.n - g->sse_off;
    if (n > max) n = max;
    memcpy(buf, g->sse.p + g->sse_off, n);
    g->sse_off += n;
    engine_wait(g, 0);
    return (ssize_t)n;
}

static void sse_free(void *cls) { gen_free(cls); }

/* ---- the completion endpoints ---------------------------------------------------------------------- */
static enum MHD_Result serve_generate(srv_server *S, conn_ctx *cc, struct MHD_Connection *c)
{
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
    if (!ct || strncasecmp(ct, "application/json", 16) || (ct[16] && ct[16] != ';' && ct[16] != ' '))
        return send_error(S, cc, c, 415, NULL, NULL, "Content-Type must be application/json");
    if (cc->too_big)
        return send_error(S, cc, c, 413, NULL, NULL, "request body over the limit of %zu bytes", S->o.max_body);
    if (utf8_valid_prefix((const uint8_t *)cc->body.p, cc->body.n) != cc->body.n)
        return send_error(S, cc, c, 400, NULL, NULL, "the request body is not valid UTF-8");
    cJSON *root = cc->body.n ? cJSON_ParseWithLength(cc->body.p, cc->body.n) : NULL;
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return send_error(S, cc, c, 400, NULL, NULL, "the request body is not a JSON object");
    }
    gen *g = calloc(1, sizeof *g);
    if (!g) {
        cJSON_Delete(root);
        return send_error(S, cc, c, 500, NULL, NULL, "out of memory");
    }
    g->S = S;
    g->root = root;
    g->r.chat = cc->endpoint == EP_CHAT;
    bad b = {0};
    if (parse_common(S, root, &g->r, &b) || (g->r.chat ? parse_chat(S, root, &g->r, &b) : parse_completion(S, root, &g->r, &b))) {
        gen_free(g);
        return send_error(S, cc, c, 400, b.param, NULL, "%s", b.msg);
    }
    if (g->r.n_ids >= S->max_context) {
        int64_t n = g->r.n_ids;
        const char *param = g->r.chat ? "messages" : "prompt";
        gen_free(g);
        return send_error(S, cc, c, 400, param, "context_length_exceeded",
                          "the prompt has %lld tokens; this server's context is %lld", (long long)n, (long long)S->max_context);
    }
    if (g->r.logprobs && S->o.mtp) {
        gen_free(g);
        return send_error(S, cc, c, 400, "logprobs", NULL, "logprobs are not served with MTP decoding (serve --mtp 0)");
    }
    srv_job *j = srv_job_new(RING_CAP);
    /* no more tokens than the context holds, whatever max_tokens says */
    g->ids = malloc((size_t)(g->r.max_tokens < S->max_context ? g->r.max_tokens : S->max_context) * sizeof *g->ids);
    if (!j || !g->ids) {
        srv_job_release(j);
        gen_free(g);
        return send_error(S, cc, c, 500, NULL, NULL, "out of memory");
    }
    j->prompt = g->r.ids;
    j->n_prompt = g->r.n_ids;
    g->r.ids = NULL;
    j->forced = g->r.forced;
    j->n_forced = g->r.n_forced;
    g->r.forced = NULL;
    j->max_tokens = g->r.max_tokens;
    j->sampling = g->r.sampling;
    j->stop_at_eos = !g->r.ignore_eos;
    j->top_logprobs = g->r.logprobs ? g->r.top_logprobs : -1;
    if (atomic_load(&S->stopping) || srv_submit(S->sched, j)) {
        srv_job_release(j);
        gen_free(g);
        return send_error(S, cc, c, 503, NULL, NULL, "the server is %s; retry later", atomic_load(&S->stopping) ? "shutting down" : "at capacity");
    }
    g->j = j;
    g->conn = c;
    engine_wait(g, 1);
    snprintf(g->id, sizeof g->id, "%s-%016llx", g->r.chat ? "chatcmpl" : "cmpl", (unsigned long long)atomic_fetch_add(&S->counter, 1));
    g->created = time(NULL);
    srv_out_init(&g->out, g->r.chat && g->r.thinking, g->r.chat && g->r.has_tools, g->r.stop, g->r.n_stop);
    dsv4_decode_stream_init(&g->ds, DSV4_DECODE_SKIP_SPECIAL); /* </think> and the DSML tokens are not "special" */
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    g->fd = ci ? ci->connect_fd : -1;
    if (g->r.stream) {
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, sse_read, g, sse_free);
        if (!r) {
            gen_free(g);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        count(S, cc->endpoint, 200);
        enum MHD_Result res = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        return res;
    }
    while (!g->done) {
        if (client_gone(g->fd)) { /* nobody to answer: free the slot */
            gen_free(g);
            return MHD_NO;
        }
        gen_pull(g, 200);
    }
    engine_wait(g, 0);
    if (g->fin == SRV_FIN_ERROR) {
        enum MHD_Result res = send_error(S, cc, c, 500, NULL, NULL, "generation failed: %s", g->error);
        gen_free(g);
        return res;
    }
    enum MHD_Result res = send_json(S, cc, c, 200, response_body(g));
    gen_free(g);
    return res;
}

/* ---- routing ------------------------------------------------------------------------------------------- */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    srv_server *S = cls;
    conn_ctx *cc = *con_cls;
    if (!cc) {
        if (!(cc = calloc(1, sizeof *cc))) return MHD_NO;
        *con_cls = cc;
        cc->endpoint = !strcmp(url, "/v1/chat/completions") ? EP_CHAT : !strcmp(url, "/v1/completions") ? EP_COMPLETIONS : EP_OTHER;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > S->o.max_body) { /* refused before the body is read */
            cc->too_big = 1;
            return send_error(S, cc, c, 413, NULL, NULL, "request body over the limit of %zu bytes", S->o.max_body);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cc->too_big && cc->body.n + *upload_size > S->o.max_body) {
            cc->too_big = 1;
            srv_buf_free(&cc->body);
        }
        if (!cc->too_big && srv_buf_add(&cc->body, upload, *upload_size)) return MHD_NO;
        *upload_size = 0;
        return MHD_YES;
    }
    int post = !strcmp(method, MHD_HTTP_METHOD_POST), get = !strcmp(method, MHD_HTTP_METHOD_GET);
    if (cc->endpoint != EP_OTHER) {
        if (!post) return send_error(S, cc, c, 405, NULL, NULL, "%s takes POST", url);
        return serve_generate(S, cc, c);
    }
    if (!strcmp(url, "/health")) {
        if (!get) return send_error(S, cc, c, 405, NULL, NULL, "%s takes GET", url);
        cJSON *o = cJSON_CreateObject();
        int stopping = atomic_load(&S->stopping);
        cJSON_AddStringToObject(o, "status", stopping ? "shutting down" : "ok");
        cJSON_AddNumberToObject(o, "active", srv_sched_active(S->sched));
        cJSON_AddNumberToObject(o, "queued", srv_sched_queue_depth(S->sched));
        cJSON_AddNumberToObject(o, "slots", S->o.max_seqs);
        return send_json(S, cc, c, stopping ? 503 : 200, o);
    }
    if (!strcmp(url, "/v1/models")) {
        if (!get) return send_error(S, cc, c, 405, NULL, NULL, "%s takes GET", url);
        cJSON *o = cJSON_CreateObject(), *data, *m;
        cJSON_AddStringToObject(o, "object", "list");
        data = cJSON_AddArrayToObject(o, "data");
        cJSON_AddItemToArray(data, m = cJSON_CreateObject());
        cJSON_AddStringToObject(m, "id", S->model_id);
        cJSON_AddStringToObject(m, "object", "model");
        cJSON_AddNumberToObject(m, "created", (double)S->created);
        cJSON_AddStringToObject(m, "owned_by", "dsv4");
        cJSON_AddNumberToObject(m, "max_model_len", (double)S->max_context);
        return send_json(S, cc, c, 200, o);
    }
    if (!strcmp(url, "/metrics")) {
        if (!get) return send_error(S, cc, c, 405, NULL, NULL, "%s takes GET", url);
        char *t = srv_metrics_render(&S->m, srv_sched_queue_depth(S->sched), srv_sched_active(S->sched), S->o.max_seqs);
        if (!t) return MHD_NO;
        count(S, EP_OTHER, 200);
        return send_text(c, 200, "text/plain; version=0.0.4", t, strlen(t), 0);
    }
    return send_error(S, cc, c, 404, NULL, NULL, "no such endpoint: %s %s", method, url);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    conn_ctx *cc = *con_cls;
    if (!cc) return;
    srv_buf_free(&cc->body);
    free(cc);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    (void)fmt;
    (void)ap; /* connection-level noise (resets, timeouts) is expected from hostile clients */
}

/* ---- the server's life --------------------------------------------------------------------------------- */
static int load_tokenizer(srv_server *S)
{
    char path[4096];
    const char *p = S->o.tokenizer;
    if (!p) {
        snprintf(path, sizeof path, "%s/tokenizer.json", S->o.model);
        if (access(path, R_OK)) return 0; /* token-id prompts only */
        p = path;
    }
    if (dsv4_tokenizer_load(p, &S->tok) != DSV4_OK) {
        fprintf(stderr, "dsv4 serve: %s: %s\n", p, dsv4_last_error());
        return -1;
    }
    if (dsv4_tokenizer_vocab_size(S->tok) > S->cfg->vocab_size) {
        fprintf(stderr, "dsv4 serve: %s has %d ids, the model's vocabulary %lld\n", p, dsv4_tokenizer_vocab_size(S->tok),
                (long long)S->cfg->vocab_size);
        return -1;
    }
    return 0;
}

int srv_run(const srv_options *o)
{
    srv_server *S = calloc(1, sizeof *S);
    if (!S) return 1;
    S->o = *o;
    S->created = time(NULL);
    atomic_init(&S->stopping, 0);
    atomic_init(&S->counter, 1);
    srv_metrics_init(&S->m);
    int rc = 1;
    dsv4_ctx *ctx = NULL;
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL); /* every thread started from here leaves them to sigwait */
    signal(SIGPIPE, SIG_IGN);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o->port)};
    if (inet_pton(AF_INET, o->host, &addr.sin_addr) != 1) {
        fprintf(stderr, "dsv4 serve: --host %s is not an IPv4 address\n", o->host);
        goto done;
    }
    if (o->backend || o->threads) {
        dsv4_ctx_options co = {.backend = o->backend, .threads = o->threads};
        if (dsv4_ctx_create(&co, &ctx) != DSV4_OK) {
            fprintf(stderr, "dsv4 serve: %s\n", dsv4_last_error());
            goto done;
        }
    }
    dsv4_engine_options eo = {o->max_context, o->max_seqs, o->max_batch, o->mtp, 0, DSV4_LOAD_MAP, NULL, NULL};
    if (dsv4_engine_create(ctx, o->model, &eo, &S->e) != DSV4_OK) {
        fprintf(stderr, "dsv4 serve: %s\n", dsv4_last_error());
        goto done;
    }
    S->cfg = dsv4_engine_config(S->e);
    eo = dsv4_engine_get_options(S->e);
    S->max_context = eo.max_context;
    S->o.max_seqs = eo.max_seqs;
    if (o->mtp > eo.max_mtp) {
        fprintf(stderr, "dsv4 serve: --mtp %d: the checkpoint has no MTP block\n", o->mtp);
        goto done;
    }
    if (eo.max_batch < eo.max_seqs * (1 + o->mtp)) {
        fprintf(stderr, "dsv4 serve: --max-batch %d is below --max-seqs x (1 + --mtp) = %d: every decode row must fit a step\n",
                eo.max_batch, eo.max_seqs * (1 + o->mtp));
        goto done;
    }
    if (load_tokenizer(S)) goto done;
    if (o->model_name) snprintf(S->model_id, sizeof S->model_id, "%s", o->model_name);
    else {
        const char *slash = strrchr(o->model, '/');
        while (slash && !slash[1] && slash > o->model) { /* a trailing slash */
            const char *p = slash - 1;
            while (p > o->model && *p != '/') p--;
            slash = *p == '/' ? p : NULL;
        }
        snprintf(S->model_id, sizeof S->model_id, "%s", slash ? slash + 1 : o->model);
        size_t n = strlen(S->model_id);
        if (n && S->model_id[n - 1] == '/') S->model_id[n - 1] = 0;
    }
    if (srv_sched_start(&S->o, S->e, &S->m, &S->sched) != DSV4_OK) {
        fprintf(stderr, "dsv4 serve: cannot start the engine thread\n");
        goto done;
    }
    S->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG,
                            (uint16_t)o->port, NULL, NULL, on_request, S, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->max_connections, MHD_OPTION_CONNECTION_TIMEOUT,
                            (unsigned)o->timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024),
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, S, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                            MHD_OPTION_END);
    if (!S->d) {
        fprintf(stderr, "dsv4 serve: cannot listen on %s:%d: %s\n", o->host, o->port, strerror(errno));
        goto done;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(S->d, MHD_DAEMON_INFO_BIND_PORT);
    int port = di ? di->port : o->port;
    if (o->port_file) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", o->port_file);
        FILE *f = fopen(tmp, "w");
        if (!f || fprintf(f, "%d\n", port) < 0 || fclose(f) || rename(tmp, o->port_file)) {
            fprintf(stderr, "dsv4 serve: cannot write %s\n", o->port_file);
            goto done;
        }
    }
    fprintf(stderr, "dsv4 serve: %s on http://%s:%d (slots %d, context %lld, batch %d, mtp %d, tokenizer %s)\n", S->model_id,
            o->host, port, eo.max_seqs, (long long)S->max_context, eo.max_batch, o->mtp, S->tok ? "yes" : "no: token ids only");
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "dsv4 serve: %s: draining (up to %d s)\n", sig == SIGTERM ? "SIGTERM" : "SIGINT", o->drain_s);
    atomic_store(&S->stopping, 1);
    rc = 0;
done:
    if (S->sched) srv_sched_stop(S->sched, o->drain_s);
    if (S->d) MHD_stop_daemon(S->d); /* after the drain: every handler has its job finished */
    if (S->sched) srv_sched_free(S->sched);
    dsv4_tokenizer_free(S->tok);
    dsv4_engine_destroy(S->e);
    dsv4_ctx_destroy(ctx);
    if (!rc) fprintf(stderr, "dsv4 serve: stopped\n");
    free(S);
    return rc;
}
