/* A model's weights in the memory of a context's backend (model/weights_device.h). The mirror
 * starts as a copy of the checkpoint's dsv4_model_weights (views, formats, per-block facts); one
 * pass over the weight list (ws_enumerate) then moves each of its views, in place, to its offset
 * in the allocation. The same pass without an allocation sums the sizes, so the size query and
 * the upload cannot disagree on the list. */
#include "model/weights_device.h"

#include "core/backend.h"
#include "core/error.h"
#include "model/weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t align_up(uint64_t n) { return (n + ENG_DEV_ALIGN - 1) / ENG_DEV_ALIGN * ENG_DEV_ALIGN; }

/* One pass over the list: base NULL counts the bytes only. */
typedef struct dev_pass {
    dsv4_ctx *ctx;
    uint8_t *base;
    uint64_t off, cap;  /* aligned bytes placed; the allocation's size */
    uint64_t data;      /* tensor bytes (without the alignment) */
    uint64_t total;     /* of all tensors, for the reports */
    dsv4_device_kind device;
    int device_index;
    uint64_t chunk, every, next_report, done;
    double t0;
    const eng_dev_upload_options *opt;
} dev_pass;

static void report(dev_pass *p, int final)
{
    if (!p->opt || !p->opt->progress) return;
    eng_dev_progress r = {.done = p->done, .total = p->total, .seconds = now_s() - p->t0, .final = final};
    r.gbps = r.seconds > 0 ? (double)r.done / 1e9 / r.seconds : 0.0;
    p->opt->progress(p->opt->user, &r);
}

static dsv4_status put_view(dev_pass *p, const char *name, const char *part, dsv4_tensor *t)
{
    if (!t->data) return DSV4_OK; /* absent from the checkpoint, or not a tensor of this block */
    if (!dsv4_tensor_is_contiguous(t))
        return dsv4_fail(DSV4_ERR_STRIDE, "weights_device: tensor '%s%s' is not contiguous", name, part);
    const uint64_t bytes = (uint64_t)dsv4_tensor_numel(t) * dsv4_dtype_size(t->dtype);
    if (p->base) {
        if (p->off + bytes > p->cap) /* the size pass saw a different list: never, but never past the end */
            return dsv4_fail(DSV4_ERR_CAPACITY, "weights_device: tensor '%s%s' (%llu bytes) past the end of the %llu-byte "
                             "allocation", name, part, (unsigned long long)bytes, (unsigned long long)p->cap);
        uint8_t *dst = p->base + p->off;
        const uint8_t *src = t->data;
        for (uint64_t o = 0; o < bytes;) {
            uint64_t n = bytes - o < p->chunk ? bytes - o : p->chunk;
            DSV4_TRY(dsv4_device_upload(p->ctx, dst + o, src + o, (size_t)n));
            o += n;
            p->done += n;
            if (p->done >= p->next_report) {
                report(p, 0);
                while (p->next_report <= p->done) p->next_report += p->every;
            }
        }
        t->data = dst;
        t->device = p->device;
        t->device_index = p->device_index;
    }
    p->off += align_up(bytes);
    p->data += bytes;
    return DSV4_OK;
}

static dsv4_status put_slot(void *user, const ws_slot *s)
{
    dev_pass *p = user;
    if (s->kind != WS_LINEAR) return put_view(p, s->name, "", s->t);
    DSV4_TRY(put_view(p, s->name, ".weight", &s->lin->weight));
    return put_view(p, s->name, ".scale", &s->lin->scale);
}

/* The mirror as a copy of the checkpoint's weights for blocks 0..n_blocks-1 (own block and
 * expert arrays: ws_alloc), every view still on the source. */
static dsv4_status mirror_init(const dsv4_model *m, int n_blocks, dsv4_model_weights *w)
{
    const dsv4_model_config *c = dsv4_model_get_config(m);
    const dsv4_model_weights *src = dsv4_model_get_weights(m);
    const int lo = (int)c->n_layers, hi = src->n_layers + src->n_mtp;
    if (n_blocks < lo || n_blocks > hi)
        return dsv4_fail(DSV4_ERR_RANGE, "weights_device: %d blocks not in [%d, %d] (the layers, then the checkpoint's "
                         "%d MTP block%s)", n_blocks, lo, hi, src->n_mtp, src->n_mtp == 1 ? "" : "s");
    DSV4_TRY(ws_alloc(c, n_blocks - lo, w));
    dsv4_layer_weights *layers = w->layers;
    const int n_mtp = w->n_mtp;
    *w = *src;
    w->layers = layers;
    w->n_mtp = n_mtp;
    for (int b = 0; b < n_blocks; b++) {
        dsv4_expert_weights *ex = layers[b].experts;
        layers[b] = src->layers[b];
        layers[b].experts = ex;
        memcpy(ex, src->layers[b].experts, (size_t)c->n_routed_experts * sizeof *ex);
    }
    return DSV4_OK;
}

static dsv4_status run_pass(const dsv4_model *m, dsv4_model_weights *w, int n_blocks, dev_pass *p)
{
    const dsv4_model_config *c = dsv4_model_get_config(m);
    return ws_enumerate(c, w, n_blocks - (int)c->n_layers, w->expert_format, put_slot, p);
}

dsv4_status eng_dev_weights_size(const dsv4_model *m, int n_blocks, uint64_t *bytes)
{
    DSV4_CHECK_ARG(m && bytes, "weights_device_size: null argument");
    dsv4_model_weights w;
    DSV4_TRY(mirror_init(m, n_blocks, &w));
    dev_pass p = {0};
    dsv4_status st = run_pass(m, &w, n_blocks, &p);
    ws_free(&w);
    if (st == DSV4_OK) *bytes = p.off;
    return st;
}

dsv4_status eng_dev_weights_upload(dsv4_ctx *ctx, const dsv4_model *m, int n_blocks, const eng_dev_upload_options *opt,
                                   eng_dev_weights *out)
{
    DSV4_CHECK_ARG(m && out, "weights_device_upload: null argument");
    memset(out, 0, sizeof *out);
    const dsv4_backend *b;
    dsv4_exec ex;
    DSV4_TRY(dsv4_op_resolve(ctx, "weights_device_upload", DSV4_FAMILY_NONE, &b, &ex));
    eng_dev_weights d = {0};
    DSV4_TRY(mirror_init(m, n_blocks, &d.w));
    dev_pass size = {0}; /* the sizes first, on the views as they are (nothing written) */
    dsv4_status st = run_pass(m, &d.w, n_blocks, &size);
    dsv4_device_info di;
    if (st == DSV4_OK && b->device != DSV4_DEVICE_CPU && dsv4_device_info_get(ctx, &di) == DSV4_OK && di.free_memory &&
        size.off > di.free_memory) /* refused with the numbers, before the allocation fails without them */
        st = dsv4_fail(DSV4_ERR_NO_MEMORY, "weights_device_upload: the weights of %d blocks take %.2f GiB, %.2f GiB of %s's "
                       "memory is free", n_blocks, (double)size.off / (double)(1ull << 30),
                       (double)di.free_memory / (double)(1ull << 30), di.name);
    if (st == DSV4_OK) st = dsv4_device_alloc(ctx, (size_t)size.off, &d.mem);
    if (st != DSV4_OK) {
        ws_free(&d.w);
        return st;
    }
    d.bytes = size.off;
    dev_pass p = {.ctx = ctx, .base = d.mem, .cap = d.bytes, .total = size.data, .device = b->device, .opt = opt};
    p.device_index = b->device == DSV4_DEVICE_CPU ? 0 : ex.device; /* as dsv4_device_tensor_alloc sets it */
    p.chunk = opt && opt->chunk ? opt->chunk : ENG_DEV_CHUNK;
    p.every = opt && opt->every ? opt->every : ENG_DEV_REPORT;
    p.next_report = p.every;
    p.t0 = now_s();
    st = run_pass(m, &d.w, n_blocks, &p);
    if (st == DSV4_OK) st = dsv4_device_sync(ctx);
    if (st != DSV4_OK) {
        eng_dev_weights_free(ctx, &d);
        return st;
    }
    if (dsv4_model_get_config(m)->tie_word_embeddings) d.w.head = d.w.embed; /* the list has no head then */
    d.seconds = now_s() - p.t0;
    d.gbps = d.seconds > 0 ? (double)p.done / 1e9 / d.seconds : 0.0;
    report(&p, 1);
    *out = d;
    return DSV4_OK;
}

void eng_dev_weights_free(dsv4_ctx *ctx, eng_dev_weights *d)
{
    if (!d) return;
    if (d->mem) dsv4_device_free(ctx, d->mem);
    ws_free(&d->w);
    memset(d, 0, sizeof *d);
}

int eng_dev_progress_line(const eng_dev_progress *p, char *buf, size_t cap)
{
    if (!p || !buf || !cap) return 0;
    if (p->final)
        return snprintf(buf, cap, "weights to device: %.1f GB in %.1f s, %.1f GB/s", (double)p->done / 1e9, p->seconds, p->gbps);
    return snprintf(buf, cap, "weights to device: %.1f of %.1f GB, %.1f GB/s", (double)p->done / 1e9, (double)p->total / 1e9,
                    p->gbps);
}
