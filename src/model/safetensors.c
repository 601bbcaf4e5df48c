#include "model/safetensors.h"

#include "core/error.h"
#include "core/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- dtypes ----------------------------------------------------------------------------- */

static const struct {
    const char *name;
    int bits;
    int dsv4;
} st_dtypes[ST_DTYPE_COUNT] = {
    {"BOOL", 8, -1}, {"U8", 8, DSV4_U8}, {"I8", 8, DSV4_U8}, {"F8_E5M2", 8, -1},
    {"F8_E4M3", 8, DSV4_F8_E4M3}, {"F8_E8M0", 8, DSV4_E8M0}, {"I16", 16, -1}, {"U16", 16, -1},
    {"F16", 16, -1}, {"BF16", 16, DSV4_BF16}, {"I32", 32, DSV4_I32}, {"U32", 32, -1},
    {"F32", 32, DSV4_F32}, {"F64", 64, -1}, {"I64", 64, DSV4_I64}, {"U64", 64, -1},
    {"F4", 4, DSV4_FP4X2},
};

const char *st_dtype_name(int st) { return st >= 0 && st < ST_DTYPE_COUNT ? st_dtypes[st].name : "?"; }
int st_dtype_bits(int st) { return st >= 0 && st < ST_DTYPE_COUNT ? st_dtypes[st].bits : 0; }
int st_dtype_to_dsv4(int st) { return st >= 0 && st < ST_DTYPE_COUNT ? st_dtypes[st].dsv4 : -1; }

int st_dtype_from_dsv4(dsv4_dtype dt)
{
    switch (dt) {
    case DSV4_F32: return ST_F32;
    case DSV4_BF16: return ST_BF16;
    case DSV4_F8_E4M3: return ST_F8_E4M3;
    case DSV4_E8M0: return ST_F8_E8M0;
    case DSV4_FP4X2: return ST_I8;
    case DSV4_I32: return ST_I32;
    case DSV4_I64: return ST_I64;
    default: return ST_U8;
    }
}

uint64_t st_nbytes(const st_tensor *t) { return t->end - t->begin; }

/* ---- one file's header ------------------------------------------------------------------ */

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static int tensor_cmp(const void *a, const void *b)
{
    const st_tensor *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

static void shape_text(const st_tensor *t, char *buf, size_t cap)
{
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < t->ndim && o < cap; i++) o += (size_t)snprintf(buf + o, cap - o, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

static dsv4_status tensor_fail(const char *fname, const char *name, size_t len, const char *fmt, ...) DSV4_PRINTF(4, 5);
static dsv4_status tensor_fail(const char *fname, const char *name, size_t len, const char *fmt, ...)
{
    char q[96], msg[400];
    mj_quote(name, len, q, sizeof q);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return dsv4_fail(DSV4_ERR_FORMAT, "%s: tensor '%s': %s", fname, q, msg);
}

/* One tensor entry {dtype, shape, data_offsets} of header `d`; key node k holds the name. */
static dsv4_status parse_entry(const mj_doc *d, uint32_t k, const char *fname, uint64_t data_size, st_tensor *t)
{
    const char *nm = mj_str(d, k);
    size_t nl = d->nodes[k].count;
    uint32_t v = k + 1;
    if (d->nodes[v].type != MJ_OBJECT)
        return tensor_fail(fname, nm, nl, "entry is a %s, expected an object", mj_type_name(d->nodes[v].type));
    uint32_t f = v + 1;
    for (uint32_t m = 0; m < d->nodes[v].count; m++, f = d->nodes[f + 1].end)
        if (!mj_is(d, f, "dtype") && !mj_is(d, f, "shape") && !mj_is(d, f, "data_offsets")) {
            char q[64];
            mj_quote(mj_str(d, f), d->nodes[f].count, q, sizeof q);
            return tensor_fail(fname, nm, nl, "unknown field \"%s\"", q);
        }
    uint32_t dt = mj_get(d, v, "dtype"), sh = mj_get(d, v, "shape"), off = mj_get(d, v, "data_offsets");
    if (dt == MJ_NONE || sh == MJ_NONE || off == MJ_NONE)
        return tensor_fail(fname, nm, nl, "needs \"dtype\", \"shape\" and \"data_offsets\"");
    if (d->nodes[dt].type != MJ_STRING) return tensor_fail(fname, nm, nl, "dtype is not a string");
    int st = -1;
    for (int i = 0; i < ST_DTYPE_COUNT && st < 0; i++)
        if (mj_is(d, dt, st_dtypes[i].name)) st = i;
    if (st < 0) {
        char q[64];
        mj_quote(mj_str(d, dt), d->nodes[dt].count, q, sizeof q);
        return tensor_fail(fname, nm, nl, "unknown dtype \"%s\"", q);
    }
    t->dtype = (uint8_t)st;
    if (d->nodes[sh].type != MJ_ARRAY) return tensor_fail(fname, nm, nl, "shape is not an array");
    if (d->nodes[sh].count > DSV4_MAX_DIMS)
        return tensor_fail(fname, nm, nl, "%u dims, at most %d are supported", d->nodes[sh].count, DSV4_MAX_DIMS);
    t->ndim = (uint8_t)d->nodes[sh].count;
    /* numel * bits must fit comfortably: every dim <= 2^40 and the product <= 2^56 elements */
    uint64_t numel = 1;
    for (uint32_t i = 0, e = sh + 1; i < t->ndim; i++, e = d->nodes[e].end) {
        const mj_node *n = &d->nodes[e];
        if (n->type != MJ_NUMBER || !n->is_int || n->v.i < 0)
            return tensor_fail(fname, nm, nl, "shape entry %u is not a non-negative integer", i);
        if (n->v.i > ((int64_t)1 << 40)) return tensor_fail(fname, nm, nl, "dim %u = %lld is too large", i, (long long)n->v.i);
        t->shape[i] = n->v.i;
        if (numel && (uint64_t)n->v.i > (((uint64_t)1 << 56) / numel))
            return tensor_fail(fname, nm, nl, "shape has too many elements");
        numel *= (uint64_t)n->v.i;
    }
    if (d->nodes[off].type != MJ_ARRAY || d->nodes[off].count != 2)
        return tensor_fail(fname, nm, nl, "data_offsets must be [begin, end]");
    const mj_node *b = &d->nodes[off + 1], *e = &d->nodes[off + 2];
    if (b->type != MJ_NUMBER || e->type != MJ_NUMBER || !b->is_int || !e->is_int || b->v.i < 0 || e->v.i < 0)
        return tensor_fail(fname, nm, nl, "data_offsets must be non-negative integers");
    t->begin = (uint64_t)b->v.i;
    t->end = (uint64_t)e->v.i;
    if (t->begin > t->end || t->end > data_size)
        return tensor_fail(fname, nm, nl, "data_offsets [%llu, %llu] are outside the %llu-byte data area%s",
                           (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)data_size,
                           t->end > data_size ? " (file truncated?)" : "");
    uint64_t bits = numel * (uint64_t)st_dtypes[st].bits;
    if (bits % 8 || t->end - t->begin != bits / 8) {
        char shp[96];
        shape_text(t, shp, sizeof shp);
        if (bits % 8) return tensor_fail(fname, nm, nl, "%s %s is not a whole number of bytes", st_dtypes[st].name, shp);
        return tensor_fail(fname, nm, nl, "%s %s needs %llu bytes but data_offsets [%llu, %llu] hold %llu", st_dtypes[st].name,
                           shp, (unsigned long long)(bits / 8), (unsigned long long)t->begin, (unsigned long long)t->end,
                           (unsigned long long)(t->end - t->begin));
    }
    return DSV4_OK;
}

static dsv4_status check_metadata(const mj_doc *d, uint32_t v, const char *fname)
{
    if (d->nodes[v].type != MJ_OBJECT) return dsv4_fail(DSV4_ERR_FORMAT, "%s: __metadata__ is not an object", fname);
    for (uint32_t k = v + 1, m = 0; m < d->nodes[v].count; m++, k = d->nodes[k + 1].end)
        if (d->nodes[k + 1].type != MJ_STRING) {
            char q[64];
            mj_quote(mj_str(d, k), d->nodes[k].count, q, sizeof q);
            return dsv4_fail(DSV4_ERR_FORMAT, "%s: __metadata__ entry \"%s\" is not a string", fname, q);
        }
    return DSV4_OK;
}

/* A tensor name: non-empty, no U+0000, at most ST_MAX_NAME bytes (the JSON reader checked its UTF-8). */
static dsv4_status check_name(const mj_doc *d, uint32_t k, const char *fname)
{
    if (d->nodes[k].count && d->nodes[k].count <= ST_MAX_NAME && !d->nodes[k].has_nul) return DSV4_OK;
    char q[96];
    mj_quote(mj_str(d, k), d->nodes[k].count, q, sizeof q);
    if (d->nodes[k].count == 0) return dsv4_fail(DSV4_ERR_FORMAT, "%s: a tensor has an empty name", fname);
    if (d->nodes[k].has_nul) return dsv4_fail(DSV4_ERR_FORMAT, "%s: tensor name '%s' contains U+0000", fname, q);
    if (d->nodes[k].count > ST_MAX_NAME)
        return dsv4_fail(DSV4_ERR_FORMAT, "%s: tensor name '%s...' is longer than %d bytes", fname, q, ST_MAX_NAME);
    return DSV4_OK;
}

dsv4_status st_parse(const uint8_t *file, uint64_t size, const char *fname, uint32_t file_index,
                     st_tensor **tensors, int64_t *n_out, char **arena_out, uint64_t *data_start)
{
    if (size < 8)
        return dsv4_fail(DSV4_ERR_FORMAT, "%s: %llu bytes is too short for a safetensors file (8-byte header length + header)",
                         fname, (unsigned long long)size);
    uint64_t hlen = le64(file);
    if (hlen > size - 8)
        return dsv4_fail(DSV4_ERR_FORMAT, "%s: header length %llu runs past the end of the %llu-byte file (truncated or not safetensors)",
                         fname, (unsigned long long)hlen, (unsigned long long)size);
    if (hlen > ST_MAX_HEADER)
        return dsv4_fail(DSV4_ERR_FORMAT, "%s: header length %llu exceeds the format's %llu-byte limit", fname,
                         (unsigned long long)hlen, ST_MAX_HEADER);
    if (hlen < 2 || file[8] != '{')
        return dsv4_fail(DSV4_ERR_FORMAT, "%s: the header does not begin with '{' (not a safetensors file)", fname);
    uint64_t data_size = size - 8 - hlen;
    char what[320];
    snprintf(what, sizeof what, "%s (header)", fname);
    mj_doc d;
    DSV4_TRY(mj_parse((const char *)file + 8, (size_t)hlen, what, &d));
    dsv4_status st = DSV4_OK;
    st_tensor *t = NULL;
    char *arena = NULL;
    int64_t n = 0;
    size_t names = 0;
    for (uint32_t k = 1, m = 0; m < d.nodes[0].count; m++, k = d.nodes[k + 1].end)
        if (!mj_is(&d, k, "__metadata__")) names += 2 * (size_t)d.nodes[k].count + 10;
    t = malloc((d.nodes[0].count + 1) * sizeof *t);
    arena = malloc(names + 1);
    if (!t || !arena) {
        st = dsv4_fail(DSV4_ERR_NO_MEMORY, "%s: out of memory for the tensor table", fname);
        goto done;
    }
    size_t a = 0;
    for (uint32_t k = 1, m = 0; m < d.nodes[0].count; m++, k = d.nodes[k + 1].end) {
        if (mj_is(&d, k, "__metadata__")) {
            if ((st = check_metadata(&d, k + 1, fname)) != DSV4_OK) goto done;
            continue;
        }
        if ((st = check_name(&d, k, fname)) != DSV4_OK) goto done;
        st_tensor *e = &t[n];
        memset(e, 0, sizeof *e);
        if ((st = parse_entry(&d, k, fname, data_size, e)) != DSV4_OK) goto done;
        memcpy(arena + a, mj_str(&d, k), d.nodes[k].count + 1);
        e->name = arena + a;
        a += d.nodes[k].count + 1;
        e->canon = arena + a;
        st_canonical_name(e->name, arena + a);
        a += strlen(arena + a) + 1;
        e->file = file_index;
        n++;
    }
    qsort(t, (size_t)n, sizeof *t, tensor_cmp);
    uint64_t cursor = 0;
    for (int64_t i = 0; i < n; i++) {
        char q[96];
        if (t[i].begin != cursor) mj_quote(t[i].name, strlen(t[i].name), q, sizeof q);
        if (t[i].begin < cursor) {
            char q2[96];
            mj_quote(t[i - 1].name, strlen(t[i - 1].name), q2, sizeof q2);
            st = dsv4_fail(DSV4_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap (data_offsets [%llu, %llu] and [%llu, %llu])",
                           fname, q2, q, (unsigned long long)t[i - 1].begin, (unsigned long long)t[i - 1].end,
                           (unsigned long long)t[i].begin, (unsigned long long)t[i].end);
            goto done;
        }
        if (t[i].begin > cursor) {
            st = dsv4_fail(DSV4_ERR_FORMAT, "%s: %llu bytes before tensor '%s' belong to no tensor (holes are not allowed)",
                           fname, (unsigned long long)(t[i].begin - cursor), q);
            goto done;
        }
        cursor = t[i].end;
    }
    if (cursor != data_size) {
        st = dsv4_fail(DSV4_ERR_FORMAT, "%s: %llu bytes at the end of the data area belong to no tensor", fname,
                       (unsigned long long)(data_size - cursor));
        goto done;
    }
done:
    mj_free(&d);
    if (st != DSV4_OK) {
        free(t);
        free(arena);
        return st;
    }
    *tensors = t;
    *n_out = n;
    *arena_out = arena;
    *data_start = 8 + hlen;
    return DSV4_OK;
}

/* ---- names -------------------------------------------------------------------------------- */

/* Length of a "layers.N." or "mtp.N." block prefix at s, or 0. */
static size_t block_prefix(const char *s)
{
    size_t p;
    if (!strncmp(s, "layers.", 7)) p = 7;
    else if (!strncmp(s, "mtp.", 4)) p = 4;
    else return 0;
    size_t q = p;
    while (s[q] >= '0' && s[q] <= '9') q++;
    return q > p && s[q] == '.' ? q + 1 : 0;
}

int st_canonical_name(const char *name, char *out)
{
    int hf = !strncmp(name, "model.", 6);
    const char *s = hf ? name + 6 : name;
    if (!strcmp(s, "embed_tokens.weight")) s = "embed.weight";
    else if (!strcmp(s, "lm_head.weight")) s = "head.weight";
    size_t p = block_prefix(s);
    memcpy(out, s, p);
    const char *r = s + p;
    char *o = out + p;
    if (!strncmp(r, "hc_head.hc_", 11)) {
        strcpy(o, "hc_head_");
        strcpy(o + 8, r + 11);
    } else if (p && !strcmp(r, "attn.norm.weight")) {
        strcpy(o, "attn.kv_norm.weight");
    } else {
        strcpy(o, r);
    }
    return hf;
}

void st_layout_name(const char *canon, dsv4_layout layout, char *out, size_t cap)
{
    if (layout != DSV4_LAYOUT_HF || !strcmp(canon, "head.weight")) {
        snprintf(out, cap, "%s", canon);
        return;
    }
    if (!strcmp(canon, "embed.weight")) {
        snprintf(out, cap, "model.embed_tokens.weight");
        return;
    }
    size_t p = block_prefix(canon);
    const char *r = canon + p;
    if (!strncmp(r, "hc_head_", 8)) snprintf(out, cap, "model.%.*shc_head.hc_%s", (int)p, canon, r + 8);
    else if (p && !strcmp(r, "attn.kv_norm.weight")) snprintf(out, cap, "model.%.*sattn.norm.weight", (int)p, canon);
    else snprintf(out, cap, "model.%s", canon);
}

/* ---- the shard index ---------------------------------------------------------------------- */

void st_index_free(st_index *ix)
{
    if (!ix) return;
    mj_free(&ix->doc);
    free(ix->files);
    memset(ix, 0, sizeof *ix);
}

static int plain_file_name(const char *s, size_t n)
{
    if (n == 0 || n > 255 || !strcmp(s, ".") || !strcmp(s, "..")) return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] == '/' || s[i] == '\\' || s[i] == '\0') return 0;
    return 1;
}

static uint64_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

dsv4_status st_parse_index(const char *text, size_t len, const char *what, st_index *out)
{
    st_index ix;
    memset(&ix, 0, sizeof ix);
    DSV4_TRY(mj_parse(text, len, what, &ix.doc));
    const mj_doc *d = &ix.doc;
    dsv4_status st = DSV4_OK;
    if (d->nodes[0].type != MJ_OBJECT) {
        st = dsv4_fail(DSV4_ERR_FORMAT, "%s: not a JSON object", what);
        goto fail;
    }
    uint32_t md = mj_get(d, 0, "metadata");
    if (md != MJ_NONE && d->nodes[md].type != MJ_OBJECT && d->nodes[md].type != MJ_NULL) {
        st = dsv4_fail(DSV4_ERR_FORMAT, "%s: \"metadata\" is not an object", what);
        goto fail;
    }
    ix.weight_map = mj_get(d, 0, "weight_map");
    if (ix.weight_map == MJ_NONE || d->nodes[ix.weight_map].type != MJ_OBJECT) {
        st = dsv4_fail(DSV4_ERR_FORMAT, "%s: \"weight_map\" (an object of tensor name -> file) is missing", what);
        goto fail;
    }
    uint32_t wm = ix.weight_map, count = d->nodes[wm].count;
    /* The distinct file names, de-duplicated through an open-addressing table of their hashes
     * (slots: index + 1, 0 = empty) sized for every entry: linear in the weight map. */
    size_t slots = 16;
    while (slots < 2 * (size_t)count) slots *= 2;
    uint32_t *seen_at = calloc(slots, sizeof *seen_at);
    ix.files = malloc(((size_t)count + 1) * sizeof *ix.files);
    if (!ix.files || !seen_at) {
        free(seen_at);
        st = dsv4_fail(DSV4_ERR_NO_MEMORY, "%s: out of memory", what);
        goto fail;
    }
    for (uint32_t k = wm + 1, m = 0; m < count; m++, k = d->nodes[k + 1].end) {
        char q[96];
        mj_quote(mj_str(d, k), d->nodes[k].count, q, sizeof q);
        const mj_node *v = &d->nodes[k + 1];
        if (v->type != MJ_STRING) {
            st = dsv4_fail(DSV4_ERR_FORMAT, "%s: weight_map['%s'] is not a file name string", what, q);
            break;
        }
        const char *f = mj_str(d, k + 1);
        if (!plain_file_name(f, v->count) || v->has_nul) {
            char qf[96];
            mj_quote(f, v->count, qf, sizeof qf);
            st = dsv4_fail(DSV4_ERR_FORMAT, "%s: weight_map['%s'] = \"%s\" is not a plain file name in the checkpoint directory",
                           what, q, qf);
            break;
        }
        size_t h = (size_t)name_hash(f) & (slots - 1);
        while (seen_at[h] && strcmp(ix.files[seen_at[h] - 1], f)) h = (h + 1) & (slots - 1);
        if (seen_at[h]) continue;
        if (ix.n_files == ST_MAX_FILES) {
            st = dsv4_fail(DSV4_ERR_FORMAT, "%s: the weight map names more than %d shard files", what, ST_MAX_FILES);
            break;
        }
        ix.files[ix.n_files++] = f;
        seen_at[h] = (uint32_t)ix.n_files;
    }
    free(seen_at);
    if (st != DSV4_OK) goto fail;
    if (ix.n_files == 0) {
        st = dsv4_fail(DSV4_ERR_FORMAT, "%s: the weight map is empty", what);
        goto fail;
    }
    *out = ix;
    return DSV4_OK;
fail:
    st_index_free(&ix);
    return st;
}

/* ---- checkpoints ---------------------------------------------------------------------------- */

/* Slots hold (index + 1) | hash tag << 32; the tag skips most string compares. */
int64_t st_lookup(const dsv4_checkpoint *ck, const char *canon)
{
    if (!ck->hash) return -1;
    uint64_t hv = name_hash(canon), tag = hv >> 32;
    for (uint64_t h = hv & ck->hash_mask;; h = (h + 1) & ck->hash_mask) {
        uint64_t v = ck->hash[h];
        if (!v) return -1;
        if (v >> 32 == tag && !strcmp(ck->t[(uint32_t)v - 1].canon, canon)) return (int64_t)(uint32_t)v - 1;
    }
}

const void *st_data(const dsv4_checkpoint *ck, int64_t i)
{
    const st_tensor *t = &ck->t[i];
    return ck->maps[t->file] + ck->data_start[t->file] + t->begin;
}

void st_view(const dsv4_checkpoint *ck, int64_t i, dsv4_dtype as, dsv4_tensor *out)
{
    const st_tensor *t = &ck->t[i];
    int64_t shape[DSV4_MAX_DIMS];
    for (int k = 0; k < t->ndim; k++) shape[k] = t->shape[k];
    if (t->dtype == ST_F4 && t->ndim) shape[t->ndim - 1] /= 2;
    dsv4_tensor_init(out, (void *)st_data(ck, i), as, t->ndim, shape);
}

void dsv4_checkpoint_close(dsv4_checkpoint *ck)
{
    if (!ck) return;
    for (int i = 0; i < ck->n_files; i++) {
        if (ck->bases) free(ck->bases[i]);
        else if (ck->maps && ck->maps[i]) munmap(ck->maps[i], ck->sizes[i]);
        if (ck->arenas) free(ck->arenas[i]);
        if (ck->paths) free(ck->paths[i]);
    }
    free(ck->paths);
    free(ck->fnames);
    free(ck->maps);
    free(ck->bases);
    free(ck->sizes);
    free(ck->data_start);
    free(ck->arenas);
    free(ck->t);
    free(ck->hash);
    free(ck);
}

/* DSV4_LOAD_COPY: the file read into a new allocation (*base), placed so that its data area
 * (after the 8-byte length and the header) starts 64-byte aligned. */
static dsv4_status copy_file(const char *path, int fd, uint64_t size, uint8_t **base, uint8_t **map)
{
    uint8_t len8[8] = {0};
    uint64_t hl = 0;
    if (size >= 8 && pread(fd, len8, 8, 0) == 8)
        for (int k = 0; k < 8; k++) hl |= (uint64_t)len8[k] << (8 * k);
    const size_t shift = (size_t)((64 - (8 + hl) % 64) % 64);
    if (size > SIZE_MAX - 128) return dsv4_fail(DSV4_ERR_NO_MEMORY, "%s: %llu bytes cannot be copied", path, (unsigned long long)size);
    uint8_t *b = malloc((size_t)size + shift + 64);
    if (!b) return dsv4_fail(DSV4_ERR_NO_MEMORY, "%s: out of memory copying %llu bytes", path, (unsigned long long)size);
    uint8_t *m = (uint8_t *)(((uintptr_t)b + 63) & ~(uintptr_t)63) + shift;
    uint64_t got = 0;
    while (got < size) {
        ssize_t r = pread(fd, m + got, (size_t)(size - got < (1u << 30) ? size - got : (1u << 30)), (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            free(b);
            return dsv4_fail(DSV4_ERR_IO, "%s: %s after %llu of %llu bytes (did the file change while it was read?)", path,
                             r < 0 ? strerror(errno) : "end of file", (unsigned long long)got, (unsigned long long)size);
        }
        got += (uint64_t)r;
    }
    char extra;
    if (pread(fd, &extra, 1, (off_t)size) > 0) {
        free(b);
        return dsv4_fail(DSV4_ERR_IO, "%s: grew while it was read", path);
    }
    *base = b;
    *map = m;
    return DSV4_OK;
}

static dsv4_status map_file(const char *path, dsv4_load_mode mode, uint8_t **base, uint8_t **map, uint64_t *size)
{
    int fd;
    DSV4_TRY(dsv4_open_regular(path, &fd, size));
    *map = NULL;
    if (mode == DSV4_LOAD_COPY) {
        dsv4_status st = *size ? copy_file(path, fd, *size, base, map) : DSV4_OK;
        close(fd);
        return st;
    }
    if (*size > 0) {
        void *m = mmap(NULL, (size_t)*size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            return dsv4_fail(DSV4_ERR_IO, "%s: cannot map %llu bytes: %s", path, (unsigned long long)*size, strerror(e));
        }
        *map = m;
    }
    close(fd);
    return DSV4_OK;
}

static char *join_path(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t o = a;
    if (a && dir[a - 1] != '/') p[o++] = '/';
    memcpy(p + o, name, b + 1);
    return p;
}

/* Allocate the per-file arrays of ck for n files. */
static dsv4_status alloc_files(dsv4_checkpoint *ck, int n, dsv4_load_mode mode)
{
    if (mode == DSV4_LOAD_COPY && !(ck->bases = calloc((size_t)n, sizeof *ck->bases)))
        return dsv4_fail(DSV4_ERR_NO_MEMORY, "checkpoint: out of memory");
    ck->paths = calloc((size_t)n, sizeof *ck->paths);
    ck->fnames = calloc((size_t)n, sizeof *ck->fnames);
    ck->maps = calloc((size_t)n, sizeof *ck->maps);
    ck->sizes = calloc((size_t)n, sizeof *ck->sizes);
    ck->data_start = calloc((size_t)n, sizeof *ck->data_start);
    ck->arenas = calloc((size_t)n, sizeof *ck->arenas);
    if (!ck->paths || !ck->fnames || !ck->maps || !ck->sizes || !ck->data_start || !ck->arenas)
        return dsv4_fail(DSV4_ERR_NO_MEMORY, "checkpoint: out of memory");
    ck->n_files = n;
    return DSV4_OK;
}

/* Map and parse file i (path already set), appending its tensors to ck->t. */
static dsv4_status load_file(dsv4_checkpoint *ck, int i)
{
    const char *slash = strrchr(ck->paths[i], '/');
    ck->fnames[i] = slash ? slash + 1 : ck->paths[i];
    DSV4_TRY(map_file(ck->paths[i], ck->bases ? DSV4_LOAD_COPY : DSV4_LOAD_MAP, ck->bases ? &ck->bases[i] : NULL, &ck->maps[i],
                      &ck->sizes[i]));
    st_tensor *t;
    int64_t n;
    DSV4_TRY(st_parse(ck->maps[i] ? ck->maps[i] : (const uint8_t *)"", ck->sizes[i], ck->fnames[i], (uint32_t)i, &t, &n,
                      &ck->arenas[i], &ck->data_start[i]));
    st_tensor *all = realloc(ck->t, (size_t)(ck->n + n + 1) * sizeof *all);
    if (!all) {
        free(t);
        return dsv4_fail(DSV4_ERR_NO_MEMORY, "%s: out of memory", ck->fnames[i]);
    }
    memcpy(all + ck->n, t, (size_t)n * sizeof *t);
    free(t);
    ck->t = all;
    ck->n += n;
    return DSV4_OK;
}

/* Hash every canonical name; two tensors standing for the same weight are an error. */
static dsv4_status build_hash(dsv4_checkpoint *ck)
{
    uint64_t cap = 16;
    while (cap < 2 * (uint64_t)ck->n) cap *= 2;
    ck->hash = calloc(cap, sizeof *ck->hash);
    if (!ck->hash) return dsv4_fail(DSV4_ERR_NO_MEMORY, "checkpoint: out of memory");
    ck->hash_mask = cap - 1;
    int hf = 0;
    for (int64_t i = 0; i < ck->n; i++) {
        const st_tensor *t = &ck->t[i];
        if (!strncmp(t->name, "model.", 6)) hf = 1;
        uint64_t hv = name_hash(t->canon), h = hv & ck->hash_mask;
        for (; ck->hash[h]; h = (h + 1) & ck->hash_mask) {
            const st_tensor *o = &ck->t[(uint32_t)ck->hash[h] - 1];
            if (ck->hash[h] >> 32 == hv >> 32 && !strcmp(o->canon, t->canon)) {
                char q1[96], q2[96];
                mj_quote(o->name, strlen(o->name), q1, sizeof q1);
                mj_quote(t->name, strlen(t->name), q2, sizeof q2);
                return dsv4_fail(DSV4_ERR_FORMAT, "%s: tensor '%s' duplicates '%s' of %s (both are '%s')",
                                 ck->fnames[t->file], q2, q1, ck->fnames[o->file], t->canon);
            }
        }
        ck->hash[h] = (uint64_t)(i + 1) | (hv >> 32) << 32;
    }
    ck->layout = hf ? DSV4_LAYOUT_HF : DSV4_LAYOUT_OFFICIAL; /* names are matched canonically either way */
    return DSV4_OK;
}

/* Every weight-map entry is in the file it names, and every tensor is in the map. */
static dsv4_status check_index(const dsv4_checkpoint *ck, const st_index *ix, const char *what)
{
    const mj_doc *d = &ix->doc;
    uint32_t wm = ix->weight_map;
    uint8_t *listed = calloc((size_t)ck->n + 1, 1);
    char *canon = malloc(ST_MAX_NAME + 16);
    dsv4_status st = DSV4_OK;
    if (!listed || !canon) st = dsv4_fail(DSV4_ERR_NO_MEMORY, "%s: out of memory", what);
    for (uint32_t k = wm + 1, m = 0; st == DSV4_OK && m < d->nodes[wm].count; m++, k = d->nodes[k + 1].end) {
        const char *name = mj_str(d, k), *file = mj_str(d, k + 1);
        char q[96];
        mj_quote(name, d->nodes[k].count, q, sizeof q);
        int64_t i = -1;
        if (!d->nodes[k].has_nul && d->nodes[k].count <= ST_MAX_NAME) {
            st_canonical_name(name, canon);
            i = st_lookup(ck, canon);
        }
        if (i < 0 || strcmp(ck->t[i].name, name))
            st = dsv4_fail(DSV4_ERR_FORMAT, "%s: weight_map lists tensor '%s' in %s, which does not contain it", what, q, file);
        else if (strcmp(ck->fnames[ck->t[i].file], file))
            st = dsv4_fail(DSV4_ERR_FORMAT, "%s: weight_map puts tensor '%s' in %s but it is in %s", what, q, file,
                           ck->fnames[ck->t[i].file]);
        else
            listed[i] = 1;
    }
    for (int64_t i = 0; st == DSV4_OK && i < ck->n; i++)
        if (!listed[i]) {
            char q[96];
            mj_quote(ck->t[i].name, strlen(ck->t[i].name), q, sizeof q);
            st = dsv4_fail(DSV4_ERR_FORMAT, "%s: tensor '%s' is not listed in %s", ck->fnames[ck->t[i].file], q, what);
        }
    free(listed);
    free(canon);
    return st;
}

dsv4_status dsv4_checkpoint_open(const char *path, dsv4_checkpoint **out) { return dsv4_checkpoint_open_mode(path, DSV4_LOAD_MAP, out); }

dsv4_status dsv4_checkpoint_open_mode(const char *path, dsv4_load_mode mode, dsv4_checkpoint **out)
{
    DSV4_CHECK_ARG(path && out, "checkpoint_open: null argument");
    DSV4_CHECK_ARG(mode == DSV4_LOAD_MAP || mode == DSV4_LOAD_COPY, "checkpoint_open: load mode %d is neither MAP nor COPY", (int)mode);
    struct stat sb;
    if (stat(path, &sb) != 0)
        return dsv4_fail(errno == ENOENT ? DSV4_ERR_NOT_FOUND : DSV4_ERR_IO, "%s: %s", path, strerror(errno));
    dsv4_checkpoint *ck = calloc(1, sizeof *ck);
    if (!ck) return dsv4_fail(DSV4_ERR_NO_MEMORY, "checkpoint: out of memory");
    st_index ix;
    memset(&ix, 0, sizeof ix);
    char *index_path = NULL, *text = NULL;
    dsv4_status st = DSV4_OK;
    int is_dir = S_ISDIR(sb.st_mode);
    size_t plen = strlen(path);
    int is_index = !is_dir && plen >= 5 && !strcmp(path + plen - 5, ".json");
    if (is_dir) {
        index_path = join_path(path, "model.safetensors.index.json");
        if (!index_path) {
            st = dsv4_fail(DSV4_ERR_NO_MEMORY, "checkpoint: out of memory");
            goto done;
        }
        if (access(index_path, F_OK) != 0) {
            free(index_path);
            index_path = NULL;
        }
    } else if (is_index) {
        index_path = strdup(path);
    }
    if (index_path) {
        size_t len;
        if ((st = dsv4_read_file(index_path, (size_t)256 << 20, &text, &len)) != DSV4_OK) goto done;
        const char *slash = strrchr(index_path, '/');
        const char *what = slash ? slash + 1 : index_path;
        if ((st = st_parse_index(text, len, what, &ix)) != DSV4_OK) goto done;
        if ((st = alloc_files(ck, ix.n_files, mode)) != DSV4_OK) goto done;
        char *dir = strdup(index_path);
        if (!dir) {
            st = dsv4_fail(DSV4_ERR_NO_MEMORY, "checkpoint: out of memory");
            goto done;
        }
        char *ds = strrchr(dir, '/');
        if (ds) ds[1] = '\0';
        else strcpy(dir, ".");
        for (int i = 0; i < ix.n_files && st == DSV4_OK; i++) {
            ck->paths[i] = join_path(dir, ix.files[i]);
            st = ck->paths[i] ? load_file(ck, i) : dsv4_fail(DSV4_ERR_NO_MEMORY, "checkpoint: out of memory");
        }
        free(dir);
        if (st == DSV4_OK) st = build_hash(ck);
        if (st == DSV4_OK) st = check_index(ck, &ix, what);
    } else {
        if ((st = alloc_files(ck, 1, mode)) != DSV4_OK) goto done;
        ck->paths[0] = is_dir ? join_path(path, "model.safetensors") : strdup(path);
        if (!ck->paths[0]) {
            st = dsv4_fail(DSV4_ERR_NO_MEMORY, "checkpoint: out of memory");
            goto done;
        }
        if (is_dir && access(ck->paths[0], F_OK) != 0) {
            st = dsv4_fail(DSV4_ERR_NOT_FOUND, "%s: neither model.safetensors.index.json nor model.safetensors is there", path);
            goto done;
        }
        st = load_file(ck, 0);
        if (st == DSV4_OK) st = build_hash(ck);
    }
done:
    free(index_path);
    free(text);
    st_index_free(&ix);
    if (st != DSV4_OK) {
        dsv4_checkpoint_close(ck);
        return st;
    }
    *out = ck;
    return DSV4_OK;
}

int64_t dsv4_checkpoint_count(const dsv4_checkpoint *ck) { return ck ? ck->n : 0; }
int dsv4_checkpoint_file_count(const dsv4_checkpoint *ck) { return ck ? ck->n_files : 0; }
dsv4_layout dsv4_checkpoint_layout(const dsv4_checkpoint *ck) { return ck ? ck->layout : DSV4_LAYOUT_OFFICIAL; }

static void fill_entry(const dsv4_checkpoint *ck, int64_t i, dsv4_tensor_entry *e)
{
    const st_tensor *t = &ck->t[i];
    memset(e, 0, sizeof *e);
    e->name = t->name;
    e->canonical = t->canon;
    e->file = ck->fnames[t->file];
    e->st_dtype = st_dtype_name(t->dtype);
    e->dtype = st_dtype_to_dsv4(t->dtype);
    e->ndim = t->ndim;
    for (int k = 0; k < t->ndim; k++) e->shape[k] = t->shape[k];
    e->nbytes = st_nbytes(t);
    e->file_offset = ck->data_start[t->file] + t->begin;
    e->data = st_data(ck, i);
}

dsv4_status dsv4_checkpoint_entry(const dsv4_checkpoint *ck, int64_t i, dsv4_tensor_entry *out)
{
    DSV4_CHECK_ARG(ck && out, "checkpoint_entry: null argument");
    if (i < 0 || i >= ck->n)
        return dsv4_fail(DSV4_ERR_RANGE, "checkpoint_entry: index %lld not in [0, %lld)", (long long)i, (long long)ck->n);
    fill_entry(ck, i, out);
    return DSV4_OK;
}

dsv4_status dsv4_checkpoint_find(const dsv4_checkpoint *ck, const char *name, dsv4_tensor_entry *out)
{
    DSV4_CHECK_ARG(ck && name && out, "checkpoint_find: null argument");
    size_t len = strlen(name);
    char buf[ST_MAX_NAME + 16];
    if (len > ST_MAX_NAME) return dsv4_fail(DSV4_ERR_NOT_FOUND, "checkpoint: no tensor named '%.64s...'", name);
    st_canonical_name(name, buf);
    int64_t i = st_lookup(ck, buf);
    if (i < 0) return dsv4_fail(DSV4_ERR_NOT_FOUND, "checkpoint: no tensor named '%s'", name);
    fill_entry(ck, i, out);
    return DSV4_OK;
}
