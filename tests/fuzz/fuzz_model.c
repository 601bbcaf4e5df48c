/* libFuzzer target for the checkpoint parsers: every input is tried as a safetensors file image,
 * as a shard index and as config.json. They may refuse it, but must not crash, leak or read out
 * of bounds; an accepted config must survive a write/read round trip unchanged, and an accepted
 * header must describe its data area exactly.
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -std=c17 -D_POSIX_C_SOURCE=200809L \
 *         -Iinclude -Isrc tests/fuzz/fuzz_model.c src/core/json.c src/model/safetensors.c \
 *         src/model/config.c src/core/error.c src/core/file.c src/core/tensor.c -lm -o fuzz_model
 *   ./fuzz_model -dict=tests/fuzz/model.dict CORPUS_DIR tests/fuzz/corpus
 * (tests/python/test_model_fuzz.py does this for a bounded time.) */
#include "core/json.h"
#include "dsv4/model.h"
#include "model/safetensors.h"

#include <stdlib.h>
#include <string.h>

static void try_safetensors(const uint8_t *data, size_t size)
{
    st_tensor *t = NULL;
    char *arena = NULL;
    int64_t n = 0;
    uint64_t start = 0;
    if (st_parse(data, size, "fuzz.safetensors", 0, &t, &n, &arena, &start) != DSV4_OK) return;
    uint64_t covered = 0;
    for (int64_t i = 0; i < n; i++) {
        if (t[i].begin != covered || !t[i].name[0]) abort();
        covered = t[i].end;
        char canon[ST_MAX_NAME + 16];
        if (strlen(t[i].name) > ST_MAX_NAME) abort();
        st_canonical_name(t[i].name, canon);
        if (strcmp(canon, t[i].canon)) abort();
    }
    if (start + covered != size) abort();
    free(t);
    free(arena);
}

static void try_index(const uint8_t *data, size_t size)
{
    st_index ix;
    if (st_parse_index((const char *)data, size, "fuzz.index.json", &ix) != DSV4_OK) return;
    for (int i = 0; i < ix.n_files; i++)
        if (strchr(ix.files[i], '/') || !strcmp(ix.files[i], "..")) abort();
    st_index_free(&ix);
}

static void try_config(const uint8_t *data, size_t size)
{
    dsv4_model_config c, back;
    if (dsv4_config_parse((const char *)data, size, "fuzz.json", &c) != DSV4_OK) return;
    if (dsv4_config_validate(&c) != DSV4_OK) abort();
    static char buf[65536];
    size_t len = 0;
    if (dsv4_config_to_json(&c, buf, sizeof buf, &len) != DSV4_OK) return; /* e.g. CSA layers of two ratios and an HCA of 4 */
    if (dsv4_config_parse(buf, len, "fuzz-roundtrip.json", &back) != DSV4_OK) abort();
    memset(c.naming, 0, sizeof c.naming);
    memset(back.naming, 0, sizeof back.naming);
    if (memcmp(&c, &back, sizeof c)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dsv4_set_warning_handler(NULL, NULL); /* unknown keys by the million: not on stderr */
    try_safetensors(data, size);
    try_index(data, size);
    try_config(data, size);
    /* the first two bytes as a header length that fits: the rest reaches the tensor checks */
    if (size >= 2) {
        size_t hlen = (size_t)data[0] | (size_t)data[1] << 8;
        if (hlen > size - 2) hlen = size - 2;
        uint8_t *f = malloc(size + 6);
        if (!f) return 0;
        for (int k = 0; k < 8; k++) f[k] = (uint8_t)((uint64_t)hlen >> (8 * k));
        memcpy(f + 8, data + 2, size - 2);
        try_safetensors(f, size + 6);
        free(f);
    }
    return 0;
}
