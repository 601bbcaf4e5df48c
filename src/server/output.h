/* The text of a completion as it streams in, split into what the OpenAI API returns
 * (docs/server.md §4): reasoning (thinking mode, up to </think>), content, and the DSML tool-call
 * block (chat with tools), with stop strings cut out. Text that could still become a marker or a
 * stop string is held back until it cannot. Pure functions of the bytes fed: the unit tests
 * (tests/c/test_server_output.c) drive it with given token texts. */
#ifndef DSV4_SERVER_OUTPUT_H
#define DSV4_SERVER_OUTPUT_H

#include <stddef.h>

typedef struct srv_buf {
    char *p;
    size_t n, cap;
} srv_buf;

int srv_buf_add(srv_buf *b, const char *s, size_t n); /* 0 ok, -1 out of memory */
void srv_buf_free(srv_buf *b);

enum { SRV_OUT_CONTENT = 0, SRV_OUT_REASONING = 1 };

typedef struct srv_out {
    int parse_tools;        /* chat: a DSML block starts the tool calls */
    int section;            /* SRV_OUT_REASONING until </think> in thinking mode */
    const char *const *stop;
    int n_stop;
    srv_buf pending;        /* fed, not yet emitted */
    srv_buf tools;          /* the DSML block, from its first marker */
    int in_tools, stopped, failed;
    /* emitted text since the last srv_out_take */
    srv_buf out[2];
} srv_out;

/* stop: up to n_stop strings (kept by the caller for the lifetime of o). */
void srv_out_init(srv_out *o, int thinking, int parse_tools, const char *const *stop, int n_stop);
void srv_out_free(srv_out *o);
/* Feed decoded bytes. Sets o->stopped once a stop string matched (nothing after it is emitted). */
void srv_out_feed(srv_out *o, const char *s, size_t n);
/* End of the completion: flush what was held back. When a tool block was seen it is parsed:
 * *message receives the assistant message dsv4_completion_parse reads from it (JSON text,
 * malloc'd; its "tool_calls" are the calls), or the block ends as content with its markup
 * removed, trimmed, after a blank line (the malformed-DSML rule) and *message stays NULL. */
void srv_out_finish(srv_out *o, char **message);

/* The DSML block's text with every tag of the DSML markup removed (<｜DSML｜...> and
 * </｜DSML｜...>), into out. */
int srv_dsml_strip(const char *s, size_t n, srv_buf *out);

/* Bytes as valid UTF-8: every ill-formed sequence becomes U+FFFD. */
int srv_utf8_clean(const char *s, size_t n, srv_buf *out);

#endif
