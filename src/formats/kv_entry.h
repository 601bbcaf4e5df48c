/* The FP8 KV cache entry ("MODEL1", include/dsv4/attention.h) and its paged layout, named once for
 * every piece of code that reads or writes cache bytes: the C backends, the engine and the CUDA
 * kernels (this header has plain macros and inline helpers only, and compiles as C17 and as CUDA
 * C++, host and device).
 *
 * One entry is the 512-vector of one token:
 *   data row,  576 bytes: 448 E4M3 codes (dims 0..447, DSV4_KVE_GROUPS groups of 64 dims), then
 *                         64 BF16 (dims 448..511, little-endian, already rotated);
 *   scale row,   8 bytes: 7 UE8M0 scales (one per group of 64 E4M3 codes), then one zero pad byte.
 * A page of block_size entries holds all data rows first (row r at r*576), then all scale rows
 * (row r at block_size*576 + r*8); its size is block_size*584 rounded up to a multiple of 576.
 * slot = page*block_size + row; page p starts page_stride bytes after page p-1. */
#ifndef DSV4_FORMATS_KV_ENTRY_H
#define DSV4_FORMATS_KV_ENTRY_H

#include <stdint.h>

#define DSV4_KVE_DIM 512       /* values of one entry */
#define DSV4_KVE_NOPE_DIM 448  /* E4M3 dims 0..447 */
#define DSV4_KVE_ROPE_DIM 64   /* BF16 dims 448..511 */
#define DSV4_KVE_GROUP 64      /* E4M3 codes per UE8M0 scale */
#define DSV4_KVE_GROUPS 7      /* DSV4_KVE_NOPE_DIM / DSV4_KVE_GROUP: scale bytes in use */
#define DSV4_KVE_NOPE_BYTES 448  /* offset of the BF16 part in the data row */
#define DSV4_KVE_ROPE_BYTES 128  /* the BF16 part */
#define DSV4_KVE_DATA_BYTES 576  /* data row: DSV4_KVE_NOPE_BYTES + DSV4_KVE_ROPE_BYTES */
#define DSV4_KVE_SCALE_BYTES 8   /* scale row: DSV4_KVE_GROUPS scales + one zero pad byte */
#define DSV4_KVE_ENTRY_BYTES 584 /* DSV4_KVE_DATA_BYTES + DSV4_KVE_SCALE_BYTES */
#define DSV4_KVE_PAGE_ALIGN 576  /* page sizes are multiples of this */
/* The largest block_size a page size is computed for (pages stay below 2^40 bytes). */
#define DSV4_KVE_MAX_BLOCK (((int64_t)1 << 40) / DSV4_KVE_ENTRY_BYTES)

#if defined(__CUDACC__)
#define DSV4_KVE_FN static __host__ __device__ __forceinline__
#else
#define DSV4_KVE_FN static inline
#endif

/* Bytes of one page of block_size entries: block_size*584 rounded up to a multiple of 576;
 * 0 when block_size is outside [1, DSV4_KVE_MAX_BLOCK]. */
DSV4_KVE_FN int64_t dsv4_kve_page_bytes(int64_t block_size)
{
    if (block_size < 1 || block_size > DSV4_KVE_MAX_BLOCK) return 0;
    const int64_t payload = block_size * DSV4_KVE_ENTRY_BYTES;
    return (payload + DSV4_KVE_PAGE_ALIGN - 1) / DSV4_KVE_PAGE_ALIGN * DSV4_KVE_PAGE_ALIGN;
}

/* Offsets inside one page: the data row and the scale row of row `row`. */
DSV4_KVE_FN int64_t dsv4_kve_row_data(int64_t row) { return row * DSV4_KVE_DATA_BYTES; }
DSV4_KVE_FN int64_t dsv4_kve_row_scale(int64_t block_size, int64_t row)
{
    return block_size * DSV4_KVE_DATA_BYTES + row * DSV4_KVE_SCALE_BYTES;
}

/* Offsets from page 0 of slot `slot` (>= 0): its data row and its scale row. */
DSV4_KVE_FN int64_t dsv4_kve_slot_data(int64_t page_stride, int64_t block_size, int64_t slot)
{
    return (slot / block_size) * page_stride + dsv4_kve_row_data(slot % block_size);
}
DSV4_KVE_FN int64_t dsv4_kve_slot_scale(int64_t page_stride, int64_t block_size, int64_t slot)
{
    return (slot / block_size) * page_stride + dsv4_kve_row_scale(block_size, slot % block_size);
}

/* The sizes are one another's sums; a change to one that breaks the others fails to compile. */
#if defined(__cplusplus)
#define DSV4_KVE_ASSERT(c, m) static_assert(c, m)
#else
#define DSV4_KVE_ASSERT(c, m) _Static_assert(c, m)
#endif
DSV4_KVE_ASSERT(DSV4_KVE_NOPE_DIM + DSV4_KVE_ROPE_DIM == DSV4_KVE_DIM, "kv entry: dims");
DSV4_KVE_ASSERT(DSV4_KVE_GROUPS * DSV4_KVE_GROUP == DSV4_KVE_NOPE_DIM, "kv entry: scale groups");
DSV4_KVE_ASSERT(DSV4_KVE_NOPE_BYTES == DSV4_KVE_NOPE_DIM && DSV4_KVE_ROPE_BYTES == 2 * DSV4_KVE_ROPE_DIM,
                "kv entry: E4M3 codes are bytes, BF16 values two");
DSV4_KVE_ASSERT(DSV4_KVE_DATA_BYTES == DSV4_KVE_NOPE_BYTES + DSV4_KVE_ROPE_BYTES, "kv entry: data row");
DSV4_KVE_ASSERT(DSV4_KVE_SCALE_BYTES == DSV4_KVE_GROUPS + 1, "kv entry: scale row");
DSV4_KVE_ASSERT(DSV4_KVE_ENTRY_BYTES == DSV4_KVE_DATA_BYTES + DSV4_KVE_SCALE_BYTES, "kv entry: entry");

/* The public constants (include/dsv4/attention.h) must say the same; checked wherever both are seen. */
#if defined(DSV4_ATTENTION_H)
DSV4_KVE_ASSERT(DSV4_KV_DIM == DSV4_KVE_DIM && DSV4_KV_NOPE_DIM == DSV4_KVE_NOPE_DIM &&
                    DSV4_KV_ROPE_DIM == DSV4_KVE_ROPE_DIM && DSV4_KV_DATA_BYTES == DSV4_KVE_DATA_BYTES &&
                    DSV4_KV_SCALE_BYTES == DSV4_KVE_SCALE_BYTES && DSV4_KV_ENTRY_BYTES == DSV4_KVE_ENTRY_BYTES,
                "include/dsv4/attention.h and src/formats/kv_entry.h disagree on the KV entry");
#endif

#endif
