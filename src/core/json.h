/* The strict JSON reader (RFC 8259) of the library: safetensors headers, the shard index,
 * config.json and tokenizer.json.
 *
 * The document becomes a flat tape of nodes in document order: a container's children follow it
 * and node.end is the index just past its subtree, so members are walked with i = first child,
 * i = nodes[i].end. Object members are (key, value) node pairs. Strings are decoded (escapes,
 * surrogate pairs) into one arena. Rejected: invalid UTF-8 anywhere, unescaped control
 * characters, lone surrogates, trailing commas, comments, leading zeros, NaN/Infinity, numbers
 * that overflow a double, duplicate object keys, nesting deeper than 64, anything after the value.
 * Allocation: the tape (grown geometrically) and one arena; nothing per value. */
#ifndef DSV4_CORE_JSON_H
#define DSV4_CORE_JSON_H

#include "dsv4/core.h"

#include <stddef.h>
#include <stdint.h>

typedef enum mj_type { MJ_NULL, MJ_FALSE, MJ_TRUE, MJ_NUMBER, MJ_STRING, MJ_ARRAY, MJ_OBJECT } mj_type;

#define MJ_NONE UINT32_MAX

typedef struct mj_node {
    uint8_t type;    /* mj_type */
    uint8_t is_int;  /* number written without fraction or exponent that fits in int64 */
    uint8_t has_nul; /* string holds U+0000 */
    uint32_t count;  /* string: bytes; array: items; object: members */
    uint32_t end;    /* index one past this node's subtree */
    uint32_t src;    /* byte offset of the value in the text (for messages) */
    union {
        int64_t i;   /* is_int numbers */
        double d;    /* other numbers */
        uint32_t str;/* strings: offset of the NUL-terminated bytes in the arena */
    } v;
} mj_node;

typedef struct mj_doc {
    mj_node *nodes;
    uint32_t count, cap;
    char *arena;
    size_t arena_len;
} mj_doc;

/* Parse len bytes; `what` names the text in error messages (DSV4_ERR_FORMAT). On failure the
 * doc is left empty (nothing to free). Texts over 2^31 bytes are refused. */
dsv4_status mj_parse(const char *text, size_t len, const char *what, mj_doc *doc);
void mj_free(mj_doc *doc);

static inline const mj_node *mj_at(const mj_doc *d, uint32_t i) { return &d->nodes[i]; }
static inline const char *mj_str(const mj_doc *d, uint32_t i) { return d->arena + d->nodes[i].v.str; }
/* Object member value by key, or MJ_NONE (also when `obj` is not an object). */
uint32_t mj_get(const mj_doc *d, uint32_t obj, const char *key);
/* String node equals s (NUL-terminated)? */
int mj_is(const mj_doc *d, uint32_t i, const char *s);
/* Numeric value of a number node (ints converted). */
double mj_num(const mj_doc *d, uint32_t i);
const char *mj_type_name(mj_type t);

/* Copy s into out (cap bytes, NUL-terminated) with bytes outside printable ASCII written as
 * \xNN, for quoting untrusted names in messages. */
void mj_quote(const char *s, size_t n, char *out, size_t cap);

#endif
