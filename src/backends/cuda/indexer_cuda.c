/* The indexer family of the cuda backend (core/ops_indexer.h): the query path (RoPE, Hadamard,
 * FP4), head weights, scores, top-k and select (scores and top-k fused: no [T, N] scores in memory)
 * on the device (indexer_cuda.cu), launched on the context's stream with nothing allocated, read
 * back or waited for. Positions in host memory and n_valid (host arrays) are read by the glue and
 * travel in the launch parameters, a bounded number of tokens a launch; positions in device
 * memory (the graph-shaped decode step) are read by the kernels. The compressor
 * (compressor_cuda.cu) keeps its state in device memory: its entries and state update, and the
 * reset of a fresh state, are launches on the stream too (start_pos and n_tokens are host
 * scalars of the call, or the one token's position is read on the device). */
#include "backends/cuda/cuda_glue.h"
#include "backends/cuda/cuda_indexer.h"
#include "core/error.h"
#include "core/ops_indexer.h"

_Static_assert(DSV4_CU_IX_MAX_HEADS == DSV4_IX_MAX_HEADS, "the scores kernel's shared query follows the op limit");
_Static_assert(DSV4_CU_CMP_MAX_DIM == DSV4_CMP_MAX_DIM, "the compressor's shared entry row follows the op limit");

static dsv4_status cu_compress(const dsv4_exec *ex, const dsv4_cmp_call *c)
{
    dsv4_cu_cmp a = {
        .kind = c->kind, .ratio = c->ratio, .dim = c->dim, .overlap = c->overlap, .fp8_sim = c->fp8_sim,
        .norm_bf16 = c->norm_bf16, .packed = c->out_mode == DSV4_CMP_OUT_PACKED, .eps = c->eps,
        .start_pos = c->start_pos, .n_tokens = c->n_tokens, .kv = c->kv, .gate = c->gate, .ld_in_kv = c->ld_in_kv,
        .ld_in_gate = c->ld_in_gate, .ape = c->ape, .ld_ape = c->ld_ape, .norm = c->norm, .rope = c->rope,
        .ld_rope = c->ld_rope, .state_kv = c->state_kv, .state_score = c->state_score,
        .ld_state_kv = c->ld_state_kv, .ld_state_score = c->ld_state_score, .out = c->out, .ld_out = c->ld_out,
        .out_scales = c->out_scales, .ld_out_scales = c->ld_out_scales,
        .position = c->position, .out_rows = c->out_rows, .rope_rows = c->rope_rows,
    };
    CU_LAUNCH(ex, "compressor_forward", dsv4_cu_cmp_launch(&a, dsv4_cu_stream(ex)));
}

static dsv4_status cu_compress_reset(const dsv4_exec *ex, float *state_kv, int64_t ld_kv, float *state_score,
                                     int64_t ld_score, int64_t rows, int64_t cols)
{
    CU_LAUNCH(ex, "compressor_state_reset",
              dsv4_cu_cmp_reset_launch(state_kv, ld_kv, state_score, ld_score, rows, cols, dsv4_cu_stream(ex)));
}

static dsv4_status cu_head_weights(const dsv4_exec *ex, const void *proj, int proj_bf16, int64_t ld_proj,
                                   int64_t tokens, int64_t heads, float scale, float *out, int64_t ld_out)
{
    CU_LAUNCH(ex, "indexer_weights",
              dsv4_cu_ix_weights_launch(proj, proj_bf16, ld_proj, tokens, heads, scale, out, ld_out,
                                        dsv4_cu_stream(ex)));
}

static int64_t host_position(const void *p, int i64, int64_t ld, int64_t t)
{
    return i64 ? ((const int64_t *)p)[t * ld] : ((const int32_t *)p)[t * ld];
}

static dsv4_status cu_index_q(const dsv4_exec *ex, const dsv4_ixq_call *c)
{
    const char *op = "indexer_q";
    dsv4_cu_guard g;
    DSV4_TRY(dsv4_cu_enter(ex, op, &g));
    dsv4_cu_ixq a = {
        .heads = c->heads, .dim = c->dim, .packed = c->packed,
        .q = c->q, .ld_q_t = c->ld_q_t, .ld_q_h = c->ld_q_h, .rope = c->rope, .ld_rope = c->ld_rope, .out = c->out,
        .ld_out_t = c->ld_out_t, .ld_out_h = c->ld_out_h, .out_scales = c->out_scales, .ld_os_t = c->ld_os_t,
        .ld_os_h = c->ld_os_h,
    };
    int err = 0;
    for (int64_t t0 = 0; t0 < c->tokens && !err; t0 += DSV4_CU_IXQ_TOKENS) {
        a.t0 = t0;
        a.tokens = c->tokens - t0 < DSV4_CU_IXQ_TOKENS ? c->tokens - t0 : DSV4_CU_IXQ_TOKENS;
        if (c->pos_device) {
            a.dpos = c->positions, a.ld_dpos = c->ld_pos, a.rope_rows = c->rope_rows;
        } else {
            for (int64_t i = 0; i < a.tokens; i++) a.pos[i] = host_position(c->positions, c->pos_i64, c->ld_pos, t0 + i);
        }
        err = dsv4_cu_ixq_launch(&a, dsv4_cu_stream(ex));
    }
    dsv4_cu_leave(&g);
    return dsv4_cu_status(err, op);
}

/* Candidates of token t: (position + 1) / ratio (dsv4_indexer_args). */
static int32_t n_candidates(const dsv4_ix_operands *o, int64_t t)
{
    /* <= n_cache < 2^31 - 1 (op layer) */
    return (int32_t)((host_position(o->positions, o->pos_i64, o->ld_pos, t) + 1) / o->ratio);
}

/* The operands of the scores kernels (counts filled per launch). */
static dsv4_cu_ix_scores score_args(const dsv4_ix_operands *o)
{
    return (dsv4_cu_ix_scores){
        .n_cache = o->n_cache, .heads = (int)o->heads, .dim = o->dim, .q = o->q, .q_scales = o->q_scales,
        .ld_q_t = o->ld_q_t, .ld_q_h = o->ld_q_h, .ld_qs_t = o->ld_qs_t, .ld_qs_h = o->ld_qs_h,
        .weights = o->weights, .ld_w = o->ld_w, .k = o->k, .k_scales = o->k_scales, .ld_k = o->ld_k, .ld_ks = o->ld_ks,
        .dpos = o->pos_device ? o->positions : NULL, .ld_dpos = o->ld_pos, .ratio = o->ratio,
    };
}

static dsv4_status cu_scores(const dsv4_exec *ex, const dsv4_ix_operands *o, float *scores, int64_t ld)
{
    const char *op = "indexer_scores";
    dsv4_cu_guard g;
    DSV4_TRY(dsv4_cu_enter(ex, op, &g));
    dsv4_cu_ix_scores a = score_args(o);
    int err = 0;
    for (int64_t t0 = 0; t0 < o->tokens && !err; t0 += DSV4_CU_IX_TOKENS) {
        a.t0 = t0;
        a.tokens = o->tokens - t0 < DSV4_CU_IX_TOKENS ? o->tokens - t0 : DSV4_CU_IX_TOKENS;
        for (int64_t i = 0; i < a.tokens && !o->pos_device; i++) a.count[i] = n_candidates(o, t0 + i);
        err = dsv4_cu_ix_scores_launch(&a, scores, ld, dsv4_cu_stream(ex));
    }
    dsv4_cu_leave(&g);
    return dsv4_cu_status(err, op);
}

static dsv4_status cu_topk(const dsv4_exec *ex, const float *scores, int64_t ld, int64_t tokens, int64_t n,
                           const int32_t *n_valid, int64_t ld_valid, const dsv4_topk_out *out)
{
    const char *op = "indexer_topk";
    if (out->topk > DSV4_CU_IX_MAX_TOPK)
        return dsv4_fail(DSV4_ERR_UNSUPPORTED, "%s: topk %lld is more than the cuda kernel's %d", op,
                         (long long)out->topk, DSV4_CU_IX_MAX_TOPK);
    dsv4_cu_guard g;
    DSV4_TRY(dsv4_cu_enter(ex, op, &g));
    dsv4_cu_ix_topk a = {.topk = out->topk, .scores = scores, .ld = ld, .indices = out->indices,
                         .ld_indices = out->ld_indices, .lengths = out->lengths, .ld_lengths = out->ld_lengths};
    int err = 0;
    for (int64_t t0 = 0; t0 < tokens && !err; t0 += DSV4_CU_IX_TOKENS) {
        a.t0 = t0;
        a.tokens = tokens - t0 < DSV4_CU_IX_TOKENS ? tokens - t0 : DSV4_CU_IX_TOKENS;
        for (int64_t i = 0; i < a.tokens; i++) a.count[i] = n_valid ? n_valid[(t0 + i) * ld_valid] : (int32_t)n;
        err = dsv4_cu_ix_topk_launch(&a, dsv4_cu_stream(ex));
    }
    dsv4_cu_leave(&g);
    return dsv4_cu_status(err, op);
}

/* select: parts per token, so that about SEL_SLOTS CTAs score at once (at most SEL_MAX_PARTS a
 * token); tokens * parts <= SEL_SLOTS + tokens rows of topk keys in the workspace. */
#define SEL_SLOTS 256
#define SEL_MAX_PARTS 32

static int select_parts(int64_t tokens)
{
    const int64_t p = (SEL_SLOTS + tokens - 1) / tokens;
    return p > SEL_MAX_PARTS ? SEL_MAX_PARTS : (int)p;
}

/* topk keeps its keys in shared memory; select's parts keep theirs in the workspace. */
static size_t cu_workspace_size(const dsv4_exec *ex, int64_t tokens, int64_t topk)
{
    (void)ex;
    return 64 + (size_t)(SEL_SLOTS + tokens) * (size_t)topk * sizeof(uint64_t);
}

static dsv4_status cu_select(const dsv4_exec *ex, const dsv4_ix_operands *o, const dsv4_topk_out *out)
{
    const char *op = "indexer_select";
    if (out->topk > DSV4_CU_IX_MAX_TOPK)
        return dsv4_fail(DSV4_ERR_UNSUPPORTED, "%s: topk %lld is more than the cuda kernel's %d", op,
                         (long long)out->topk, DSV4_CU_IX_MAX_TOPK);
    if (out->workspace_bytes < cu_workspace_size(ex, o->tokens, out->topk))
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: workspace too small", op);
    dsv4_cu_guard g;
    DSV4_TRY(dsv4_cu_enter(ex, op, &g));
    dsv4_cu_ix_select a = {
        .s = score_args(o),
        .topk = out->topk, .ws = (unsigned long long *)(((uintptr_t)out->workspace + 15) & ~(uintptr_t)15),
        .indices = out->indices, .ld_indices = out->ld_indices, .lengths = out->lengths,
        .ld_lengths = out->ld_lengths,
    };
    const int parts = select_parts(o->tokens);
    int err = 0;
    for (int64_t t0 = 0; t0 < o->tokens && !err; t0 += DSV4_CU_IX_TOKENS) {
        a.s.t0 = t0;
        a.s.tokens = o->tokens - t0 < DSV4_CU_IX_TOKENS ? o->tokens - t0 : DSV4_CU_IX_TOKENS;
        for (int64_t i = 0; i < a.s.tokens && !o->pos_device; i++) a.s.count[i] = n_candidates(o, t0 + i);
        err = dsv4_cu_ix_select_launch(&a, parts, dsv4_cu_stream(ex));
    }
    dsv4_cu_leave(&g);
    return dsv4_cu_status(err, op);
}

const struct dsv4_indexer_ops dsv4_cuda_indexer_ops = {
    .compress = cu_compress,
    .compress_reset = cu_compress_reset,
    .index_q = cu_index_q,
    .head_weights = cu_head_weights,
    .scores = cu_scores,
    .select = cu_select,
    .topk = cu_topk,
    .workspace_size = cu_workspace_size,
};
