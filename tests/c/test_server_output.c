/* The server's output splitter (src/server/output.c) over given completion texts: reasoning up to
 * </think>, content, DSML tool calls (the exact text the prompt format renders), the malformed-DSML
 * rule, stop strings, UTF-8 cleaning; every text is also fed in random pieces and must give the
 * same result as when fed whole (what is held back never changes what comes out). */
#include "server/output.h"
#include "test_util.h"

#include "dsv4/tokenizer.h"

#define BAR "\xef\xbd\x9c"

typedef struct result {
    char content[4096], reasoning[4096];
    char *message;
    int stopped;
} result;

/* Feed text in pieces (random lengths when split, else whole), then finish. */
static void run(const char *text, int thinking, int tools, const char *const *stop, int n_stop, int split, result *r)
{
    srv_out o;
    srv_out_init(&o, thinking, tools, stop, n_stop);
    size_t n = strlen(text), at = 0;
    while (at < n) {
        size_t k = split ? 1 + test_rand_u64() % 7 : n;
        if (k > n - at) k = n - at;
        srv_out_feed(&o, text + at, k);
        at += k;
    }
    srv_out_finish(&o, &r->message);
    r->stopped = o.stopped;
    snprintf(r->content, sizeof r->content, "%s", o.out[SRV_OUT_CONTENT].p ? o.out[SRV_OUT_CONTENT].p : "");
    snprintf(r->reasoning, sizeof r->reasoning, "%s", o.out[SRV_OUT_REASONING].p ? o.out[SRV_OUT_REASONING].p : "");
    CHECK(!o.failed, "allocation failure");
    srv_out_free(&o);
}

/* The same text whole and in 20 random splits. */
static void expect(const char *name, const char *text, int thinking, int tools, const char *const *stop, int n_stop,
                   const char *content, const char *reasoning, int stopped, const char *message_has)
{
    for (int t = 0; t < 21; t++) {
        result r = {0};
        run(text, thinking, tools, stop, n_stop, t > 0, &r);
        CHECK(!strcmp(r.content, content), "%s (split %d): content '%s', expected '%s'", name, t, r.content, content);
        CHECK(!strcmp(r.reasoning, reasoning), "%s (split %d): reasoning '%s', expected '%s'", name, t, r.reasoning, reasoning);
        CHECK(r.stopped == stopped, "%s (split %d): stopped %d", name, t, r.stopped);
        if (message_has) CHECK(r.message && strstr(r.message, message_has), "%s: message %s lacks %s", name, r.message ? r.message : "(none)", message_has);
        else CHECK(!r.message, "%s: unexpected tool calls %s", name, r.message);
        CHECK(!strstr(r.content, "DSML"), "%s: markup in the content: %s", name, r.content);
        free(r.message);
    }
}

/* The DSML block of an assistant message with these calls, as the prompt format writes it. */
static char *rendered_calls(const dsv4_tool_call *calls, size_t n)
{
    dsv4_chat_message m[2] = {{.role = DSV4_ROLE_USER, .content = "q", .content_len = 1},
                              {.role = DSV4_ROLE_ASSISTANT, .content = "Sure.", .content_len = 5, .tool_calls = calls, .n_tool_calls = n}};
    dsv4_prompt_options po = {DSV4_PROMPT_CHAT, 0};
    size_t len = 0;
    CHECK_STATUS(dsv4_prompt_render(m, 2, &po, NULL, 0, &len), DSV4_OK);
    char *t = calloc(len + 1, 1);
    CHECK_STATUS(dsv4_prompt_render(m, 2, &po, t, len, &len), DSV4_OK);
    char *start = strstr(t, "Sure."), *end = strstr(t, "<" BAR "end\xe2\x96\x81of\xe2\x96\x81sentence" BAR ">");
    CHECK(start && end && end > start, "rendered assistant turn not found in %s", t);
    if (!start || !end) return t;
    *end = 0;
    memmove(t, start, strlen(start) + 1);
    return t; /* "Sure.\n\n<｜DSML｜tool_calls>...</｜DSML｜tool_calls>" */
}

static void test_sections(void)
{
    expect("plain", "Hello world", 0, 0, NULL, 0, "Hello world", "", 0, NULL);
    expect("thinking", "Let me see.</think>The answer is 4.", 1, 0, NULL, 0, "The answer is 4.", "Let me see.", 0, NULL);
    expect("thinking, unfinished", "Still thinking </thi", 1, 0, NULL, 0, "", "Still thinking </thi", 0, NULL);
    expect("a lone < is content", "a < b and c <", 0, 1, NULL, 0, "a < b and c <", "", 0, NULL);
    const char *stop[] = {"STOP", "\n\n"};
    expect("stop", "one two STOP three", 0, 0, stop, 1, "one two ", "", 1, NULL);
    expect("stop, the earliest", "ab\n\ncd STOP", 0, 0, stop, 2, "ab", "", 1, NULL);
    expect("stop prefix at the end", "one ST", 0, 0, stop, 1, "one ST", "", 0, NULL);
    expect("stop not in the reasoning", "STOP here</think>ok STOP x", 1, 0, stop, 1, "ok ", "STOP here", 1, NULL);
}

static void test_tools(void)
{
    dsv4_tool_call calls[2] = {{.name = "get_weather", .name_len = 11, .arguments = "{\"city\": \"Paris\", \"days\": 3}", .arguments_len = 28},
                               {.name = "now", .name_len = 3, .arguments = "{}", .arguments_len = 2}};
    char *text = rendered_calls(calls, 2);
    expect("tool calls", text, 0, 1, NULL, 0, "Sure.", "", 0, "\"get_weather\"");
    result r = {0};
    run(text, 0, 1, NULL, 0, 0, &r);
    CHECK(r.message && strstr(r.message, "\\\"city\\\": \\\"Paris\\\"") && strstr(r.message, "\"now\""), "arguments: %s", r.message);
    free(r.message);
    /* without tools offered, the block is not parsed: it is text of the content like any other */
    result plain = {0};
    run(text, 0, 0, NULL, 0, 0, &plain);
    CHECK(!plain.message && !strcmp(plain.content, text), "tools off: %s", plain.content);
    free(plain.message);
    /* thinking, then calls */
    size_t n = strlen(text);
    char *th = malloc(n + 32);
    snprintf(th, n + 32, "plan</think>%s", text);
    expect("thinking + tool calls", th, 1, 1, NULL, 0, "Sure.", "plan", 0, "\"now\"");
    free(th);

    /* the malformed-DSML rule: a block cut short, or departing from the format, ends as content
     * without its markup, and no tool call comes out */
    char *cut = strdup(text);
    cut[strlen(cut) - 30] = 0;
    expect("cut block", cut, 0, 1, NULL, 0, "Sure.\n\nParis\n3", "", 0, NULL);
    free(cut);
    expect("garbled block", "Hi\n\n<" BAR "DSML" BAR "tool_calls>\n<" BAR "DSML" BAR "invoke nme=\"x\">y</" BAR "DSML" BAR "invoke>", 0, 1, NULL, 0,
           "Hi\n\ny", "", 0, NULL);
    expect("stray close tag", "a</" BAR "DSML" BAR "parameter>b", 0, 1, NULL, 0, "a\n\nb", "", 0, NULL);
    expect("unclosed tag", "a<" BAR "DSML" BAR "invoke name=", 0, 1, NULL, 0, "a", "", 0, NULL);
    free(text);
}

static void test_utf8(void)
{
    struct {
        const char *in, *out;
    } cases[] = {{"abc", "abc"},
                 {"a\xff" "b", "a\xef\xbf\xbd" "b"},
                 {"\xe2\x82\xac", "\xe2\x82\xac"},
                 {"x\xe2\x82", "x\xef\xbf\xbd"},
                 {"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd"},
                 {"\xed\xa0\x80z", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbdz"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        srv_buf b = {0};
        CHECK(srv_utf8_clean(cases[i].in, strlen(cases[i].in), &b) == 0, "clean");
        CHECK(b.p && !strcmp(b.p, cases[i].out), "utf8 case %zu: got '%s'", i, b.p ? b.p : "");
        srv_buf_free(&b);
    }
}

int main(void)
{
    test_seed();
    test_sections();
    test_tools();
    test_utf8();
    TEST_DONE();
}
