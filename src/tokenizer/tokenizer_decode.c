/* Decoding: ids -> bytes (ByteLevel decoder), whole or streamed one id at a time. */
#include "core/error.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/utf8.h"

#include <string.h>

static dsv4_status check_id(const dsv4_tokenizer *tok, int32_t id, size_t pos, const char *op)
{
    if (id < 0 || id >= tok->n_ids || !(tok->flags[id] & TOK_PRESENT))
        return dsv4_fail(DSV4_ERR_RANGE, "%s: id %d at position %zu is not in the vocabulary (size %d)", op, (int)id, pos,
                         (int)tok->n_ids);
    return DSV4_OK;
}

static int skipped(const dsv4_tokenizer *tok, int32_t id, unsigned flags)
{
    return (flags & DSV4_DECODE_SKIP_SPECIAL) && (tok->flags[id] & TOK_SPECIAL);
}

dsv4_status dsv4_tokenizer_decode(const dsv4_tokenizer *tok, const int32_t *ids, size_t n, unsigned flags, char *out,
                                  size_t cap, size_t *len)
{
    const char *op = "tokenizer_decode";
    DSV4_CHECK_ARG(tok && len && (ids || !n), "%s: null pointer", op);
    DSV4_CHECK_ARG(!(flags & ~(unsigned)DSV4_DECODE_SKIP_SPECIAL), "%s: unknown flags 0x%x", op, flags);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        DSV4_TRY(check_id(tok, ids[i], i, op));
        if (!skipped(tok, ids[i], flags)) total += tok->bytes_len[ids[i]];
    }
    if (out) {
        if (cap < total) return dsv4_fail(DSV4_ERR_CAPACITY, "%s: %zu bytes do not fit in a buffer of %zu", op, total, cap);
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            if (skipped(tok, ids[i], flags)) continue;
            memcpy(out + k, tok->bytes + tok->bytes_off[ids[i]], tok->bytes_len[ids[i]]);
            k += tok->bytes_len[ids[i]];
        }
    }
    *len = total;
    return DSV4_OK;
}

void dsv4_decode_stream_init(dsv4_decode_stream *st, unsigned flags)
{
    if (!st) return;
    memset(st, 0, sizeof *st);
    st->flags = flags;
}

dsv4_status dsv4_decode_stream_step(const dsv4_tokenizer *tok, dsv4_decode_stream *st, int32_t id, char *out, size_t cap,
                                    size_t *len)
{
    const char *op = "decode_stream_step";
    DSV4_CHECK_ARG(tok && st && out && len, "%s: null pointer", op);
    DSV4_CHECK_ARG(st->n_pending < 4 && !(st->flags & ~(unsigned)DSV4_DECODE_SKIP_SPECIAL), "%s: corrupt stream state", op);
    DSV4_TRY(check_id(tok, id, 0, op));
    if (skipped(tok, id, st->flags)) {
        *len = 0;
        return DSV4_OK;
    }
    size_t tl = tok->bytes_len[id], total = st->n_pending + tl;
    if (cap < total)
        return dsv4_fail(DSV4_ERR_CAPACITY, "%s: needs %zu bytes of output space, has %zu", op, total, cap);
    uint8_t *o = (uint8_t *)out;
    memcpy(o, st->pending, st->n_pending);
    memcpy(o + st->n_pending, tok->bytes + tok->bytes_off[id], tl);
    /* pass complete characters and bytes that can never complete; hold an unfinished tail */
    size_t i = 0;
    while (i < total) {
        int k = utf8_check(o + i, total - i);
        if (k < 0) break;
        i += k > 0 ? (size_t)k : 1;
    }
    st->n_pending = (uint32_t)(total - i);
    memcpy(st->pending, o + i, st->n_pending);
    *len = i;
    return DSV4_OK;
}

dsv4_status dsv4_decode_stream_flush(dsv4_decode_stream *st, char *out, size_t cap, size_t *len)
{
    const char *op = "decode_stream_flush";
    DSV4_CHECK_ARG(st && len && (out || !st->n_pending), "%s: null pointer", op);
    DSV4_CHECK_ARG(st->n_pending < 4, "%s: corrupt stream state", op);
    if (cap < st->n_pending)
        return dsv4_fail(DSV4_ERR_CAPACITY, "%s: needs %u bytes of output space, has %zu", op, st->n_pending, cap);
    if (st->n_pending) memcpy(out, st->pending, st->n_pending);
    *len = st->n_pending;
    st->n_pending = 0;
    return DSV4_OK;
}
