"""Checkpoint side of the float64 DeepSeek-V4 reference (tests/python/ref_model.py): config.json in
every naming, a minimal safetensors reader/writer, tensor-name normalization and exact dequantization.

Written from docs/model.md (§1.1, §2.1, §9), docs/formats.md §6 and docs/contracts.md §8 (the two
checkpoint layouts), not from the C code. Pure numpy + ml_dtypes (through oracles.py).

Config namings understood (docs/model.md §1.1):
  * official `ModelArgs` (inference/config.json): dim, n_layers, n_heads, rope_head_dim, window_size,
    compress_ratios, n_hash_layers, moe_inter_dim, n_activated_experts, score_func, route_scale,
    rope_factor, original_seq_len, beta_fast, beta_slow, n_mtp_layers, ...
  * Hugging Face root config of the official repos: hidden_size, num_hidden_layers, qk_rope_head_dim,
    sliding_window, compress_ratios, num_hash_layers, rope_scaling{factor, original_max_position_embeddings,
    beta_fast, beta_slow}, num_experts_per_tok, routed_scaling_factor, scoring_func, ...
  * transformers' own DeepseekV4Config (what save_pretrained writes, e.g. testdata/hf-tiny-a): layer_types
    + compress_rates{compressed_sparse_attention, heavily_compressed_attention} instead of compress_ratios,
    mlp_layer_types ("hash_moe"/"moe") instead of num_hash_layers, nested rope_parameters{main, compress}
    (the YaRN parameters sit in rope_parameters.compress), partial_rotary_factor instead of
    qk_rope_head_dim.
"""
import json
import math
import os
import struct
from dataclasses import dataclass, field

import numpy as np

import oracles as o

# ---- safetensors ---------------------------------------------------------------------------
_NP_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64,
              "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
              "F8_E4M3": np.uint8, "F8_E8M0": np.uint8}


def read_safetensors(path):
    """{name: (dtype string, raw numpy array)}: BF16 as uint16 bits, F8_* as uint8 codes, I8 (packed FP4
    in official checkpoints) as int8; everything little endian. Checks the header and the offsets."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise ValueError(f"{path}: header length {n} beyond the file ({len(blob)} bytes)")
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = memoryview(blob)[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = info["dtype"]
        if dt not in _NP_DTYPES:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {dt}")
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        npdt = np.dtype(_NP_DTYPES[dt]).newbyteorder("<")
        if not 0 <= begin <= end <= len(data) or end - begin != math.prod(shape) * npdt.itemsize:
            raise ValueError(f"{path}: tensor {name}: bad data_offsets {begin}..{end} for {dt}{list(shape)}")
        out[name] = (dt, np.frombuffer(data[begin:end], npdt).reshape(shape).copy())
    return out


def write_safetensors(path, tensors):
    """tensors: {name: (dtype string, numpy array of the storage type)} -> a .safetensors file."""
    header, chunks, off = {}, [], 0
    for name, (dt, arr) in tensors.items():
        raw = np.ascontiguousarray(arr, np.dtype(_NP_DTYPES[dt]).newbyteorder("<")).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * ((-len(hb)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb + b"".join(chunks))


def read_checkpoint_files(model_dir):
    """All tensors of a checkpoint directory (single file or sharded through the index)."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
    if not files:
        raise ValueError(f"{model_dir}: no .safetensors file")
    out = {}
    for fn in files:
        for name, t in read_safetensors(os.path.join(model_dir, fn)).items():
            if name in out:
                raise ValueError(f"{model_dir}: tensor {name} in two shards")
            out[name] = t
    return out


# ---- config --------------------------------------------------------------------------------
@dataclass
class Config:
    dim: int
    n_layers: int
    vocab_size: int
    n_heads: int
    head_dim: int
    rope_dim: int
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    window: int
    ratios: list            # n_layers + n_mtp entries: 0 = SWA, else the compression ratio
    kinds: list             # "swa" | "csa" (overlap + indexer) | "hca", same length
    hash_layers: list       # bool per main layer (MTP blocks are never hash-routed)
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    n_routed_experts: int
    n_shared_experts: int
    n_activated_experts: int
    moe_inter_dim: int
    score_func: str
    route_scale: float
    swiglu_limit: float
    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float
    norm_eps: float
    rope_theta: float
    compress_rope_theta: float
    rope_factor: float
    original_seq_len: int   # 0 = no YaRN on the compressed layers
    beta_fast: float
    beta_slow: float
    n_mtp_layers: int
    raw: dict = field(default_factory=dict, repr=False)

    @property
    def nope_dim(self):
        return self.head_dim - self.rope_dim


def _first(cfg, *keys, default=None, required=False):
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    if required:
        raise ValueError(f"config.json: none of {keys} present")
    return default


def parse_config(c):
    """dict from config.json (any naming of the module docstring) -> Config."""
    n_layers = int(_first(c, "n_layers", "num_hidden_layers", required=True))
    n_mtp = int(_first(c, "n_mtp_layers", "num_nextn_predict_layers", default=1))
    head_dim = int(_first(c, "head_dim", default=512))
    rope_dim = _first(c, "rope_head_dim", "qk_rope_head_dim")
    if rope_dim is None:
        prf = _first(c, "partial_rotary_factor",
                     default=(c.get("rope_parameters") or {}).get("main", {}).get("partial_rotary_factor", 0.125))
        rope_dim = int(head_dim * prf)
    rope_dim = int(rope_dim)

    # per-layer attention kind and ratio. transformers' rule: the kind comes from layer_types (or,
    # without it, from compress_ratios through {0: SWA, 4: CSA, 128: HCA}) and the ratio from
    # compress_rates of that kind; a CSA layer compresses with overlapping windows and has an indexer,
    # an HCA layer not, whatever the ratio. A config with compress_ratios and no rates at all is read
    # by the official rule instead: the ratio as written, CSA where it is 4.
    rates = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
    rates.update(c.get("compress_rates") or {})
    if c.get("compress_rate_csa") is not None:
        rates["compressed_sparse_attention"] = c["compress_rate_csa"]
    if c.get("compress_rate_hca") is not None:
        rates["heavily_compressed_attention"] = c["compress_rate_hca"]
    has_rates = any(c.get(k) is not None for k in ("compress_rates", "compress_rate_csa", "compress_rate_hca"))
    names = {"sliding_attention": "swa", "compressed_sparse_attention": "csa", "heavily_compressed_attention": "hca"}
    if c.get("layer_types") is not None:
        types = list(c["layer_types"])
    elif c.get("compress_ratios") is not None and has_rates:
        by_ratio = {0: "sliding_attention", 1: "sliding_attention", 4: "compressed_sparse_attention",
                    128: "heavily_compressed_attention"}
        types = [by_ratio[int(r)] for r in c["compress_ratios"]]
    elif c.get("compress_ratios") is not None:
        types = None
        ratios = [0 if int(r) == 1 else int(r) for r in c["compress_ratios"]]
        kinds = ["swa" if r == 0 else "csa" if r == 4 else "hca" for r in ratios]
    else:
        raise ValueError("config.json: neither compress_ratios nor layer_types")
    if types is not None:
        kinds = [names[t] for t in types]
        ratios = [0 if t == "sliding_attention" else int(rates[t]) for t in types]
    if len(ratios) < n_layers:
        raise ValueError(f"config.json: {len(ratios)} layer ratios for {n_layers} layers")
    # compress_ratios has n_layers + 1 entries, the last one for the MTP block (docs/model.md §13, item 16);
    # layer_types has n_layers: MTP blocks are SWA-only.
    ratios = ratios[:n_layers] + (ratios[n_layers:] + [0] * n_mtp)[:n_mtp]
    kinds = kinds[:n_layers] + (kinds[n_layers:] + ["swa"] * n_mtp)[:n_mtp]

    n_hash = _first(c, "n_hash_layers", "num_hash_layers")
    if n_hash is not None:
        hash_layers = [i < int(n_hash) for i in range(n_layers)]
    elif c.get("mlp_layer_types") is not None:
        hash_layers = [t == "hash_moe" for t in c["mlp_layer_types"][:n_layers]]
    else:
        hash_layers = [i < 3 for i in range(n_layers)]

    # RoPE: main (SWA layers) and compress (CSA/HCA layers, YaRN)
    rp = c.get("rope_parameters") or {}
    main_rp = rp.get("main") if isinstance(rp.get("main"), dict) else {}
    comp_rp = rp.get("compress") if isinstance(rp.get("compress"), dict) else None
    rope_theta = float(main_rp.get("rope_theta", _first(c, "rope_theta", default=10000.0)))
    compress_theta = float(_first(c, "compress_rope_theta", default=160000.0))
    if comp_rp is not None:
        compress_theta = float(comp_rp.get("rope_theta", compress_theta))
        yarn = comp_rp if comp_rp.get("rope_type", comp_rp.get("type")) == "yarn" else {}
        # transformers scales cos/sin by attention_factor, 0.1 ln(factor) + 1 where a nested entry leaves
        # it out; DeepSeek-V4 (and this reference) apply none
        if yarn and float(yarn.get("attention_factor", 0.1 * math.log(float(yarn["factor"])) + 1.0)) != 1.0:
            raise ValueError("config.json: rope_parameters.compress: a YaRN attention_factor other than 1.0")
    else:  # rope_scaling (HF root config) or a flat rope_parameters dict
        flat = rp if rp.get("rope_type", rp.get("type")) == "yarn" else {}
        yarn = c.get("rope_scaling") or flat
    if "rope_factor" in c or "original_seq_len" in c:  # ModelArgs naming
        factor = float(c.get("rope_factor", 40))
        orig = int(c.get("original_seq_len", 0))
        beta_fast, beta_slow = float(c.get("beta_fast", 32)), float(c.get("beta_slow", 1))
    elif yarn:
        factor = float(yarn.get("factor", 1.0))
        orig = int(yarn.get("original_max_position_embeddings", 0))
        beta_fast, beta_slow = float(yarn.get("beta_fast", 32)), float(yarn.get("beta_slow", 1))
    else:
        factor, orig, beta_fast, beta_slow = 1.0, 0, 32.0, 1.0

    return Config(
        dim=int(_first(c, "dim", "hidden_size", required=True)),
        n_layers=n_layers,
        vocab_size=int(_first(c, "vocab_size", required=True)),
        n_heads=int(_first(c, "n_heads", "num_attention_heads", required=True)),
        head_dim=head_dim,
        rope_dim=rope_dim,
        q_lora_rank=int(_first(c, "q_lora_rank", required=True)),
        o_groups=int(_first(c, "o_groups", default=8)),
        o_lora_rank=int(_first(c, "o_lora_rank", default=1024)),
        window=int(_first(c, "window_size", "sliding_window", default=128)),
        ratios=ratios,
        kinds=kinds,
        hash_layers=hash_layers,
        index_n_heads=int(_first(c, "index_n_heads", default=64)),
        index_head_dim=int(_first(c, "index_head_dim", default=128)),
        index_topk=int(_first(c, "index_topk", default=512)),
        n_routed_experts=int(_first(c, "n_routed_experts", "num_local_experts", required=True)),
        n_shared_experts=int(_first(c, "n_shared_experts", default=1)),
        n_activated_experts=int(_first(c, "n_activated_experts", "num_experts_per_tok", required=True)),
        moe_inter_dim=int(_first(c, "moe_inter_dim", "moe_intermediate_size", required=True)),
        score_func=str(_first(c, "score_func", "scoring_func", default="sqrtsoftplus")),
        route_scale=float(_first(c, "route_scale", "routed_scaling_factor", default=1.0)),
        swiglu_limit=float(_first(c, "swiglu_limit", default=0.0)),
        hc_mult=int(_first(c, "hc_mult", default=4)),
        hc_sinkhorn_iters=int(_first(c, "hc_sinkhorn_iters", default=20)),
        hc_eps=float(_first(c, "hc_eps", default=1e-6)),
        norm_eps=float(_first(c, "norm_eps", "rms_norm_eps", default=1e-6)),
        rope_theta=rope_theta,
        compress_rope_theta=compress_theta,
        rope_factor=factor,
        original_seq_len=orig,
        beta_fast=beta_fast,
        beta_slow=beta_slow,
        n_mtp_layers=n_mtp,
        raw=dict(c),
    )


def load_config(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        return parse_config(json.load(f))


# ---- tensor names --------------------------------------------------------------------------
# Canonical names are the official ones (docs/model.md §9.1/§9.2): no prefix, `X.weight` + `X.scale`.
# The Hugging Face layout written by transformers' save_pretrained (testdata/hf-tiny-a) uses the official
# names under a `model.` prefix, except: model.embed_tokens.weight (embed.weight), model.hc_head.hc_{fn,
# base,scale} (hc_head_{fn,base,scale}) and model.layers.N.attn.norm.weight (= attn.kv_norm.weight).
_SUFFIX_ALIASES = [  # (suffix in the file, canonical suffix); matched on the name after prefix stripping
    ("embed_tokens.weight", "embed.weight"),
    ("lm_head.weight", "head.weight"),
    ("hc_head.hc_fn", "hc_head_fn"), ("hc_head.hc_base", "hc_head_base"), ("hc_head.hc_scale", "hc_head_scale"),
    (".attn.norm.weight", ".attn.kv_norm.weight"),
    (".weight_scale_inv", ".scale"), (".e_score_correction_bias", ".bias"),
]
_PART_ALIASES = {"self_attn": "attn", "mlp": "ffn"}


def canonical_name(name):
    if name.startswith("model."):
        name = name[len("model."):]
    parts = [_PART_ALIASES.get(p, p) for p in name.split(".")]
    name = ".".join(parts)
    for old, new in _SUFFIX_ALIASES:
        if name.endswith(old) and (old[0] == "." or name == old or name.endswith("." + old)):
            name = name[: len(name) - len(old)] + new
            break
    return name


# Linears whose official weights are FP8 (128x128 scales) or FP4 (1x32): the GEMMs that quantize their
# activations per 1x128 (act_quant) in the official path (docs/model.md §2.2, §11). wo_a is FP8 in the
# checkpoint but converted to BF16 and used without act_quant (9.3); compressor, weights_proj, gate and head
# are BF16/FP32 linears.
_QUANT_LINEARS = ("attn.wq_a", "attn.wq_b", "attn.wkv", "attn.wo_b", "attn.indexer.wq_b",
                  "ffn.shared_experts.w1", "ffn.shared_experts.w2", "ffn.shared_experts.w3", "e_proj", "h_proj")


def is_quant_linear(canonical_weight_name):
    base = canonical_weight_name[: -len(".weight")] if canonical_weight_name.endswith(".weight") else ""
    if ".ffn.experts." in base:
        return True
    return any(base.endswith("." + q) or base == q for q in _QUANT_LINEARS)


# ---- dequantization ------------------------------------------------------------------------
def decode_float(dt, arr):
    """Plain (non block-scaled) tensor -> float64 (BF16/F16/F32/F64 values, E4M3 codes, E8M0 scales)."""
    if dt == "BF16":
        return o.bf16_decode(arr)
    if dt == "F8_E4M3":
        return o.e4m3_decode(arr)
    if dt == "F8_E8M0":
        return o.e8m0_decode(arr)
    return np.asarray(arr, np.float64)


def fp4_unpack(packed):
    """int8 [out, in/2] -> E2M1 codes uint8 [out, in]: low nibble = element 2k, high nibble = 2k+1."""
    b = np.asarray(packed).view(np.uint8)
    codes = np.empty(b.shape[:-1] + (b.shape[-1] * 2,), np.uint8)
    codes[..., 0::2] = b & 0xF
    codes[..., 1::2] = b >> 4
    return codes


def _scale_values(sdt, s):
    return o.e8m0_decode(s) if sdt == "F8_E8M0" else decode_float(sdt, s)


def dequantize_weight(wdt, w, sdt, s):
    """Block-scaled weight -> float64, exactly (docs/model.md §2.1):
    F8_E4M3 [out, in] with scale [ceil(out/128), ceil(in/128)] (or [out, in/32], MXFP8);
    I8 packed FP4 [out, in/2] with scale [out, in/32]."""
    sv = _scale_values(sdt, s)
    if wdt == "I8":
        vals = o.e2m1_decode(fp4_unpack(w))
    elif wdt == "F8_E4M3":
        vals = o.e4m3_decode(w)
    else:
        raise ValueError(f"block-scaled weight of dtype {wdt}")
    out_f, in_f = vals.shape
    if sv.shape == (out_f, in_f // 32) and (wdt == "I8" or in_f // 32 != math.ceil(in_f / 128)):
        return (vals.reshape(out_f, in_f // 32, 32) * sv[..., None]).reshape(out_f, in_f)
    if sv.shape == (math.ceil(out_f / 128), math.ceil(in_f / 128)):
        full = np.repeat(np.repeat(sv, 128, axis=0), 128, axis=1)[:out_f, :in_f]
        return vals * full
    raise ValueError(f"scale shape {sv.shape} fits neither 128x128 blocks nor 1x32 groups of {vals.shape}")


class Checkpoint:
    """Weights by canonical name as float64 arrays (block-scaled weights dequantized exactly), the int
    tables (tid2eid) as int64, and `had_fp8` (any F8_E4M3/FP4 weight: the official layout)."""

    def __init__(self, model_dir, cfg=None):
        self.cfg = cfg or load_config(model_dir)
        raw = {canonical_name(k): v for k, v in read_checkpoint_files(model_dir).items()}
        self.tensors = {}
        self.had_fp8 = False
        for name, (dt, arr) in raw.items():
            if name.endswith(".scale") and name[: -len(".scale")] + ".weight" in raw:
                continue
            sname = name[: -len(".weight")] + ".scale" if name.endswith(".weight") else None
            if sname in raw and dt in ("F8_E4M3", "I8"):
                sdt, s = raw[sname]
                self.tensors[name] = dequantize_weight(dt, arr, sdt, s)
                self.had_fp8 = True
            elif dt in ("I64", "I32", "I16"):
                self.tensors[name] = np.asarray(arr, np.int64)
            elif dt == "I8":
                raise ValueError(f"tensor {name}: I8 (packed FP4) without a .scale")
            else:
                self.tensors[name] = decode_float(dt, arr)

    def __getitem__(self, name):
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"checkpoint has no tensor {name}") from None

    def get(self, name, default=None):
        return self.tensors.get(name, default)

    def __contains__(self, name):
        return name in self.tensors
