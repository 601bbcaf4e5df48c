/* Text in, text out: the Hugging Face byte-level BPE tokenizer (`tokenizer.json`) of DeepSeek-V4
 * and its prompt format.
 *
 * Encoding follows the `tokenizers` pipeline of such a file step for step, and gives the same ids:
 *   1. added tokens are split out of the text (leftmost-longest match; first those with
 *      "normalized": false, then, in what is left, those with "normalized": true);
 *   2. the normalizer (only an empty one is supported: DeepSeek-V4 ships `Sequence []`);
 *   3. the pre-tokenizer: `Split` steps (regular expressions with Unicode properties, run by PCRE2,
 *      or plain strings; every split behaviour, `invert`) and a final `ByteLevel` step;
 *   4. byte-level BPE: merges applied by rank (lowest first, leftmost on ties), with a cache.
 * Text that is not valid UTF-8 is accepted: every maximal run of ill-formed bytes is its own piece
 * (byte-level BPE of those bytes, no pre-tokenizer). The round trip: decode(encode(x)) == x for
 * any bytes x when the file's ByteLevel step has "add_prefix_space": false (DeepSeek-V4's does).
 * With true, every piece that reaches that step without a leading space (the text between added
 * tokens, after the Split steps) gets one, as tokenizers does, and decoding gives it back: "a"
 * decodes as " a".
 * Anything else in the file (other models, normalizers, pre-tokenizers, decoders, post-processors,
 * added tokens with lstrip / rstrip / single_word) is rejected at load with DSV4_ERR_UNSUPPORTED;
 * a file whose added-token ids differ from those tokenizers would give them, with DSV4_ERR_FORMAT.
 * Patterns are Oniguruma's (tokenizers' engine); \s and \w are rewritten to Oniguruma's sets
 * before PCRE2 compiles them. One gap remains: PCRE2 classifies characters with its own Unicode
 * tables (libpcre2 10.42 of Debian 12: Unicode 14), so characters assigned in later Unicode
 * versions (CJK Extension H, Unicode 16 scripts) may be pre-tokenized differently, and the ids
 * around them then differ from tokenizers'.
 *
 * The tokenizer runs on the host and uses no backend or thread pool, so these functions take no
 * dsv4_ctx. A loaded tokenizer is immutable except for its encode cache, which a mutex guards:
 * any number of threads may share one. Failures return a status with dsv4_last_error() set and
 * leave every output untouched (except an allocation failure in the middle of an encode, after
 * which the ids buffer holds an unspecified prefix). */
#ifndef DSV4_TOKENIZER_H
#define DSV4_TOKENIZER_H

#include "dsv4/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsv4_tokenizer dsv4_tokenizer;

/* Load `tokenizer.json` from a file, or from `len` bytes in memory. */
DSV4_API dsv4_status dsv4_tokenizer_load(const char *path, dsv4_tokenizer **out);
DSV4_API dsv4_status dsv4_tokenizer_load_json(const char *json, size_t len, dsv4_tokenizer **out);
DSV4_API void dsv4_tokenizer_free(dsv4_tokenizer *tok);

/* Number of ids (model vocabulary and added tokens): valid ids are 0 .. vocab_size-1. */
DSV4_API int32_t dsv4_tokenizer_vocab_size(const dsv4_tokenizer *tok);
/* The most bytes one token decodes to. */
DSV4_API size_t dsv4_tokenizer_max_token_bytes(const dsv4_tokenizer *tok);
/* Id of a token written as in tokenizer.json (vocabulary key or added-token content).
 * DSV4_ERR_NOT_FOUND if there is none. */
DSV4_API dsv4_status dsv4_tokenizer_token_id(const dsv4_tokenizer *tok, const char *token, size_t len, int32_t *id);
/* The token's text as written in tokenizer.json (NUL-terminated, owned by the tokenizer). */
DSV4_API dsv4_status dsv4_tokenizer_token_text(const dsv4_tokenizer *tok, int32_t id, const char **text, size_t *len);
/* 1 for added tokens marked "special" (e.g. BOS, EOS), 0 otherwise; -1 for an invalid id. */
DSV4_API int dsv4_tokenizer_is_special(const dsv4_tokenizer *tok, int32_t id);

/* ---- encoding ---------------------------------------------------------------------------- */
enum {
    /* Treat added tokens marked "special" as plain text (`encode_special_tokens` in tokenizers):
     * user text cannot then smuggle in BOS, EOS or role markers. */
    DSV4_TOKENIZE_SPECIAL_AS_TEXT = 1
};

/* Most ids that `len` bytes of text can give: len, or 2·len when the file's ByteLevel step adds
 * prefix spaces. */
DSV4_API size_t dsv4_tokenizer_max_ids(const dsv4_tokenizer *tok, size_t len);

/* Encode `len` bytes of text (any bytes; UTF-8 expected). Writes the ids to ids[0 .. *n_ids).
 * cap >= dsv4_tokenizer_max_ids(tok, len) always suffices. ids == NULL asks only for the count
 * (written to *n_ids). A smaller cap that the ids do not fit fails with DSV4_ERR_CAPACITY. */
DSV4_API dsv4_status dsv4_tokenizer_encode(dsv4_tokenizer *tok, const char *text, size_t len, unsigned flags,
                                           int32_t *ids, size_t cap, size_t *n_ids);

/* ---- decoding ---------------------------------------------------------------------------- */
enum {
    DSV4_DECODE_SKIP_SPECIAL = 1 /* leave out added tokens marked "special" */
};

/* The bytes of n ids, concatenated (byte-level decoding; the result is the UTF-8 text, or the
 * exact bytes that were encoded). out == NULL asks only for the size. DSV4_ERR_RANGE for an id
 * outside the vocabulary, DSV4_ERR_CAPACITY when cap is too small. */
DSV4_API dsv4_status dsv4_tokenizer_decode(const dsv4_tokenizer *tok, const int32_t *ids, size_t n, unsigned flags,
                                           char *out, size_t cap, size_t *len);

/* Streaming decode for generation: feed one id at a time, print what comes out. Output never
 * ends inside a UTF-8 character: the bytes of an unfinished character wait for the next token.
 * Bytes that can no longer become a well-formed character are passed through as they are, so the
 * concatenated output (with the final flush) equals dsv4_tokenizer_decode of all the ids.
 * The state is a plain value owned by the caller: zero it (or call _init) to start. */
typedef struct dsv4_decode_stream {
    uint8_t pending[4];
    uint32_t n_pending;
    unsigned flags; /* DSV4_DECODE_* */
} dsv4_decode_stream;

DSV4_API void dsv4_decode_stream_init(dsv4_decode_stream *st, unsigned flags);
/* Bytes ready after one more id; cap >= max_token_bytes + 3 always suffices. */
DSV4_API dsv4_status dsv4_decode_stream_step(const dsv4_tokenizer *tok, dsv4_decode_stream *st, int32_t id,
                                             char *out, size_t cap, size_t *len);
/* Whatever is still waiting (an unfinished character at the end of the output); cap >= 3. */
DSV4_API dsv4_status dsv4_decode_stream_flush(dsv4_decode_stream *st, char *out, size_t cap, size_t *len);

/* ---- DeepSeek-V4 prompt format ------------------------------------------------------------
 * `encoding/encoding_dsv4.py` of the official release (encode_messages): BOS, then each message:
 *   system     {content}["\n\n"{the Tools section, when it carries tools}]
 *   user       <｜User｜>{content}
 *   tool       <｜User｜><tool_result>{content}</tool_result>
 *   assistant  [{reasoning}</think>]{content}["\n\n"{its tool calls in DSML}]<｜end▁of▁sentence｜>
 * where consecutive user and tool messages form one user turn, their blocks joined by "\n\n"
 * (merge_tool_messages), tool results of a turn in the order of the calls of the last assistant
 * message that made calls, by id (sort_tool_results_by_call_order); and after a user turn that
 * the last message or an assistant message follows, the transition <｜Assistant｜> plus </think>
 * (chat mode) or <think> (thinking mode). In thinking mode, reasoning of assistant turns before
 * the last user turn is dropped (and those turns' transitions get </think>) unless
 * keep_reasoning is set or a message carries tools; in chat mode it never appears.
 * The Tools section lists each tool's "function" object re-serialized as Python's json.dumps
 * writes it (", " and ": " separators, non-ASCII kept, floats in their shortest form); a tool
 * call is <｜DSML｜invoke name="NAME"> with one <｜DSML｜parameter name="KEY" string="true|false">
 * per member of its arguments object (strings as they are, other values as JSON).
 * The rendered text is then encoded with special tokens recognized, as the reference does. */
typedef enum dsv4_chat_role {
    DSV4_ROLE_SYSTEM = 0,
    DSV4_ROLE_USER = 1,
    DSV4_ROLE_ASSISTANT = 2,
    DSV4_ROLE_TOOL = 3 /* a tool's result (content), answering the call tool_call_id */
} dsv4_chat_role;

/* One tool call of an assistant message. */
typedef struct dsv4_tool_call {
    const char *id;        /* may be empty: orders the results of a later user turn */
    size_t id_len;
    const char *name;
    size_t name_len;
    const char *arguments; /* a JSON object (the OpenAI "arguments" string); empty = {} */
    size_t arguments_len;
} dsv4_tool_call;

typedef struct dsv4_chat_message {
    dsv4_chat_role role;
    const char *content;   /* may be NULL when content_len is 0 */
    size_t content_len;
    const char *reasoning; /* assistant only: reasoning_content (NULL / 0 for none) */
    size_t reasoning_len;
    const char *tools;     /* system only: the OpenAI "tools" array as JSON text (NULL / 0: none) */
    size_t tools_len;
    const dsv4_tool_call *tool_calls; /* assistant only (NULL / 0: none) */
    size_t n_tool_calls;
    const char *tool_call_id; /* tool only: the id of the call answered (may be empty) */
    size_t tool_call_id_len;
} dsv4_chat_message;

typedef enum dsv4_prompt_mode { DSV4_PROMPT_CHAT = 0, DSV4_PROMPT_THINKING = 1 } dsv4_prompt_mode;

typedef struct dsv4_prompt_options {
    dsv4_prompt_mode mode;
    int keep_reasoning; /* 1: drop_thinking=False of the reference */
} dsv4_prompt_options;

/* The prompt as text (no NUL written). out == NULL asks only for the size. opt NULL (or zeroed):
 * chat mode. */
DSV4_API dsv4_status dsv4_prompt_render(const dsv4_chat_message *msgs, size_t n_msgs, const dsv4_prompt_options *opt,
                                        char *out, size_t cap, size_t *len);
/* The prompt as ids (BOS first). ids == NULL asks only for the count. */
DSV4_API dsv4_status dsv4_prompt_encode(dsv4_tokenizer *tok, const dsv4_chat_message *msgs, size_t n_msgs,
                                        const dsv4_prompt_options *opt, int32_t *ids, size_t cap, size_t *n_ids);

/* The assistant message of a completion (the decoded text of the generated ids with special
 * tokens kept, ending with <｜end▁of▁sentence｜>), read as the reference's
 * parse_message_from_completion_text reads it: in thinking mode the reasoning up to </think>,
 * then the content up to the end token or to "\n\n<｜DSML｜tool_calls", then the DSML tool calls
 * (exactly in the rendered form). Written into out (no NUL) as the JSON object
 *   {"role": "assistant", "content": ..., "reasoning_content": ..., "tool_calls": [{"type":
 *    "function", "function": {"name": ..., "arguments": "{\"KEY\": VALUE, ...}"}}, ...]}
 * (string parameters quoted, the others as the model wrote them). A completion that departs from
 * the format, or special tokens inside the content or the reasoning, give DSV4_ERR_FORMAT.
 * out == NULL asks only for the size. */
DSV4_API dsv4_status dsv4_completion_parse(const char *text, size_t len, dsv4_prompt_mode mode, char *out, size_t cap,
                                           size_t *out_len);

#ifdef __cplusplus
}
#endif
#endif
