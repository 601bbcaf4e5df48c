"""Checkpoint loading against oracles written from the docs, not from the C code:
- a safetensors reader/writer in plain Python (the format: u64 length, JSON header, data);
- the tensor list of a config from docs/model.md §9.2 and docs/contracts.md §8 (names, shapes, dtypes);
- the config field table of docs/model.md §1.1 (three namings, V4-Flash defaults);
- the scale rules of docs/contracts.md §3-§4 checked on the written FP8/FP4 weights with ml_dtypes.
Hostile checkpoints must raise ValueError naming the file and the tensor and leave the output
handle untouched."""
import ctypes
import json
import math
import pathlib
import shutil
import struct

import numpy as np
import pytest

import oracles
from dsv4 import DSV4Error, lib, model

HF_TINY = pathlib.Path(oracles.TESTDATA) / "hf-tiny-a"
FP4_TABLE = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])


# ---- an independent safetensors reader / writer --------------------------------------------------
def st_read(path):
    b = pathlib.Path(path).read_bytes()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    header.pop("__metadata__", None)
    data = b[8 + n:]
    return {k: (v["dtype"], tuple(v["shape"]), data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in header.items()}


def st_write(path, tensors, raw_header=None):
    """tensors: dict name -> (dtype, shape, bytes), written in order, no holes."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for k, (dt, shape, raw) in tensors.items():
        header[k] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    h = raw_header if raw_header is not None else json.dumps(header).encode()
    h += b" " * (-(len(h) + 8) % 8)
    pathlib.Path(path).write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_checkpoint(d):
    d = pathlib.Path(d)
    index = d / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    out = {}
    for f in files:
        for k, v in st_read(d / f).items():
            out[k] = v + (f,)
    return out


# ---- the tensor list of a config (docs/model.md §9.2, docs/contracts.md §8) ------------------------
def expected_tensors(cfg, with_mtp=True):
    """Official layout: FP8 weights + 128x128 E8M0 scales, FP4 experts I8 [out, in/2] + [out, in/32]."""
    D, V, H, q = cfg["hidden_size"], cfg["vocab_size"], cfg["num_attention_heads"], cfg["q_lora_rank"]
    G, ol, E, I = cfg["o_groups"], cfg["o_lora_rank"], cfg["n_routed_experts"], cfg["moe_intermediate_size"]
    nI, dI, k, hc = cfg["index_n_heads"], cfg["index_head_dim"], cfg["num_experts_per_tok"], cfg["hc_mult"]
    L, ratios = cfg["num_hidden_layers"], cfg["compress_ratios"]
    mix = (2 + hc) * hc
    t = {}

    def fp8(name, out, inp):
        t[name + ".weight"] = ("F8_E4M3", (out, inp))
        t[name + ".scale"] = ("F8_E8M0", (math.ceil(out / 128), math.ceil(inp / 128)))

    def fp4(name, out, inp):
        t[name + ".weight"] = ("I8", (out, inp // 2))
        t[name + ".scale"] = ("F8_E8M0", (out, inp // 32))

    def block(p, r, hash_routed, mtp):
        for n in ("attn_norm", "ffn_norm"):
            t[p + n + ".weight"] = ("BF16", (D,))
        for site in ("attn", "ffn"):
            t[p + f"hc_{site}_fn"] = ("F32", (mix, hc * D))
            t[p + f"hc_{site}_base"] = ("F32", (mix,))
            t[p + f"hc_{site}_scale"] = ("F32", (3,))
        fp8(p + "attn.wq_a", q, D)
        t[p + "attn.q_norm.weight"] = ("BF16", (q,))
        fp8(p + "attn.wq_b", H * 512, q)
        fp8(p + "attn.wkv", 512, D)
        t[p + "attn.kv_norm.weight"] = ("BF16", (512,))
        fp8(p + "attn.wo_a", G * ol, H * 512 // G)
        fp8(p + "attn.wo_b", D, G * ol)
        t[p + "attn.attn_sink"] = ("F32", (H,))
        if r:
            coff = 2 if r == 4 else 1
            for n in ("wkv", "wgate"):
                t[p + f"attn.compressor.{n}.weight"] = ("BF16", (coff * 512, D))
            t[p + "attn.compressor.ape"] = ("F32", (r, coff * 512))
            t[p + "attn.compressor.norm.weight"] = ("BF16", (512,))
        if r == 4:
            fp8(p + "attn.indexer.wq_b", nI * dI, q)
            t[p + "attn.indexer.weights_proj.weight"] = ("BF16", (nI, D))
            for n in ("wkv", "wgate"):
                t[p + f"attn.indexer.compressor.{n}.weight"] = ("BF16", (2 * dI, D))
            t[p + "attn.indexer.compressor.ape"] = ("F32", (r, 2 * dI))
            t[p + "attn.indexer.compressor.norm.weight"] = ("BF16", (dI,))
        t[p + "ffn.gate.weight"] = ("BF16", (E, D))
        if hash_routed:
            t[p + "ffn.gate.tid2eid"] = ("I64", (V, k))
        else:
            t[p + "ffn.gate.bias"] = ("F32", (E,))
        for e in range(E):
            fp4(p + f"ffn.experts.{e}.w1", I, D)
            fp4(p + f"ffn.experts.{e}.w2", D, I)
            fp4(p + f"ffn.experts.{e}.w3", I, D)
        fp8(p + "ffn.shared_experts.w1", I, D)
        fp8(p + "ffn.shared_experts.w2", D, I)
        fp8(p + "ffn.shared_experts.w3", I, D)
        if mtp:
            fp8(p + "e_proj", D, D)
            fp8(p + "h_proj", D, D)
            for n in ("enorm", "hnorm", "norm"):
                t[p + n + ".weight"] = ("BF16", (D,))
            t[p + "hc_head_fn"] = ("F32", (hc, hc * D))
            t[p + "hc_head_base"] = ("F32", (hc,))
            t[p + "hc_head_scale"] = ("F32", (1,))

    t["embed.weight"] = ("BF16", (V, D))
    t["head.weight"] = ("BF16", (V, D))
    t["norm.weight"] = ("BF16", (D,))
    t["hc_head_fn"] = ("F32", (hc, hc * D))
    t["hc_head_base"] = ("F32", (hc,))
    t["hc_head_scale"] = ("F32", (1,))
    for i in range(L):
        block(f"layers.{i}.", ratios[i], i < cfg["num_hash_layers"], False)
    for m in range(cfg["num_nextn_predict_layers"] if with_mtp else 0):
        block(f"mtp.{m}.", ratios[L + m], False, True)
    return t


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    rng = oracles.rng("make_tiny")
    seed = int(rng.integers(0, 2**31))
    d = tmp_path_factory.mktemp("tiny")
    model.make_tiny(d, seed)
    return d


def test_make_tiny_tensor_list(tiny):
    cfg = json.loads((tiny / "config.json").read_text())
    got = read_checkpoint(tiny)
    want = expected_tensors(cfg)
    assert set(got) == set(want), (sorted(set(got) - set(want))[:5], sorted(set(want) - set(got))[:5])
    for name, (dt, shape) in want.items():
        assert got[name][:2] == (dt, shape), (name, got[name][:2], (dt, shape))
    # SWA, CSA and HCA blocks; hash and learned routing; the MTP block
    assert {0, 4}.issubset(cfg["compress_ratios"]) and any(r not in (0, 4) for r in cfg["compress_ratios"])
    assert 0 < cfg["num_hash_layers"] < cfg["num_hidden_layers"] and cfg["num_nextn_predict_layers"] == 1
    assert cfg["quantization_config"]["weight_block_size"] == [128, 128] and cfg["expert_dtype"] == "fp4"
    # the index lists every tensor in the file that holds it
    wm = json.loads((tiny / "model.safetensors.index.json").read_text())["weight_map"]
    assert wm == {k: v[3] for k, v in got.items()}


def test_make_tiny_values(tiny):
    cfg = json.loads((tiny / "config.json").read_text())
    got = read_checkpoint(tiny)
    E, k = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    for name, (dt, shape, raw, _) in got.items():
        if dt == "F8_E4M3":
            codes = np.frombuffer(raw, np.uint8).reshape(shape)
            scales = np.frombuffer(got[name[:-len("weight")] + "scale"][2], np.uint8).reshape(
                math.ceil(shape[0] / 128), math.ceil(shape[1] / 128))
            vals = oracles.e4m3_decode(codes)
            assert np.isfinite(vals).all()
            # docs/contracts.md §4, act128 rule per 128x128 block: scale = 2^ceil(log2(amax/448)), so
            # amax/scale lies in (224, 448] (no floor hit), which E4M3 rounds into [224, 448] (a value
            # in (224, 232) is 224, the grid's step there being 16)
            for br in range(scales.shape[0]):
                for bc in range(scales.shape[1]):
                    blk = np.abs(vals[br * 128:(br + 1) * 128, bc * 128:(bc + 1) * 128])
                    assert 224 <= blk.max() <= 448, (name, br, bc, blk.max())
            w = vals * np.repeat(np.repeat(oracles.e8m0_decode(scales), 128, 0), 128, 1)[:shape[0], :shape[1]]
            rms = math.sqrt((w ** 2).mean())
            fan = 1 / math.sqrt(shape[1])
            # linear weights N(0, 1/in), output projections 0.05x (src/model/weights.h): FP8 moves
            # the rms by < 3%; the sample of >= 16k values by < 2%
            ok = abs(rms / fan - 1) < 0.06 or abs(rms / (0.05 * fan) - 1) < 0.06
            assert ok, (name, rms, fan)
        elif dt == "I8":
            packed = np.frombuffer(raw, np.uint8).reshape(shape)
            codes = np.stack([packed & 15, packed >> 4], -1).reshape(shape[0], shape[1] * 2)  # low nibble first
            scales = np.frombuffer(got[name[:-len("weight")] + "scale"][2], np.uint8).reshape(shape[0], -1)
            vals = FP4_TABLE[codes]
            # fp4_32 rule: scale = 2^ceil(log2(amax/6)) -> amax/scale in (3, 6], which E2M1 rounds to 3, 4 or 6
            gmax = np.abs(vals).reshape(shape[0], -1, 32).max(-1)
            assert set(np.unique(gmax)).issubset({3.0, 4.0, 6.0}), (name, np.unique(gmax))
            w = vals * np.repeat(oracles.e8m0_decode(scales), 32, 1)
            rms, fan = math.sqrt((w ** 2).mean()), 1 / math.sqrt(shape[1] * 2)
            # FP4 rounding is coarse (relative step up to 1/3): rms within 20%
            assert abs(rms / fan - 1) < 0.2 or abs(rms / (0.05 * fan) - 1) < 0.2, (name, rms, fan)
        elif dt == "I64":
            ids = np.frombuffer(raw, np.int64).reshape(shape)
            assert ids.min() >= 0 and ids.max() < E and shape[1] == k
            assert all(len(set(r)) == k for r in ids.tolist()), name
        elif dt == "BF16" and name.endswith("norm.weight"):
            v = oracles.bf16_decode(np.frombuffer(raw, np.uint16))
            assert abs(v.mean() - 1) < 0.1 and 0.03 < v.std() < 0.2, name
        elif dt == "BF16" and name == "embed.weight":
            v = oracles.bf16_decode(np.frombuffer(raw, np.uint16))
            assert abs(v.std() - 1) < 0.05 and abs(v.mean()) < 0.05


def test_binding_views_are_the_file_bytes(tiny):
    got = read_checkpoint(tiny)
    with model.Model(tiny) as m:
        assert m.layout == "official" and m.n_files == 2 and m.issues == []
        listed = m.tensors()
        assert {e["name"] for e in listed} == set(got)
        for e in listed:
            dt, shape, raw, f = got[e["name"]]
            assert (e["st_dtype"], e["shape"], e["file"], e["nbytes"]) == (dt, shape, f, len(raw))
            assert m.raw(e["name"]) == raw
        a = m.array("layers.0.ffn.gate.tid2eid")
        assert a.dtype == np.int64 and a.tobytes() == got["layers.0.ffn.gate.tid2eid"][2]


@pytest.mark.skipif(not HF_TINY.is_dir(), reason="shared/testdata/hf-tiny-a not present (set DSV4_SHARED)")
def test_hf_tiny_checkpoint():
    cfg = json.loads((HF_TINY / "config.json").read_text())
    got = read_checkpoint(HF_TINY)
    with model.Model(HF_TINY) as m:
        c = m.config
        assert m.layout == "transformers" and m.issues == []
        assert c["dim"] == cfg["hidden_size"] and c["n_layers"] == cfg["num_hidden_layers"]
        kinds = {"sliding_attention": "SWA", "compressed_sparse_attention": "CSA", "heavily_compressed_attention": "HCA"}
        assert c["attn_kind"][:5] == [kinds[x] for x in cfg["layer_types"]]
        rates = cfg["compress_rates"]
        assert c["compress_ratio"][:5] == [0 if x == "sliding_attention" else rates[x] for x in cfg["layer_types"]]
        assert c["hash_routed"][:5] == [x == "hash_moe" for x in cfg["mlp_layer_types"]]
        rc = cfg["rope_parameters"]["compress"]
        assert c["rope_compress"]["yarn"] and c["rope_compress"]["factor"] == rc["factor"]
        assert c["rope_compress"]["theta"] == rc["rope_theta"] and c["rope_main"]["theta"] == cfg["rope_parameters"]["main"]["rope_theta"]
        assert c["weight_format"] == "bf16" and c["expert_format"] == "bf16"
        # every tensor of the file is bound; official names reach HF names
        for e in m.tensors():
            assert m.raw(e["name"]) == got[e["name"]][2]
        assert m.raw("layers.3.attn.kv_norm.weight") == got["model.layers.3.attn.norm.weight"][2]
        assert m.raw("hc_head_fn") == got["model.hc_head.hc_fn"][2]
        assert m.raw("embed.weight") == got["model.embed_tokens.weight"][2]


# ---- config.json: docs/model.md §1.1 ------------------------------------------------------------
FLASH = {"dim": 4096, "n_layers": 43, "vocab_size": 129280, "n_heads": 64, "n_kv_heads": 1, "head_dim": 512,
         "rope_head_dim": 64, "nope_head_dim": 448, "q_lora_rank": 1024, "o_groups": 8, "o_lora_rank": 1024,
         "window_size": 128, "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512, "n_routed_experts": 256,
         "n_shared_experts": 1, "n_activated_experts": 6, "moe_inter_dim": 2048, "n_hash_layers": 3,
         "score_func": "sqrtsoftplus", "route_scale": 1.5, "norm_topk_prob": True, "swiglu_limit": 10.0, "hc_mult": 4,
         "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "norm_eps": 1e-6, "max_position_embeddings": 1048576,
         "n_mtp_layers": 1, "bos_token_id": 0, "eos_token_ids": [1], "tie_word_embeddings": False}


def test_config_defaults_are_flash():
    c = model.config_parse("{}")
    for k, v in FLASH.items():
        assert c[k] == v, (k, c[k], v)
    assert c["rope_main"]["theta"] == 10000 and not c["rope_main"]["yarn"]
    rc = c["rope_compress"]
    assert (rc["theta"], rc["yarn"], rc["factor"], rc["original_max_position"], rc["beta_fast"], rc["beta_slow"]) == \
        (160000, True, 16, 65536, 32, 1)
    assert c["compress_ratio"] == [0, 0] + [4, 128] * 20 + [4, 0]
    assert c["hash_routed"] == [True] * 3 + [False] * 41


def _random_model(rng):
    L = int(rng.integers(2, 9))
    H = int(rng.choice([2, 4, 8, 16]))
    G = int(rng.choice([g for g in (1, 2, 4, 8) if H % g == 0]))
    E = int(rng.integers(2, 33))
    ratios = [int(rng.choice([0, 4, 8, 16, 128])) for _ in range(L)] + [0]
    return {"dim": 128 * int(rng.integers(1, 5)), "n_layers": L, "n_mtp_layers": 1, "vocab": int(rng.integers(64, 5000)),
            "n_heads": H, "q_lora": 128 * int(rng.integers(1, 4)), "o_groups": G, "o_lora": 128 * int(rng.integers(1, 3)) // G * G,
            "window": int(rng.integers(1, 300)), "index_heads": int(rng.integers(1, 9)), "index_dim": int(rng.choice([64, 128, 256])),
            "topk": int(rng.integers(1, 600)), "experts": E, "active": int(rng.integers(1, min(E, 8) + 1)),
            "inter": 128 * int(rng.integers(1, 5)), "n_hash": int(rng.integers(0, L + 1)), "route_scale": float(rng.uniform(0.5, 3)),
            "swiglu": float(rng.uniform(0, 20)), "hc": int(rng.integers(1, 5)), "iters": int(rng.integers(1, 30)),
            "hc_eps": float(rng.uniform(1e-7, 1e-5)), "rms_eps": float(rng.uniform(1e-7, 1e-5)),
            "theta": float(rng.uniform(1e3, 1e5)), "ctheta": float(rng.uniform(1e4, 1e6)), "factor": float(rng.uniform(1, 40)),
            "orig": int(rng.integers(1024, 200000)), "bf": float(rng.uniform(8, 64)), "bs": float(rng.uniform(0.5, 4)),
            "maxpos": int(rng.integers(1000, 2**22)), "ratios": ratios}


def _namings(m):
    """The same model in the official, reference (ModelArgs) and transformers namings (docs/model.md §1.1)."""
    csa, hca = 4, 128
    official = {"hidden_size": m["dim"], "num_hidden_layers": m["n_layers"], "num_nextn_predict_layers": 1,
                "vocab_size": m["vocab"], "num_attention_heads": m["n_heads"], "num_key_value_heads": 1, "head_dim": 512,
                "qk_rope_head_dim": 64, "q_lora_rank": m["q_lora"], "o_groups": m["o_groups"], "o_lora_rank": m["o_lora"],
                "sliding_window": m["window"], "index_n_heads": m["index_heads"], "index_head_dim": m["index_dim"],
                "index_topk": m["topk"], "n_routed_experts": m["experts"], "n_shared_experts": 1,
                "num_experts_per_tok": m["active"], "moe_intermediate_size": m["inter"], "num_hash_layers": m["n_hash"],
                "routed_scaling_factor": m["route_scale"], "swiglu_limit": m["swiglu"], "hc_mult": m["hc"],
                "hc_sinkhorn_iters": m["iters"], "hc_eps": m["hc_eps"], "rms_norm_eps": m["rms_eps"], "rope_theta": m["theta"],
                "compress_rope_theta": m["ctheta"], "max_position_embeddings": m["maxpos"],
                "rope_scaling": {"type": "yarn", "factor": m["factor"], "original_max_position_embeddings": m["orig"],
                                 "beta_fast": m["bf"], "beta_slow": m["bs"]},
                "compress_ratios": m["ratios"], "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc",
                "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                        "weight_block_size": [128, 128], "activation_scheme": "dynamic"},
                "expert_dtype": "fp4"}
    reference = {"dim": m["dim"], "n_layers": m["n_layers"], "n_mtp_layers": 1, "vocab_size": m["vocab"],
                 "n_heads": m["n_heads"], "head_dim": 512, "rope_head_dim": 64, "q_lora_rank": m["q_lora"],
                 "o_groups": m["o_groups"], "o_lora_rank": m["o_lora"], "window_size": m["window"],
                 "index_n_heads": m["index_heads"], "index_head_dim": m["index_dim"], "index_topk": m["topk"],
                 "n_routed_experts": m["experts"], "n_shared_experts": 1, "n_activated_experts": m["active"],
                 "moe_inter_dim": m["inter"], "n_hash_layers": m["n_hash"], "score_func": "sqrtsoftplus",
                 "route_scale": m["route_scale"], "swiglu_limit": m["swiglu"], "hc_mult": m["hc"],
                 "hc_sinkhorn_iters": m["iters"], "hc_eps": m["hc_eps"], "norm_eps": m["rms_eps"], "rope_theta": m["theta"],
                 "compress_rope_theta": m["ctheta"], "rope_factor": m["factor"], "original_seq_len": m["orig"],
                 "beta_fast": m["bf"], "beta_slow": m["bs"], "compress_ratios": m["ratios"], "dtype": "fp8",
                 "scale_fmt": "ue8m0", "expert_dtype": "fp4", "max_position_embeddings": m["maxpos"]}
    kind = {0: "sliding_attention", 4: "compressed_sparse_attention"}
    transformers = {k: v for k, v in official.items() if k not in ("compress_ratios", "num_hash_layers", "rope_scaling",
                                                                   "rope_theta", "compress_rope_theta", "qk_rope_head_dim")}
    transformers.update(
        partial_rotary_factor=0.125,
        layer_types=[kind.get(r, "heavily_compressed_attention") for r in m["ratios"][:-1]],
        mlp_layer_types=["hash_moe" if i < m["n_hash"] else "moe" for i in range(m["n_layers"])],
        compress_rates={"compressed_sparse_attention": csa, "heavily_compressed_attention": hca},
        rope_parameters={"main": {"rope_type": "default", "rope_theta": m["theta"]},
                         "compress": {"rope_type": "yarn", "rope_theta": m["ctheta"], "factor": m["factor"],
                                      "original_max_position_embeddings": m["orig"], "beta_fast": m["bf"],
                                      "beta_slow": m["bs"], "attention_factor": 1.0}})  # as save_pretrained writes it
    return official, reference, transformers


def test_config_three_namings_agree():
    rng = oracles.rng("namings")
    for _ in range(20):
        m = _random_model(rng)
        # transformers names one HCA rate for every HCA layer
        m["ratios"] = [r if r in (0, 4) else 128 for r in m["ratios"]]
        official, reference, transformers = _namings(m)
        a = model.config_parse(json.dumps(official))
        b = model.config_parse(json.dumps(reference))
        t = model.config_parse(json.dumps(transformers))
        assert (a.pop("naming"), b.pop("naming"), t.pop("naming")) == ("hf", "reference", "transformers")
        assert a == b == t
        assert a["dim"] == m["dim"] and a["compress_ratio"] == m["ratios"] and a["route_scale"] == m["route_scale"]
        assert a["hash_routed"] == [i < m["n_hash"] for i in range(m["n_layers"])] + [False]
        assert a["attn_kind"] == [{0: "SWA", 4: "CSA"}.get(r, "HCA") for r in m["ratios"]]
        assert a["rope_compress"]["factor"] == m["factor"] and a["rope_compress"]["original_max_position"] == m["orig"]


# ---- hostile inputs -----------------------------------------------------------------------------
def test_config_spellings_each_set_their_field():
    """Every spelling of the key table (src/model/config.c) is read: the official / transformers one
    and the reference's, each alone, give the same config; a value of the wrong type is refused."""
    pairs = [("hidden_size", "dim", 1024), ("num_hidden_layers", "n_layers", 7), ("num_nextn_predict_layers", "n_mtp_layers", 0),
             ("num_attention_heads", "n_heads", 16), ("sliding_window", "window_size", 64),
             ("num_experts_per_tok", "n_activated_experts", 3), ("moe_intermediate_size", "moe_inter_dim", 512),
             ("num_hash_layers", "n_hash_layers", 1), ("routed_scaling_factor", "route_scale", 2.0),
             ("rms_norm_eps", "norm_eps", 1e-5), ("scoring_func", "score_func", "sqrtsoftplus"),
             ("n_routed_experts", "num_local_experts", 32), ("moe_intermediate_size", "intermediate_size", 256)]  # aliases
    for hf, ref, v in pairs:
        a, b = model.config_parse(json.dumps({hf: v})), model.config_parse(json.dumps({ref: v}))
        a.pop("naming"), b.pop("naming")
        a.pop("weight_format"), b.pop("weight_format")  # the reference naming defaults to FP8 weights
        a.pop("expert_format"), b.pop("expert_format")
        for k in ("attn_kind", "compress_ratio"):  # an alias is transformers-only: its default schedule
            a.pop(k), b.pop(k)
        assert a == b, (hf, ref)
        with pytest.raises(DSV4Error, match=hf):
            model.config_parse(json.dumps({hf: [v]}))


def test_config_null_is_refused_not_the_default():
    for key in ("hidden_size", "num_hidden_layers", "vocab_size", "rms_norm_eps", "sliding_window", "eos_token_id"):
        with pytest.raises(DSV4Error, match=f'"{key}" is null'):
            model.config_parse(json.dumps({key: None}))


def test_config_unknown_keys_warn(capfd, tiny):
    """A key of no row draws one warning on stderr naming it; the keys transformers configs carry
    that dsv4 does not use, the hf-tiny-a config and the writer's own output draw none."""
    ignored = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "transformers_version": "5.17.0",
               "use_cache": True, "pad_token_id": None, "initializer_range": 0.02, "router_aux_loss_coef": 0.001,
               "router_jitter_noise": 0.0, "output_router_logits": False, "attention_dropout": 0.0, "mlp_bias": False}
    capfd.readouterr()
    model.config_parse(json.dumps(dict(ignored, hidden_size=4096, my_new_knob=3, **{"bad\u0001key": 1})), source="w.json")
    err = capfd.readouterr().err
    assert 'w.json: unknown config key "my_new_knob" ignored' in err
    assert 'unknown config key "bad\\x01key"' in err  # untrusted names are quoted
    assert err.count("unknown config key") == 2
    model.config_parse(json.dumps(ignored))
    model.config_load(tiny)
    if HF_TINY.is_dir():
        model.config_load(HF_TINY)
    assert "unknown config key" not in capfd.readouterr().err


def _open_untouched(path):
    """dsv4_model_open must fail and leave the caller's handle as it was."""
    handle = ctypes.c_void_p(0x5151)
    st = lib.dsv4_model_open(str(path).encode(), None, ctypes.byref(handle))
    assert st != 0 and handle.value == 0x5151
    return lib.dsv4_last_error().decode()


def _variant(tiny, tmp_path, name):
    d = tmp_path / name
    shutil.copytree(tiny, d)
    return d


def _edit_shard(d, shard, fn, index_fn=None):
    p = d / f"model-0000{shard}-of-00002.safetensors"
    tensors = {k: v for k, v in st_read(p).items()}
    fn(tensors)
    st_write(p, tensors)
    ip = d / "model.safetensors.index.json"
    idx = json.loads(ip.read_text())
    wm = {k: v for k, v in idx["weight_map"].items() if not v.endswith(f"0000{shard}-of-00002.safetensors")}
    wm.update({k: p.name for k in tensors})
    idx["weight_map"] = wm
    ip.write_text(json.dumps(idx))


SHARD1 = "model-00001-of-00002.safetensors"


@pytest.mark.parametrize("case", ["missing", "extra", "dtype", "shape", "truncated", "header_len", "overlap", "range",
                                  "hole", "utf8", "bad_json", "huge_config", "index_traversal", "index_missing_file"])
def test_hostile_checkpoints(tiny, tmp_path, case):
    d = _variant(tiny, tmp_path, case)
    p1 = d / SHARD1
    if case == "missing":
        _edit_shard(d, 1, lambda t: t.pop("layers.1.attn.kv_norm.weight"))
        needles = ["layers.1.attn.kv_norm.weight", "missing"]
    elif case == "extra":
        _edit_shard(d, 1, lambda t: t.update({"layers.0.attn.extra": ("F32", (2,), b"\0" * 8)}))
        needles = [SHARD1, "layers.0.attn.extra"]
    elif case == "dtype":
        _edit_shard(d, 1, lambda t: t.update({"layers.0.hc_attn_base": ("I32",) + t["layers.0.hc_attn_base"][1:]}))
        needles = [SHARD1, "layers.0.hc_attn_base", "I32"]
    elif case == "shape":
        def transpose(t):
            dt, (a, b), raw = t["layers.0.attn.wq_a.weight"]
            t["layers.0.attn.wq_a.weight"] = (dt, (b, a), raw)
        _edit_shard(d, 1, transpose)
        needles = [SHARD1, "layers.0.attn.wq_a.weight", "shape [256, 128]"]
    elif case == "truncated":
        p1.write_bytes(p1.read_bytes()[:-10])
        needles = [SHARD1, "truncated"]
    elif case == "header_len":
        b = bytearray(p1.read_bytes())
        b[:8] = struct.pack("<Q", len(b))
        p1.write_bytes(bytes(b))
        needles = [SHARD1, "runs past the end"]
    elif case in ("overlap", "range", "hole"):
        t = st_read(p1)
        names = sorted(t, key=lambda k: -len(t[k][2]))[:2]
        h, off = {}, 0
        for k, (dt, shape, raw) in t.items():
            h[k] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
            off += len(raw)
        total = off
        a = h[names[0]]["data_offsets"]
        if case == "overlap":
            h[names[1]]["data_offsets"] = [a[0], a[0] + len(t[names[1]][2])]
        elif case == "range":
            n = len(t[names[0]][2])
            h[names[0]]["data_offsets"] = [total, total + n]
        else:
            h[names[0]]["data_offsets"] = [a[0] + 2, a[1] + 2]  # data shifted: holes and overlaps
        st_write(p1, t, raw_header=json.dumps(h).encode())
        needles = [SHARD1] + ([names[1]] if case == "overlap" else [names[0]] if case == "range" else [])
    elif case == "utf8":
        t = st_read(p1)
        header = {k: {"dtype": v[0], "shape": list(v[1])} for k, v in t.items()}
        off = 0
        for k, v in t.items():
            header[k]["data_offsets"] = [off, off + len(v[2])]
            off += len(v[2])
        raw = json.dumps(header).encode().replace(b'"layers.0.attn_norm.weight"', b'"layers.0.attn_\xffnorm.weight"')
        st_write(p1, t, raw_header=raw)
        needles = [SHARD1, "invalid UTF-8", "layers.0.attn_"]
    elif case == "bad_json":
        t = st_read(p1)
        st_write(p1, t, raw_header=b'{"a": {"dtype": "F32",}}')
        needles = [SHARD1, "invalid JSON"]
    elif case == "huge_config":
        c = json.loads((d / "config.json").read_text())
        c["moe_intermediate_size"] = 2**40
        (d / "config.json").write_text(json.dumps(c))
        needles = ["config.json", "moe_intermediate_size"]
    elif case == "index_traversal":
        idx = json.loads((d / "model.safetensors.index.json").read_text())
        idx["weight_map"]["embed.weight"] = "../../etc/passwd"
        (d / "model.safetensors.index.json").write_text(json.dumps(idx))
        needles = ["model.safetensors.index.json", "embed.weight", "not a plain file name"]
    elif case == "index_missing_file":
        (d / "model-00002-of-00002.safetensors").unlink()
        needles = ["model-00002-of-00002.safetensors", "cannot open"]
    msg = _open_untouched(d)
    for n in needles:
        assert n in msg, (case, n, msg)
    with pytest.raises(ValueError) as e:
        model.Model(d)
    assert isinstance(e.value, DSV4Error) and str(e.value) == msg


def test_inspect_mode_lists_issues(tiny, tmp_path):
    d = _variant(tiny, tmp_path, "lenient")
    _edit_shard(d, 1, lambda t: (t.pop("layers.1.attn.wkv.scale"), t.update({"bogus": ("U8", (1,), b"\1")})))
    with model.Model(d, allow_issues=True) as m:
        kinds = sorted((k, n) for k, n, _ in m.issues)
        assert kinds == [("missing", "layers.1.attn.wkv.scale"), ("unexpected", "bogus")]


def test_config_errors_leave_output_untouched():
    c = model.ModelConfig()
    ctypes.memset(ctypes.byref(c), 0xA5, ctypes.sizeof(c))
    before = bytes(c)
    for text in ('{"hidden_size": 1e12}', '{"num_hidden_layers": 999999}', '{"vocab_size": -1}',
                 '{"n_routed_experts": 100000, "num_hidden_layers": 61}', '{"hidden_size": 4096, "dim": 7168}', '{"a":'):
        data = text.encode()
        assert lib.dsv4_config_parse(data, len(data), b"x.json", ctypes.byref(c)) != 0
        assert bytes(c) == before
        assert "x.json" in lib.dsv4_last_error().decode()


def test_cli_make_tiny_and_inspect(tmp_path):
    import os
    import subprocess
    exe = pathlib.Path(os.environ.get("DSV4_LIB", "build/libdsv4.so")).resolve().parent / "dsv4"
    if not exe.exists():
        pytest.skip(f"{exe} not built")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}  # the binary links its own sanitizer runtime
    d = tmp_path / "cli"
    r = subprocess.run([str(exe), "make-tiny", "--out", str(d), "--seed", "3", "--no-tokenizer"], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "427 tensors" in r.stdout and "vocab 512" in r.stdout, r.stdout + r.stderr
    assert not (d / "tokenizer.json").exists()
    r = subprocess.run([str(exe), "inspect", str(d)], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "problems: none" in r.stdout and "F8_E4M3" in r.stdout and "MTP" in r.stdout, r.stdout
    (d / "model-00002-of-00002.safetensors").write_bytes(b"\x10" + b"\0" * 7 + b"{}")
    r = subprocess.run([str(exe), "inspect", str(d)], capture_output=True, text=True, env=env)
    assert r.returncode == 1 and "model-00002-of-00002.safetensors" in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    r = subprocess.run([str(exe), "make-tiny", "--seed", "-1"], capture_output=True, text=True, env=env)
    assert r.returncode == 2


def test_cli_inspect_values(tmp_path):
    """`dsv4 inspect --values` passes a clean checkpoint and flags, tensor by tensor, a NaN BF16 /
    F32 element, an Inf, a NaN E4M3 code and a 0xFF (NaN) UE8M0 scale, exiting 1."""
    import os
    import subprocess
    exe = pathlib.Path(os.environ.get("DSV4_LIB", "build/libdsv4.so")).resolve().parent / "dsv4"
    if not exe.exists():
        pytest.skip(f"{exe} not built")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    d = tmp_path / "cli"
    assert subprocess.run([str(exe), "make-tiny", "--out", str(d), "--no-tokenizer"], capture_output=True, env=env).returncode == 0
    r = subprocess.run([str(exe), "inspect", str(d), "--values"], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "every element is a number" in r.stdout, r.stdout + r.stderr
    want = {"F8_E4M3": b"\x7f", "F8_E8M0": b"\xff", "F32": struct.pack("<f", math.inf), "BF16": b"\xc0\x7f"}
    hit = {}
    for f in sorted(d.glob("*.safetensors")):
        data = bytearray(f.read_bytes())
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n])
        for name, t in header.items():
            if name == "__metadata__" or t["dtype"] not in want or t["dtype"] in hit:
                continue
            at = 8 + n + t["data_offsets"][0] + 2 * len(want[t["dtype"]])  # the third element
            data[at:at + len(want[t["dtype"]])] = want[t["dtype"]]
            hit[t["dtype"]] = (f.name, name)
        f.write_bytes(bytes(data))
    assert set(hit) == set(want), hit
    r = subprocess.run([str(exe), "inspect", str(d), "--values"], capture_output=True, text=True, env=env)
    assert r.returncode == 1 and "4 tensors with non-finite elements or NaN scales" in r.stdout, r.stdout
    for dtype, (file, name) in hit.items():
        line = [ln for ln in r.stdout.splitlines() if f"'{name}'" in ln]
        assert line and file in line[0] and "the first at element 2" in line[0], (dtype, r.stdout)
        assert ("1 Inf" if dtype == "F32" else "1 NaN") in line[0], line[0]


def test_cli_make_tiny_ships_the_tokenizer(tmp_path):
    """`dsv4 make-tiny` writes DeepSeek-V4's tokenizer.json beside the weights with the vocabulary sized
    to it, so `dsv4 run --chat` turns text into text; without a tokenizer it says how to get one."""
    import os
    import subprocess
    import tokenizer_data
    exe = pathlib.Path(os.environ.get("DSV4_LIB", "build/libdsv4.so")).resolve().parent / "dsv4"
    if not exe.exists():
        pytest.skip(f"{exe} not built")
    src = pathlib.Path(tokenizer_data.tokenizer_json())
    base = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "DSV4_TOKENIZER", "DSV4_CACHE")}
    run = lambda *a, **env: subprocess.run([str(exe), *map(str, a)], capture_output=True, text=True, env={**base, **env})
    d = tmp_path / "tiny"
    r = run("make-tiny", "--out", d, "--tokenizer", src.parent)  # a folder holding tokenizer.json
    assert r.returncode == 0 and "vocab 129280" in r.stdout and "random" in r.stdout, r.stdout + r.stderr
    assert (d / "tokenizer.json").read_bytes() == src.read_bytes()
    r = run("run", "--model", d, "--chat", "Hello!", "--max-tokens", "4", "--threads", "1")
    assert r.returncode == 0 and "decode" in r.stderr and len(r.stdout.strip()) > 0, r.stdout + r.stderr
    # the default is $DSV4_TOKENIZER, else the fetched copy under $DSV4_CACHE; none: a clear error, nothing written
    empty, e = tmp_path / "empty-cache", tmp_path / "none"
    empty.mkdir()
    r = run("make-tiny", "--out", e, DSV4_CACHE=str(empty))
    assert r.returncode == 1 and "no tokenizer.json found" in r.stderr and "install-deps" in r.stderr and not e.exists(), r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": {}}')
    r = run("make-tiny", "--out", e, DSV4_TOKENIZER=str(bad))
    assert r.returncode == 1 and "bad.json" in r.stderr and not e.exists(), r.stderr
    # rewriting as a token-id model drops the tokenizer that no longer matches its vocabulary
    r = run("make-tiny", "--out", d, "--no-tokenizer")
    assert r.returncode == 0 and not (d / "tokenizer.json").exists(), r.stdout + r.stderr
    assert run("make-tiny", "--out", d, "--no-tokenizer", "--tokenizer", src).returncode == 2
