/* The loaded tokenizer: tables built once by the loader, read by encode / decode / prompt. */
#ifndef DSV4_TOKENIZER_INTERNAL_H
#define DSV4_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>

#include "dsv4/tokenizer.h"

#include <stddef.h>
#include <stdint.h>

/* Split behaviours of the `Split` pre-tokenizer (names as in tokenizer.json). */
enum { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS };

/* One pre-tokenizer step. A `Split` has a pattern; the final `ByteLevel` step may add a prefix
 * space to each piece and split it with the GPT-2 expression (Isolated), or do neither. */
typedef struct tok_step {
    pcre2_code *re;             /* NULL: no splitting in this step */
    pcre2_match_data *md;
    int behavior, invert;
    int prefix_space;           /* ByteLevel add_prefix_space */
} tok_step;

/* Byte trie of added-token contents, for leftmost-longest matching. Node 0 is the root;
 * children are a linked list of siblings (index 0 = none). */
typedef struct tok_trie {
    uint32_t n_nodes, cap;
    int32_t *token;             /* per node: id ending here, or -1 */
    uint32_t *child, *sibling;
    uint8_t *byte;
    uint32_t root[256];         /* child of the root per first byte */
} tok_trie;

/* Open-addressing hash of merge pairs (left id, right id) -> (rank, merged id). */
typedef struct tok_merges {
    uint64_t *key;              /* (left << 32 | right) + 1; 0 = empty slot */
    uint32_t *rank;
    int32_t *id;
    uint64_t mask;
    int shift;
} tok_merges;

/* Hash of token strings (as written in tokenizer.json) -> id. */
typedef struct tok_strmap {
    int32_t *slot;              /* id, or -1 */
    uint64_t mask;
} tok_strmap;

/* Encode cache: piece bytes -> ids, cleared when full. */
typedef struct tok_cache_slot {
    uint64_t hash;
    uint32_t key_off, ids_off;
    uint16_t key_len, n_ids;    /* key_len 0: empty */
} tok_cache_slot;

typedef struct tok_cache {
    tok_cache_slot *slots;
    uint8_t *keys;
    int32_t *ids;
    uint32_t used, keys_used, ids_used;
} tok_cache;

/* Grow-only working memory of the encoder (guarded by the tokenizer's mutex). */
typedef struct tok_scratch {
    void *sym, *heap, *prefix, *word, *out;
    size_t sym_cap, heap_cap, prefix_cap, word_cap, out_cap;
} tok_scratch;

enum { TOK_PRESENT = 1, TOK_ADDED = 2, TOK_SPECIAL = 4 };

struct dsv4_tokenizer {
    int32_t n_ids;              /* valid ids 0 .. n_ids-1 (where flags has TOK_PRESENT) */
    uint8_t *flags;
    uint32_t *text_off, *text_len;   /* token string as in the file */
    char *text;
    uint32_t *bytes_off, *bytes_len; /* decoded bytes (ByteLevel decoder) */
    uint8_t *bytes;
    size_t max_token_bytes;
    tok_strmap by_text;

    int32_t byte_id[256];       /* id of the single byte-level character of each byte */
    tok_merges merges;
    int ignore_merges;

    tok_trie added[2];          /* [0]: "normalized": false, [1]: "normalized": true */
    tok_step *steps;
    int n_steps;
    int prefix_space;           /* some step adds prefix spaces: ids may reach 2 per byte */

    pthread_mutex_t lock;       /* guards everything below */
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
    tok_cache cache;
    tok_scratch scratch;
};

/* GPT-2 byte <-> character alphabet of the ByteLevel steps: the character standing for a byte,
 * and the byte of a character of the alphabet (-1 for other characters). */
uint32_t tok_byte_char(int b);
int tok_char_byte(uint32_t cp);

uint64_t tok_hash(const uint8_t *s, size_t n);
int32_t tok_strmap_get(const dsv4_tokenizer *tok, const char *s, size_t n);
/* Rank and merged id of the pair (a, b); 0 if the pair does not merge. */
static inline int tok_merge_find(const tok_merges *m, int32_t a, int32_t b, uint32_t *rank, int32_t *id)
{
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    uint64_t h = (key * 0x9E3779B97F4A7C15ull) >> m->shift;
    for (;; h = (h + 1) & m->mask) {
        uint64_t k = m->key[h];
        if (k == key) {
            *rank = m->rank[h];
            *id = m->id[h];
            return 1;
        }
        if (!k) return 0;
    }
}

/* Longest added token starting at s[0..n): its id and byte length, or -1. */
int32_t tok_trie_match(const tok_trie *t, const uint8_t *s, size_t n, size_t *len);

/* An Oniguruma pattern (as tokenizers runs it) in the PCRE2 form that matches the same; the
 * result is malloc'ed. */
dsv4_status tok_regex_translate(const char *pat, size_t len, char **out, size_t *out_len);
/* Cache and scratch of the encoder, made once at load. */
dsv4_status tok_encode_prepare(dsv4_tokenizer *tok);
/* Encoder entry used by dsv4_tokenizer_encode and dsv4_prompt_encode (lock held by caller). */
dsv4_status tok_encode_locked(dsv4_tokenizer *tok, const char *text, size_t len, unsigned flags, int32_t *ids,
                              size_t cap, size_t *n_ids);
/* Upper bound of ids for len bytes. */
size_t tok_max_ids(const dsv4_tokenizer *tok, size_t len);

#endif
