/* Encoding: ill-formed UTF-8 runs apart, added tokens split out, pre-tokenizer steps (PCRE2),
 * byte-level BPE by merge rank with a cache. The steps stream into each other: every piece a
 * step produces goes on to the next step at once, so no list of pieces is ever built. */
#include "core/error.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/utf8.h"

#include <stdlib.h>
#include <string.h>

enum {
    CACHE_SLOTS = 1 << 15,      /* power of two */
    CACHE_ENTRIES = CACHE_SLOTS / 2,
    CACHE_MAX_KEY = 64,         /* longer pieces are not cached */
    CACHE_KEY_POOL = 1 << 20,
    CACHE_ID_POOL = 1 << 18,
    SCRATCH_INIT = 4096         /* piece length the scratch holds from the start */
};

typedef struct {
    int32_t id, prev, next;
    uint32_t len; /* 0: merged into its left neighbour */
} bpe_sym;

typedef struct {
    uint32_t rank;
    int32_t pos, id;
} bpe_cand;

typedef struct {
    dsv4_tokenizer *tok;
    unsigned flags;
    int32_t *ids; /* NULL: count only */
    size_t n;
    dsv4_status err;
} enc;

static inline void emit(enc *e, int32_t id)
{
    if (e->ids) e->ids[e->n] = id;
    e->n++;
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return 1;
    size_t c = *cap ? *cap : SCRATCH_INIT;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return 0;
    *p = q;
    *cap = c;
    return 1;
}

static void fail_oom(enc *e) { e->err = dsv4_fail(DSV4_ERR_NO_MEMORY, "tokenizer_encode: out of memory"); }

/* ---- BPE ---- */
static inline int cand_before(const bpe_cand *a, const bpe_cand *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(bpe_cand *h, size_t *n, bpe_cand c)
{
    size_t i = (*n)++;
    while (i) {
        size_t parent = (i - 1) / 2;
        if (!cand_before(&c, &h[parent])) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = c;
}

static bpe_cand heap_pop(bpe_cand *h, size_t *n)
{
    bpe_cand top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && cand_before(&h[c + 1], &h[c])) c++;
        if (!cand_before(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

static inline void push_pair(const tok_merges *m, const bpe_sym *y, int32_t pos, bpe_cand *h, size_t *nh)
{
    uint32_t rank;
    int32_t id;
    if (tok_merge_find(m, y[pos].id, y[y[pos].next].id, &rank, &id)) heap_push(h, nh, (bpe_cand){rank, pos, id});
}

/* Merge the bytes s[0..n) by rank (lowest first, leftmost on ties); the ids go to out[0..). */
static size_t bpe(enc *e, const uint8_t *s, size_t n, int32_t *out)
{
    dsv4_tokenizer *tok = e->tok;
    tok_scratch *sc = &tok->scratch;
    if (!grow(&sc->sym, &sc->sym_cap, n, sizeof(bpe_sym)) || !grow(&sc->heap, &sc->heap_cap, 3 * n, sizeof(bpe_cand))) {
        fail_oom(e);
        return 0;
    }
    bpe_sym *y = sc->sym;
    bpe_cand *h = sc->heap;
    size_t nh = 0;
    for (size_t i = 0; i < n; i++) y[i] = (bpe_sym){tok->byte_id[s[i]], (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1, 1};
    for (size_t i = 0; i + 1 < n; i++) push_pair(&tok->merges, y, (int32_t)i, h, &nh);
    while (nh) {
        bpe_cand c = heap_pop(h, &nh);
        bpe_sym *p = &y[c.pos];
        if (!p->len || p->next < 0) continue;
        bpe_sym *q = &y[p->next];
        uint32_t rank;
        int32_t id;
        if (!tok_merge_find(&tok->merges, p->id, q->id, &rank, &id) || id != c.id) continue; /* stale */
        p->id = id;
        p->len += q->len;
        q->len = 0;
        p->next = q->next;
        if (p->next >= 0) y[p->next].prev = c.pos;
        if (p->prev >= 0) push_pair(&tok->merges, y, p->prev, h, &nh);
        if (p->next >= 0) push_pair(&tok->merges, y, c.pos, h, &nh);
    }
    size_t k = 0;
    for (int32_t i = 0; i >= 0; i = y[i].next) out[k++] = y[i].id;
    return k;
}

/* ---- cache ---- */
static dsv4_status cache_init(tok_cache *c)
{
    c->slots = calloc(CACHE_SLOTS, sizeof *c->slots);
    c->keys = malloc(CACHE_KEY_POOL);
    c->ids = malloc(CACHE_ID_POOL * sizeof *c->ids);
    if (!c->slots || !c->keys || !c->ids) return dsv4_fail(DSV4_ERR_NO_MEMORY, "tokenizer: out of memory");
    return DSV4_OK;
}

static void cache_clear(tok_cache *c)
{
    memset(c->slots, 0, CACHE_SLOTS * sizeof *c->slots);
    c->used = c->keys_used = c->ids_used = 0;
}

/* The slot holding s[0..n) or the empty slot where it would go. */
static tok_cache_slot *cache_slot(tok_cache *c, const uint8_t *s, size_t n, uint64_t h)
{
    for (uint64_t i = h & (CACHE_SLOTS - 1);; i = (i + 1) & (CACHE_SLOTS - 1)) {
        tok_cache_slot *sl = &c->slots[i];
        if (!sl->key_len || (sl->hash == h && sl->key_len == n && !memcmp(c->keys + sl->key_off, s, n))) return sl;
    }
}

/* ---- one piece: byte-level BPE ---- */
static void piece(enc *e, const uint8_t *s, size_t n)
{
    dsv4_tokenizer *tok = e->tok;
    if (n == 1) {
        emit(e, tok->byte_id[s[0]]);
        return;
    }
    if (tok->ignore_merges) { /* a piece that is a whole vocabulary token stays one token */
        tok_scratch *sc = &tok->scratch;
        if (!grow(&sc->word, &sc->word_cap, 2 * n, 1)) {
            fail_oom(e);
            return;
        }
        uint8_t *w = sc->word;
        size_t k = 0;
        for (size_t i = 0; i < n; i++) k += utf8_put(w + k, tok_byte_char(s[i]));
        int32_t id = tok_strmap_get(tok, (const char *)w, k);
        if (id >= 0 && !(tok->flags[id] & TOK_ADDED)) {
            emit(e, id);
            return;
        }
    }
    tok_cache *c = &tok->cache;
    if (n > CACHE_MAX_KEY) {
        tok_scratch *sc = &tok->scratch;
        if (!grow(&sc->out, &sc->out_cap, n, sizeof(int32_t))) {
            fail_oom(e);
            return;
        }
        size_t k = bpe(e, s, n, sc->out);
        for (size_t i = 0; i < k; i++) emit(e, ((int32_t *)sc->out)[i]);
        return;
    }
    uint64_t h = tok_hash(s, n);
    tok_cache_slot *sl = cache_slot(c, s, n, h);
    if (!sl->key_len) {
        if (c->used >= CACHE_ENTRIES || c->keys_used + n > CACHE_KEY_POOL || c->ids_used + n > CACHE_ID_POOL) {
            cache_clear(c);
            sl = cache_slot(c, s, n, h);
        }
        size_t k = bpe(e, s, n, c->ids + c->ids_used);
        if (e->err) return;
        memcpy(c->keys + c->keys_used, s, n);
        *sl = (tok_cache_slot){h, c->keys_used, c->ids_used, (uint16_t)n, (uint16_t)k};
        c->keys_used += (uint32_t)n;
        c->ids_used += (uint32_t)k;
        c->used++;
    }
    const int32_t *ids = c->ids + sl->ids_off;
    for (uint32_t i = 0; i < sl->n_ids; i++) emit(e, ids[i]);
}

/* ---- pre-tokenizer ---- */
static void pretok(enc *e, int level, const uint8_t *s, size_t n);

typedef struct {
    size_t a, b;   /* held piece */
    int have, match, prev_match;
} split_state;

static void out_piece(enc *e, int level, const uint8_t *s, size_t a, size_t b)
{
    if (b > a) pretok(e, level + 1, s + a, b - a);
}

/* One segment of the step's pattern scan (a match or the text between matches), in order. */
static void segment(enc *e, int level, const uint8_t *s, split_state *st, size_t a, size_t b, int match)
{
    const tok_step *step = &e->tok->steps[level];
    if (step->invert) match = !match;
    switch (step->behavior) {
    case SPLIT_ISOLATED: out_piece(e, level, s, a, b); break;
    case SPLIT_REMOVED:
        if (!match) out_piece(e, level, s, a, b);
        break;
    case SPLIT_CONTIGUOUS: /* runs of segments of one kind become one piece */
        if (st->have && st->match == match) {
            st->b = b;
            break;
        }
        if (st->have) out_piece(e, level, s, st->a, st->b);
        *st = (split_state){a, b, 1, match, 0};
        break;
    case SPLIT_MERGED_PREV: /* a match joins the piece before it */
        if (match && !st->prev_match && st->have) {
            st->b = b;
        } else {
            if (st->have) out_piece(e, level, s, st->a, st->b);
            st->a = a;
            st->b = b;
            st->have = 1;
        }
        st->prev_match = match;
        break;
    case SPLIT_MERGED_NEXT: /* a match joins the piece after it, unless that is a match too */
        if (st->have) {
            st->have = 0;
            if (!match) {
                out_piece(e, level, s, st->a, b);
                break;
            }
            out_piece(e, level, s, st->a, st->b);
        }
        if (match) *st = (split_state){a, b, 1, 1, 0};
        else out_piece(e, level, s, a, b);
        break;
    }
}

/* Scan s[0..n) with the step's pattern the way Oniguruma's find_iter does (an empty match right
 * where the previous match ended is skipped, moving on by one character). */
static void split_run(enc *e, int level, const uint8_t *s, size_t n)
{
    dsv4_tokenizer *tok = e->tok;
    const tok_step *step = &tok->steps[level];
    split_state st = {0, 0, 0, 0, 0};
    size_t prev = 0, last_end = 0, last_match_end = (size_t)-1;
    while (last_end <= n && !e->err) {
        int rc = pcre2_match(step->re, s, n, last_end, PCRE2_NO_UTF_CHECK, step->md, tok->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[200];
            pcre2_get_error_message(rc, msg, sizeof msg);
            e->err = dsv4_fail(DSV4_ERR_UNSUPPORTED, "tokenizer_encode: pre-tokenizer pattern failed on a %zu-byte piece: %s", n,
                               (char *)msg);
            return;
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(step->md);
        size_t ms = ov[0], me = ov[1];
        if (ms == me && me == last_match_end) {
            if (last_end >= n) break;
            int k = utf8_check(s + last_end, n - last_end);
            last_end += k > 0 ? (size_t)k : 1;
            continue;
        }
        last_end = last_match_end = me;
        if (ms > prev) segment(e, level, s, &st, prev, ms, 0);
        segment(e, level, s, &st, ms, me, 1);
        prev = me;
    }
    if (e->err) return;
    if (prev < n) segment(e, level, s, &st, prev, n, 0);
    if (st.have) out_piece(e, level, s, st.a, st.b);
}

static void pretok(enc *e, int level, const uint8_t *s, size_t n)
{
    if (e->err) return;
    dsv4_tokenizer *tok = e->tok;
    if (level == tok->n_steps) {
        piece(e, s, n);
        return;
    }
    const tok_step *step = &tok->steps[level];
    if (step->prefix_space && s[0] != ' ') { /* ByteLevel add_prefix_space (the last step) */
        tok_scratch *sc = &tok->scratch;
        if (!grow(&sc->prefix, &sc->prefix_cap, n + 1, 1)) {
            fail_oom(e);
            return;
        }
        uint8_t *p = sc->prefix;
        p[0] = ' ';
        memcpy(p + 1, s, n);
        s = p;
        n++;
    }
    if (step->re) split_run(e, level, s, n);
    else pretok(e, level + 1, s, n);
}

/* ---- added tokens ---- */
static void added_split(enc *e, int pass, const uint8_t *s, size_t n)
{
    const dsv4_tokenizer *tok = e->tok;
    const tok_trie *t = &tok->added[pass];
    size_t gap = 0, i = 0;
    while (t->n_nodes && i < n && !e->err) {
        if (!t->root[s[i]]) {
            i++;
            continue;
        }
        size_t len;
        int32_t id = tok_trie_match(t, s + i, n - i, &len);
        if (id < 0) {
            i++;
            continue;
        }
        if ((e->flags & DSV4_TOKENIZE_SPECIAL_AS_TEXT) && (tok->flags[id] & TOK_SPECIAL)) { /* stays text */
            i += len;
            continue;
        }
        if (i > gap) {
            if (pass == 0) added_split(e, 1, s + gap, i - gap);
            else pretok(e, 0, s + gap, i - gap);
        }
        emit(e, id);
        i += len;
        gap = i;
    }
    if (n > gap && !e->err) {
        if (pass == 0) added_split(e, 1, s + gap, n - gap);
        else pretok(e, 0, s + gap, n - gap);
    }
}

static void encode_text(enc *e, const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n && !e->err) {
        size_t j = i + utf8_valid_prefix(s + i, n - i);
        if (j > i) added_split(e, 0, s + i, j - i);
        size_t k = j;
        while (k < n && utf8_check(s + k, n - k) <= 0) k++;
        if (k > j && !e->err) piece(e, s + j, k - j); /* ill-formed bytes: byte-level BPE alone */
        i = k;
    }
}

dsv4_status tok_encode_prepare(dsv4_tokenizer *tok)
{
    DSV4_TRY(cache_init(&tok->cache));
    tok_scratch *sc = &tok->scratch;
    if (!grow(&sc->sym, &sc->sym_cap, SCRATCH_INIT, sizeof(bpe_sym)) ||
        !grow(&sc->heap, &sc->heap_cap, 3 * SCRATCH_INIT, sizeof(bpe_cand)))
        return dsv4_fail(DSV4_ERR_NO_MEMORY, "tokenizer: out of memory");
    return DSV4_OK;
}

dsv4_status tok_encode_locked(dsv4_tokenizer *tok, const char *text, size_t len, unsigned flags, int32_t *ids,
                              size_t cap, size_t *n_ids)
{
    enc e = {tok, flags, NULL, 0, DSV4_OK};
    if (ids && cap < tok_max_ids(tok, len)) { /* count first: a short buffer is written only if it fits */
        encode_text(&e, (const uint8_t *)text, len);
        if (e.err) return e.err;
        if (e.n > cap)
            return dsv4_fail(DSV4_ERR_CAPACITY, "tokenizer_encode: %zu ids do not fit in a buffer of %zu", e.n, cap);
        e.n = 0;
    }
    e.ids = ids;
    encode_text(&e, (const uint8_t *)text, len);
    if (e.err) return e.err;
    *n_ids = e.n;
    return DSV4_OK;
}

dsv4_status dsv4_tokenizer_encode(dsv4_tokenizer *tok, const char *text, size_t len, unsigned flags, int32_t *ids,
                                  size_t cap, size_t *n_ids)
{
    DSV4_CHECK_ARG(tok && n_ids && (text || !len), "tokenizer_encode: null pointer");
    DSV4_CHECK_ARG(!(flags & ~(unsigned)DSV4_TOKENIZE_SPECIAL_AS_TEXT), "tokenizer_encode: unknown flags 0x%x", flags);
    pthread_mutex_lock(&tok->lock);
    dsv4_status s = tok_encode_locked(tok, text ? text : "", len, flags, ids, cap, n_ids);
    pthread_mutex_unlock(&tok->lock);
    return s;
}
