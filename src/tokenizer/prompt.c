/* DeepSeek-V4 prompt format (chat and thinking modes), see include/dsv4/tokenizer.h. */
#include "core/error.h"
#include "tokenizer/tok_internal.h"

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

static void render(const dsv4_chat_message *m, size_t n, const dsv4_prompt_options *opt, writer *w)
{
    int thinking = opt->mode == DSV4_PROMPT_THINKING, drop = thinking && !opt->keep_reasoning;
    size_t last_user = (size_t)-1;
    for (size_t i = 0; i < n; i++)
        if (m[i].role == DSV4_ROLE_USER) last_user = i;
    PUT_LIT(w, bos);
    for (size_t i = 0; i < n; i++) {
        switch (m[i].role) {
        case DSV4_ROLE_SYSTEM: put(w, m[i].content, m[i].content_len); break;
        case DSV4_ROLE_USER:
            /* consecutive user messages are one turn, their texts joined by a blank line (the
             * reference encoder folds every user message into content blocks and appends a user
             * message to a user turn just before it: merge_tool_messages) */
            if (i > 0 && m[i - 1].role == DSV4_ROLE_USER) PUT_LIT(w, "\n\n");
            else PUT_LIT(w, user_tag);
            put(w, m[i].content, m[i].content_len);
            break;
        case DSV4_ROLE_ASSISTANT:
            /* reasoning survives only in thinking mode, and with dropping only after the last user turn */
            if (thinking && (!drop || last_user == (size_t)-1 || i > last_user)) {
                put(w, m[i].reasoning, m[i].reasoning_len);
                PUT_LIT(w, think_end);
            }
            put(w, m[i].content, m[i].content_len);
            PUT_LIT(w, eos);
            break;
        }
        /* a user turn that the end or an assistant turn follows opens the assistant's turn */
        int opens = m[i].role == DSV4_ROLE_USER && (i + 1 == n || m[i + 1].role == DSV4_ROLE_ASSISTANT);
        if (opens) {
            PUT_LIT(w, assistant_tag);
            if (thinking && (!drop || i >= last_user)) PUT_LIT(w, think_start);
            else PUT_LIT(w, think_end);
        }
    }
}

static dsv4_status check_messages(const char *op, const dsv4_chat_message *m, size_t n, const dsv4_prompt_options *opt)
{
    DSV4_CHECK_ARG(opt && (m || !n), "%s: null pointer", op);
    DSV4_CHECK_ARG(opt->mode == DSV4_PROMPT_CHAT || opt->mode == DSV4_PROMPT_THINKING, "%s: mode %d is not chat (0) or thinking (1)",
                   op, (int)opt->mode);
    for (size_t i = 0; i < n; i++) {
        DSV4_CHECK_ARG((unsigned)m[i].role <= DSV4_ROLE_ASSISTANT, "%s: message %zu has role %d (system 0, user 1, assistant 2)", op,
                       i, (int)m[i].role);
        DSV4_CHECK_ARG(m[i].content || !m[i].content_len, "%s: message %zu: null content of %zu bytes", op, i, m[i].content_len);
        DSV4_CHECK_ARG(m[i].reasoning || !m[i].reasoning_len, "%s: message %zu: null reasoning of %zu bytes", op, i,
                       m[i].reasoning_len);
        DSV4_CHECK_ARG(!m[i].reasoning_len || m[i].role == DSV4_ROLE_ASSISTANT, "%s: message %zu: only assistant messages carry reasoning",
                       op, i);
    }
    return DSV4_OK;
}

dsv4_status dsv4_prompt_render(const dsv4_chat_message *msgs, size_t n_msgs, const dsv4_prompt_options *opt, char *out, size_t cap,
                               size_t *len)
{
    const char *op = "prompt_render";
    DSV4_CHECK_ARG(len, "%s: null pointer", op);
    DSV4_TRY(check_messages(op, msgs, n_msgs, opt));
    writer w = {NULL, 0};
    render(msgs, n_msgs, opt, &w);
    if (out) {
        if (cap < w.n) return dsv4_fail(DSV4_ERR_CAPACITY, "%s: %zu bytes do not fit in a buffer of %zu", op, w.n, cap);
        w = (writer){out, 0};
        render(msgs, n_msgs, opt, &w);
    }
    *len = w.n;
    return DSV4_OK;
}

dsv4_status dsv4_prompt_encode(dsv4_tokenizer *tok, const dsv4_chat_message *msgs, size_t n_msgs, const dsv4_prompt_options *opt,
                               int32_t *ids, size_t cap, size_t *n_ids)
{
    const char *op = "prompt_encode";
    DSV4_CHECK_ARG(tok && n_ids, "%s: null pointer", op);
    DSV4_TRY(check_messages(op, msgs, n_msgs, opt));
    writer w = {NULL, 0};
    render(msgs, n_msgs, opt, &w);
    char *text = malloc(w.n ? w.n : 1);
    if (!text) return dsv4_fail(DSV4_ERR_NO_MEMORY, "%s: out of memory for a %zu-byte prompt", op, w.n);
    w = (writer){text, 0};
    render(msgs, n_msgs, opt, &w);
    pthread_mutex_lock(&tok->lock);
    dsv4_status s = tok_encode_locked(tok, text, w.n, 0, ids, cap, n_ids);
    pthread_mutex_unlock(&tok->lock);
    free(text);
    return s;
}
