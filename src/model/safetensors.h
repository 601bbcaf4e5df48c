/* safetensors files and checkpoints inside the model layer.
 *
 * A file is `u64 header_len (little-endian) | header JSON | data`. The header is an object of
 * tensors {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the data area)
 * plus an optional "__metadata__" object of strings. The data area must be covered exactly:
 * tensors sorted by offset, each starting where the previous one ended, the last one ending
 * at the end of the file (the format's own rule against holes and polyglot files). */
#ifndef DSV4_MODEL_SAFETENSORS_H
#define DSV4_MODEL_SAFETENSORS_H

#include "dsv4/model.h"
#include "core/json.h"

#include <stddef.h>
#include <stdint.h>

#define ST_MAX_HEADER 100000000ull /* the format's limit on the header length */
#define ST_MAX_NAME 1024
#define ST_MAX_FILES 65536 /* shard files of one checkpoint, at most (DeepSeek-V4 ships 64) */

typedef enum st_dtype {
    ST_BOOL, ST_U8, ST_I8, ST_F8_E5M2, ST_F8_E4M3, ST_F8_E8M0, ST_I16, ST_U16, ST_F16, ST_BF16,
    ST_I32, ST_U32, ST_F32, ST_F64, ST_I64, ST_U64, ST_F4, ST_DTYPE_COUNT
} st_dtype;

const char *st_dtype_name(int st);
int st_dtype_bits(int st);
/* dsv4_dtype holding the raw elements of st, or -1 (I8 maps to U8; F4 to FP4X2, see st_view). */
int st_dtype_to_dsv4(int st);
/* Inverse for writing. */
int st_dtype_from_dsv4(dsv4_dtype dt);

typedef struct st_tensor {
    const char *name;  /* valid UTF-8, no NUL */
    const char *canon; /* official-layout name */
    uint32_t file;
    uint8_t dtype;     /* st_dtype */
    uint8_t ndim;
    int64_t shape[DSV4_MAX_DIMS];
    uint64_t begin, end; /* inside the data area */
} st_tensor;

/* Validate the safetensors image `file` (size bytes) and list its tensors, sorted by offset.
 * `fname` names the file in messages. On success *tensors (n entries) and *arena (names) are
 * malloc'd for the caller; data_start is the offset of the data area. */
dsv4_status st_parse(const uint8_t *file, uint64_t size, const char *fname, uint32_t file_index,
                     st_tensor **tensors, int64_t *n, char **arena, uint64_t *data_start);

/* A validated model.safetensors.index.json: the shard file names in first-use order (plain
 * names: no directory part, no "..") and the weight map (name -> one of them). */
typedef struct st_index {
    mj_doc doc;
    uint32_t weight_map; /* object node */
    int n_files;
    const char **files;  /* into doc's arena */
} st_index;
dsv4_status st_parse_index(const char *text, size_t len, const char *what, st_index *out);
void st_index_free(st_index *ix);

/* Official-layout name of a checkpoint name (HF: "model." prefix, embed_tokens, lm_head,
 * hc_head.hc_*, attn.norm = kv_norm). out needs strlen(name) + 8 bytes. Returns 1 if the name
 * carried the HF "model." prefix. */
int st_canonical_name(const char *name, char *out);
/* The name a tensor gets in `layout` (inverse of st_canonical_name). out: 160+ bytes. */
void st_layout_name(const char *canon, dsv4_layout layout, char *out, size_t cap);

struct dsv4_checkpoint {
    int n_files;
    char **paths;       /* full paths */
    const char **fnames;/* base names (into paths) */
    uint8_t **maps;     /* whole files: read-only mappings, or (copies) into bases */
    uint8_t **bases;    /* DSV4_LOAD_COPY: the allocations holding the copies; NULL when mapped */
    uint64_t *sizes, *data_start;
    char **arenas;      /* per file: names and canonical names */
    int64_t n;
    st_tensor *t;       /* all tensors: file by file, each file by offset */
    uint64_t *hash;     /* open addressing over canonical names: (index + 1) | tag << 32, 0 = empty */
    uint64_t hash_mask;
    dsv4_layout layout;
};

/* Index of the tensor with this canonical name, or -1. */
int64_t st_lookup(const dsv4_checkpoint *ck, const char *canon);
/* Data pointer of tensor i. */
const void *st_data(const dsv4_checkpoint *ck, int64_t i);
/* A dsv4_tensor view of tensor i as dtype `as` (its raw bytes reinterpreted; FP4X2 from
 * F4 halves the last dim). */
void st_view(const dsv4_checkpoint *ck, int64_t i, dsv4_dtype as, dsv4_tensor *out);
uint64_t st_nbytes(const st_tensor *t);

#endif
