"""Write a tiny checkpoint in the official DeepSeek-V4 layout (docs/contracts.md §8) for the reference's tests:
FP8 E4M3 weights with 128x128 UE8M0 block scales, routed experts as packed FP4 E2M1 (low nibble = even
element) with 1x32 UE8M0 scales, FP32 mHC params / sinks / ape / router bias, int64 tid2eid, an MTP block
(`mtp.0.*`), and config.json in the `ModelArgs` naming. Made from an existing checkpoint (e.g. the
Hugging Face hf-tiny-a) by quantizing its weights; the MTP tensors are random, scaled like the rest."""
import json
import math
import os

import numpy as np

import oracles as o
from ref_checkpoint import is_quant_linear, write_safetensors


def quantize_fp8_128(w):
    """float [out, in] -> (E4M3 codes uint8 [out, in], UE8M0 bytes [ceil(out/128), ceil(in/128)]): one
    power-of-two scale per 128x128 block, 2^ceil(log2(amax/448)) (amax floored at 1e-4)."""
    out_f, in_f = w.shape
    sb, sc = math.ceil(out_f / 128), math.ceil(in_f / 128)
    pad = np.zeros((sb * 128, sc * 128))
    pad[:out_f, :in_f] = w
    amax = np.abs(pad.reshape(sb, 128, sc, 128)).max(axis=(1, 3))
    e = o.scale_exponent("act128", amax)
    full = np.repeat(np.repeat(np.ldexp(1.0, -e), 128, 0), 128, 1)[:out_f, :in_f]
    return o.e4m3_encode(w * full), (e + 127).astype(np.uint8)


def pack_fp4(codes):
    """E2M1 codes [out, in] -> int8 [out, in/2], element 2k in the low nibble, 2k+1 in the high one."""
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8).view(np.int8)


def official_config(cfg):
    """Config -> config.json dict in the official ModelArgs naming."""
    return {
        "vocab_size": cfg.vocab_size, "dim": cfg.dim, "moe_inter_dim": cfg.moe_inter_dim,
        "n_layers": cfg.n_layers, "n_hash_layers": sum(cfg.hash_layers), "n_mtp_layers": cfg.n_mtp_layers,
        "n_heads": cfg.n_heads, "n_routed_experts": cfg.n_routed_experts, "n_shared_experts": cfg.n_shared_experts,
        "n_activated_experts": cfg.n_activated_experts, "score_func": cfg.score_func,
        "route_scale": cfg.route_scale, "swiglu_limit": cfg.swiglu_limit, "q_lora_rank": cfg.q_lora_rank,
        "head_dim": cfg.head_dim, "rope_head_dim": cfg.rope_dim, "o_groups": cfg.o_groups,
        "o_lora_rank": cfg.o_lora_rank, "window_size": cfg.window, "original_seq_len": cfg.original_seq_len,
        "rope_theta": cfg.rope_theta, "rope_factor": cfg.rope_factor, "beta_fast": cfg.beta_fast,
        "beta_slow": cfg.beta_slow, "index_n_heads": cfg.index_n_heads, "index_head_dim": cfg.index_head_dim,
        "index_topk": cfg.index_topk, "hc_mult": cfg.hc_mult, "hc_sinkhorn_iters": cfg.hc_sinkhorn_iters,
        "hc_eps": cfg.hc_eps, "norm_eps": cfg.norm_eps, "dtype": "fp8", "scale_fmt": "ue8m0",
        "expert_dtype": "fp4", "compress_rope_theta": cfg.compress_rope_theta,
        "compress_ratios": list(cfg.ratios[: cfg.n_layers]) + [0] * cfg.n_mtp_layers,
    }


def _mtp_tensors(ckpt, rng):
    """Random MTP block 0: an SWA block shaped like layer 0 with learned (biased) routing, + e_proj,
    h_proj, enorm, hnorm, norm and its own hc_head."""
    cfg = ckpt.cfg
    out = {}
    for name, t in ckpt.tensors.items():
        if not name.startswith("layers.0.") or "compressor" in name or "indexer" in name:
            continue
        rest = name[len("layers.0."):]
        if rest == "ffn.gate.tid2eid":
            out["mtp.0.ffn.gate.bias"] = rng.standard_normal(cfg.n_routed_experts) * 0.1
            continue
        scale = np.std(t) if t.ndim > 1 else 0.0
        out["mtp.0." + rest] = t + rng.standard_normal(t.shape) * scale * 0.5 if t.ndim > 1 else t.copy()
    d = cfg.dim
    for p in ("e_proj", "h_proj"):
        out[f"mtp.0.{p}.weight"] = rng.standard_normal((d, d)) * d ** -0.5
    for p in ("enorm", "hnorm", "norm"):
        out[f"mtp.0.{p}.weight"] = 1.0 + 0.1 * rng.standard_normal(d)
    for p in ("hc_head_fn", "hc_head_base", "hc_head_scale"):
        out["mtp.0." + p] = ckpt[p].copy()
    return out


def write_official(ckpt, out_dir, seed=0, mtp=True):
    """Write `ckpt` (a ref_checkpoint.Checkpoint) to out_dir in the official layout, in two shards with
    model.safetensors.index.json. Returns {canonical weight name: the float64 values written} (the exact
    dequantized values the reader must give back)."""
    rng = np.random.default_rng(seed)
    tensors = dict(ckpt.tensors)
    if mtp:
        tensors.update(_mtp_tensors(ckpt, rng))
    files, expect = ({}, {}), {}
    for name, t in tensors.items():
        shard = files[1] if name.startswith("mtp.") or ".ffn.experts." in name else files[0]
        if t.dtype == np.int64:
            shard[name] = ("I64", t)
            continue
        base = name[: -len(".weight")]
        if name.endswith(".weight") and ".ffn.experts." in name:
            codes, s = o.quantize(t, "fp4_32")  # 1x32 groups, scale 2^ceil(log2(amax/6))
            shard[name], shard[base + ".scale"] = ("I8", pack_fp4(codes)), ("F8_E8M0", s)
            expect[name] = o.dequantize(codes, s, "fp4_32")
        elif name.endswith(".weight") and (is_quant_linear(name) or name.endswith("attn.wo_a.weight")):
            c, s = quantize_fp8_128(t)
            shard[name], shard[base + ".scale"] = ("F8_E4M3", c), ("F8_E8M0", s)
            full = np.repeat(np.repeat(o.e8m0_decode(s), 128, 0), 128, 1)[: t.shape[0], : t.shape[1]]
            expect[name] = o.e4m3_decode(c) * full
        elif name.endswith(".weight"):
            shard[name] = ("BF16", o.bf16_encode(t))
            expect[name] = o.bf16_round(t)
        else:  # mHC params, attn_sink, ape, gate.bias: FP32
            shard[name] = ("F32", np.asarray(t, np.float32))
            expect[name] = np.asarray(t, np.float32).astype(np.float64)
    os.makedirs(out_dir, exist_ok=True)
    weight_map = {}
    for i, shard in enumerate(files):
        fn = f"model-{i + 1:05d}-of-{len(files):05d}.safetensors"
        write_safetensors(os.path.join(out_dir, fn), shard)
        weight_map.update({k: fn for k in shard})
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(official_config(ckpt.cfg), f, indent=1)
    return expect
