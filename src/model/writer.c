/* Writing checkpoints: config.json + safetensors (one file, or shards + index) of a config with
 * well-scaled random weights, in the official layout (FP8 128x128 / FP4 1x32 block formats) or
 * the transformers layout (BF16). `dsv4 make-tiny` is dsv4_make_tiny. */
#include "core/error.h"
#include "dsv4/formats.h"
#include "formats/codec.h"
#include "model/safetensors.h"
#include "model/weights.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct wrec {
    char name[160];  /* in the layout being written */
    ws_slot slot;    /* what it is (slot.t / slot.lin unused) */
    int part;        /* linear: 0 weight, 1 scale */
    int st;          /* st_dtype */
    int ndim;
    int64_t shape[2];
    uint64_t nbytes, begin;
    int shard;
} wrec;

typedef struct wlist {
    wrec *r;
    int64_t n, cap;
    const dsv4_write_options *opt;
    int n_blocks;
} wlist;

static dsv4_status push(wlist *l, const ws_slot *s, int part, int st, int ndim, const int64_t *shape)
{
    if (l->n == l->cap) {
        int64_t cap = l->cap ? l->cap * 2 : 256;
        wrec *r = realloc(l->r, (size_t)cap * sizeof *r);
        if (!r) return dsv4_fail(DSV4_ERR_NO_MEMORY, "checkpoint_write: out of memory");
        l->r = r;
        l->cap = cap;
    }
    wrec *w = &l->r[l->n++];
    memset(w, 0, sizeof *w);
    w->slot = *s;
    w->part = part;
    w->st = st;
    w->ndim = ndim;
    uint64_t numel = 1;
    for (int k = 0; k < ndim; k++) {
        w->shape[k] = shape[k];
        numel *= (uint64_t)shape[k];
    }
    w->nbytes = numel * (uint64_t)st_dtype_bits(st) / 8;
    char canon[160];
    if (s->kind == WS_LINEAR) snprintf(canon, sizeof canon, "%s.%s", s->name, part ? "scale" : "weight");
    else snprintf(canon, sizeof canon, "%s", s->name);
    st_layout_name(canon, l->opt->layout, w->name, sizeof w->name);
    int shards = l->opt->shards;
    w->shard = (int)((int64_t)(s->block + 1) * shards / (l->n_blocks + 1));
    if (w->shard >= shards) w->shard = shards - 1;
    return DSV4_OK;
}

static dsv4_status collect(void *user, const ws_slot *s)
{
    wlist *l = user;
    int official = l->opt->layout == DSV4_LAYOUT_OFFICIAL;
    if (s->kind == WS_INDEX) return push(l, s, 0, ST_I64, s->ndim, s->shape);
    if (s->kind == WS_FLOAT) {
        /* official checkpoints keep mHC params, sinks, ape and router biases in F32 */
        int f32 = official && (s->init == WI_HC_FN || s->init == WI_HC_SCALE || s->init == WI_SMALL || s->init == WI_SINK);
        return push(l, s, 0, f32 ? ST_F32 : ST_BF16, s->ndim, s->shape);
    }
    for (int part = 0; part < 2; part++) {
        int64_t shape[2];
        int st = ws_linear_part(s, part, shape);
        if (st >= 0) DSV4_TRY(push(l, s, part, st, 2, shape));
    }
    return DSV4_OK;
}

/* ---- random values ---------------------------------------------------------------------------- */

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Unit-variance, bell-shaped (sum of four uniforms): plain arithmetic, the same bits everywhere. */
static float rnd_normal(uint64_t *s)
{
    uint64_t u = splitmix(s);
    float sum = 0;
    for (int k = 0; k < 4; k++) sum += (float)((u >> (16 * k)) & 0xFFFF) * (1.0f / 65536.0f);
    return (sum - 2.0f + 2.0f / 65536.0f) * 1.7320508f;
}

static uint64_t tensor_seed(uint64_t seed, const char *canon)
{
    uint64_t h = 1469598103934665603ull ^ seed;
    for (const char *c = canon; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
    return h;
}

/* The float values of a slot, [numel] (row-major, logical shape). Conditioned as trained networks
 * are (docs/testing.md §4.1): every sub-layer reads an RMS-normalized input, so what sets the
 * end-to-end gain is how much each residual branch adds to streams of RMS ~1 (the embedding
 * rows): output projections are 0.05 / sqrt(in), a few percent per branch; the mHC mixes lean on
 * their base (fn 0.2 / sqrt(in)); the head gives logits of standard deviation ~2. */
static void gen_values(const ws_slot *s, uint64_t seed, float *x, int64_t numel)
{
    uint64_t st = tensor_seed(seed, s->name);
    int64_t in = s->ndim == 2 ? s->shape[1] : s->shape[0];
    float fan = 1.0f / sqrtf((float)(in > 0 ? in : 1));
    for (int64_t i = 0; i < numel; i++) {
        float n = rnd_normal(&st);
        switch (s->init) {
        case WI_NORM: x[i] = 1.0f + 0.1f * n; break;
        case WI_EMBED: case WI_SINK: x[i] = n; break;
        case WI_HEAD: x[i] = 2.0f * fan * n; break;
        case WI_OUT: x[i] = 0.05f * fan * n; break;
        case WI_HC_FN: x[i] = 0.2f * fan * n; break;
        case WI_SMALL: x[i] = 0.1f * n; break;
        case WI_HC_SCALE: x[i] = 0.75f + 0.1f * n; break;
        default: x[i] = fan * n; break;
        }
    }
}

/* Distinct experts per token: the first k of a seeded shuffle. */
static void gen_tid2eid(const ws_slot *s, uint64_t seed, int64_t n_experts, int64_t *out, int64_t *perm)
{
    uint64_t st = tensor_seed(seed, s->name);
    int64_t k = s->shape[1];
    for (int64_t e = 0; e < n_experts; e++) perm[e] = e;
    for (int64_t t = 0; t < s->shape[0]; t++) {
        for (int64_t j = 0; j < k; j++) {
            int64_t r = j + (int64_t)(splitmix(&st) % (uint64_t)(n_experts - j));
            int64_t tmp = perm[j];
            perm[j] = perm[r];
            perm[r] = tmp;
            out[t * k + j] = perm[j];
        }
    }
}

/* FP8 E4M3 with one E8M0 scale per 128x128 block (edge blocks allowed), the act128 scale rule
 * applied to the block's amax. */
static void quant_fp8_blocks(const float *x, int64_t out, int64_t in, uint8_t *codes, uint8_t *scales)
{
    const dsv4_qrule_params *rule = &dsv4_qrules[DSV4_QRULE_ACT128];
    int64_t nbc = (in + 127) / 128;
    for (int64_t br = 0; br < (out + 127) / 128; br++)
        for (int64_t bc = 0; bc < nbc; bc++) {
            int64_t r1 = br * 128 + 128 < out ? br * 128 + 128 : out, c0 = bc * 128;
            int64_t cn = c0 + 128 < in ? 128 : in - c0;
            float amax = 0;
            for (int64_t r = br * 128; r < r1; r++) {
                float a = dsv4_absmax(x + r * in + c0, cn);
                if (a > amax) amax = a;
            }
            int e = dsv4_qrule_exponent(rule, amax);
            float inv = dsv4_pow2f(-e);
            for (int64_t r = br * 128; r < r1; r++)
                for (int64_t c = c0; c < c0 + cn; c++) codes[r * in + c] = dsv4_e4m3_from_f32(x[r * in + c] * inv);
            scales[br * nbc + bc] = (uint8_t)(e + 127);
        }
}

/* The bytes of record w into buf (w->nbytes); scratch holds 2 floats per element of the slot. */
static dsv4_status gen_record(const wrec *w, uint64_t seed, int64_t n_experts, dsv4_ctx *ctx, void *buf, float *scratch)
{
    const ws_slot *s = &w->slot;
    int64_t numel = s->shape[0] * (s->ndim == 2 ? s->shape[1] : 1);
    if (s->kind == WS_INDEX) {
        gen_tid2eid(s, seed, n_experts, buf, (int64_t *)scratch);
        return DSV4_OK;
    }
    gen_values(s, seed, scratch, numel);
    if (s->kind == WS_FLOAT || s->fmt == DSV4_WFMT_BF16) {
        if (w->st == ST_F32) memcpy(buf, scratch, (size_t)numel * 4);
        else
            for (int64_t i = 0; i < numel; i++) ((uint16_t *)buf)[i] = dsv4_bf16_from_f32(scratch[i]);
        return DSV4_OK;
    }
    int64_t out = s->shape[0], in = s->shape[1];
    uint8_t *codes = (uint8_t *)(scratch + numel);
    if (s->fmt == DSV4_WFMT_FP8) {
        uint8_t *sc = codes + numel;
        quant_fp8_blocks(scratch, out, in, codes, sc);
        memcpy(buf, w->part ? sc : codes, (size_t)w->nbytes);
        return DSV4_OK;
    }
    /* FP4: 1x32 groups along the input, through the formats API, then nibble-packed */
    dsv4_tensor tx, tc, ts;
    int64_t xs[2] = {out, in}, ss[2] = {out, in / 32};
    uint8_t *sc = codes + numel;
    DSV4_TRY(dsv4_tensor_init(&tx, scratch, DSV4_F32, 2, xs));
    DSV4_TRY(dsv4_tensor_init(&tc, codes, DSV4_U8, 2, xs));
    DSV4_TRY(dsv4_tensor_init(&ts, sc, DSV4_E8M0, 2, ss));
    DSV4_TRY(dsv4_quantize(ctx, DSV4_QRULE_FP4_32, &tx, &tc, &ts));
    if (w->part) memcpy(buf, sc, (size_t)w->nbytes);
    else DSV4_TRY(dsv4_fp4_pack(codes, numel, buf));
    return DSV4_OK;
}

/* ---- files ------------------------------------------------------------------------------------ */

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static int sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return 0;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return 1;
}

static int sb_str(sbuf *b, const char *s) { return sb_put(b, s, strlen(s)); }

static int rec_order(const void *a, const void *b)
{
    const wrec *x = a, *y = b;
    if (x->shard != y->shard) return x->shard - y->shard;
    int bx = st_dtype_bits(x->st), by = st_dtype_bits(y->st); /* widest first: every tensor stays aligned */
    if (bx != by) return by - bx;
    return strcmp(x->name, y->name);
}

static dsv4_status write_all(FILE *f, const void *p, size_t n, const char *path)
{
    if (n && fwrite(p, 1, n, f) != n) return dsv4_fail(DSV4_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return DSV4_OK;
}

static void shard_name(const dsv4_write_options *o, int s, char *out, size_t cap)
{
    if (o->shards == 1) snprintf(out, cap, "model.safetensors");
    else snprintf(out, cap, "model-%05d-of-%05d.safetensors", s + 1, o->shards);
}

/* Records [lo, hi) of one shard into dir/name. */
static dsv4_status write_shard(const char *path, wrec *r, int64_t lo, int64_t hi, const dsv4_model_config *c,
                               const dsv4_write_options *o, dsv4_ctx *ctx, float *scratch, void *buf)
{
    sbuf h = {0};
    uint64_t off = 0;
    int ok = sb_str(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int64_t i = lo; i < hi && ok; i++) {
        char e[512];
        r[i].begin = off;
        off += r[i].nbytes;
        int n = snprintf(e, sizeof e, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", r[i].name, st_dtype_name(r[i].st));
        for (int k = 0; k < r[i].ndim; k++) n += snprintf(e + n, sizeof e - (size_t)n, k ? ",%lld" : "%lld", (long long)r[i].shape[k]);
        snprintf(e + n, sizeof e - (size_t)n, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)r[i].begin,
                 (unsigned long long)off);
        ok = sb_str(&h, e);
    }
    ok = ok && sb_str(&h, "}");
    while (ok && (h.n + 8) % 8) ok = sb_str(&h, " ");
    if (!ok) {
        free(h.p);
        return dsv4_fail(DSV4_ERR_NO_MEMORY, "checkpoint_write: out of memory");
    }
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(h.p);
        return dsv4_fail(DSV4_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    }
    uint8_t len8[8];
    for (int k = 0; k < 8; k++) len8[k] = (uint8_t)((uint64_t)h.n >> (8 * k));
    dsv4_status st = write_all(f, len8, 8, path);
    if (st == DSV4_OK) st = write_all(f, h.p, h.n, path);
    uint64_t total = 8 + h.n + off;
    free(h.p);
    for (int64_t i = lo; i < hi && st == DSV4_OK && !o->sparse; i++) {
        st = gen_record(&r[i], o->seed, c->n_routed_experts, ctx, buf, scratch);
        if (st == DSV4_OK) st = write_all(f, buf, (size_t)r[i].nbytes, path);
    }
    if (fflush(f) != 0 && st == DSV4_OK) st = dsv4_fail(DSV4_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    if (st == DSV4_OK && o->sparse && ftruncate(fileno(f), (off_t)total) != 0)
        st = dsv4_fail(DSV4_ERR_IO, "%s: cannot extend to %llu bytes: %s", path, (unsigned long long)total, strerror(errno));
    if (fclose(f) != 0 && st == DSV4_OK) st = dsv4_fail(DSV4_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return st;
}

static char *path_in(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static dsv4_status write_text(const char *dir, const char *name, const char *text, size_t n)
{
    char *path = path_in(dir, name);
    if (!path) return dsv4_fail(DSV4_ERR_NO_MEMORY, "checkpoint_write: out of memory");
    FILE *f = fopen(path, "wb");
    dsv4_status st = DSV4_OK;
    if (!f) st = dsv4_fail(DSV4_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    else {
        st = write_all(f, text, n, path);
        if (fclose(f) != 0 && st == DSV4_OK) st = dsv4_fail(DSV4_ERR_IO, "%s: write failed", path);
    }
    free(path);
    return st;
}

static dsv4_status write_index(const char *dir, const wrec *r, int64_t n, const dsv4_write_options *o)
{
    uint64_t total = 0;
    for (int64_t i = 0; i < n; i++) total += r[i].nbytes;
    sbuf b = {0};
    char line[512];
    snprintf(line, sizeof line, "{\n  \"metadata\": {\"total_size\": %llu},\n  \"weight_map\": {", (unsigned long long)total);
    int ok = sb_str(&b, line);
    for (int64_t i = 0; i < n && ok; i++) {
        char file[64];
        shard_name(o, r[i].shard, file, sizeof file);
        snprintf(line, sizeof line, "%s\n    \"%s\": \"%s\"", i ? "," : "", r[i].name, file);
        ok = sb_str(&b, line);
    }
    ok = ok && sb_str(&b, "\n  }\n}\n");
    dsv4_status st = ok ? write_text(dir, "model.safetensors.index.json", b.p, b.n)
                        : dsv4_fail(DSV4_ERR_NO_MEMORY, "checkpoint_write: out of memory");
    free(b.p);
    return st;
}

static dsv4_status make_dir(const char *dir)
{
    struct stat sb;
    if (stat(dir, &sb) == 0) return S_ISDIR(sb.st_mode) ? DSV4_OK : dsv4_fail(DSV4_ERR_IO, "%s exists and is not a directory", dir);
    if (mkdir(dir, 0755) != 0) return dsv4_fail(DSV4_ERR_IO, "%s: cannot create the directory: %s", dir, strerror(errno));
    return DSV4_OK;
}

static dsv4_status check_options(const dsv4_model_config *c, const dsv4_write_options *o)
{
    DSV4_TRY(dsv4_config_validate(c));
    if (o->shards < 1 || o->shards > 999) return dsv4_fail(DSV4_ERR_INVALID_ARG, "checkpoint_write: %d shards (1 to 999)", o->shards);
    if (o->layout != DSV4_LAYOUT_OFFICIAL && o->layout != DSV4_LAYOUT_HF)
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "checkpoint_write: unknown layout %d", (int)o->layout);
    if (o->layout == DSV4_LAYOUT_HF && (c->weight_format != DSV4_WFMT_BF16 || c->expert_format != DSV4_WFMT_BF16))
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "checkpoint_write: the transformers layout holds BF16 weights; the config says %s / %s experts",
                         dsv4_weight_format_name(c->weight_format), dsv4_weight_format_name(c->expert_format));
    return DSV4_OK;
}

dsv4_status dsv4_checkpoint_write(const char *dir, const dsv4_model_config *cfg, const dsv4_write_options *options)
{
    DSV4_CHECK_ARG(dir && cfg, "checkpoint_write: null argument");
    dsv4_write_options resolved = options ? *options : (dsv4_write_options){0};
    if (resolved.shards == 0) resolved.shards = 1; /* the zero default: one file */
    DSV4_TRY(check_options(cfg, &resolved));
    const dsv4_write_options *o = &resolved;
    int n_mtp = o->with_mtp ? (int)cfg->n_mtp_layers : 0;
    dsv4_weight_format ef = cfg->expert_format == DSV4_WFMT_AUTO ? DSV4_WFMT_FP4 : cfg->expert_format;
    /* config.json first: a config the official naming cannot express fails before any file is written */
    size_t len = 0, cap = 16384;
    char *text = malloc(cap);
    if (!text) return dsv4_fail(DSV4_ERR_NO_MEMORY, "checkpoint_write: out of memory");
    dsv4_status st = dsv4_config_to_json(cfg, text, cap, &len);
    if (st == DSV4_OK) st = make_dir(dir);
    dsv4_model_weights w;
    if (st == DSV4_OK) st = ws_alloc(cfg, n_mtp, &w);
    if (st != DSV4_OK) {
        free(text);
        return st;
    }
    wlist l = {NULL, 0, 0, o, (int)cfg->n_layers + n_mtp};
    st = ws_enumerate(cfg, &w, n_mtp, ef, collect, &l);
    ws_free(&w);
    float *scratch = NULL;
    void *buf = NULL;
    dsv4_ctx *ctx = NULL;
    if (st == DSV4_OK) {
        qsort(l.r, (size_t)l.n, sizeof *l.r, rec_order);
        uint64_t biggest = 0;
        for (int64_t i = 0; i < l.n; i++) {
            uint64_t numel = (uint64_t)l.r[i].slot.shape[0] * (uint64_t)(l.r[i].slot.ndim == 2 ? l.r[i].slot.shape[1] : 1);
            if (numel > biggest) biggest = numel;
            if (l.r[i].nbytes > biggest) biggest = l.r[i].nbytes;
        }
        if (!o->sparse) {
            /* floats, then codes and scales behind them (and int64 shuffles for tid2eid) */
            scratch = malloc((size_t)biggest * 3 * sizeof(float) + (size_t)cfg->n_routed_experts * 8 + 64);
            buf = malloc((size_t)biggest * 4 + 64);
            if (!scratch || !buf) st = dsv4_fail(DSV4_ERR_NO_MEMORY, "checkpoint_write: out of memory");
            /* one thread: the generation between quantize calls is serial, idle workers would only spin */
            dsv4_ctx_options one = {.backend = NULL, .threads = 1};
            if (st == DSV4_OK) st = dsv4_ctx_create(&one, &ctx);
        }
    }
    for (int s = 0, i0 = 0; s < o->shards && st == DSV4_OK; s++) {
        int64_t i1 = i0;
        while (i1 < l.n && l.r[i1].shard == s) i1++;
        char name[64];
        shard_name(o, s, name, sizeof name);
        char *path = path_in(dir, name);
        st = path ? write_shard(path, l.r, i0, i1, cfg, o, ctx, scratch, buf)
                  : dsv4_fail(DSV4_ERR_NO_MEMORY, "checkpoint_write: out of memory");
        free(path);
        i0 = (int)i1;
    }
    /* a file of the other arrangement left from an earlier write would shadow or confuse this one */
    char *stale = path_in(dir, o->shards > 1 ? "model.safetensors" : "model.safetensors.index.json");
    if (stale) unlink(stale);
    free(stale);
    if (st == DSV4_OK && o->shards > 1) st = write_index(dir, l.r, l.n, o);
    if (st == DSV4_OK) st = write_text(dir, "config.json", text, len);
    free(text);
    dsv4_ctx_destroy(ctx);
    free(scratch);
    free(buf);
    free(l.r);
    return st;
}

dsv4_status dsv4_make_tiny(const char *dir, uint64_t seed)
{
    dsv4_model_config c;
    dsv4_config_tiny(&c);
    dsv4_write_options o = {seed, 2, DSV4_LAYOUT_OFFICIAL, 1, 0};
    return dsv4_checkpoint_write(dir, &c, &o);
}
