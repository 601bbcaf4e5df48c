/* libFuzzer target of the tokenizer loader: the input up to its first 0xFF byte is tried as a
 * tokenizer.json, the rest is text. Loading may refuse the file, but must not crash, leak or read
 * out of bounds; a tokenizer that loads encodes the text to the count the size query gave (within
 * dsv4_tokenizer_max_ids), decodes those ids, and its streaming decode gives the same bytes.
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -std=c17 -D_POSIX_C_SOURCE=200809L -Iinclude -Isrc \
 *         tests/fuzz/fuzz_tokenizer.c src/tokenizer/[a-z_]*.c src/core/json.c src/core/error.c src/core/file.c \
 *         $(pkg-config --cflags --libs libpcre2-8) -lm -o fuzz_tokenizer
 *   ./fuzz_tokenizer -dict=tests/fuzz/tokenizer.dict CORPUS_DIR tests/fuzz/corpus_tokenizer
 * (tests/python/test_model_fuzz.py runs it for a bounded time.) */
#include "dsv4/tokenizer.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dsv4_set_warning_handler(NULL, NULL); /* unknown keys by the million: not on stderr */
    const uint8_t *cut = memchr(data, 0xFF, size);
    size_t jlen = cut ? (size_t)(cut - data) : size;
    const char *text = cut ? (const char *)cut + 1 : "";
    size_t tlen = cut ? size - jlen - 1 : 0;
    dsv4_tokenizer *tok = NULL;
    if (dsv4_tokenizer_load_json((const char *)data, jlen, &tok) != DSV4_OK) {
        if (tok) abort(); /* no output on failure */
        return 0;
    }
    size_t n = 0, m = 0, cap = dsv4_tokenizer_max_ids(tok, tlen);
    int32_t *ids = malloc((cap + 1) * sizeof *ids);
    if (!ids) abort();
    for (unsigned flags = 0; flags < 2; flags++) {
        if (dsv4_tokenizer_encode(tok, text, tlen, flags, NULL, 0, &n) != DSV4_OK) continue;
        if (n > cap || dsv4_tokenizer_encode(tok, text, tlen, flags, ids, cap, &m) != DSV4_OK || m != n) abort();
        size_t blen = 0, got = 0;
        if (dsv4_tokenizer_decode(tok, ids, n, 0, NULL, 0, &blen) != DSV4_OK) abort();
        char *a = malloc(blen + 1), *b = malloc(blen + 4 * n + 8);
        if (!a || !b || dsv4_tokenizer_decode(tok, ids, n, 0, a, blen, &got) != DSV4_OK || got != blen) abort();
        dsv4_decode_stream ds;
        dsv4_decode_stream_init(&ds, 0);
        size_t o = 0, step = 0;
        char *piece = malloc(dsv4_tokenizer_max_token_bytes(tok) + 3);
        if (!piece) abort();
        for (size_t i = 0; i < n; i++) {
            if (dsv4_decode_stream_step(tok, &ds, ids[i], piece, dsv4_tokenizer_max_token_bytes(tok) + 3, &step) != DSV4_OK ||
                o + step > blen)
                abort();
            memcpy(b + o, piece, step);
            o += step;
        }
        if (dsv4_decode_stream_flush(&ds, piece, 3, &step) != DSV4_OK || o + step != blen) abort();
        memcpy(b + o, piece, step);
        if (memcmp(a, b, blen)) abort();
        free(piece);
        free(a);
        free(b);
    }
    free(ids);
    dsv4_tokenizer_free(tok);
    return 0;
}
