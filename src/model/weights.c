/* The weight list of a config and its binding to a checkpoint: dsv4_model_open. */
#include "model/weights.h"

#include "core/error.h"
#include "core/json.h"
#include "model/safetensors.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- the list ------------------------------------------------------------------------------ */

typedef struct ws_ctx {
    ws_visit fn;
    void *user;
    ws_slot s;
    char prefix[32];
} ws_ctx;

static dsv4_status emit(ws_ctx *x, const char *name, ws_kind kind, ws_init init, int ndim, int64_t d0, int64_t d1,
                        dsv4_tensor *t)
{
    snprintf(x->s.name, sizeof x->s.name, "%s%s", x->prefix, name);
    x->s.kind = kind;
    x->s.init = init;
    x->s.ndim = ndim;
    x->s.shape[0] = d0;
    x->s.shape[1] = d1;
    x->s.t = t;
    x->s.lin = NULL;
    return x->fn(x->user, &x->s);
}

static dsv4_status emit_linear(ws_ctx *x, const char *name, ws_init init, int64_t out, int64_t in, dsv4_weight_format fmt,
                               dsv4_linear_weight *lin)
{
    snprintf(x->s.name, sizeof x->s.name, "%s%s", x->prefix, name);
    x->s.kind = WS_LINEAR;
    x->s.init = init;
    x->s.ndim = 2;
    x->s.shape[0] = out;
    x->s.shape[1] = in;
    x->s.fmt = fmt;
    x->s.t = NULL;
    x->s.lin = lin;
    return x->fn(x->user, &x->s);
}

static dsv4_status emit_compressor(ws_ctx *x, const char *base, int64_t coff_d, int64_t d, int64_t ratio, int64_t dim,
                                   dsv4_compressor_weights *cw)
{
    char n[64];
    snprintf(n, sizeof n, "%s.wkv.weight", base);
    DSV4_TRY(emit(x, n, WS_FLOAT, WI_LINEAR, 2, coff_d, dim, &cw->wkv));
    snprintf(n, sizeof n, "%s.wgate.weight", base);
    DSV4_TRY(emit(x, n, WS_FLOAT, WI_LINEAR, 2, coff_d, dim, &cw->wgate));
    snprintf(n, sizeof n, "%s.ape", base);
    DSV4_TRY(emit(x, n, WS_FLOAT, WI_SMALL, 2, ratio, coff_d, &cw->ape));
    snprintf(n, sizeof n, "%s.norm.weight", base);
    return emit(x, n, WS_FLOAT, WI_NORM, 1, d, 0, &cw->norm);
}

static dsv4_status emit_hc(ws_ctx *x, const char *site, const dsv4_model_config *c, int64_t mix, dsv4_tensor *fn,
                           dsv4_tensor *base, dsv4_tensor *scale, int64_t n_scale)
{
    char n[32];
    snprintf(n, sizeof n, "hc_%s_fn", site);
    DSV4_TRY(emit(x, n, WS_FLOAT, WI_HC_FN, 2, mix, c->hc_mult * c->dim, fn));
    snprintf(n, sizeof n, "hc_%s_base", site);
    DSV4_TRY(emit(x, n, WS_FLOAT, WI_SMALL, 1, mix, 0, base));
    snprintf(n, sizeof n, "hc_%s_scale", site);
    return emit(x, n, WS_FLOAT, WI_HC_SCALE, 1, n_scale, 0, scale);
}

static dsv4_status emit_block(ws_ctx *x, const dsv4_model_config *c, dsv4_layer_weights *L, dsv4_weight_format expert_fmt)
{
    const int64_t D = c->dim, H = c->n_heads, hd = c->head_dim, q = c->q_lora_rank, G = c->o_groups, ol = c->o_lora_rank;
    const int64_t E = c->n_routed_experts, I = c->moe_inter_dim, mix = (2 + c->hc_mult) * c->hc_mult;
    const dsv4_weight_format wf = c->weight_format;
    DSV4_TRY(emit(x, "attn_norm.weight", WS_FLOAT, WI_NORM, 1, D, 0, &L->attn_norm));
    DSV4_TRY(emit(x, "ffn_norm.weight", WS_FLOAT, WI_NORM, 1, D, 0, &L->ffn_norm));
    DSV4_TRY(emit_hc(x, "attn", c, mix, &L->hc_attn_fn, &L->hc_attn_base, &L->hc_attn_scale, 3));
    DSV4_TRY(emit_hc(x, "ffn", c, mix, &L->hc_ffn_fn, &L->hc_ffn_base, &L->hc_ffn_scale, 3));
    DSV4_TRY(emit_linear(x, "attn.wq_a", WI_LINEAR, q, D, wf, &L->wq_a));
    DSV4_TRY(emit(x, "attn.q_norm.weight", WS_FLOAT, WI_NORM, 1, q, 0, &L->q_norm));
    DSV4_TRY(emit_linear(x, "attn.wq_b", WI_LINEAR, H * hd, q, wf, &L->wq_b));
    DSV4_TRY(emit_linear(x, "attn.wkv", WI_LINEAR, hd, D, wf, &L->wkv));
    DSV4_TRY(emit(x, "attn.kv_norm.weight", WS_FLOAT, WI_NORM, 1, hd, 0, &L->kv_norm));
    DSV4_TRY(emit_linear(x, "attn.wo_a", WI_LINEAR, G * ol, H * hd / G, wf, &L->wo_a));
    DSV4_TRY(emit_linear(x, "attn.wo_b", WI_OUT, D, G * ol, wf, &L->wo_b));
    DSV4_TRY(emit(x, "attn.attn_sink", WS_FLOAT, WI_SINK, 1, H, 0, &L->attn_sink));
    if (L->kind != DSV4_ATTN_SWA) {
        int64_t coff = L->kind == DSV4_ATTN_CSA ? 2 : 1;
        DSV4_TRY(emit_compressor(x, "attn.compressor", coff * hd, hd, L->compress_ratio, D, &L->compressor));
    }
    if (L->kind == DSV4_ATTN_CSA) {
        const int64_t nI = c->index_n_heads, dI = c->index_head_dim;
        DSV4_TRY(emit_linear(x, "attn.indexer.wq_b", WI_LINEAR, nI * dI, q, wf, &L->index_wq_b));
        DSV4_TRY(emit(x, "attn.indexer.weights_proj.weight", WS_FLOAT, WI_LINEAR, 2, nI, D, &L->index_weights_proj));
        DSV4_TRY(emit_compressor(x, "attn.indexer.compressor", 2 * dI, dI, L->compress_ratio, D, &L->index_compressor));
    }
    DSV4_TRY(emit(x, "ffn.gate.weight", WS_FLOAT, WI_LINEAR, 2, E, D, &L->gate_weight));
    if (L->hash_routed) DSV4_TRY(emit(x, "ffn.gate.tid2eid", WS_INDEX, WI_TID2EID, 2, c->vocab_size, c->n_activated_experts, &L->tid2eid));
    else DSV4_TRY(emit(x, "ffn.gate.bias", WS_FLOAT, WI_SMALL, 1, E, 0, &L->gate_bias));
    for (int64_t e = 0; e < E; e++) {
        char n[48];
        dsv4_expert_weights *ex = &L->experts[e];
        snprintf(n, sizeof n, "ffn.experts.%lld.w1", (long long)e);
        DSV4_TRY(emit_linear(x, n, WI_LINEAR, I, D, expert_fmt, &ex->w1));
        snprintf(n, sizeof n, "ffn.experts.%lld.w2", (long long)e);
        DSV4_TRY(emit_linear(x, n, WI_OUT, D, I, expert_fmt, &ex->w2));
        snprintf(n, sizeof n, "ffn.experts.%lld.w3", (long long)e);
        DSV4_TRY(emit_linear(x, n, WI_LINEAR, I, D, expert_fmt, &ex->w3));
    }
    if (c->n_shared_experts) {
        DSV4_TRY(emit_linear(x, "ffn.shared_experts.w1", WI_LINEAR, I, D, wf, &L->shared.w1));
        DSV4_TRY(emit_linear(x, "ffn.shared_experts.w2", WI_OUT, D, I, wf, &L->shared.w2));
        DSV4_TRY(emit_linear(x, "ffn.shared_experts.w3", WI_LINEAR, I, D, wf, &L->shared.w3));
    }
    if (!L->is_mtp) return DSV4_OK;
    DSV4_TRY(emit_linear(x, "e_proj", WI_LINEAR, D, D, wf, &L->e_proj));
    DSV4_TRY(emit_linear(x, "h_proj", WI_LINEAR, D, D, wf, &L->h_proj));
    DSV4_TRY(emit(x, "enorm.weight", WS_FLOAT, WI_NORM, 1, D, 0, &L->enorm));
    DSV4_TRY(emit(x, "hnorm.weight", WS_FLOAT, WI_NORM, 1, D, 0, &L->hnorm));
    DSV4_TRY(emit(x, "norm.weight", WS_FLOAT, WI_NORM, 1, D, 0, &L->norm));
    return emit_hc(x, "head", c, c->hc_mult, &L->hc_head_fn, &L->hc_head_base, &L->hc_head_scale, 1);
}

dsv4_status ws_enumerate(const dsv4_model_config *c, dsv4_model_weights *w, int n_mtp, dsv4_weight_format expert_fmt,
                         ws_visit fn, void *user)
{
    ws_ctx x;
    memset(&x, 0, sizeof x);
    x.fn = fn;
    x.user = user;
    x.s.block = -1;
    const int64_t D = c->dim;
    DSV4_TRY(emit(&x, "embed.weight", WS_FLOAT, WI_EMBED, 2, c->vocab_size, D, &w->embed));
    if (!c->tie_word_embeddings) DSV4_TRY(emit(&x, "head.weight", WS_FLOAT, WI_HEAD, 2, c->vocab_size, D, &w->head));
    DSV4_TRY(emit(&x, "norm.weight", WS_FLOAT, WI_NORM, 1, D, 0, &w->norm));
    DSV4_TRY(emit_hc(&x, "head", c, c->hc_mult, &w->hc_head_fn, &w->hc_head_base, &w->hc_head_scale, 1));
    for (int b = 0; b < c->n_layers + n_mtp; b++) {
        int mtp = b >= c->n_layers;
        snprintf(x.prefix, sizeof x.prefix, mtp ? "mtp.%d." : "layers.%d.", mtp ? b - (int)c->n_layers : b);
        x.s.block = b;
        DSV4_TRY(emit_block(&x, c, &w->layers[b], expert_fmt));
    }
    return DSV4_OK;
}

dsv4_status ws_alloc(const dsv4_model_config *c, int n_mtp, dsv4_model_weights *w)
{
    memset(w, 0, sizeof *w);
    int nb = (int)c->n_layers + n_mtp;
    w->layers = calloc((size_t)nb, sizeof *w->layers);
    dsv4_expert_weights *ex = calloc((size_t)nb * (size_t)c->n_routed_experts + 1, sizeof *ex);
    if (!w->layers || !ex) {
        free(w->layers);
        free(ex);
        w->layers = NULL;
        return dsv4_fail(DSV4_ERR_NO_MEMORY, "model: out of memory for %d blocks", nb);
    }
    w->n_layers = (int)c->n_layers;
    w->n_mtp = n_mtp;
    for (int b = 0; b < nb; b++) {
        dsv4_layer_weights *L = &w->layers[b];
        L->index = b;
        L->is_mtp = b >= c->n_layers;
        L->kind = (dsv4_attn_kind)c->attn_kind[b];
        L->compress_ratio = c->compress_ratio[b];
        L->hash_routed = c->hash_routed[b];
        L->experts = ex + (size_t)b * (size_t)c->n_routed_experts;
    }
    return DSV4_OK;
}

void ws_free(dsv4_model_weights *w)
{
    if (!w || !w->layers) return;
    free(w->layers[0].experts);
    free(w->layers);
    w->layers = NULL;
}

int ws_linear_part(const ws_slot *s, int part, int64_t shape[2])
{
    int64_t out = s->shape[0], in = s->shape[1];
    shape[0] = out;
    shape[1] = in;
    switch (s->fmt) {
    case DSV4_WFMT_FP8:
        if (part == 0) return ST_F8_E4M3;
        shape[0] = (out + 127) / 128;
        shape[1] = (in + 127) / 128;
        return ST_F8_E8M0;
    case DSV4_WFMT_FP4:
        shape[1] = part == 0 ? in / 2 : in / 32;
        return part == 0 ? ST_I8 : ST_F8_E8M0;
    default:
        return part == 0 ? ST_BF16 : -1;
    }
}

/* ---- binding to a checkpoint ---------------------------------------------------------------- */

#define MAX_STORED_ISSUES 10000

typedef struct issue {
    dsv4_issue_kind kind;
    char *name, *message;
} issue;

struct dsv4_model {
    dsv4_model_config cfg;
    dsv4_checkpoint *ck;
    dsv4_model_weights w;
    uint8_t *used;
    void **copies; /* aligned copies of tensors whose mapped data is not aligned for their dtype */
    int n_copies;
    issue *issues;
    int n_issues, n_stored;
    char dir[512];
};

static void add_issue(dsv4_model *m, dsv4_issue_kind kind, const char *name, const char *fmt, ...) DSV4_PRINTF(4, 5);
static void add_issue(dsv4_model *m, dsv4_issue_kind kind, const char *name, const char *fmt, ...)
{
    m->n_issues++;
    if (m->n_stored >= MAX_STORED_ISSUES) return;
    if (m->n_stored % 64 == 0) {
        issue *g = realloc(m->issues, (size_t)(m->n_stored + 64) * sizeof *g);
        if (!g) return;
        m->issues = g;
    }
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    issue *is = &m->issues[m->n_stored];
    is->kind = kind;
    is->name = strdup(name);
    is->message = strdup(msg);
    if (!is->name || !is->message) {
        free(is->name);
        free(is->message);
        return;
    }
    m->n_stored++;
}

static void shape_str(int ndim, const int64_t *shape, char *buf, size_t cap)
{
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && o < cap; i++) o += (size_t)snprintf(buf + o, cap - o, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

/* Bind one stored tensor: present, one of the allowed st dtypes, this shape. Returns its index
 * or -1 (issue recorded). */
static int64_t bind_one(dsv4_model *m, const char *canon, const int *dtypes, int n_dtypes, int ndim, const int64_t *shape,
                        const char *why)
{
    dsv4_checkpoint *ck = m->ck;
    char lname[160];
    st_layout_name(canon, ck->layout, lname, sizeof lname);
    int64_t i = st_lookup(ck, canon);
    if (i < 0) {
        add_issue(m, DSV4_ISSUE_MISSING, canon, "%s: tensor '%s' is missing", m->dir, lname);
        return -1;
    }
    m->used[i] = 1;
    const st_tensor *t = &ck->t[i];
    const char *file = ck->fnames[t->file];
    int ok = 0;
    for (int k = 0; k < n_dtypes; k++) ok |= t->dtype == dtypes[k];
    if (!ok) {
        char want[64] = "";
        for (int k = 0; k < n_dtypes; k++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%s", k ? " or " : "", st_dtype_name(dtypes[k]));
        add_issue(m, DSV4_ISSUE_DTYPE, canon, "%s: tensor '%s' has dtype %s, expected %s%s", file, t->name,
                  st_dtype_name(t->dtype), want, why);
        return -1;
    }
    int64_t want_shape[2] = {shape[0], ndim > 1 ? shape[1] : 0};
    if (t->dtype == ST_F4 && ndim == 2) want_shape[1] *= 2; /* F4 counts elements, not bytes */
    int same = t->ndim == ndim;
    for (int k = 0; same && k < ndim; k++) same = t->shape[k] == want_shape[k];
    if (!same) {
        char got[96], want[96];
        shape_str(t->ndim, t->shape, got, sizeof got);
        shape_str(ndim, want_shape, want, sizeof want);
        add_issue(m, DSV4_ISSUE_SHAPE, canon, "%s: tensor '%s' has shape %s, expected %s by config.json", file, t->name, got, want);
        return -1;
    }
    return i;
}

/* Kernels read tensors through typed pointers, but the safetensors format places a tensor at any
 * byte (a header may be padded to any length, and a tensor may follow one of odd size): a view
 * whose data is not aligned for its dtype is pointed at an aligned copy instead, made here once,
 * so that nothing downstream reads a misaligned element. */
static dsv4_status align_view(dsv4_model *m, dsv4_tensor *t)
{
    const size_t sz = dsv4_dtype_size(t->dtype);
    if (!t->data || sz <= 1 || !((uintptr_t)t->data % sz)) return DSV4_OK;
    const size_t bytes = (size_t)dsv4_tensor_numel(t) * sz; /* mapped contiguous (the checkpoint's layout) */
    if (m->n_copies % 64 == 0) {
        void **g = realloc(m->copies, (size_t)(m->n_copies + 64) * sizeof *g);
        if (!g) return dsv4_fail(DSV4_ERR_NO_MEMORY, "model: out of memory");
        m->copies = g;
    }
    void *buf = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!buf) return dsv4_fail(DSV4_ERR_NO_MEMORY, "model: out of memory copying a misaligned tensor of %zu bytes", bytes);
    memcpy(buf, t->data, bytes);
    m->copies[m->n_copies++] = buf;
    t->data = buf;
    return DSV4_OK;
}

static dsv4_status bind_slot(void *user, const ws_slot *s)
{
    dsv4_model *m = user;
    static const int floats[] = {ST_BF16, ST_F32}, index[] = {ST_I64, ST_I32};
    static const int fp8[] = {ST_F8_E4M3}, fp4[] = {ST_I8, ST_U8, ST_F4}, scales[] = {ST_F8_E8M0, ST_U8};
    if (s->kind != WS_LINEAR) {
        int is_index = s->kind == WS_INDEX;
        int64_t i = bind_one(m, s->name, is_index ? index : floats, 2, s->ndim, s->shape, "");
        if (i < 0) return DSV4_OK;
        st_view(m->ck, i, (dsv4_dtype)st_dtype_to_dsv4(m->ck->t[i].dtype), s->t);
        return align_view(m, s->t);
    }
    char wn[160], sn[160];
    snprintf(wn, sizeof wn, "%s.weight", s->name);
    snprintf(sn, sizeof sn, "%s.scale", s->name);
    dsv4_linear_weight *L = s->lin;
    L->format = s->fmt;
    L->out_features = s->shape[0];
    L->in_features = s->shape[1];
    int64_t wshape[2], sshape[2];
    ws_linear_part(s, 0, wshape);
    ws_linear_part(s, 1, sshape);
    const char *why = s->fmt == DSV4_WFMT_FP8 ? " (fp8 weights by config.json)"
                      : s->fmt == DSV4_WFMT_FP4 ? " (fp4 experts)" : " (bf16 weights by config.json)";
    int64_t wi, si = -1;
    if (s->fmt == DSV4_WFMT_BF16) wi = bind_one(m, wn, floats, 2, 2, wshape, why);
    else wi = bind_one(m, wn, s->fmt == DSV4_WFMT_FP8 ? fp8 : fp4, s->fmt == DSV4_WFMT_FP8 ? 1 : 3, 2, wshape, why);
    if (s->fmt != DSV4_WFMT_BF16) si = bind_one(m, sn, scales, 2, 2, sshape, why);
    if (wi >= 0) {
        int raw = st_dtype_to_dsv4(m->ck->t[wi].dtype);
        st_view(m->ck, wi, s->fmt == DSV4_WFMT_FP4 ? DSV4_FP4X2 : (dsv4_dtype)raw, &L->weight);
        DSV4_TRY(align_view(m, &L->weight));
    }
    if (si >= 0) st_view(m->ck, si, DSV4_E8M0, &L->scale);
    return DSV4_OK;
}

/* The routed experts' format: the config's, or from the first expert weight in the checkpoint. */
static dsv4_weight_format resolve_expert_format(const dsv4_model *m)
{
    const dsv4_model_config *c = &m->cfg;
    if (c->expert_format != DSV4_WFMT_AUTO) return c->expert_format;
    int64_t i = st_lookup(m->ck, "layers.0.ffn.experts.0.w1.weight");
    if (i >= 0) {
        switch (m->ck->t[i].dtype) {
        case ST_I8: case ST_U8: case ST_F4: return DSV4_WFMT_FP4;
        case ST_F8_E4M3: return DSV4_WFMT_FP8;
        case ST_BF16: case ST_F32: return DSV4_WFMT_BF16;
        default: break;
        }
    }
    return c->weight_format == DSV4_WFMT_FP8 ? DSV4_WFMT_FP4 : DSV4_WFMT_BF16;
}

void dsv4_model_close(dsv4_model *m)
{
    if (!m) return;
    for (int i = 0; i < m->n_stored; i++) {
        free(m->issues[i].name);
        free(m->issues[i].message);
    }
    free(m->issues);
    free(m->used);
    for (int i = 0; i < m->n_copies; i++) free(m->copies[i]);
    free(m->copies);
    ws_free(&m->w);
    dsv4_checkpoint_close(m->ck);
    free(m);
}

static dsv4_status issue_status(dsv4_issue_kind k)
{
    switch (k) {
    case DSV4_ISSUE_DTYPE: return DSV4_ERR_DTYPE;
    case DSV4_ISSUE_SHAPE: return DSV4_ERR_SHAPE;
    case DSV4_ISSUE_MISSING: return DSV4_ERR_NOT_FOUND;
    default: return DSV4_ERR_FORMAT;
    }
}

static dsv4_status bind_all(dsv4_model *m)
{
    const dsv4_model_config *c = &m->cfg;
    dsv4_checkpoint *ck = m->ck;
    int has_mtp = 0;
    for (int64_t i = 0; i < ck->n && !has_mtp; i++) has_mtp = !strncmp(ck->t[i].canon, "mtp.", 4);
    int n_mtp = has_mtp ? (int)c->n_mtp_layers : 0;
    DSV4_TRY(ws_alloc(c, n_mtp, &m->w));
    m->w.layout = ck->layout;
    m->w.expert_format = resolve_expert_format(m);
    m->used = calloc((size_t)ck->n + 1, 1);
    if (!m->used) return dsv4_fail(DSV4_ERR_NO_MEMORY, "model: out of memory");
    DSV4_TRY(ws_enumerate(c, &m->w, n_mtp, m->w.expert_format, bind_slot, m));
    if (c->tie_word_embeddings) m->w.head = m->w.embed;
    for (int64_t i = 0; i < ck->n; i++)
        if (!m->used[i]) {
            char q[96];
            mj_quote(ck->t[i].name, strlen(ck->t[i].name), q, sizeof q);
            add_issue(m, DSV4_ISSUE_UNEXPECTED, ck->t[i].canon, "%s: tensor '%s' is not a weight of the model config.json describes",
                      ck->fnames[ck->t[i].file], q);
        }
    return DSV4_OK;
}

dsv4_status dsv4_model_open(const char *dir, const dsv4_model_open_options *options, dsv4_model **out)
{
    DSV4_CHECK_ARG(dir && out, "model_open: null argument");
    struct stat sb;
    if (stat(dir, &sb) != 0)
        return dsv4_fail(errno == ENOENT ? DSV4_ERR_NOT_FOUND : DSV4_ERR_IO, "%s: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) /* a file here would be read as config.json, whatever it holds */
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: not a directory (a model is the folder of config.json and the safetensors)", dir);
    dsv4_model *m = calloc(1, sizeof *m);
    if (!m) return dsv4_fail(DSV4_ERR_NO_MEMORY, "model: out of memory");
    snprintf(m->dir, sizeof m->dir, "%s", dir);
    dsv4_status st = dsv4_config_load(dir, &m->cfg);
    if (st == DSV4_OK) st = dsv4_checkpoint_open_mode(dir, options ? options->load : DSV4_LOAD_MAP, &m->ck);
    if (st == DSV4_OK) st = bind_all(m);
    if (st == DSV4_OK && m->n_issues && !(options && options->allow_issues)) {
        const issue *first = m->n_stored ? &m->issues[0] : NULL;
        st = dsv4_fail(first ? issue_status(first->kind) : DSV4_ERR_FORMAT, "%s%s(%d problem%s in all; `dsv4 inspect %s` lists them)",
                       first ? first->message : "", first ? " " : "", m->n_issues, m->n_issues > 1 ? "s" : "", dir);
    }
    if (st != DSV4_OK) {
        dsv4_model_close(m);
        return st;
    }
    *out = m;
    return DSV4_OK;
}

const dsv4_model_config *dsv4_model_get_config(const dsv4_model *m) { return m ? &m->cfg : NULL; }
const dsv4_model_weights *dsv4_model_get_weights(const dsv4_model *m) { return m ? &m->w : NULL; }
const dsv4_checkpoint *dsv4_model_get_checkpoint(const dsv4_model *m) { return m ? m->ck : NULL; }
int dsv4_model_issue_count(const dsv4_model *m) { return m ? m->n_issues : 0; }

dsv4_status dsv4_model_issue(const dsv4_model *m, int i, dsv4_model_issue_info *out)
{
    DSV4_CHECK_ARG(m && out, "model_issue: null argument");
    if (i < 0 || i >= m->n_stored)
        return dsv4_fail(DSV4_ERR_RANGE, "model_issue: %d not in [0, %d) (the first %d problems are kept)", i, m->n_stored,
                         MAX_STORED_ISSUES);
    out->kind = m->issues[i].kind;
    out->name = m->issues[i].name;
    out->message = m->issues[i].message;
    return DSV4_OK;
}
