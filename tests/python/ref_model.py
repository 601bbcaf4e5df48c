"""An independent float64 numpy reference forward of DeepSeek-V4 (the oracle of the engine's tests).

Written from docs/model.md (§3-§8 and §11-§13), not from the C code. Pure numpy +
ml_dtypes; the number formats and scale rules come from oracles.py, the checkpoint side (config.json in
every naming, safetensors, names, exact dequantization) from ref_checkpoint.py. REF_MODEL.md (beside this
file) lists the ambiguities of the design resolved here and the golden-data result.

    m = RefModel("shared/testdata/hf-tiny-a")                 # pure float64, no act_quant (HF layout)
    logits = m.forward(ids)                                   # [S, vocab], every position, teacher forced
    logits, streams = m.forward(ids, return_streams=True)     # + the pre-hc_head streams [S, hc, D]
    mtp_logits = m.mtp_forward(ids, streams)                  # [S-1, vocab]: row t predicts ids[t+2]

Semantics: position-by-position (decode) semantics evaluated for the whole prompt at once. The query at
position p sees the SWA entries max(0, p-window+1)..p, the compressed entries c < (p+1) // r of its layer
(HCA: all of them; CSA: the indexer's top-k of them) -- exactly what token-by-token decoding sees, so
logits[p] depends on ids[:p+1] only (the tests check this).

Quantization-simulation points (always on: they are the model's semantics, docs/contracts.md §1):
  * FP8 E4M3, groups of 64, UE8M0 scale, amax floor 1e-4 (rule kv64): the nope dims of every SWA KV vector
    (after kv_norm and RoPE) and of every main-compressor output (after norm and RoPE);
  * Hadamard (Sylvester, /sqrt(128)) + FP4 E2M1 groups of 32 (rule fp4_32): the indexer queries (after RoPE)
    and the indexer-compressor outputs (after norm and RoPE).

Precision switches:
  * `bf16=False` (default): every step in float64, no rounding anywhere except the simulation points above.
    This is the mode to compare with the transformers float32 golden logits.
  * `bf16=True`: float64 arithmetic, values rounded to BF16 (RNE via float32) at the points of
    docs/model.md §11, i.e. where the C engine (fp32 compute) stores BF16: embedding; streams after every
    hc_post; hc_pre / hc_head outputs; every RMSNorm output; every linear output (FP8/FP4/BF16 weights,
    wo_a, weights_proj, and the indexer head weights after their scale); q after per-head norm + RoPE
    (rounded once, docs/kernels.md §2.2); kv / compressor outputs after RoPE; the pooled compressor vector
    before its norm; Hadamard outputs; the SwiGLU activation into w2; the MoE sum; the attention output
    and its inverse RoPE. Kept unrounded (fp32 in the reference): mHC mixes / post / comb, compressor
    a / g, router scores and weights, attention scores, softmax denominator, indexer scores, logits. The
    probabilities are rounded to BF16 for P.V (exp(s - max) with the global max of the query's set);
    as every attention kernel of the library does; `p_bf16=False` keeps them unrounded.
  * `act_quant` (default: True for an official FP8/FP4 checkpoint, False for a BF16 one): simulate the
    1x128 FP8 activation quantization (rule act128) in front of the linears whose official weights are
    FP8/FP4 (wq_a, wq_b, wkv, wo_b, indexer wq_b, experts, shared experts, e_proj, h_proj). A K that is
    not a multiple of 128 (tiny configs) ends with a shorter block of its own.
"""
import numpy as np

import oracles as o
from ref_checkpoint import Checkpoint, is_quant_linear


def rope_freqs(cfg, kind):
    """Inverse frequencies f_i, i < rope_dim/2 (docs/model.md §5.4). kind "main": base rope_theta, no YaRN
    (SWA layers, MTP); kind "compress": base compress_rope_theta with YaRN (CSA/HCA layers, indexers)."""
    rd = cfg.rope_dim
    base = cfg.rope_theta if kind == "main" else cfg.compress_rope_theta
    f = 1.0 / base ** (np.arange(0, rd, 2, dtype=np.float64) / rd)
    if kind == "compress" and cfg.original_seq_len > 0:
        def corr_dim(rot):
            return rd * np.log(cfg.original_seq_len / (rot * 2 * np.pi)) / (2 * np.log(base))
        low = max(int(np.floor(corr_dim(cfg.beta_fast))), 0)
        high = min(int(np.ceil(corr_dim(cfg.beta_slow))), rd - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(rd // 2) - low) / (high - low), 0.0, 1.0)
        smooth = 1.0 - ramp
        f = f / cfg.rope_factor * (1.0 - smooth) + f * smooth
    return f


def rope(x, pos, freqs, inverse=False):
    """GPT-J (interleaved pairs) rotation of the last 2*len(freqs) dims of x [S, ..., d] at positions
    pos [S]; inverse rotates by -theta. Returns a new array."""
    x = np.array(x, np.float64)
    theta = np.asarray(pos, np.float64)[:, None] * freqs[None, :]  # [S, rd/2]
    theta = theta.reshape(theta.shape[:1] + (1,) * (x.ndim - 2) + theta.shape[1:])
    c, s = np.cos(theta), np.sin(theta)
    if inverse:
        s = -s
    rd = 2 * len(freqs)
    a = x[..., -rd::2].copy()
    b = x[..., -rd + 1::2].copy()
    x[..., -rd::2] = a * c - b * s
    x[..., -rd + 1::2] = a * s + b * c
    return x


def softmax(z, axis):
    m = np.max(z, axis=axis, keepdims=True)
    e = np.exp(z - m)
    return e / e.sum(axis=axis, keepdims=True)


def topk_stable(scores, k):
    """Indices of the k largest entries along the last axis, ties to the lower index (documented
    deterministic tie-break; torch.topk leaves the order of ties unspecified)."""
    return np.argsort(-scores, axis=-1, kind="stable")[..., :k]


def compress_pool(a, g, ratio, d, overlap):
    """Pooled (pre-norm) compressed entries [n, d] from the per-token projections a, g [n*ratio, coff*d]
    (g already holding the ape of the in-block offset): entry c is the per-channel softmax(g)-weighted sum
    of a over its block; with overlap (ratio 4) the previous block's tokens join with the first d
    columns, the current block's with the last d (for c = 0 the previous slots are empty)."""
    n = a.shape[0] // ratio
    a = a.reshape(n, ratio, -1)
    g = g.reshape(n, ratio, -1)
    if overlap:
        prev_a = np.zeros((n, ratio, d))
        prev_g = np.full((n, ratio, d), -np.inf)
        prev_a[1:] = a[:-1, :, :d]
        prev_g[1:] = g[:-1, :, :d]
        a = np.concatenate([prev_a, a[:, :, d:]], axis=1)
        g = np.concatenate([prev_g, g[:, :, d:]], axis=1)
    return (softmax(g, axis=1) * a).sum(axis=1)


class RefModel:
    def __init__(self, model_dir=None, *, checkpoint=None, bf16=False, act_quant=None, p_bf16=True):
        self.ckpt = checkpoint if checkpoint is not None else Checkpoint(model_dir)
        self.cfg = self.ckpt.cfg
        self.w = self.ckpt
        self.bf16 = bool(bf16)
        self.p_bf16 = bool(p_bf16)  # bf16 mode: round the attention probabilities for P.V (see above)
        self.act_quant = self.ckpt.had_fp8 if act_quant is None else bool(act_quant)
        self.freqs = {"main": rope_freqs(self.cfg, "main"), "compress": rope_freqs(self.cfg, "compress")}

    # ---- elementary steps ----------------------------------------------------------------
    def r(self, x):
        """BF16 rounding point (docs/model.md §11); identity in the float64 mode."""
        return o.bf16_round(x) if self.bf16 else np.asarray(x, np.float64)

    def linear(self, x, name):
        """y = x W^T for the weight `name.weight` (dequantized exactly), with the act128 simulation in front
        of FP8/FP4 linears when act_quant is on; output rounded to BF16 in the bf16 mode."""
        wname = name + ".weight"
        if self.act_quant and is_quant_linear(wname):
            x = o.block_sim(x, "act128")
        return self.r(x @ self.w[wname].T)

    def rmsnorm(self, x, wname):
        x = np.asarray(x, np.float64)
        y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.cfg.norm_eps)
        return self.r(self.w[wname] * y)

    # ---- mHC (docs/model.md §4) ------------------------------------------------------------
    def hc_pre(self, X, prefix):
        """X [S, hc, D] -> (layer input [S, D], post [S, hc], comb [S, hc(src), hc(dst)])."""
        cfg, hc = self.cfg, self.cfg.hc_mult
        fn, scale, base = self.w[prefix + "fn"], self.w[prefix + "scale"], self.w[prefix + "base"]
        S = X.shape[0]
        xf = X.reshape(S, -1)
        rs = 1.0 / np.sqrt(np.mean(xf * xf, axis=-1, keepdims=True) + cfg.norm_eps)
        mixes = (xf @ fn.T) * rs
        eps = cfg.hc_eps
        pre = 1.0 / (1.0 + np.exp(-(mixes[:, :hc] * scale[0] + base[:hc]))) + eps
        post = 2.0 / (1.0 + np.exp(-(mixes[:, hc:2 * hc] * scale[1] + base[hc:2 * hc])))
        comb = mixes[:, 2 * hc:].reshape(S, hc, hc) * scale[2] + base[2 * hc:].reshape(hc, hc)
        comb = softmax(comb, axis=-1) + eps
        comb = comb / (comb.sum(axis=-2, keepdims=True) + eps)
        for _ in range(cfg.hc_sinkhorn_iters - 1):
            comb = comb / (comb.sum(axis=-1, keepdims=True) + eps)
            comb = comb / (comb.sum(axis=-2, keepdims=True) + eps)
        y = self.r(np.einsum("sj,sjd->sd", pre, X))
        return y, post, comb

    def hc_post(self, x, X, post, comb):
        """new[k] = post[k] x + sum_j comb[j][k] X[j] (comb[src][dst]), stored BF16 in the bf16 mode."""
        return self.r(post[:, :, None] * x[:, None, :] + np.einsum("sjk,sjd->skd", comb, X))

    def hc_head(self, X, prefix):
        cfg = self.cfg
        fn, scale, base = self.w[prefix + "hc_head_fn"], self.w[prefix + "hc_head_scale"], \
            self.w[prefix + "hc_head_base"]
        S = X.shape[0]
        xf = X.reshape(S, -1)
        rs = 1.0 / np.sqrt(np.mean(xf * xf, axis=-1, keepdims=True) + cfg.norm_eps)
        mixes = (xf @ fn.T) * rs
        pre = 1.0 / (1.0 + np.exp(-(mixes * scale[0] + base))) + cfg.hc_eps
        return self.r(np.einsum("sj,sjd->sd", pre, X))

    # ---- attention (docs/model.md §5) -------------------------------------------------------
    def compressor(self, prefix, ratio, d, overlap, x, pos, indexer):
        """Compressed entries [S // ratio, d] of one compressor (5.5). Entry c pools the tokens
        c*r .. c*r+r-1 (overlap: also the previous block with the first half of the projections) by a
        per-channel softmax of the gate scores (+ ape of the in-block offset) and is rotated at c*r."""
        cfg = self.cfg
        S = x.shape[0]
        n = S // ratio
        if n == 0:
            return np.zeros((0, d))
        a = x[: n * ratio] @ self.w[prefix + "wkv.weight"].T
        g = x[: n * ratio] @ self.w[prefix + "wgate.weight"].T + self.w[prefix + "ape"][pos[: n * ratio] % ratio]
        v = compress_pool(a, g, ratio, d, overlap)
        v = self.rmsnorm(self.r(v), prefix + "norm.weight")
        v = self.r(rope(v, np.arange(n) * ratio, self.freqs["compress"]))
        if indexer:
            return o.fp4_sim(self.r(o.hadamard_rotate(v)))
        v[:, : cfg.nope_dim] = o.block_sim(v[:, : cfg.nope_dim], "kv64")
        return v

    def indexer(self, prefix, ratio, x, qr, pos, visible):
        """Lightning indexer (5.6): bool [S, n], the top-min(k, #visible) visible compressed entries of
        every query by I[c] = sum_h w_h relu(q_h . k_c)."""
        cfg = self.cfg
        S = x.shape[0]
        nI, dI = cfg.index_n_heads, cfg.index_head_dim
        q = self.linear(qr, prefix + "wq_b").reshape(S, nI, dI)
        q = self.r(rope(q, pos, self.freqs["compress"]))
        q = o.fp4_sim(self.r(o.hadamard_rotate(q)))
        wts = self.r(self.r(x @ self.w[prefix + "weights_proj.weight"].T) * (dI ** -0.5 * nI ** -0.5))
        k = self.compressor(prefix + "compressor.", ratio, dI, True, x, pos, indexer=True)
        sel = np.zeros(visible.shape, bool)
        if k.shape[0] == 0:
            return sel
        dots = np.maximum(np.einsum("shd,cd->shc", q, k), 0.0)
        score = np.einsum("sh,shc->sc", wts, dots)
        score = np.where(visible, score, -np.inf)
        top = topk_stable(score, min(cfg.index_topk, k.shape[0]))
        rows = np.arange(S)[:, None]
        sel[rows, top] = True
        return sel & visible

    def attention(self, prefix, kind, ratio, x, pos):
        cfg = self.cfg
        S = x.shape[0]
        H, hd, nope = cfg.n_heads, cfg.head_dim, cfg.nope_dim
        fr = self.freqs["main" if kind == "swa" else "compress"]
        # query path (5.1)
        qr = self.rmsnorm(self.linear(x, prefix + "wq_a"), prefix + "q_norm.weight")
        q = self.linear(qr, prefix + "wq_b").reshape(S, H, hd)
        q = q / np.sqrt(np.mean(q * q, axis=-1, keepdims=True) + cfg.norm_eps)
        q = self.r(rope(q, pos, fr))
        # the shared KV latent (5.2)
        kv = self.rmsnorm(self.linear(x, prefix + "wkv"), prefix + "kv_norm.weight")
        kv = self.r(rope(kv, pos, fr))
        kv[:, :nope] = o.block_sim(kv[:, :nope], "kv64")
        # attention set (5.7): the SWA window, then the compressed entries
        i, j = pos[:, None], pos[None, :]
        mask = (j <= i) & (j > i - cfg.window)
        entries = kv
        if kind != "swa":
            comp = self.compressor(prefix + "compressor.", ratio, hd, kind == "csa", x, pos, indexer=False)
            visible = np.arange(comp.shape[0])[None, :] < ((pos + 1) // ratio)[:, None]
            if kind == "csa":
                visible = self.indexer(prefix + "indexer.", ratio, x, qr, pos, visible)
            entries = np.concatenate([kv, comp], axis=0)
            mask = np.concatenate([mask, visible], axis=1)
        # sparse attention with sink
        s = np.einsum("shd,ed->she", q, entries) * hd ** -0.5
        s = np.where(mask[:, None, :], s, -np.inf)
        m = s.max(axis=-1, keepdims=True)  # over real entries (the query itself is always one)
        p = np.exp(s - m)
        den = p.sum(axis=-1, keepdims=True) + np.exp(self.w[prefix + "attn_sink"][None, :, None] - m)
        out = self.r(np.einsum("she,ed->shd", self.r(p) if self.p_bf16 else p, entries) / den)
        out = self.r(rope(out, pos, fr, inverse=True))
        # grouped wo_a (block diagonal over G groups of consecutive heads), then wo_b (5.8)
        G = cfg.o_groups
        wa = self.w[prefix + "wo_a.weight"].reshape(G, cfg.o_lora_rank, -1)
        z = self.r(np.einsum("sgk,grk->sgr", out.reshape(S, G, -1), wa)).reshape(S, -1)
        return self.linear(z, prefix + "wo_b")

    # ---- MoE (docs/model.md §7) -------------------------------------------------------------
    def expert(self, prefix, x, weight):
        L = self.cfg.swiglu_limit
        g = self.linear(x, prefix + "w1")
        u = self.linear(x, prefix + "w3")
        if L > 0:
            g = np.minimum(g, L)
            u = np.clip(u, -L, L)
        h = g / (1.0 + np.exp(-g)) * u * weight
        return self.linear(self.r(h), prefix + "w2")

    def route(self, prefix, is_hash, x, ids):
        """(expert ids [S, k], weights [S, k]) of the gate (7.1)."""
        cfg = self.cfg
        logits = x @ self.w[prefix + "gate.weight"].T
        if cfg.score_func == "softmax":
            scores = softmax(logits, axis=-1)
        elif cfg.score_func == "sigmoid":
            scores = 1.0 / (1.0 + np.exp(-logits))
        else:  # sqrtsoftplus
            scores = np.sqrt(np.logaddexp(0.0, logits))
        if is_hash:
            idx = self.w[prefix + "gate.tid2eid"][ids]
        else:
            bias = self.w.get(prefix + "gate.bias")
            idx = topk_stable(scores + (0.0 if bias is None else bias), cfg.n_activated_experts)
        wts = np.take_along_axis(scores, idx, axis=-1)
        if cfg.score_func != "softmax":
            wts = wts / wts.sum(axis=-1, keepdims=True)
        return idx, wts * cfg.route_scale

    def moe(self, prefix, is_hash, x, ids):
        idx, wts = self.route(prefix, is_hash, x, ids)
        y = np.zeros_like(x)
        for e in np.unique(idx):
            rows, slot = np.nonzero(idx == e)  # a token listing an expert twice gets it twice
            np.add.at(y, rows, self.expert(f"{prefix}experts.{e}.", x[rows], wts[rows, slot][:, None]))
        if self.cfg.n_shared_experts:
            y += self.expert(prefix + "shared_experts.", x, 1.0)
        return self.r(y)

    # ---- blocks and the whole model (docs/model.md §3, §8) -----------------------------------
    def block(self, prefix, layer, X, ids, pos):
        cfg = self.cfg
        kind, ratio = cfg.kinds[layer], cfg.ratios[layer]
        is_hash = layer < cfg.n_layers and cfg.hash_layers[layer]
        xin, post, comb = self.hc_pre(X, prefix + "hc_attn_")
        a = self.attention(prefix + "attn.", kind, ratio, self.rmsnorm(xin, prefix + "attn_norm.weight"), pos)
        X = self.hc_post(a, X, post, comb)
        xin, post, comb = self.hc_pre(X, prefix + "hc_ffn_")
        m = self.moe(prefix + "ffn.", is_hash, self.rmsnorm(xin, prefix + "ffn_norm.weight"), ids)
        return self.hc_post(m, X, post, comb)

    def logits_from_streams(self, X, prefix=""):
        y = self.rmsnorm(self.hc_head(X, prefix), prefix + "norm.weight")
        return y @ self.w["head.weight"].T

    def forward(self, ids, return_streams=False):
        """Logits [S, vocab] of every position of the teacher-forced prompt `ids` (positions 0..S-1)."""
        ids = np.asarray(ids, np.int64)
        pos = np.arange(len(ids))
        X = np.repeat(self.r(self.w["embed.weight"][ids])[:, None, :], self.cfg.hc_mult, axis=1)
        for layer in range(self.cfg.n_layers):
            X = self.block(f"layers.{layer}.", layer, X, ids, pos)
        logits = self.logits_from_streams(X)
        return (logits, X) if return_streams else logits

    def mtp_forward(self, ids, streams, k=0, return_streams=False):
        """MTP block k (docs/model.md §8) over the whole sequence: row t (t = 0..S-2, attention position
        t) combines the main model's pre-hc_head streams at t with the embedding of ids[t+1] and predicts
        ids[t+2]. Its own streams (return_streams) are what a second draft step feeds back in place of
        `streams` (with ids shifted once more)."""
        cfg = self.cfg
        ids = np.asarray(ids, np.int64)
        T = len(ids) - 1
        p = f"mtp.{k}."
        e = self.rmsnorm(self.r(self.w["embed.weight"][ids[1:]]), p + "enorm.weight")
        hh = self.rmsnorm(np.asarray(streams, np.float64)[:T], p + "hnorm.weight")
        X = self.r(self.linear(e, p + "e_proj")[:, None, :] + self.linear(hh, p + "h_proj"))
        X = self.block(p, cfg.n_layers + k, X, ids[1:], np.arange(T))
        logits = self.logits_from_streams(X, p)
        return (logits, X) if return_streams else logits
