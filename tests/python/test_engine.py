"""The decode engine (include/dsv4/engine.h) against the independent float64 reference forward
(ref_model.py, written from docs/model.md) and against itself.

Models: the built-in tiny checkpoint (`make-tiny`: official layout, FP8 weights, FP4 experts, layers
SWA / CSA / HCA(ratio 8) / CSA, hash routing in layers 0-1, learned routing after, an MTP block),
one-layer checkpoints cut from it (one per attention kind and routing kind, MTP kept), a vocabulary-8
variant with an MTP block that echoes the main prediction (so that drafts get accepted), models whose
config.json gives the schedule in transformers' naming with ratios the official naming cannot say
(an HCA layer of ratio 4, a CSA layer of ratio 8, CSA and HCA layers sharing ratio 4 or 2), and the
Hugging Face golden checkpoint hf-tiny-a.
Prompts are 80 tokens (48 on the scalar cpu-ref backend): past the 16-token window, 10 (6) HCA blocks,
20 (12) CSA entries for a top-4 indexer.

Why the logits tolerances are statistical. These models quantize activations to FP8 (1x128) before
every FP8/FP4 linear, the KV latent to FP8 and the indexer to FP4: a one-ulp BF16 difference
anywhere (fp32 C arithmetic vs float64 numpy) flips an FP8 code now and then, and each flip is a
~6 % change of one element that later layers and every later position (through the caches) pick
up. The built-in model is conditioned as trained networks are (docs/testing.md §4.1: each
residual branch a few-percent update of the streams), so such flips stay small: the reference
itself in BF16 storage mode vs float64 mode differs by 0.3-0.6 % (median relative L2 of the main
logits; 1.4-1.9 % for the MTP rows) where the model before the conditioning gave 1.2-3.3 %. With
noise = rel(ref_bf16, ref_f64) per position, the engine is held to
  * median rel(engine, ref_f64) <= 1.5 x median(noise) and p90 <= 2 x p90(noise): measured <= 1.04x
    and <= 1.22x over 3 seeds x 12 models (the golden data's rule, 3x, is what the unconditioned
    model needed: its p90 ratio reached 1.8x);
  * median rel(engine, ref_bf16) <= median(noise): the engine is nearer to the reference evaluated with
    the engine's own BF16 storage points than the float64 evaluation is (measured <= 0.64x);
  * a ceiling of its own: median <= 1.5 %, p90 <= 2.5 % for the main logits (measured <= 0.64 % and
    0.95 %: ~2.5x; the unconditioned model's 3.3 % / 11 % fail it), <= 4 % / 5 % for the MTP rows
    (measured 1.9 % / 2.3 %);
and exactness is checked where it is defined: on one-layer models some position reproduces the
reference to fp32 rounding (every quantization-simulation point identical), and the cache entries (FP8 KV rows,
compressed entries, MXFP4 indexer entries) of one-layer models equal the reference's element for
element except for rare one-code flips. Self-consistency is exact: prefill == n single decodes
(logits and cache bytes), any chunking, 1 vs 2 threads, speculative greedy == plain greedy."""
import dataclasses
import json
import os
import subprocess
import types

import numpy as np
import pytest

import dsv4
import oracles as o
import ref_checkpoint as rc
import ref_model as rm
from dsv4.engine import Engine, rng_seed
from ref_tiny import write_official

HF_TINY = os.path.join(o.TESTDATA, "hf-tiny-a")
SEED = int(os.environ.get("DSV4_TEST_SEED", np.random.SeedSequence().entropy % (1 << 32)))
N_PROMPT = 80


def rel(a, b):
    return np.linalg.norm(a - b, axis=-1) / np.linalg.norm(b, axis=-1)


@pytest.fixture(scope="module")
def rng():
    print(f"test_engine seed {SEED} (DSV4_TEST_SEED to replay)")
    return np.random.default_rng(SEED)


# ---- checkpoints ---------------------------------------------------------------------------------
def _echo_mtp(t, cfg):
    """An MTP block that drafts well: it passes the main model's streams through (e_proj 0, h_proj I,
    sub-layer outputs 0, comb = I) into the main model's hc_head and norm, so its row t repeats the
    main prediction of position t; a target that repeats a token then accepts every draft."""
    D = cfg.dim
    t["mtp.0.e_proj.weight"] = np.zeros((D, D))
    t["mtp.0.h_proj.weight"] = np.eye(D)
    t["mtp.0.hnorm.weight"] = np.ones(D)
    for n in list(t):
        if n.startswith("mtp.0.") and (n.endswith("wo_b.weight") or n.endswith("w2.weight")):
            t[n] = np.zeros_like(t[n])
    for site in ("attn", "ffn"):
        t[f"mtp.0.hc_{site}_fn"] = np.zeros_like(t[f"mtp.0.hc_{site}_fn"])
        base = t[f"mtp.0.hc_{site}_base"].copy()
        base[2 * cfg.hc_mult:] = 20.0 * np.eye(cfg.hc_mult).ravel()
        t[f"mtp.0.hc_{site}_base"] = base
    for n in ("hc_head_fn", "hc_head_base", "hc_head_scale", "norm.weight"):
        t["mtp.0." + n] = t[n].copy()
    # and a head that leans towards repeating the current token (the embedding's own direction)
    t["head.weight"] = t["head.weight"] + t["embed.weight"] * 0.3 / np.sqrt(D)


def _write_variant(base, out, layer=None, vocab=None, echo=False):
    """One layer of `base` (layer k becomes layer 0) or the whole model with a smaller vocabulary
    (and an echoing MTP block), written in the official layout with the MTP block kept."""
    cfg, t = base.cfg, {}
    for n, v in base.tensors.items():
        if layer is not None and n.startswith("layers."):
            pre = f"layers.{layer}."
            if n.startswith(pre):
                t["layers.0." + n[len(pre):]] = v
            continue
        t[n] = v
    if layer is not None:
        k = layer
        cfg = dataclasses.replace(cfg, n_layers=1, ratios=[cfg.ratios[k], 0], kinds=[cfg.kinds[k], "swa"],
                                  hash_layers=[cfg.hash_layers[k]])
    if vocab is not None:
        for n in list(t):
            if n in ("embed.weight", "head.weight") or n.endswith("gate.tid2eid"):
                t[n] = t[n][:vocab]
        cfg = dataclasses.replace(cfg, vocab_size=vocab)
    if echo:
        _echo_mtp(t, cfg)
    write_official(types.SimpleNamespace(cfg=cfg, tensors=t), out, mtp=False)
    return out


_TYPES = {"swa": "sliding_attention", "csa": "compressed_sparse_attention", "hca": "heavily_compressed_attention"}


def _write_rates_variant(base, out, layers, rates, rng):
    """Layers `layers` of `base` (kept in that order) re-rated: a CSA / HCA layer of the new model
    compresses at rates[kind], which its ape rows follow (rows cut, or new rows drawn like the
    old). Written in the official layout with config.json's schedule in transformers' naming
    (layer_types + compress_rates): what the official naming cannot say (an HCA layer of ratio 4,
    a CSA layer of another ratio)."""
    cfg, t = base.cfg, {}
    for n, v in base.tensors.items():
        if not n.startswith("layers."):
            t[n] = v
    for j, k in enumerate(layers):
        pre = f"layers.{k}."
        r = rates.get(cfg.kinds[k], 0)
        for n, v in base.tensors.items():
            if not n.startswith(pre):
                continue
            if n.endswith(".ape"):
                extra = rng.standard_normal((max(r - v.shape[0], 0), v.shape[1])) * np.std(v)
                v = np.concatenate([v, extra])[:r]
            t[f"layers.{j}." + n[len(pre):]] = v
    kinds = [cfg.kinds[k] for k in layers]
    hash_layers = [cfg.hash_layers[k] for k in layers]
    cfg = dataclasses.replace(cfg, n_layers=len(layers), ratios=[rates.get(x, 0) for x in kinds] + [0],
                              kinds=kinds + ["swa"], hash_layers=hash_layers)
    write_official(types.SimpleNamespace(cfg=cfg, tensors=t), out, mtp=False)
    path = os.path.join(out, "config.json")
    with open(path) as f:
        c = json.load(f)
    del c["compress_ratios"], c["n_hash_layers"]
    c["layer_types"] = [_TYPES[x] for x in kinds]
    c["compress_rates"] = {_TYPES[x]: r for x, r in rates.items()}
    c["mlp_layer_types"] = ["hash_moe" if h else "moe" for h in hash_layers]
    with open(path, "w") as f:
        json.dump(c, f, indent=1)
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory, rng):
    root = tmp_path_factory.mktemp("engine-models")
    tiny = str(root / "tiny")
    dsv4.model.make_tiny(tiny, seed=int(rng.integers(1 << 30)))
    base = rc.Checkpoint(tiny)
    assert base.cfg.kinds[:4] == ["swa", "csa", "hca", "csa"] and base.cfg.hash_layers[:2] == [True, True]
    d = {"tiny": tiny}
    for name, k in (("swa-hash", 0), ("csa-hash", 1), ("hca-learned", 2), ("csa-learned", 3)):
        d[name] = _write_variant(base, str(root / name), layer=k)
    d["vocab8"] = _write_variant(base, str(root / "vocab8"), vocab=8, echo=True)
    # ratios the official naming cannot give: the overlap and the indexer follow the kind
    d["hca4"] = _write_rates_variant(base, str(root / "hca4"), [2], {"csa": 4, "hca": 4}, rng)
    d["csa8"] = _write_rates_variant(base, str(root / "csa8"), [1], {"csa": 8, "hca": 128}, rng)
    d["csa4-hca4"] = _write_rates_variant(base, str(root / "csa4-hca4"), [1, 2], {"csa": 4, "hca": 4}, rng)
    d["hca2-csa2"] = _write_rates_variant(base, str(root / "hca2-csa2"), [2, 1], {"csa": 2, "hca": 2}, rng)
    return d


_refs = {}


def ref(path, bf16):
    """The reference (bf16: at the engine's rounding points; P rounded to BF16 for P.V, as every
    attention kernel of the library does, docs/kernels.md §3.2)."""
    key = (path, bf16)
    if key not in _refs:
        _refs[key] = rm.RefModel(path, bf16=bf16)
    return _refs[key]


def ref_logits(path, ids, bf16):
    """Main logits [S, V] and MTP logits [S-1, V] of the reference."""
    m = ref(path, bf16)
    lg, X = m.forward(ids, return_streams=True)
    return lg, m.mtp_forward(ids, X)


def engine_logits(path, ids, backend, threads=1):
    with Engine(path, max_context=256, max_batch=128, max_mtp=1, backend=backend, threads=threads) as e:
        s = e.seq_create()
        out = e.forward(s, ids, n_mtp_logits=len(ids) - 1)
        return out + (e.export(s),)


MAIN_CEILING, MTP_CEILING = (0.015, 0.025), (0.04, 0.05)  # median, p90 (module doc)


def check_noise_rule(name, got, r64, r16, ceiling):
    noise, err, err_b = rel(r16, r64), rel(got, r64), rel(got, r16)
    print(f"{name}: err median {np.median(err):.3g} p90 {np.percentile(err, 90):.3g}; vs bf16-ref median "
          f"{np.median(err_b):.3g} min {err_b.min():.2g}; noise median {np.median(noise):.3g} p90 "
          f"{np.percentile(noise, 90):.3g}")
    assert np.median(err) <= 1.5 * np.median(noise)
    assert np.percentile(err, 90) <= 2 * np.percentile(noise, 90)
    assert np.median(err_b) <= np.median(noise)
    assert np.median(err) <= ceiling[0] and np.percentile(err, 90) <= ceiling[1]
    return err_b


# ---- logits of every position vs the reference ----------------------------------------------------
@pytest.mark.parametrize("name,backend", [("tiny", "cpu"), ("tiny", "cpu-ref"), ("swa-hash", "cpu-ref"),
                                          ("csa-hash", "cpu-ref"), ("hca-learned", "cpu"),
                                          ("csa-learned", "cpu-ref"), ("hca4", "cpu-ref"), ("csa8", "cpu-ref"),
                                          ("hca4", "cpu"), ("csa8", "cpu"), ("csa4-hca4", "cpu"),
                                          ("hca2-csa2", "cpu")])
def test_logits_match_reference(models, rng, name, backend):
    """Every position of an 80-token prompt and every MTP row, against the reference (module doc for
    the rule)."""
    path = models[name]
    ids = rng.integers(0, 512, N_PROMPT if backend == "cpu" else 48)  # the scalar kernels are slow
    lg, ml, _ = engine_logits(path, ids, backend)
    r64, m64 = ref_logits(path, ids, bf16=False)
    r16, m16 = ref_logits(path, ids, bf16=True)
    err_b = check_noise_rule(f"{name}/{backend} main", lg, r64, r16, MAIN_CEILING)
    check_noise_rule(f"{name}/{backend} mtp", ml, m64, m16, MTP_CEILING)
    # one layer: where no FP8 code flipped upstream (position 0 sees itself only), every rounding and
    # quantization point is the reference's, so some position agrees to fp32 rounding (four layers
    # have too many quantization points for that to be sure)
    if name in ("swa-hash", "csa-hash", "hca-learned", "csa-learned", "hca4", "csa8"):
        assert err_b.min() <= 1e-5


def _parse_export(blob, cfg, n, window):
    """The export of a one-layer model without MTP: ring entries, compressed entries, indexer entries."""
    def entries(raw, count):
        raw = raw[: count * 584].reshape(count, 584)
        v = o.e4m3_decode(raw[:, :448]) * np.repeat(o.e8m0_decode(raw[:, 576:583]), 64, axis=1)
        return np.concatenate([v, o.bf16_decode(raw[:, 448:576].copy().view(np.uint16))], axis=1)
    nring = min(n, window)
    out = {"ring": entries(blob, nring)}
    off = nring * 584
    r = cfg.ratios[0]
    if r:
        out["comp"] = entries(blob[off:], n // r)
        off += n // r * 584
    if cfg.kinds[0] == "csa":  # the indexer pools its layer's windows
        raw = blob[off: off + n // r * 68].reshape(n // r, 68)
        codes = np.stack([raw[:, :64] & 15, raw[:, :64] >> 4], axis=-1).reshape(n // r, 128)
        out["index"] = o.e2m1_decode(codes) * np.repeat(o.e8m0_decode(raw[:, 64:68]), 32, axis=1)
    return out


@pytest.mark.parametrize("name", ["csa-hash", "hca-learned", "hca4", "csa8"])
def test_cache_entries_match_reference(models, rng, name):
    """The quantization-simulation points themselves: the FP8 KV rows of the window, the compressed
    entries (FP8 nope dims, UE8M0 per 64, BF16 rope dims) and the MXFP4 indexer entries of a one-layer
    model equal the reference's values element for element; only rare flips are allowed, where an fp32
    vs float64 difference crosses a BF16 rounding boundary upstream (a flip before a norm moves a few
    dozen codes of that entry): >= 50 % of the entries bit-identical, <= 2 % of all elements differ."""
    path = models[name]
    ids = rng.integers(0, 512, N_PROMPT)
    with Engine(path, max_context=256, max_batch=128, backend="cpu-ref") as e:
        s = e.seq_create()
        e.forward(s, ids, n_logits=0)
        got = _parse_export(e.export(s), ref(path, True).cfg, N_PROMPT, ref(path, True).cfg.window)
    m = ref(path, True)
    cfg, pos = m.cfg, np.arange(N_PROMPT)
    X = np.repeat(m.r(m.w["embed.weight"][ids])[:, None, :], cfg.hc_mult, axis=1)
    xin, _, _ = m.hc_pre(X, "layers.0.hc_attn_")
    x = m.rmsnorm(xin, "layers.0.attn_norm.weight")
    p = "layers.0.attn."
    kv = m.rmsnorm(m.linear(x, p + "wkv"), p + "kv_norm.weight")
    kv = m.r(rm.rope(kv, pos, m.freqs["compress"]))
    kv[:, :448] = o.block_sim(kv[:, :448], "kv64")
    want = {"ring": kv[-cfg.window:],
            "comp": m.compressor(p + "compressor.", cfg.ratios[0], 512, cfg.kinds[0] == "csa", x, pos, False)}
    if cfg.kinds[0] == "csa":
        want["index"] = m.compressor(p + "indexer.compressor.", cfg.ratios[0], 128, True, x, pos, True)
    for k, w in want.items():
        assert got[k].shape == w.shape, k
        frac, same = np.mean(got[k] != w), np.mean(np.all(got[k] == w, axis=1))
        print(f"{name} {k}: {got[k].shape[0]} entries, {same:.0%} identical, {frac:.2%} of the elements differ")
        assert frac <= 0.02 and same >= 0.5, k


# ---- greedy decoding -------------------------------------------------------------------------------
# The bound on |engine - reference logit| at any greedy step, x 2: the reference's top-2 margin above
# which the engine must choose as it does. Measured (cpu vs the BF16-mode reference, 3 seeds): <= 0.18
# on the four-layer model (logits of standard deviation ~2), <= 0.02 on one layer; 0.5 is a whole
# residual branch flipped by a routing or indexer near-tie (~5 % of the streams in a random
# direction moves the largest of 512 logits by ~0.05 x 2 x 3 = 0.3), the bound tests/c/test_engine.c
# holds every CPU ISA to against cpu-ref.
GREEDY_DELTA = 1.0


@pytest.mark.parametrize("name", ["tiny", "swa-hash", "hca-learned"])
def test_greedy_64_steps_match_reference(models, rng, name):
    """64 greedy steps of the engine (cpu); the reference, teacher-forced on the same tokens, must choose
    the same token at every step whose top-2 margin exceeds GREEDY_DELTA; the logits differ by at most
    GREEDY_DELTA / 2 at every step, and near-ties where the choices differ are rare."""
    path = models[name]
    prompt = rng.integers(0, 512, 8)
    with Engine(path, max_context=256, max_batch=64, backend="cpu", threads=1) as e:
        toks, stats, steps = e.generate(prompt, 64, keep_logits=True)
    assert len(toks) == 64 and stats["generated_tokens"] == 64
    got = np.concatenate([s["logits"][-len(s["tokens"]):] for s in steps])
    want = ref(path, True).forward(np.concatenate([prompt, toks])[:-1])[len(prompt) - 1:]
    assert np.array_equal(got.argmax(1), toks)
    bad = np.nonzero(want.argmax(1) != toks)[0]
    diff = np.abs(got - want).max()
    top2 = np.sort(want, 1)[:, -2:]
    margin = top2[:, 1] - top2[:, 0]
    print(f"{name}: {len(bad)} near-tie steps of 64 ({np.sum(margin <= GREEDY_DELTA)} of margin <= {GREEDY_DELTA}); "
          f"max |logit difference| {diff:.3g}")
    assert diff <= GREEDY_DELTA / 2
    assert np.all(margin[bad] <= GREEDY_DELTA), margin[bad]
    # measured 0-1 over 3 seeds x 3 models (the unconditioned model: 1-5 on four layers, bound 12)
    assert len(bad) <= 4


# ---- self-consistency --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["tiny", "csa4-hca4", "hca2-csa2", "csa8"])
def test_prefill_equals_single_decodes(models, rng, name):
    """Prefill in one call, in chunks of 16 (max_batch) or 7, and 40 single-token decodes give the same
    logits, the same MTP logits and the same cache bytes (rings, compressed and indexer caches,
    compressor states, the MTP ring); also with CSA and HCA layers of one ratio sharing its page pool."""
    path = models[name]
    ids = rng.integers(0, 512, 40)
    with Engine(path, max_context=128, max_batch=16, max_mtp=2, threads=1) as e:
        runs = []
        for chunk in (40, 7, 1):
            s = e.seq_create()
            lg, ml = [], []
            for c0 in range(0, 40, chunk):
                part = ids[c0:c0 + chunk]
                rows = len(part) - (c0 == 0)
                a, b = e.forward(s, part, n_mtp_logits=rows)
                lg.append(a)
                ml.append(b)
            runs.append((np.concatenate(lg), np.concatenate(ml), e.export(s)))
            e.seq_free(s)
    for lg, ml, ex in runs[1:]:
        assert np.array_equal(lg, runs[0][0])
        assert np.array_equal(ml, runs[0][1])
        assert np.array_equal(ex, runs[0][2])


def test_threads_bit_identical(models, rng):
    ids = rng.integers(0, 512, 40)
    a = engine_logits(models["tiny"], ids, "cpu", threads=1)
    b = engine_logits(models["tiny"], ids, "cpu", threads=2)
    for x, y in zip(a, b):
        assert np.array_equal(x, y)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_speculative_greedy_equals_plain(models, rng, k):
    """MTP speculative decoding with k drafts: the same 48 tokens as plain greedy decoding and the same
    target logits for every kept position (verification is the batched forward); acceptance reported.
    On the tiny model drafts are rejected (rollback of every compressor state); the vocabulary-8
    model's echoing MTP gets them accepted, fully or partly (a few prompts are tried until a step
    keeps some but not all of its drafts), so the accept / bonus / partial-rollback paths all run."""
    for name in ("tiny", "vocab8", "csa8", "hca2-csa2"):  # rollback of overlapping states of ratio 8 and 2
        path, vocab = models[name], 8 if name == "vocab8" else 512
        accepted = partial = 0
        with Engine(path, max_context=256, max_batch=32, max_mtp=3, threads=1) as e:
            for attempt in range(1 if name == "tiny" else 8):
                prompt = rng.integers(0, vocab, 5)
                plain, _, ps = e.generate(prompt, 48, keep_logits=True)
                spec, st, ss = e.generate(prompt, 48, mtp=k, keep_logits=True)
                assert np.array_equal(plain, spec)
                rows = lambda steps: np.concatenate([s["logits"][-len(s["tokens"]):] for s in steps])  # noqa: E731
                assert np.array_equal(rows(ps), rows(ss))
                assert 0 <= st["accepted"] <= st["drafted"] and st["drafted"] > 0
                assert sum(s["accepted"] for s in ss) == st["accepted"] and st["steps"] == len(ss)
                accepted += st["accepted"]
                partial += sum(0 < s["accepted"] < s["drafted"] for s in ss)
                print(f"{name} k={k}: acceptance {st['acceptance']:.2f} ({st['accepted']}/{st['drafted']})")
                if partial or (k == 1 and accepted):
                    break
        if name == "vocab8":
            assert accepted > 0
            print(f"vocab8 k={k}: {partial} steps kept part of their drafts")


def test_speculative_sampling(models, rng):
    """Temperature > 0 with MTP (rejection sampling): reproducible from the seed, valid ids, and the
    target model's logits of the kept positions equal those of a plain forward over the output; drafts
    get accepted (a few prompts are tried)."""
    path = models["vocab8"]
    accepted = 0
    with Engine(path, max_context=256, max_batch=32, max_mtp=2, threads=1) as e:
        for attempt in range(5):
            prompt, seed = rng.integers(0, 8, 6), int(rng.integers(1 << 30))
            a, st, steps = e.generate(prompt, 40, mtp=2, temperature=0.8, top_p=0.95, seed=seed, keep_logits=True)
            b, _, _ = e.generate(prompt, 40, mtp=2, temperature=0.8, top_p=0.95, seed=seed)
            assert np.array_equal(a, b) and len(a) == 40 and a.min() >= 0 and a.max() < 8
            s = e.seq_create()
            full, _ = e.forward(s, np.concatenate([prompt, a[:-1]]))
            e.seq_free(s)
            got = np.concatenate([x["logits"][-len(x["tokens"]):] for x in steps])
            assert np.array_equal(got, full[len(prompt) - 1:])
            accepted += st["accepted"]
            print(f"sampling: acceptance {st['acceptance']:.2f} ({st['accepted']}/{st['drafted']})")
            if accepted:
                break
    assert accepted > 0


# ---- sampling --------------------------------------------------------------------------------------
def test_sampler_distribution(models, rng):
    """Gumbel-max with temperature: the frequencies of 4000 draws follow softmax(logits / T) (each within
    5 binomial standard deviations); top-p never leaves the nucleus; temperature 0 is argmax; the same
    generator state gives the same draws."""
    with Engine(models["swa-hash"], max_context=64) as e:
        logits = np.full(512, -40.0, np.float32)
        hot = rng.choice(512, 5, replace=False)
        logits[hot] = [2.0, 1.5, 1.0, 0.2, -0.5]
        assert e.sample(logits) == hot[0]
        T, n = 0.7, 4000
        st = rng_seed(int(rng.integers(1 << 62)))
        draws = np.array([e.sample(logits, temperature=T, rng=st) for _ in range(n)])
        p = np.exp(logits.astype(np.float64) / T)
        p /= p.sum()
        counts = np.bincount(draws, minlength=512)
        assert np.all(np.abs(counts - n * p) <= 5 * np.sqrt(n * p * (1 - p)) + 1)
        # nucleus of 0.8: the two most likely tokens (mass 0.39 + 0.30 < 0.8, + 0.19 reaches it): three
        q = np.sort(p)[::-1]
        keep = int(np.searchsorted(np.cumsum(q), 0.8) + 1)
        draws = [e.sample(logits, temperature=T, top_p=0.8, rng=st) for _ in range(600)]
        assert set(draws) <= set(hot[:keep]) and len(set(draws)) == keep
        s1, s2 = rng_seed(5), rng_seed(5)
        assert [e.sample(logits, 1.0, rng=s1) for _ in range(50)] == [e.sample(logits, 1.0, rng=s2) for _ in range(50)]


# ---- the Hugging Face golden logits ----------------------------------------------------------------
@pytest.mark.skipif(not os.path.isdir(HF_TINY), reason="shared/testdata/hf-tiny-a not present")
@pytest.mark.parametrize("backend", ["cpu", "cpu-ref", pytest.param("cuda", marks=pytest.mark.skipif(
    not dsv4.device.available("cuda")[0], reason="no usable CUDA device"))])
def test_golden_hf_tiny_a(backend):
    """testdata/README.md's acceptance rule on transformers' float32 logits of hf-tiny-a (BF16 weights in
    the HF layout): median rel error <= 3 x median(noise), p90 <= 3 x p90(noise)."""
    g = np.load(os.path.join(HF_TINY, "golden.npz"))
    want = g["logits_ref"].astype(np.float64)
    noise = rel(g["logits_bf16"].astype(np.float64), want)
    with Engine(HF_TINY, max_context=128, max_batch=64, backend=backend, threads=0 if backend == "cuda" else 1) as e:
        got, _ = e.forward(e.seq_create(), g["ids"])
    err = rel(got, want)
    print(f"{backend}: err median {np.median(err):.4f} p90 {np.percentile(err, 90):.4f}; bounds "
          f"{3 * np.median(noise):.4f} {3 * np.percentile(noise, 90):.4f}")
    assert np.median(err) <= 3 * np.median(noise)
    assert np.percentile(err, 90) <= 3 * np.percentile(noise, 90)


# ---- API behaviour -----------------------------------------------------------------------------------
def test_bad_inputs_leave_state_untouched(models, rng, tmp_path):
    path = models["tiny"]
    with Engine(path, max_context=32, max_seqs=2, max_batch=16, max_mtp=1) as e:
        s = e.seq_create()
        e.forward(s, rng.integers(0, 512, 10))
        before = e.export(s)
        for bad in ([5, 512], [-1], np.zeros(23, np.int64)):  # out of vocabulary; past max_context
            with pytest.raises(ValueError):
                e.forward(s, bad)
            assert e.seq_length(s) == 10 and np.array_equal(e.export(s), before)
        with pytest.raises(ValueError, match="n_logits"):
            e.forward(s, [1, 2], n_logits=3)
        with pytest.raises(ValueError, match="sequence"):
            e.forward(7, [1])
        with pytest.raises(ValueError, match="mtp"):
            e.generate([1, 2], 4, mtp=2)
        with pytest.raises(ValueError, match="max_context"):
            e.generate([1, 2], 40)
        e.seq_create()
        with pytest.raises(ValueError, match="all 2 sequences"):
            e.seq_create()
        assert e.seq_length(s) == 10 and np.array_equal(e.export(s), before)
    with pytest.raises(ValueError):
        Engine(str(tmp_path / "missing"))
    # a truncated shard is refused with a message naming the file
    bad = tmp_path / "truncated"
    bad.mkdir()
    for f in os.listdir(path):
        data = open(os.path.join(path, f), "rb").read()
        (bad / f).write_bytes(data[: len(data) // 2] if f.endswith("00002-of-00002.safetensors") else data)
    with pytest.raises(ValueError, match="00002-of-00002"):
        Engine(str(bad))
    with pytest.raises(ValueError, match="max_mtp"):
        Engine(path, max_batch=2, max_mtp=2)


def test_every_call_size_at_long_context(models, rng):
    """Calls of every size 1..max_batch where the HCA scope is long (the attention's workspace is not
    monotone in the call size: small calls split a query's entries, large ones do not), and MTP
    verifications there: all succeed, and equal max_batch chunks bit for bit (each op's result for a
    token is independent of the call size)."""
    ids = rng.integers(0, 512, 700)
    with Engine(models["tiny"], max_context=768, max_batch=24, max_mtp=2, threads=1) as e:
        runs = []
        for sizes in (np.arange(700) % 24 + 1, np.full(700, 24)):
            s, c0, lg = e.seq_create(), 0, []
            for m in sizes:
                part = ids[c0:c0 + m]
                if not len(part):
                    break
                lg.append(e.forward(s, part, n_mtp_logits=len(part) - (c0 == 0))[0])
                c0 += len(part)
            runs.append(np.concatenate(lg))
            e.seq_free(s)
        assert np.all(np.isfinite(runs[0])) and np.array_equal(runs[0], runs[1])
        toks, st, _ = e.generate(ids[:650], 16, mtp=2)
        assert len(toks) == 16 and st["drafted"] > 0


def test_generate_checks_prompt_first_and_stops_in_prefill(models, rng):
    """A bad id anywhere in the prompt fails before the first chunk runs; a stop request from the
    callback during a chunked prefill ends the generation there, with no token generated."""
    ids = rng.integers(0, 512, 12)
    with Engine(models["tiny"], max_context=64, max_batch=16, max_mtp=1, logits_rows=4) as e:
        s = e.seq_create()
        bad = ids.copy()
        bad[9] = 512
        with pytest.raises(ValueError, match="prompt token 9"):
            e.generate(bad, 4, mtp=1, prompt_logits=True, seq=s)
        assert e.seq_length(s) == 0
        toks, _, steps = e.generate(ids, 4, mtp=1, prompt_logits=True, seq=s, on_step=lambda d: d["step"] == 0)
        assert len(toks) == 0 and len(steps) == 1 and e.seq_length(s) == 4
        # a reset sequence is a fresh one
        e.seq_reset(s)
        assert e.seq_length(s) == 0
        a, _ = e.forward(s, ids)
        e.seq_free(s)
        b, _ = e.forward(e.seq_create(), ids)
        assert np.array_equal(a, b)


def test_bad_tid2eid_refused_at_load(models, tmp_path):
    """Hash routing reads tid2eid in the middle of a forward pass: an entry that is not an expert is
    refused when the engine is created, not by a forward that has already changed the caches."""
    base = rc.Checkpoint(models["tiny"])
    t = dict(base.tensors)
    tab = t["layers.1.ffn.gate.tid2eid"].copy()
    tab[300, 1] = base.cfg.n_routed_experts
    t["layers.1.ffn.gate.tid2eid"] = tab
    write_official(types.SimpleNamespace(cfg=base.cfg, tensors=t), str(tmp_path / "bad"), mtp=False)
    with pytest.raises(ValueError, match=r"block 1: ffn.gate.tid2eid\[300\]\[1\]"):
        Engine(str(tmp_path / "bad"))


def test_f32_embedding_converted_at_load(models, rng, tmp_path):
    """An F32 embedding table is converted to BF16 once at load (RNE): the same logits as the checkpoint
    that stores those rows in BF16 (values off the BF16 grid, so the rounding is exercised)."""
    base = rc.Checkpoint(models["tiny"])
    t = dict(base.tensors)
    emb = t["embed.weight"] + rng.normal(0.0, 1e-3, t["embed.weight"].shape)
    t["embed.weight"] = emb.astype(np.float32).astype(np.float64)
    a, b = str(tmp_path / "bf16"), str(tmp_path / "f32")
    for d in (a, b):
        write_official(types.SimpleNamespace(cfg=base.cfg, tensors=t), d, mtp=False)
    shard = os.path.join(b, "model-00001-of-00002.safetensors")
    tensors = rc.read_safetensors(shard)
    assert tensors["embed.weight"][0] == "BF16"
    tensors["embed.weight"] = ("F32", t["embed.weight"].astype(np.float32))
    rc.write_safetensors(shard, tensors)
    ids = rng.integers(0, 512, 20)
    out = []
    for d in (a, b):
        with Engine(d, max_context=32, max_batch=8, threads=1) as e:
            out.append(e.forward(e.seq_create(), ids)[0])
    assert np.array_equal(out[0], out[1])


def test_sequences_and_memory(models, rng):
    """Memory is planned at creation and does not grow; two interleaved sequences do not disturb each
    other; a freed slot starts empty."""
    path = models["tiny"]
    a_ids, b_ids = rng.integers(0, 512, 24), rng.integers(0, 512, 24)
    with Engine(path, max_context=64, max_seqs=2, max_batch=8, threads=1) as e:
        mem0 = e.memory()
        assert mem0["planned"] == mem0["weights_converted"] + mem0["kv_cache"] + mem0["state"] + mem0["scratch"]
        assert mem0["kv_used"] == 0 and mem0["weights_mapped"] > 0
        alone = []
        s = e.seq_create()
        for t in a_ids:
            alone.append(e.forward(s, [t])[0])
        e.seq_free(s)
        sa, sb = e.seq_create(), e.seq_create()
        mixed = []
        for ta, tb in zip(a_ids, b_ids):
            mixed.append(e.forward(sa, [ta])[0])
            e.forward(sb, [tb])
        assert np.array_equal(np.concatenate(alone), np.concatenate(mixed))
        mem1 = e.memory()
        assert mem1["planned"] == mem0["planned"] and mem1["kv_used"] > 0
        e.seq_free(sb)
        sc = e.seq_create()
        assert e.seq_length(sc) == 0


def _cli():
    lib = os.environ.get("DSV4_LIB", "")
    exe = os.path.join(os.path.dirname(lib), "dsv4")
    return exe if lib and os.path.exists(exe) else None


@pytest.mark.skipif(_cli() is None, reason="the dsv4 executable is not beside DSV4_LIB")
def test_cli_run(models, tmp_path):
    """`dsv4 run`: JSON output equal to Engine.generate, the logits dump, a clear one-line error."""
    path, dump = models["vocab8"], str(tmp_path / "logits.npy")
    cmd = [_cli(), "run", "--model", path, "--prompt-ids", "1,2,3,4", "--max-tokens", "12", "--mtp", "2",
           "--output", "json", "--dump-logits", dump, "--ignore-eos"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert "decode" in r.stderr and "acceptance" in r.stderr and "memory planned" in r.stderr
    with Engine(path, max_context=4096, max_batch=128, max_mtp=2, logits_rows=128) as e:
        toks, st, steps = e.generate([1, 2, 3, 4], 12, mtp=2, keep_logits=True, prompt_logits=True)
    assert out["generated_ids"] == toks.tolist() and out["drafted"] == st["drafted"]
    assert [s["tokens"] for s in out["steps"]] == [s["tokens"] for s in steps if s["tokens"]]
    d = np.load(dump)
    assert d.shape == (4 + 12 - 1, 8) and np.array_equal(d[:4], steps[0]["logits"])
    r = subprocess.run([_cli(), "run", "--model", path, "--prompt-ids", "1,99", "--max-tokens", "3"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "prompt-ids" in r.stderr


def test_generate_default_max_tokens(models, rng):
    """max_tokens 0 (the zero default of dsv4_generate_options) generates until the sequence holds
    max_context positions: the same tokens as asking for exactly that many."""
    ids = rng.integers(0, 512, 5).astype(np.int32)
    with dsv4.Engine(models["tiny"], max_context=20) as e:
        a, _, _ = e.generate(ids, 0)
        b, _, _ = e.generate(ids, 20 - 5 + 1)
    assert len(a) == 16 and list(a) == list(b)
