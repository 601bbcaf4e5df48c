/* The rest of a DeepSeek-V4 block around attention (docs/model.md §3, §4, §7, §11):
 * RMSNorm, the manifold-constrained hyper-connections (mHC), the MoE router and the MoE block.
 *
 * Conventions: BF16 tensors hold uint16 bit patterns; every view has a unit inner stride unless a
 * function says otherwise, outer strides are free. On error nothing is written. Results never
 * depend on the context's thread count (fixed work split, fixed reduction order). */
#ifndef DSV4_LAYER_H
#define DSV4_LAYER_H

#include "core.h"
#include "linear.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- RMSNorm -----------------------------------------------------------------------------
 * y[r, :] = (x[r, :] * rsqrt(mean(x[r, :]^2) + eps)) * w        in fp32, rounded once to y's type.
 * x: BF16 or F32 [rows, D]; weight: BF16 or F32 [D], or NULL for the unweighted form (the
 * per-head q scaling: pass q as [T*H, head_dim]); y: BF16 or F32 [rows, D]. y may be x itself
 * (the same view: in place); any other overlap is refused. eps >= 0 (the model uses 1e-6). */
DSV4_API dsv4_status dsv4_rms_norm(dsv4_ctx *ctx, const dsv4_tensor *x, const dsv4_tensor *weight, float eps,
                                   dsv4_tensor *y);

/* ---- mHC (docs/model.md §4; n = hc_mult = 4 in V4, any 1 <= n <= DSV4_HC_MAX here) ----------
 * One mHC site's parameters, all F32 and contiguous:
 *   hc_pre / fused:  fn [(2+n)·n, n·D] (row stride free), scale [3], base [(2+n)·n]
 *   hc_head:         fn [n, n·D],                          scale [1], base [n]
 * The residual streams X are BF16 [T, n, D]; per token xf = X[t] flattened to n·D (stream-major).
 *   r      = 1 / sqrt(mean(xf^2) + norm_eps)                   (one scalar per token)
 *   mix[i] = r · Σ_k fn[i][k]·xf[k]
 *   pre[j] = sigmoid(mix[j]·scale[0] + base[j]) + eps           y[d] = bf16(Σ_j pre[j]·X[j][d])
 *   post[j] = 2·sigmoid(mix[n+j]·scale[1] + base[n+j])
 *   comb    = Sinkhorn(mix[2n + n·j + k]·scale[2] + base[2n + n·j + k]): row softmax + eps, column
 *             normalization, then sinkhorn_iters − 1 (row, column) normalizations, each dividing
 *             by (sum + eps).  comb[j][k]: j = source stream, k = destination stream.
 * hc_post: new[k][d] = bf16(post[k]·x[d] + Σ_j comb[j][k]·X[j][d])   (fp32). */
#define DSV4_HC_MAX 8

typedef struct dsv4_hc_site {
    dsv4_tensor fn, scale, base; /* F32, shapes above */
    int sinkhorn_iters;          /* >= 1; V4: 20 (unused by hc_head) */
    float eps;                   /* hc_eps, V4: 1e-6 */
    float norm_eps;              /* eps of the rsqrt, V4: 1e-6 */
} dsv4_hc_site;

/* x BF16 [T, n, D] -> y BF16 [T, D], post F32 [T, n], comb F32 [T, n, n]. */
DSV4_API dsv4_status dsv4_hc_pre(dsv4_ctx *ctx, const dsv4_hc_site *site, const dsv4_tensor *x, dsv4_tensor *y,
                                 dsv4_tensor *post, dsv4_tensor *comb);
/* x BF16 [T, D] (sub-layer output), residual BF16 [T, n, D], post F32 [T, n], comb F32 [T, n, n]
 * -> out BF16 [T, n, D]. out may be the residual view itself (in place). */
DSV4_API dsv4_status dsv4_hc_post(dsv4_ctx *ctx, const dsv4_tensor *x, const dsv4_tensor *residual,
                                  const dsv4_tensor *post, const dsv4_tensor *comb, dsv4_tensor *out);
/* hc_post of one site followed by hc_pre of the next site (`next`) in one pass over the streams:
 * streams = hc_post(x, residual, post, comb) (BF16, as stored), then (y, post_out, comb_out) =
 * hc_pre(next, streams). Identical to the two calls. streams may be residual, post_out may be
 * post and comb_out may be comb (the same views: in place). */
DSV4_API dsv4_status dsv4_hc_post_pre(dsv4_ctx *ctx, const dsv4_tensor *x, const dsv4_tensor *residual,
                                      const dsv4_tensor *post, const dsv4_tensor *comb, const dsv4_hc_site *next,
                                      dsv4_tensor *streams, dsv4_tensor *y, dsv4_tensor *post_out,
                                      dsv4_tensor *comb_out);
/* hc_head before the final norm: x BF16 [T, n, D] -> y BF16 [T, D] with pre[j] as in hc_pre. */
DSV4_API dsv4_status dsv4_hc_head(dsv4_ctx *ctx, const dsv4_hc_site *site, const dsv4_tensor *x, dsv4_tensor *y);

/* ---- router (docs/model.md §7.1) ----------------------------------------------------------
 * logit[e] = Σ_k W[e][k]·x[k] (fp32), score[e] = sqrt(softplus(logit[e])) with softplus(z) = z for
 * z > 20, else log1p(exp(z)).
 * Selection: with tid2eid (hash layers), ids[t] = tid2eid[token_ids[t]] and bias must be NULL;
 * otherwise the topk experts with the largest score[e] + bias[e] (bias NULL: 0), listed in
 * descending order of that key. Tie-break: equal keys go to the lower expert index first; a NaN
 * key ranks below every number (and among NaNs the lower index first). So the result is a
 * deterministic function of the inputs.
 * Weights: w[s] = score[ids[s]] / Σ_s' score[ids[s']] · route_scale (un-biased scores, fp32, the
 * sum taken in slot order).
 *   x: BF16 or F32 [T, D]; gate_w: BF16 or F32 [E, D]; bias: F32 [E] or NULL;
 *   tid2eid: I32 or I64 [V, topk] or NULL; token_ids: I32 or I64 [T], any stride (read only with
 *   tid2eid);
 *   ids: I32 [T, topk]; weights: F32 [T, topk]. 1 <= topk <= min(E, DSV4_ROUTE_MAX_TOPK),
 *   E <= DSV4_ROUTE_MAX_EXPERTS. Token ids outside [0, V) and table entries outside [0, E) are
 *   DSV4_ERR_RANGE; on a device backend (tables in device memory, not read by the host) such a
 *   slot gets id -1 and weight 0 instead, the other slots normalized among themselves. */
#define DSV4_ROUTE_MAX_TOPK 16
#define DSV4_ROUTE_MAX_EXPERTS 1024

DSV4_API dsv4_status dsv4_route(dsv4_ctx *ctx, const dsv4_tensor *x, const dsv4_tensor *gate_w,
                                const dsv4_tensor *bias, const dsv4_tensor *tid2eid, const dsv4_tensor *token_ids,
                                float route_scale, dsv4_tensor *ids, dsv4_tensor *weights);

/* ---- SwiGLU with the V4 clamp (docs/model.md §7.2) -----------------------------------------
 * h[r, i] = bf16(silu(min(g, L)) · clamp(u, −L, L) · w[r])  in fp32, silu(z) = z / (1 + e^−z),
 * L = limit (> 0; +Inf: no clamp). g, u: BF16 [rows, I] (the gate / up products); row_weights:
 * F32 [rows] or NULL (all 1); h: BF16 [rows, I], may be g itself (in place). */
DSV4_API dsv4_status dsv4_swiglu(dsv4_ctx *ctx, const dsv4_tensor *g, const dsv4_tensor *u,
                                 const dsv4_tensor *row_weights, float limit, dsv4_tensor *h);

/* ---- MoE block (docs/model.md §7.2-§7.3) ---------------------------------------------------
 * One SwiGLU expert in a weight format of dsv4/linear.h: w1 (gate) and w3 (up) [I, D], w2 (down)
 * [D, I] (FP4: the packed [., K/2] tensors), each with its scale tensor (NULL for BF16 / F32). */
typedef struct dsv4_ffn_weights {
    dsv4_linear_format fmt;
    const dsv4_tensor *w1, *w1_scale;
    const dsv4_tensor *w3, *w3_scale;
    const dsv4_tensor *w2, *w2_scale;
} dsv4_ffn_weights;

/* y[t] = bf16( Σ_s expert_{ids[t,s]}(x[t], weights[t,s]) + shared(x[t]) ), the sum in fp32 over
 * the token's experts in ascending expert index (then slot), the shared expert last, where
 *   expert(x, w) = w2 · swiglu(w1·x, w3·x, w, limit)      (each product a dsv4_linear with BF16
 * output: FP8/FP4 formats quantize their input per 1x128, docs/model.md §2.2).
 * The (token, slot) pairs are grouped by expert with a counting sort; each expert's rows are
 * gathered once and shared by its w1 and w3 products, so every expert runs as one product of all
 * its tokens. x: BF16 [T, D]; ids: I32 [T, topk] in [0, n_experts); weights: F32 [T, topk];
 * experts: n_experts entries, all of one format and shape (each is checked, routed to or not);
 * shared: NULL or one expert (its own format and width); y: BF16 [T, D]. The backend runs the
 * whole block, the grouping included, and checks the ids itself (DSV4_ERR_RANGE; on a device
 * backend, which groups on the device without a wait, a pair with an id outside [0, n_experts)
 * contributes nothing instead). Scratch comes from `workspace` (any alignment), sized by
 * dsv4_moe_workspace_size for at least T tokens; nothing is allocated. */
DSV4_API dsv4_status dsv4_moe_workspace_size(dsv4_ctx *ctx, int64_t T, int topk, int n_experts,
                                             const dsv4_ffn_weights *expert, const dsv4_ffn_weights *shared,
                                             size_t *bytes);
DSV4_API dsv4_status dsv4_moe(dsv4_ctx *ctx, const dsv4_tensor *x, const dsv4_tensor *ids,
                              const dsv4_tensor *weights, const dsv4_ffn_weights *experts, int n_experts,
                              const dsv4_ffn_weights *shared, float swiglu_limit, dsv4_tensor *y, void *workspace,
                              size_t workspace_bytes);

/* The MoE block of one shard (docs/engine.md §9): the experts with ids e_lo .. e_lo + e_n - 1 only
 * (experts[e - e_lo] is expert e; the others are not read), the shared expert when given, and no
 * rounding:
 *   y[t] = Σ over the token's slots whose id is in the range, in ascending (expert, slot), of
 *          expert_{ids[t,s]}(x[t], weights[t,s]), + shared(x[t]) last             (fp32)
 * i.e. dsv4_moe's sum before its rounding, restricted to those experts: with e_lo = 0 and
 * e_n = n_experts, bf16(y) is dsv4_moe's y bit for bit; and bf16(y) of a range equals dsv4_moe's y
 * with the weights of the other slots set to 0 (no shared expert). Every id is checked against
 * [0, n_experts) as dsv4_moe checks it. 0 <= e_lo, 1 <= e_n, e_lo + e_n <= n_experts; y: F32
 * [T, D]; the work space is dsv4_moe_workspace_size's for (T, topk, n_experts, experts, shared).
 * A backend without it (a device backend today) returns DSV4_ERR_UNSUPPORTED. */
DSV4_API dsv4_status dsv4_moe_partial(dsv4_ctx *ctx, const dsv4_tensor *x, const dsv4_tensor *ids,
                                      const dsv4_tensor *weights, const dsv4_ffn_weights *experts, int n_experts,
                                      int e_lo, int e_n, const dsv4_ffn_weights *shared, float swiglu_limit,
                                      dsv4_tensor *y, void *workspace, size_t workspace_bytes);

#ifdef __cplusplus
}
#endif
#endif
