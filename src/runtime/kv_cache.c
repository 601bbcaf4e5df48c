/* Runtime of the paged FP8 KV cache, on the host side: page geometry, cache views, the page
 * allocator and per-sequence block tables (include/dsv4/attention.h). Nothing here touches cache
 * memory, so it serves host and device caches alike. Allocation happens only in the create functions. */
#include "core/error.h"
#include "dsv4/attention.h"
#include "formats/kv_entry.h"

#include <stdlib.h>

int64_t dsv4_kv_page_bytes(int64_t block_size) { return dsv4_kve_page_bytes(block_size); }

dsv4_status dsv4_kv_cache_view(dsv4_kv_cache *cache, void *pages, int64_t num_pages, int64_t block_size,
                               dsv4_device_kind device, int device_index)
{
    DSV4_CHECK_ARG(cache, "kv_cache_view: null cache");
    int64_t pb = dsv4_kv_page_bytes(block_size);
    DSV4_CHECK_ARG(pb > 0, "kv_cache_view: block_size %lld must be >= 1", (long long)block_size);
    DSV4_CHECK_ARG(num_pages >= 1 && num_pages <= INT32_MAX / block_size,
                   "kv_cache_view: num_pages %lld must be >= 1 and num_pages*block_size < 2^31", (long long)num_pages);
    DSV4_CHECK_ARG(pages, "kv_cache_view: null page memory");
    const int64_t shape[2] = {num_pages, pb};
    dsv4_kv_cache c;
    DSV4_TRY(dsv4_tensor_init(&c.pages, pages, DSV4_U8, 2, shape));
    c.pages.device = device;
    c.pages.device_index = device_index;
    c.block_size = block_size;
    *cache = c;
    return DSV4_OK;
}

int64_t dsv4_kv_cache_slots(const dsv4_kv_cache *cache)
{
    if (!cache || cache->block_size < 1 || cache->pages.ndim != 2) return 0;
    return cache->pages.shape[0] * cache->block_size;
}

/* ---- page allocator ----------------------------------------------------------------------- */
struct dsv4_kv_pages {
    int64_t num_pages, block_size;
    int64_t n_free;
    int32_t *free_list; /* free page numbers, the next one to hand out at the end */
};

struct dsv4_kv_seq {
    dsv4_kv_pages *pool;
    int64_t max_blocks;
    int64_t n_blocks; /* pages held */
    int32_t *table;
};

dsv4_status dsv4_kv_pages_create(int64_t num_pages, int64_t block_size, dsv4_kv_pages **out)
{
    DSV4_CHECK_ARG(out, "kv_pages_create: null output pointer");
    DSV4_CHECK_ARG(block_size >= 1 && num_pages >= 1 && num_pages <= INT32_MAX / block_size,
                   "kv_pages_create: need num_pages >= 1, block_size >= 1, num_pages*block_size < 2^31 (got %lld, %lld)",
                   (long long)num_pages, (long long)block_size);
    dsv4_kv_pages *p = malloc(sizeof *p);
    int32_t *list = malloc((size_t)num_pages * sizeof *list);
    if (!p || !list) {
        free(p);
        free(list);
        return dsv4_fail(DSV4_ERR_NO_MEMORY, "kv_pages_create: out of memory for %lld pages", (long long)num_pages);
    }
    /* Hand out low page numbers first. */
    for (int64_t i = 0; i < num_pages; i++) list[i] = (int32_t)(num_pages - 1 - i);
    p->num_pages = num_pages;
    p->block_size = block_size;
    p->n_free = num_pages;
    p->free_list = list;
    *out = p;
    return DSV4_OK;
}

void dsv4_kv_pages_destroy(dsv4_kv_pages *pool)
{
    if (!pool) return;
    free(pool->free_list);
    free(pool);
}

int64_t dsv4_kv_pages_free_count(const dsv4_kv_pages *pool) { return pool ? pool->n_free : 0; }

dsv4_status dsv4_kv_seq_create(dsv4_kv_pages *pool, int64_t max_entries, dsv4_kv_seq **out)
{
    DSV4_CHECK_ARG(pool && out, "kv_seq_create: null pointer");
    DSV4_CHECK_ARG(max_entries >= 1 && max_entries <= pool->num_pages * pool->block_size,
                   "kv_seq_create: max_entries %lld must be in [1, %lld] (the pool's slot count)",
                   (long long)max_entries, (long long)(pool->num_pages * pool->block_size));
    int64_t blocks = (max_entries + pool->block_size - 1) / pool->block_size;
    dsv4_kv_seq *s = malloc(sizeof *s);
    int32_t *table = malloc((size_t)blocks * sizeof *table);
    if (!s || !table) {
        free(s);
        free(table);
        return dsv4_fail(DSV4_ERR_NO_MEMORY, "kv_seq_create: out of memory");
    }
    s->pool = pool;
    s->max_blocks = blocks;
    s->n_blocks = 0;
    s->table = table;
    *out = s;
    return DSV4_OK;
}

void dsv4_kv_seq_destroy(dsv4_kv_seq *seq)
{
    if (!seq) return;
    dsv4_kv_pages *p = seq->pool;
    /* Give pages back in reverse so a re-created sequence gets the same pages in order. */
    for (int64_t b = seq->n_blocks - 1; b >= 0; b--) p->free_list[p->n_free++] = seq->table[b];
    free(seq->table);
    free(seq);
}

dsv4_status dsv4_kv_seq_reserve(dsv4_kv_seq *seq, int64_t n_entries)
{
    DSV4_CHECK_ARG(seq, "kv_seq_reserve: null sequence");
    dsv4_kv_pages *p = seq->pool;
    DSV4_CHECK_ARG(n_entries >= 0, "kv_seq_reserve: negative entry count %lld", (long long)n_entries);
    int64_t need = (n_entries + p->block_size - 1) / p->block_size;
    if (need > seq->max_blocks)
        return dsv4_fail(DSV4_ERR_RANGE, "kv_seq_reserve: %lld entries exceed the sequence's maximum of %lld",
                         (long long)n_entries, (long long)(seq->max_blocks * p->block_size));
    int64_t more = need - seq->n_blocks;
    if (more <= 0) return DSV4_OK;
    if (more > p->n_free)
        return dsv4_fail(DSV4_ERR_CAPACITY, "kv_seq_reserve: %lld more pages needed, %lld of %lld free",
                         (long long)more, (long long)p->n_free, (long long)p->num_pages);
    for (int64_t i = 0; i < more; i++) seq->table[seq->n_blocks++] = p->free_list[--p->n_free];
    return DSV4_OK;
}

int64_t dsv4_kv_seq_capacity(const dsv4_kv_seq *seq) { return seq ? seq->n_blocks * seq->pool->block_size : 0; }

const int32_t *dsv4_kv_seq_block_table(const dsv4_kv_seq *seq, int64_t *n_blocks)
{
    if (n_blocks) *n_blocks = seq ? seq->n_blocks : 0;
    return seq ? seq->table : NULL;
}

/* entries -> slots for either index width; checks everything before writing anything. */
#define SEQ_MAP(name, T)                                                                                    \
    DSV4_CHECK_ARG(seq, name ": null sequence");                                                           \
    DSV4_CHECK_ARG(n >= 0 && (n == 0 || (entries && out)), name ": bad arrays (n = %lld)", (long long)n);  \
    int64_t cap = dsv4_kv_seq_capacity(seq), bs = seq->pool->block_size;                                    \
    for (int64_t i = 0; i < n; i++)                                                                         \
        if (entries[i] >= cap)                                                                              \
            return dsv4_fail(DSV4_ERR_RANGE, name ": entry %lld at %lld is beyond the %lld reserved entries", \
                             (long long)entries[i], (long long)i, (long long)cap);                          \
    for (int64_t i = 0; i < n; i++) {                                                                       \
        int64_t e = entries[i];                                                                             \
        out[i] = e < 0 ? (T)-1 : (T)((int64_t)seq->table[e / bs] * bs + e % bs);                            \
    }                                                                                                       \
    return DSV4_OK

dsv4_status dsv4_kv_seq_slots(const dsv4_kv_seq *seq, const int64_t *entries, int64_t n, int64_t *out)
{
    SEQ_MAP("kv_seq_slots", int64_t);
}

dsv4_status dsv4_kv_seq_indices(const dsv4_kv_seq *seq, const int32_t *entries, int64_t n, int32_t *out)
{
    SEQ_MAP("kv_seq_indices", int32_t);
}
