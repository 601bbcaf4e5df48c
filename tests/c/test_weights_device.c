/* The weights in a backend's memory (src/model/weights_device.h) on the cpu backend, where the
 * allocation is host memory: the tiny model (FP8 weights, FP4 experts, MTP, 2 shards) and a tied
 * BF16 one in the transformers layout. Every mirror view against its source, walked in the order
 * of the one weight list: same shape, dtype, strides, format, the bytes equal, each at its own
 * aligned place in the allocation; absent tensors still absent; a tied head aliased; the size
 * query equal to the allocation; progress reports; bad arguments refused. */
#include "dsv4.h"
#include "model/weights.h"
#include "model/weights_device.h"
#include "test_util.h"

/* The views of a weight set in list order (a linear slot gives its weight, then its scale). */
#define MAX_VIEWS 4096
typedef struct view_list {
    dsv4_tensor *t[MAX_VIEWS];
    const dsv4_linear_weight *lin[MAX_VIEWS]; /* the slot's, for linear parts */
    char name[MAX_VIEWS][48];
    int n;
} view_list;

static dsv4_status collect(void *user, const ws_slot *s)
{
    view_list *v = user;
    if (v->n + 2 > MAX_VIEWS) return DSV4_ERR_CAPACITY;
    for (int part = 0; part < (s->kind == WS_LINEAR ? 2 : 1); part++) {
        v->t[v->n] = s->kind == WS_LINEAR ? (part ? &s->lin->scale : &s->lin->weight) : s->t;
        v->lin[v->n] = s->lin;
        snprintf(v->name[v->n], sizeof v->name[0], "%.40s%s", s->name, s->kind != WS_LINEAR ? "" : part ? ".scale" : ".weight");
        v->n++;
    }
    return DSV4_OK;
}

static int cmp_ptr(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)(*(dsv4_tensor *const *)a)->data, y = (uintptr_t)(*(dsv4_tensor *const *)b)->data;
    return x < y ? -1 : x > y;
}

static uint64_t view_bytes(const dsv4_tensor *t) { return (uint64_t)dsv4_tensor_numel(t) * dsv4_dtype_size(t->dtype); }

/* Every check of a mirror against its model; returns the number of the list's views that the
 * checkpoint lacks (data NULL). */
static int check_mirror(const dsv4_model *m, int n_blocks, const eng_dev_weights *d)
{
    const dsv4_model_config *c = dsv4_model_get_config(m);
    const dsv4_model_weights *src = dsv4_model_get_weights(m);
    const dsv4_model_weights *w = &d->w;
    const int n_mtp = n_blocks - (int)c->n_layers;
    CHECK(w->layout == src->layout && w->expert_format == src->expert_format && w->n_layers == src->n_layers &&
              w->n_mtp == n_mtp && w->layers && w->layers != src->layers,
          "mirror header: layout %d/%d, experts %d/%d, layers %d/%d, mtp %d (want %d)", w->layout, src->layout,
          w->expert_format, src->expert_format, w->n_layers, src->n_layers, w->n_mtp, n_mtp);
    for (int b = 0; b < n_blocks; b++) {
        const dsv4_layer_weights *L = &w->layers[b], *S = &src->layers[b];
        CHECK(L->index == S->index && L->is_mtp == S->is_mtp && L->kind == S->kind && L->compress_ratio == S->compress_ratio &&
                  L->hash_routed == S->hash_routed && L->experts && L->experts != S->experts,
              "block %d: per-block facts differ or the experts are shared with the source", b);
    }
    static view_list a, v; /* source, mirror */
    a.n = v.n = 0;
    /* the visits only record pointers: nothing is written to the model's weights */
    CHECK_STATUS(ws_enumerate(c, (dsv4_model_weights *)src, n_mtp, src->expert_format, collect, &a), DSV4_OK);
    CHECK_STATUS(ws_enumerate(c, (dsv4_model_weights *)w, n_mtp, w->expert_format, collect, &v), DSV4_OK);
    CHECK(a.n == v.n && a.n > 0, "%d source views, %d mirror views", a.n, v.n);
    static dsv4_tensor *placed[MAX_VIEWS];
    int n_placed = 0, n_null = 0, bad = 0;
    uint64_t aligned = 0;
    const uint8_t *lo = d->mem, *hi = lo + d->bytes;
    for (int i = 0; i < a.n && i < v.n && bad < 5; i++) {
        const dsv4_tensor *s = a.t[i], *t = v.t[i];
        if (!s->data) {
            n_null++;
            if (t->data) {
                bad++;
                CHECK(0, "%s: absent from the checkpoint, present in the mirror", a.name[i]);
            }
            continue;
        }
        int same = t->data && t->dtype == s->dtype && t->ndim == s->ndim;
        for (int k = 0; same && k < s->ndim; k++) same = t->shape[k] == s->shape[k] && t->stride[k] == s->stride[k];
        if (!same) {
            bad++;
            CHECK(0, "%s: the mirror's view differs in data presence, dtype, shape or strides", a.name[i]);
            continue;
        }
        const uint8_t *p = t->data;
        const uint64_t n = view_bytes(s);
        if (p < lo || p + n > hi || (uintptr_t)p % ENG_DEV_ALIGN || t->device != DSV4_DEVICE_CPU || t->device_index != 0 ||
            t->data == s->data) {
            bad++;
            CHECK(0, "%s: at %p (%llu bytes) not an aligned place of the allocation [%p, %p) of the cpu backend", a.name[i],
                  t->data, (unsigned long long)n, (void *)lo, (void *)hi);
            continue;
        }
        if (memcmp(p, s->data, n)) {
            bad++;
            CHECK(0, "%s: the uploaded bytes differ from the source's", a.name[i]);
        }
        if (a.lin[i]) {
            const dsv4_linear_weight *sl = a.lin[i], *tl = v.lin[i];
            if (sl->format != tl->format || sl->out_features != tl->out_features || sl->in_features != tl->in_features) {
                bad++;
                CHECK(0, "%s: the linear's format or sizes differ", a.name[i]);
            }
        }
        placed[n_placed++] = (dsv4_tensor *)t;
        aligned += (n + ENG_DEV_ALIGN - 1) / ENG_DEV_ALIGN * ENG_DEV_ALIGN;
    }
    CHECK(bad == 0, "%d mirror views wrong (the first 5 are named above)", bad);
    /* each tensor its own place: sorted by address, none overlaps the next */
    qsort(placed, (size_t)n_placed, sizeof *placed, cmp_ptr);
    for (int i = 0; i + 1 < n_placed; i++)
        if ((const uint8_t *)placed[i]->data + view_bytes(placed[i]) > (const uint8_t *)placed[i + 1]->data) {
            CHECK(0, "two mirror views overlap at %p", placed[i + 1]->data);
            break;
        }
    CHECK(aligned == d->bytes, "the placed views take %llu aligned bytes, the allocation has %llu", (unsigned long long)aligned,
          (unsigned long long)d->bytes);
    /* globals outside the list's order: a tied head is the embedding's view */
    if (c->tie_word_embeddings)
        CHECK(w->head.data == w->embed.data && w->head.data && !memcmp(&w->head, &w->embed, sizeof w->head),
              "tied head: %p, embedding %p", w->head.data, w->embed.data);
    else
        CHECK(w->head.data != w->embed.data && w->head.data, "untied head shares the embedding's place");
    return n_null;
}

typedef struct reports {
    int n, finals, monotone;
    eng_dev_progress last;
} reports;

static void on_progress(void *user, const eng_dev_progress *p)
{
    reports *r = user;
    if (r->n && (p->done < r->last.done || p->seconds < r->last.seconds)) r->monotone = 0;
    r->n++;
    r->finals += p->final;
    r->last = *p;
}

static void test_tiny(dsv4_ctx *ctx, const char *dir)
{
    dsv4_model *m = NULL;
    CHECK_STATUS(dsv4_model_open(dir, NULL, &m), DSV4_OK);
    if (!m) return;
    const dsv4_model_config *c = dsv4_model_get_config(m);
    const int nl = (int)c->n_layers, nb = nl + dsv4_model_get_weights(m)->n_mtp;
    CHECK(nb == nl + 1, "the tiny model has %d blocks, expected %d layers + 1 MTP block", nb, nl);
    uint64_t s_main = 0, s_all = 0;
    CHECK_STATUS(eng_dev_weights_size(m, nl, &s_main), DSV4_OK);
    CHECK_STATUS(eng_dev_weights_size(m, nb, &s_all), DSV4_OK);
    CHECK(s_main > 0 && s_all > s_main && s_main % ENG_DEV_ALIGN == 0, "sizes %llu (layers), %llu (with MTP)",
          (unsigned long long)s_main, (unsigned long long)s_all);

    /* reports every 256 KiB, chunks of an odd size (a tensor in several uploads, the last short) */
    reports r = {.monotone = 1};
    eng_dev_upload_options o = {.progress = on_progress, .user = &r, .chunk = 40009, .every = 256 << 10};
    eng_dev_weights d;
    CHECK_STATUS(eng_dev_weights_upload(ctx, m, nb, &o, &d), DSV4_OK);
    if (d.mem) {
        CHECK(d.bytes == s_all, "allocation %llu bytes, size query %llu", (unsigned long long)d.bytes, (unsigned long long)s_all);
        CHECK(check_mirror(m, nb, &d) == 0, "the tiny model lacks none of its tensors");
        /* views the config does not list for a block stay empty: an SWA block's compressors, a
         * main block's MTP tensors, the router bias of a hash-routed block, the table of a learned one */
        const dsv4_layer_weights *L0 = &d.w.layers[0], *L3 = &d.w.layers[3];
        CHECK(L0->kind == DSV4_ATTN_SWA && L0->hash_routed && !L3->hash_routed, "tiny schedule changed: fix this test");
        CHECK(!L0->compressor.wkv.data && !L0->index_compressor.ape.data && !L0->index_wq_b.weight.data &&
                  !L0->e_proj.weight.data && !L0->hnorm.data && !L0->gate_bias.data && L0->tid2eid.data &&
                  !L3->tid2eid.data && L3->gate_bias.data && d.w.layers[nl].e_proj.weight.data,
              "empty views of the source are empty in the mirror, present ones present");
        CHECK(d.seconds >= 0 && d.gbps >= 0, "time %g s, %g GB/s", d.seconds, d.gbps);
        /* tensor bytes: the allocation less the alignment padding */
        CHECK(r.finals == 1 && r.last.final && r.last.done == r.last.total && r.last.total <= d.bytes &&
                  r.last.total > d.bytes / 2 && r.monotone,
              "final report: %d finals, %llu of %llu bytes, monotone %d", r.finals, (unsigned long long)r.last.done,
              (unsigned long long)r.last.total, r.monotone);
        const int want = (int)(r.last.total / o.every); /* one per 256 KiB crossed, then the final one */
        CHECK(r.n == want + 1, "%d reports for %llu bytes every %llu, expected %d", r.n, (unsigned long long)r.last.total,
              (unsigned long long)o.every, want + 1);
        char line[160];
        eng_dev_progress_line(&r.last, line, sizeof line);
        CHECK(strstr(line, "GB in") && strstr(line, "GB/s"), "final line '%s'", line);
        eng_dev_progress mid = r.last;
        mid.final = 0;
        eng_dev_progress_line(&mid, line, sizeof line);
        CHECK(strstr(line, " of ") && strstr(line, "GB/s"), "progress line '%s'", line);
    }
    eng_dev_weights_free(ctx, &d);
    CHECK(!d.mem && !d.w.layers && !d.bytes, "free leaves the handle empty");
    eng_dev_weights_free(ctx, &d); /* again: a no-op */
    eng_dev_weights_free(ctx, NULL);

    /* the layers only, no reports (defaults) */
    CHECK_STATUS(eng_dev_weights_upload(ctx, m, nl, NULL, &d), DSV4_OK);
    if (d.mem) {
        CHECK(d.bytes == s_main && d.w.n_mtp == 0, "layers only: %llu bytes (size %llu), %d MTP", (unsigned long long)d.bytes,
              (unsigned long long)s_main, d.w.n_mtp);
        check_mirror(m, nl, &d);
    }
    eng_dev_weights_free(ctx, &d);

    /* bad arguments: clear errors, nothing held */
    uint64_t x = 7;
    CHECK_STATUS(eng_dev_weights_size(NULL, nl, &x), DSV4_ERR_INVALID_ARG);
    CHECK_STATUS(eng_dev_weights_size(m, nl, NULL), DSV4_ERR_INVALID_ARG);
    CHECK_STATUS(eng_dev_weights_size(m, nl - 1, &x), DSV4_ERR_RANGE);
    CHECK_STATUS(eng_dev_weights_size(m, nb + 1, &x), DSV4_ERR_RANGE);
    CHECK_STATUS(eng_dev_weights_size(m, -1, &x), DSV4_ERR_RANGE);
    CHECK(x == 7, "a refused size query wrote %llu", (unsigned long long)x);
    memset(&d, 0x5a, sizeof d);
    CHECK_STATUS(eng_dev_weights_upload(ctx, m, nb + 1, NULL, &d), DSV4_ERR_RANGE);
    CHECK(!d.mem && !d.w.layers && !d.bytes, "a refused upload leaves the handle empty");
    CHECK_STATUS(eng_dev_weights_upload(ctx, NULL, nb, NULL, &d), DSV4_ERR_INVALID_ARG);
    CHECK_STATUS(eng_dev_weights_upload(ctx, m, nb, NULL, NULL), DSV4_ERR_INVALID_ARG);
    dsv4_model_close(m);
}

/* Tied embeddings, BF16 weights (no scales), no MTP block: the head is uploaded once and aliased,
 * and counted once: the untied model of the same config takes exactly the head's bytes more. */
static void test_tied(dsv4_ctx *ctx, const char *base)
{
    char dir[2][300];
    uint64_t size[2] = {0, 0};
    for (int tie = 0; tie < 2; tie++) {
        snprintf(dir[tie], sizeof dir[tie], "%s/%s", base, tie ? "tied" : "untied");
        dsv4_model_config c;
        dsv4_config_tiny(&c);
        c.weight_format = DSV4_WFMT_BF16;
        c.expert_format = DSV4_WFMT_BF16;
        c.tie_word_embeddings = tie;
        dsv4_write_options o = {.seed = 5, .shards = 1, .layout = DSV4_LAYOUT_HF};
        CHECK_STATUS(dsv4_checkpoint_write(dir[tie], &c, &o), DSV4_OK);
        dsv4_model *m = NULL;
        CHECK_STATUS(dsv4_model_open(dir[tie], NULL, &m), DSV4_OK);
        if (!m) continue;
        const int nl = (int)c.n_layers;
        CHECK_STATUS(eng_dev_weights_size(m, nl, &size[tie]), DSV4_OK);
        CHECK_STATUS(eng_dev_weights_size(m, nl + 1, &size[tie]), DSV4_ERR_RANGE); /* no MTP block to include */
        eng_dev_weights d;
        CHECK_STATUS(eng_dev_weights_upload(ctx, m, nl, NULL, &d), DSV4_OK);
        if (d.mem) {
            CHECK(d.bytes == size[tie], "tie %d: allocation %llu, size %llu", tie, (unsigned long long)d.bytes,
                  (unsigned long long)size[tie]);
            CHECK(d.w.layers[0].wq_a.weight.dtype == DSV4_BF16 && !d.w.layers[0].wq_a.scale.data, "BF16 linear without scale");
            check_mirror(m, nl, &d);
        }
        eng_dev_weights_free(ctx, &d);
        if (m && !tie) {
            const dsv4_tensor *h = &dsv4_model_get_weights(m)->head;
            uint64_t hb = (uint64_t)dsv4_tensor_numel(h) * dsv4_dtype_size(h->dtype);
            size[0] -= (hb + ENG_DEV_ALIGN - 1) / ENG_DEV_ALIGN * ENG_DEV_ALIGN; /* what the tied one lacks */
        }
        dsv4_model_close(m);
        test_rm_dir(dir[tie]);
    }
    CHECK(size[0] == size[1] && size[1] > 0, "untied less its head %llu bytes, tied %llu", (unsigned long long)size[0],
          (unsigned long long)size[1]);
}

/* Tensors the checkpoint lacks stay absent: a checkpoint opened with allow_issues against a
 * config.json whose indexer has half the heads (its wq_b and weights_proj do not bind). */
static void test_absent(dsv4_ctx *ctx, const char *base)
{
    char dir[300], path[340];
    snprintf(dir, sizeof dir, "%s/absent", base);
    dsv4_model_config c;
    dsv4_config_tiny(&c);
    dsv4_write_options o = {.seed = 9, .shards = 1};
    CHECK_STATUS(dsv4_checkpoint_write(dir, &c, &o), DSV4_OK);
    c.index_n_heads /= 2;
    static char json[1 << 16];
    size_t len = 0;
    CHECK_STATUS(dsv4_config_to_json(&c, json, sizeof json, &len), DSV4_OK);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(json, 1, len, f) == len, "cannot rewrite %s", path);
    if (f) fclose(f);
    dsv4_model *m = NULL;
    dsv4_model_open_options mo = {.allow_issues = 1};
    CHECK_STATUS(dsv4_model_open(dir, &mo, &m), DSV4_OK);
    if (m) {
        CHECK(dsv4_model_issue_count(m) > 0 && !dsv4_model_get_weights(m)->layers[1].index_wq_b.weight.data,
              "the indexer of layer 1 should not bind (%d issues)", dsv4_model_issue_count(m));
        eng_dev_weights d;
        CHECK_STATUS(eng_dev_weights_upload(ctx, m, (int)c.n_layers, NULL, &d), DSV4_OK);
        if (d.mem) {
            int n_null = check_mirror(m, (int)c.n_layers, &d);
            CHECK(n_null >= 4, "%d absent views, expected the indexers' wq_b weight + scale and weights_proj", n_null);
            CHECK(!d.w.layers[1].index_wq_b.weight.data && !d.w.layers[1].index_weights_proj.data &&
                      d.w.layers[1].index_compressor.wkv.data,
                  "layer 1: absent indexer views present in the mirror, or present ones absent");
        }
        eng_dev_weights_free(ctx, &d);
        dsv4_model_close(m);
    }
    test_rm_dir(dir);
}

int main(void)
{
    test_seed();
    char base[64], tiny[96];
    snprintf(base, sizeof base, "/tmp/dsv4-wdev-XXXXXX");
    if (!mkdtemp(base)) {
        printf("cannot make a temporary directory\n");
        return 1;
    }
    snprintf(tiny, sizeof tiny, "%s/tiny", base);
    CHECK(dsv4_make_tiny(tiny, test_rand_u64() % 1000) == DSV4_OK, "make_tiny: %s", dsv4_last_error());
    dsv4_ctx *ctx = NULL;
    dsv4_ctx_options o = {.backend = "cpu", .threads = 1};
    CHECK(dsv4_ctx_create(&o, &ctx) == DSV4_OK, "context: %s", dsv4_last_error());
    if (ctx) {
        test_tiny(ctx, tiny);
        test_tied(ctx, base);
        test_absent(ctx, base);
    }
    dsv4_ctx_destroy(ctx);
    test_rm_dir(tiny);
    rmdir(base);
    TEST_DONE();
}
