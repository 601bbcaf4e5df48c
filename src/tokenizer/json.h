/* A small JSON reader for tokenizer.json: the whole document becomes a tree of tj_val in one
 * arena. Strict RFC 8259 grammar (no comments, no trailing commas), UTF-8 checked, \u escapes
 * with surrogate pairs decoded, nesting limited; hostile input yields DSV4_ERR_FORMAT. */
#ifndef DSV4_TOKENIZER_JSON_H
#define DSV4_TOKENIZER_JSON_H

#include "dsv4/core.h"

#include <stddef.h>
#include <stdint.h>

typedef enum tj_type { TJ_NULL, TJ_FALSE, TJ_TRUE, TJ_NUM, TJ_STR, TJ_ARR, TJ_OBJ } tj_type;

typedef struct tj_val tj_val;
struct tj_val {
    tj_type type;
    uint32_t n;         /* string: bytes; array / object: members */
    int is_int;         /* TJ_NUM written without fraction or exponent and within int64 */
    int64_t i;          /* TJ_NUM with is_int */
    double num;         /* TJ_NUM */
    const char *str;    /* TJ_STR: n bytes, NUL-terminated (may hold NUL itself) */
    tj_val *items;      /* TJ_ARR items, TJ_OBJ values */
    tj_val *keys;       /* TJ_OBJ keys (TJ_STR), parallel to items */
};

typedef struct tj_doc tj_doc;

/* Parse `len` bytes. `what` names the input in error messages. */
dsv4_status tj_parse(const char *text, size_t len, const char *what, tj_doc **out);
void tj_free(tj_doc *doc);
const tj_val *tj_root(const tj_doc *doc);

/* Member `key` of an object (NULL if absent or `v` is not an object). */
const tj_val *tj_get(const tj_val *v, const char *key);
/* Does string value `v` equal the NUL-terminated `s`? */
int tj_is(const tj_val *v, const char *s);
const char *tj_type_name(tj_type t);

#endif
