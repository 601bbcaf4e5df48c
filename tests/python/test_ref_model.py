"""The float64 DeepSeek-V4 reference (ref_model.py) against the transformers golden logits of
shared/testdata/hf-tiny-a, plus the properties that make it a usable oracle: causality (the logits of a
position depend on the tokens up to it only), the compressor's batched form == the per-token state machine
of docs/model.md §5.5, both checkpoint layouts and every config naming, exact dequantization, the MTP
block. Pure numpy: no C library involved. REF_MODEL.md explains the numbers."""
import json
import os
import struct

import numpy as np
import pytest

import oracles as o
import ref_checkpoint as rc
import ref_model as rm
from ref_tiny import official_config, write_official

HF_TINY = os.path.join(o.TESTDATA, "hf-tiny-a")
pytestmark = pytest.mark.skipif(not os.path.isdir(HF_TINY), reason="shared/testdata/hf-tiny-a not present")


@pytest.fixture(scope="module")
def golden():
    return np.load(os.path.join(HF_TINY, "golden.npz"))


@pytest.fixture(scope="module")
def hf_ckpt():
    return rc.Checkpoint(HF_TINY)


@pytest.fixture(scope="module")
def official_dir(tmp_path_factory, hf_ckpt):
    d = str(tmp_path_factory.mktemp("official-tiny"))
    return d, write_official(hf_ckpt, d, seed=1)


def rel_rows(a, b):
    return np.linalg.norm(a - b, axis=-1) / np.linalg.norm(b, axis=-1)


# ---- the golden comparison ---------------------------------------------------------------
@pytest.mark.parametrize("bf16", [False, True], ids=["f64", "bf16"])
def test_golden_logits_hf_tiny_a(golden, hf_ckpt, bf16):
    """Acceptance rule of testdata/README.md: with noise = rel(logits_bf16, logits_ref) per position,
    median rel error <= 3 x median(noise) and p90 <= 3 x p90(noise). The golden run is float32 without
    act_quant (transformers' BF16 path has none) and with the FP8 KV / compressor and Hadamard+FP4 indexer
    simulations, which is what the reference does by default on a BF16 checkpoint."""
    m = rm.RefModel(checkpoint=hf_ckpt, bf16=bf16)
    assert not m.act_quant
    logits = m.forward(golden["ids"])
    ref = golden["logits_ref"].astype(np.float64)
    noise = rel_rows(golden["logits_bf16"].astype(np.float64), ref)
    err = rel_rows(logits, ref)
    print(f"{'bf16' if bf16 else 'f64'}: err median {np.median(err):.3g} p90 {np.percentile(err, 90):.3g} "
          f"max {err.max():.3g}; noise median {np.median(noise):.3g} p90 {np.percentile(noise, 90):.3g}")
    assert np.median(err) <= 3 * np.median(noise)
    assert np.percentile(err, 90) <= 3 * np.percentile(noise, 90)
    if not bf16:
        # Position 0 sees only itself: no RoPE angle, no window, no compressed entry, no top-k. There the
        # float64 reference and the float32 golden agree to float32 rounding (2.8e-7 measured), which pins
        # every per-token step, the FP8 KV simulation included; later positions carry the unexplained
        # ~5e-4 offset and the discrete flips described in REF_MODEL.md, hence the looser bounds.
        assert err[0] < 1e-5
        assert np.median(err) < 5e-3


# ---- oracle properties ---------------------------------------------------------------------
def test_causal_prefix(golden, hf_ckpt):
    """logits[p] depends on ids[:p+1] only: a prefix gives the same rows (no leak through the window,
    the compressors, the indexer or the masks). Positions 38 and 69 end a CSA block and sit inside HCA
    blocks, past the window."""
    m = rm.RefModel(checkpoint=hf_ckpt)
    ids = golden["ids"][:70]
    full = m.forward(ids)
    for n in (39, 70):
        part = m.forward(ids[:n])
        np.testing.assert_allclose(part, full[:n], rtol=0, atol=1e-9 * np.abs(full).max())
    changed = ids.copy()
    changed[50:] = (changed[50:] + 7) % hf_ckpt.cfg.vocab_size
    np.testing.assert_allclose(m.forward(changed)[:50], full[:50], rtol=0, atol=1e-9 * np.abs(full).max())


def compressor_decode(a, g, ratio, d, overlap):
    """docs/model.md §5.5 (the state machine of decode), one token at a time: rows a/g are written
    into the state (row r + p%r with overlap, else p%r); on (p+1) % r == 0 the state is pooled (overlap:
    rows 0..r-1 with columns 0..d-1 and rows r..2r-1 with columns d..2d-1) and then shifted."""
    coff = 2 if overlap else 1
    ka, kg = np.zeros((coff * ratio, coff * d)), np.full((coff * ratio, coff * d), -np.inf)
    out = []
    for p in range(a.shape[0]):
        row = ratio + p % ratio if overlap else p % ratio
        ka[row], kg[row] = a[p], g[p]
        if (p + 1) % ratio:
            continue
        if overlap:
            sa = np.concatenate([ka[:ratio, :d], ka[ratio:, d:]])
            sg = np.concatenate([kg[:ratio, :d], kg[ratio:, d:]])
            ka[:ratio], kg[:ratio] = ka[ratio:], kg[ratio:]
        else:
            sa, sg = ka, kg
        w = np.exp(sg - sg.max(axis=0))
        out.append((w / w.sum(axis=0) * sa).sum(axis=0))
    return np.array(out).reshape(-1, d)


@pytest.mark.parametrize("ratio,overlap", [(4, True), (8, False), (128, False)])
def test_compress_pool_equals_decode_state_machine(ratio, overlap):
    rng = o.rng(f"compress ratio {ratio}")
    d = 16
    S = 3 * ratio + ratio // 2 + 1  # three complete blocks and a partial one
    a = rng.standard_normal((S, (1 + overlap) * d))
    g = rng.standard_normal((S, (1 + overlap) * d)) * 3
    n = S // ratio
    batched = rm.compress_pool(a[: n * ratio], g[: n * ratio], ratio, d, overlap)
    np.testing.assert_allclose(batched, compressor_decode(a, g, ratio, d, overlap), rtol=1e-12, atol=1e-12)


def test_rope_tables_match_spec():
    """docs/model.md §5.4 lists the V4 frequencies (computed in float64 with the same formula)."""
    cfg = rc.parse_config({"dim": 8, "n_layers": 1, "vocab_size": 4, "n_heads": 1, "q_lora_rank": 4,
                           "n_routed_experts": 2, "n_activated_experts": 1, "moe_inter_dim": 4,
                           "compress_ratios": [4, 0], "original_seq_len": 65536, "rope_factor": 16,
                           "compress_rope_theta": 160000})
    f = rm.rope_freqs(cfg, "compress")
    np.testing.assert_allclose(f[[1, 15, 16, 24, 25, 31]], [0.6876560, 0.003635539, 2.265625e-3, 1.953125e-5,
                                                            5.372313e-6, 5.680529e-7], rtol=2e-6)
    np.testing.assert_allclose(rm.rope_freqs(cfg, "main")[[1, 31]], [0.7498942, 1.333521e-4], rtol=2e-6)
    # interleaved pairs on the last dims; inverse undoes it
    x = o.rng("rope").standard_normal((5, 3, 128))
    y = rm.rope(x, np.arange(5) * 1000, f)
    np.testing.assert_array_equal(y[..., :64], x[..., :64])
    np.testing.assert_allclose(rm.rope(y, np.arange(5) * 1000, f, inverse=True), x, atol=1e-12)
    th = 1000 * f[3]
    assert np.isclose(y[1, 0, 64 + 6], x[1, 0, 70] * np.cos(th) - x[1, 0, 71] * np.sin(th))


# ---- checkpoints and configs ---------------------------------------------------------------
def test_config_namings_agree(hf_ckpt):
    """The transformers config of hf-tiny-a, the same model in the official ModelArgs naming and in the
    naming of the official repos' root config.json parse to the same Config."""
    cfg = hf_ckpt.cfg
    assert cfg.kinds == ["swa", "hca", "csa", "hca", "csa", "swa"] and cfg.ratios == [0, 8, 4, 8, 4, 0]
    assert cfg.hash_layers == [True, True, False, False, False] and cfg.window == 16
    assert (cfg.rope_factor, cfg.original_seq_len, cfg.rope_theta, cfg.compress_rope_theta) == \
        (16.0, 65536, 10000.0, 160000.0)
    hf_root = {
        "hidden_size": 128, "num_hidden_layers": 5, "vocab_size": 512, "num_attention_heads": 4,
        "head_dim": 512, "qk_rope_head_dim": 64, "q_lora_rank": 64, "o_groups": 2, "o_lora_rank": 32,
        "sliding_window": 16, "compress_ratios": [0, 8, 4, 8, 4, 0], "index_n_heads": 4,
        "index_head_dim": 128, "index_topk": 4, "n_routed_experts": 8, "n_shared_experts": 1,
        "num_experts_per_tok": 2, "moe_intermediate_size": 64, "scoring_func": "sqrtsoftplus",
        "routed_scaling_factor": 1.5, "num_hash_layers": 2, "swiglu_limit": 10.0, "hc_mult": 4,
        "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6, "rope_theta": 10000,
        "compress_rope_theta": 160000, "num_nextn_predict_layers": 1,
        "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                         "beta_fast": 32, "beta_slow": 1}}
    strip = lambda c: {k: v for k, v in vars(c).items() if k != "raw"}  # noqa: E731
    assert strip(rc.parse_config(official_config(cfg))) == strip(cfg)
    assert strip(rc.parse_config(hf_root)) == strip(cfg)


def test_hf_names_all_used(hf_ckpt):
    """Every tensor of the HF file maps to a canonical name the forward reads (attn.norm -> attn.kv_norm,
    embed_tokens -> embed, hc_head.hc_* -> hc_head_*), and the forward reads nothing else."""
    used = set()

    class Spy(dict):
        def __getitem__(self, k):
            used.add(k)
            return hf_ckpt[k]

        def get(self, k, default=None):
            used.add(k)
            return hf_ckpt.get(k, default)

    m = rm.RefModel(checkpoint=hf_ckpt)
    m.w = Spy()
    m.forward(np.arange(40))
    assert "layers.0.attn.kv_norm.weight" in hf_ckpt and "embed.weight" in hf_ckpt
    unused = set(hf_ckpt.tensors) - used
    # experts never routed to by these 40 tokens are the only unused tensors
    assert all(".ffn.experts." in k for k in unused), sorted(unused)[:5]
    assert used <= set(hf_ckpt.tensors)


def test_official_layout_dequantizes_exactly(official_dir, hf_ckpt):
    """FP8 128x128 weights, FP4 experts with 1x32 scales, FP32/BF16/I64 tensors, two shards + index, MTP
    tensors, config in ModelArgs naming: the reader gives back exactly the values written."""
    d, expect = official_dir
    ck = rc.Checkpoint(d)
    assert ck.had_fp8
    assert set(expect) | {k for k in hf_ckpt.tensors if k.endswith("tid2eid")} == set(ck.tensors)
    for k, v in expect.items():
        np.testing.assert_array_equal(ck[k], v, err_msg=k)
    np.testing.assert_array_equal(ck["layers.0.ffn.gate.tid2eid"], hf_ckpt["layers.0.ffn.gate.tid2eid"])


def test_fp4_nibble_order_and_scales():
    """Low nibble = even element (docs/formats.md §1.4), E8M0 byte b = 2^(b-127), 1x32 groups."""
    packed = np.zeros((1, 32), np.uint8)
    packed[0, 0] = 0x21  # element 0 = code 1 (0.5), element 1 = code 2 (1.0)
    packed[0, 16] = 0xF7  # element 32 = code 7 (6.0), element 33 = code 15 (-6.0)
    scale = np.array([[127, 129]], np.uint8)  # 1 for elements 0..31, 4 for 32..63
    w = rc.dequantize_weight("I8", packed.view(np.int8), "F8_E8M0", scale)
    assert w.shape == (1, 64)
    assert w[0, :2].tolist() == [0.5, 1.0] and w[0, 32:34].tolist() == [24.0, -24.0]
    assert not w[0, 2:32].any()


def test_act_quant_switch(official_dir):
    """act_quant defaults to on for an official checkpoint; it quantizes exactly the inputs of the
    FP8/FP4 linears per 1x128 (a shorter last block for K = 64) and leaves the others alone."""
    ck = rc.Checkpoint(official_dir[0])
    m = rm.RefModel(checkpoint=ck)
    assert m.act_quant
    x = o.rng("act quant").standard_normal((3, 64)) * 5
    w = ck["layers.0.attn.wq_b.weight"]
    np.testing.assert_array_equal(m.linear(x, "layers.0.attn.wq_b"), o.block_sim(x, "act128") @ w.T)
    x128 = o.rng("act quant").standard_normal((3, 128))
    wp = "layers.2.attn.indexer.weights_proj"
    np.testing.assert_array_equal(m.linear(x128, wp), x128 @ ck[wp + ".weight"].T)
    assert rc.is_quant_linear("layers.3.ffn.experts.5.w2.weight") and rc.is_quant_linear("mtp.0.e_proj.weight")
    assert not rc.is_quant_linear("layers.3.attn.wo_a.weight")
    assert not rc.is_quant_linear("layers.3.attn.compressor.wkv.weight")
    assert not rc.is_quant_linear("layers.3.ffn.gate.weight")


def test_mtp_block(official_dir, golden):
    """MTP (docs/model.md §8): logits [S-1, vocab]; row t depends on ids[:t+2] and the main streams up to
    t only; a second draft step on its own streams works the same way."""
    ck = rc.Checkpoint(official_dir[0])
    m = rm.RefModel(checkpoint=ck, act_quant=False)
    assert m.cfg.kinds[m.cfg.n_layers] == "swa"
    ids = golden["ids"][:40]
    _, streams = m.forward(ids, return_streams=True)
    lg, mtp_streams = m.mtp_forward(ids, streams, return_streams=True)
    assert lg.shape == (39, m.cfg.vocab_size) and np.isfinite(lg).all()
    changed = ids.copy()
    changed[30:] = (changed[30:] + 3) % m.cfg.vocab_size
    _, s2 = m.forward(changed, return_streams=True)
    np.testing.assert_allclose(m.mtp_forward(changed, s2)[:29], lg[:29], rtol=0, atol=1e-9 * np.abs(lg).max())
    assert np.abs(m.mtp_forward(changed, s2)[29] - lg[29]).max() > 1e-6
    lg2 = m.mtp_forward(ids[1:], mtp_streams)  # second draft step: streams of step 1, ids shifted again
    assert lg2.shape == (38, m.cfg.vocab_size) and np.isfinite(lg2).all()


def test_safetensors_reader_rejects_bad_files(tmp_path):
    p = tmp_path / "x.safetensors"
    rc.write_safetensors(str(p), {"a": ("F32", np.arange(6, dtype=np.float32).reshape(2, 3))})
    dt, a = rc.read_safetensors(str(p))["a"]
    assert dt == "F32" and a.tolist() == [[0, 1, 2], [3, 4, 5]]
    raw = p.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    for bad in (raw[:5], struct.pack("<Q", len(raw)) + raw[8:], raw[:-4]):
        p.write_bytes(bad)
        with pytest.raises(ValueError):
            rc.read_safetensors(str(p))
    header = json.loads(raw[8:8 + n])
    header["a"]["data_offsets"] = [0, 28]
    hb = json.dumps(header).encode()
    p.write_bytes(struct.pack("<Q", len(hb)) + hb + raw[8 + n:])
    with pytest.raises(ValueError):
        rc.read_safetensors(str(p))
