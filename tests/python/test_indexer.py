"""Lightning indexer (docs/model.md §5.6, docs/formats.md §5) against float64 oracles written from the docs:
query path (RoPE at p, Hadamard, FP4), head weights, scores Σ_h w_h ReLU(q_h·k_c) over the causal
candidates, and top-k in the sparse decode's form (indices by decreasing score, ties to the lower
index, -1 after the length). cpu == cpu-ref bit for bit, 1 == 2 threads, every ISA path."""
import numpy as np
import pytest

import dsv4
from dsv4 import indexer as ix

import oracles
from test_compressor import hadamard, hadamard_fp4_check, rope64, rope_interval, rope_table

BACKENDS = ["cpu", "cpu-ref"]
ISAS = ["avx512", "avx2", "scalar"]


# ---- oracles --------------------------------------------------------------------------------
def q_oracle(q_bits, positions, rope):
    """BF16 [T, H, d] -> (FP4 values, scale bytes [T, H, d/32]) per the reference's q path."""
    t, h, d = q_bits.shape
    x = q_rotated(q_bits, positions, rope)[0]
    y = oracles.bf16_round(x @ hadamard(d) / np.sqrt(d)).reshape(-1, d)
    codes, scales = oracles.quantize(y.astype(np.float32), "fp4_32")
    vals = oracles.dequantize(codes, scales, "fp4_32")
    return vals.reshape(t, h, d), scales.reshape(t, h, d // 32)


def q_rotated(q_bits, positions, rope):
    """The BF16 rows [T, H, d] the Hadamard sees: q with RoPE on the last 64 dims (float64, one
    BF16 rounding), and the spans (lo, hi) of values the kernels' fp32 rotation may round to."""
    t, h, d = q_bits.shape
    x = oracles.bf16_decode(q_bits).reshape(t, h, d).copy()
    lo, hi = x.copy(), x.copy()
    for i in range(t):
        cs = rope[positions[i]]
        lo[i, :, d - 64:], hi[i, :, d - 64:] = rope_interval(x[i, :, d - 64:], x[i, :, d - 64:], cs[None, :])
        for j in range(h):
            x[i, j, d - 64:] = oracles.bf16_round(rope64(x[i, j, d - 64:], cs))
    return x, lo, hi


def unpack(codes, scales):
    """Packed FP4 [..., d/2] + scales [..., d/32] -> float64 values [..., d]."""
    lead = codes.shape[:-1]
    c = dsv4.fp4_unpack(codes.reshape(-1, codes.shape[-1]))
    return oracles.dequantize(c, scales.reshape(-1, scales.shape[-1]), "fp4_32").reshape(lead + (c.shape[-1],))


def score_oracle(qv, w, kv, positions, ratio=4):
    """float64 scores [T, N] (-inf beyond the causal count) and the per-element error scale."""
    dots = np.einsum("thd,cd->thc", qv, kv)
    s = np.einsum("th,thc->tc", w.astype(np.float64), np.maximum(dots, 0))
    mag = np.einsum("th,thc->tc", np.abs(w), np.einsum("thd,cd->thc", np.abs(qv), np.abs(kv)))
    n = kv.shape[0]
    mask = np.arange(n)[None, :] >= ((np.asarray(positions) + 1) // ratio)[:, None]
    return np.where(mask, -np.inf, s), mag


def topk_sorted(scores, n_valid, k):
    """The contract's top-k by a full sort: decreasing score (NaN as -inf), ties to the lower index."""
    t = scores.shape[0]
    idx = np.full((t, k), -1, np.int32)
    ln = np.zeros(t, np.int32)
    for i in range(t):
        s = scores[i, : n_valid[i]].astype(np.float64)
        s = np.where(np.isnan(s), -np.inf, s)
        order = np.lexsort((np.arange(s.size), -s))[:k]
        idx[i, : order.size] = order
        ln[i] = order.size
    return idx, ln


def make_case(rng, t, h, d, n, positions=None, q_scale=1.0):
    rope = rope_table(4 * n + 8)
    q = dsv4.bf16_encode((rng.standard_normal((t, h, d)) * q_scale).astype(np.float32))
    if positions is None:
        positions = rng.integers(0, 4 * n, size=t)
    positions = np.asarray(positions, np.int32)
    # cache rows: FP4 values with their scales, as the indexer compressor writes them
    kc, ks = oracles.quantize((rng.standard_normal((n, d)) * np.exp(rng.standard_normal((n, 1)))).astype(np.float32),
                              "fp4_32")
    k_codes = dsv4.fp4_pack(kc)
    qc, qs = ix.indexer_q(q, positions, rope)
    w = ix.indexer_weights(dsv4.bf16_encode(rng.standard_normal((t, h)).astype(np.float32)), d)
    return dict(q=q, rope=rope, positions=positions, qc=qc, qs=qs, w=w, kc=k_codes, ks=ks)


# ---- query path and head weights ----------------------------------------------------------------
@pytest.mark.parametrize("h,d", [(64, 128), (4, 128), (3, 64), (8, 256)])
def test_q_path_against_oracle(h, d):
    rng = oracles.rng(f"indexer q h{h} d{d}")
    t = 5
    rope = rope_table(70000)
    q = dsv4.bf16_encode((rng.standard_normal((t, h, d)) * 4).astype(np.float32))
    pos = np.array([0, 1, 77, 4095, 65000], np.int64)
    x, lo, hi = (a.reshape(-1, d) for a in q_rotated(q, pos, rope))
    outs = []
    for be in BACKENDS:
        codes = oracles.poison((t, h, d // 2), np.uint8)
        scales = oracles.poison((t, h, d // 32), np.uint8)
        ix.indexer_q(q, pos, rope, backend=be, out=(codes, scales))
        # strict: the oracle's FP4 values and scales except flips across a rounding boundary that
        # the kernels' bounded fp32 error can reach (test_compressor.hadamard_fp4_check)
        hadamard_fp4_check(unpack(codes, scales).reshape(-1, d), scales.reshape(-1, d // 32), x, lo, hi,
                           f"{be} q rows")
        flat = ix.indexer_q(q, pos.astype(np.int32), rope, packed=False, backend=be)
        assert np.array_equal(oracles.bf16_decode(flat), unpack(codes, scales))
        outs.append((codes, scales))
    assert all(np.array_equal(a, b) for a, b in zip(outs[0], outs[1]))


@pytest.mark.parametrize("d", [64, 256])
def test_q_path_exact_on_exact_inputs(d):
    """Position 0 (identity rotation), small integer inputs and d^-0.5 a power of two: every
    step is exact in fp32, so codes and scales must equal the oracle's bit for bit."""
    rng = oracles.rng(f"indexer q exact d{d}")
    q = dsv4.bf16_encode(rng.integers(-3, 4, size=(6, 16, d)).astype(np.float32))
    pos = np.zeros(6, np.int32)
    rope = rope_table(4)
    want, want_s = q_oracle(q, pos, rope)
    for be in BACKENDS:
        codes, scales = ix.indexer_q(q, pos, rope, backend=be)
        assert np.array_equal(scales, want_s)
        assert np.array_equal(unpack(codes, scales), want)


def test_head_weights_exact():
    rng = oracles.rng("head weights")
    proj = dsv4.bf16_encode((rng.standard_normal((7, 64)) * 5).astype(np.float32))
    scale = np.float32(128 ** -0.5 * 64 ** -0.5)  # 0.011048543, one fp32 rounding of the double
    want = oracles.bf16_round(oracles.bf16_decode(proj).astype(np.float32) * scale)
    for be in BACKENDS:
        out = oracles.poison((7, 64), np.float32)
        ix.indexer_weights(proj, 128, backend=be, out=out)
        assert np.array_equal(out, want)
    f32 = rng.standard_normal((2, 4)).astype(np.float32)
    assert np.array_equal(ix.indexer_weights(f32, 128), oracles.bf16_round(f32 * np.float32(128 ** -0.5 * 0.5)))


# ---- scores -----------------------------------------------------------------------------------
@pytest.mark.parametrize("h,d,n", [(64, 128, 600), (4, 128, 300), (20, 64, 257), (128, 256, 100)])
def test_scores_against_oracle(monkeypatch, h, d, n):
    rng = oracles.rng(f"scores h{h} d{d}")
    c = make_case(rng, 4, h, d, n, positions=[4 * n - 1, 4 * n + 2, 9, 2])
    qv, kv = unpack(c["qc"], c["qs"]), unpack(c["kc"], c["ks"])
    want, mag = score_oracle(qv, c["w"], kv, c["positions"])
    got = {}
    for be in BACKENDS:
        for isa in ISAS:
            monkeypatch.setenv("DSV4_CPU_ISA", isa)
            for th in [1, 2]:
                out = oracles.poison((4, n), np.float32)
                ix.indexer_scores(c["qc"], c["qs"], c["w"], c["kc"], c["ks"], c["positions"], backend=be,
                                  threads=th, out=out)
                got[(be, isa, th)] = out
    base = got[("cpu-ref", "avx512", 1)]
    # group dot products are exact integers; fp32 fma sums over 4 groups and 16 lanes + a 4-level
    # tree add at most ~1e-6 of the summed magnitudes
    fin = np.isfinite(want)
    assert np.array_equal(np.isfinite(base), fin) and np.all(base[~fin] == -np.inf)
    assert np.all(np.abs(base[fin] - want[fin]) <= 4e-6 * mag[fin] + 1e-30)
    for key, v in got.items():  # one documented order: every backend, ISA and thread count agree
        assert np.array_equal(v, base), f"{key} differs from cpu-ref"


def test_scores_strided_cache_rows():
    """The 68-byte entry layout (64 B codes + 4 B scales adjacent) through strided views."""
    rng = oracles.rng("aos cache")
    c = make_case(rng, 2, 64, 128, 100, positions=[399, 150])
    buf = np.zeros((100, 68), np.uint8)
    buf[:, :64], buf[:, 64:] = c["kc"], c["ks"]
    a = ix.indexer_scores(c["qc"], c["qs"], c["w"], c["kc"], c["ks"], c["positions"])
    b = ix.indexer_scores(c["qc"], c["qs"], c["w"], buf[:, :64], buf[:, 64:], c["positions"])
    assert np.array_equal(a, b)


# ---- selection ------------------------------------------------------------------------------
@pytest.mark.parametrize("t,n,k", [(1, 9000, 512), (1, 9000, 16), (5, 700, 64), (3, 40, 512), (2, 5, 4)])
def test_select_is_the_full_sort(monkeypatch, t, n, k):
    """Fused streaming select == top-k of the same scores by a full sort (exactly: one total
    order), for one token split over threads (t=1, n > 2048) and for tokens per thread."""
    rng = oracles.rng(f"select t{t} n{n} k{k}")
    pos = rng.integers(4 * n - 4, 4 * n, size=t)
    pos[-1] = rng.integers(0, 4 * n)
    c = make_case(rng, t, 64, 128, n, positions=pos)
    scores = ix.indexer_scores(c["qc"], c["qs"], c["w"], c["kc"], c["ks"], c["positions"], backend="cpu-ref")
    nv = ((c["positions"] + 1) // 4).astype(np.int32)
    want_idx, want_len = topk_sorted(scores, nv, k)
    for be in BACKENDS:
        for th in [1, 2]:
            if be == "cpu-ref" and n > 5000 and th == 2:
                continue  # the scalar reference at 9000 candidates once is enough
            idx = oracles.poison((t, k), np.int32)
            ln = oracles.poison((t,), np.int32)
            ix.indexer_select(c["qc"], c["qs"], c["w"], c["kc"], c["ks"], c["positions"], k, backend=be, threads=th,
                              out=(idx, ln))
            assert np.array_equal(ln, want_len) and np.array_equal(idx, want_idx), f"{be} threads={th}"
    # and against the float64 scores: the chosen set is a top-k set up to near-ties
    qv, kv = unpack(c["qc"], c["qs"]), unpack(c["kc"], c["ks"])
    exact, mag = score_oracle(qv, c["w"], kv, c["positions"])
    for i in range(t):
        m = want_len[i]
        if m == 0:
            continue
        kth = np.sort(exact[i, : nv[i]])[::-1][m - 1]
        chosen = exact[i, want_idx[i, :m]]
        assert np.all(chosen >= kth - 4e-6 * mag[i].max())


def test_topk_ties_nan_and_lengths(monkeypatch):
    rng = oracles.rng("topk ties")
    t, n, k = 6, 5000, 100
    scores = rng.integers(-3, 4, size=(t, n)).astype(np.float32)  # massive ties
    scores[1] = np.arange(n, dtype=np.float32)                     # ascending: every candidate enters
    scores[2, ::7] = np.nan
    scores[3] = 0.0                                                # all equal
    scores[3, ::2] = -0.0                                          # -0 ties with +0
    scores[4, :10] = -np.inf
    nv = np.array([n, n, n, n, 50, 0], np.int32)
    want_idx, want_len = topk_sorted(scores, nv, k)
    assert np.array_equal(want_idx[3], np.arange(k))
    for be in BACKENDS:
        for isa in ["avx512", "scalar"]:
            monkeypatch.setenv("DSV4_CPU_ISA", isa)
            for th in [1, 2]:
                idx, ln = ix.indexer_topk(scores, k, n_valid=nv, backend=be, threads=th)
                assert np.array_equal(ln, want_len) and np.array_equal(idx, want_idx)
                one, ln1 = ix.indexer_topk(scores[:1], k, backend=be, threads=th)  # T=1 < threads: chunked
                assert np.array_equal(one[0], want_idx[0]) and ln1[0] == k
    assert want_len[4] == 50 and np.all(want_idx[4, 50:] == -1) and want_len[5] == 0


def test_all_equal_scores_pick_lowest_indices():
    """Zero head weights make every score 0: the first k entries, in order."""
    rng = oracles.rng("all equal")
    c = make_case(rng, 2, 64, 128, 300, positions=[1199, 40])
    w = np.zeros_like(c["w"])
    for be in BACKENDS:
        idx, ln = ix.indexer_select(c["qc"], c["qs"], w, c["kc"], c["ks"], c["positions"], 32, backend=be)
        assert list(ln) == [32, 10]
        assert np.array_equal(idx[0], np.arange(32)) and np.array_equal(idx[1, :10], np.arange(10))
        assert np.all(idx[1, 10:] == -1)


def test_pipeline_compressor_to_selection():
    """Indexer compressor rows written into a cache by chunks, then q path + weights + select, vs
    a float64 oracle of the whole chain: the chosen entries are a top-k set up to near-ties."""
    from test_compressor import RefCompressor, finish, make_inputs
    rng = oracles.rng("pipeline")
    d, ratio, n_tok, h, k = 128, 4, 203, 16, 8
    rope = rope_table(n_tok + 8)
    kv, gate, ape, norm = make_inputs(rng, n_tok, ratio, d, True)
    cache_c = np.zeros((n_tok // ratio, d // 2), np.uint8)
    cache_s = np.zeros((n_tok // ratio, d // 32), np.uint8)
    skv, ss = ix.compressor_state(ratio, d, "indexer", overlap=True)
    for a, b in [(0, 37), (37, 38), (38, 150), (150, n_tok)]:
        c0 = a // ratio
        m = ix.compressor_emit_count(ratio, a, b - a)
        ix.compressor_forward(kv[a:b], gate[a:b], ape, norm, rope, skv, ss, a, ratio, kind="indexer", packed=True,
                              overlap=True, out=(cache_c[c0:c0 + m], cache_s[c0:c0 + m]))
    ref = RefCompressor(ratio, d, True)
    kref = []
    for p in range(n_tok):
        v = ref.step(p, kv[p], gate[p], ape)
        if v is not None:
            kref.append(finish(v, p // ratio, ratio, oracles.bf16_decode(norm), rope, "indexer")[1])
    kref = np.array(kref)
    q = dsv4.bf16_encode(rng.standard_normal((3, h, d)).astype(np.float32))
    pos = np.array([n_tok - 1, 100, 3], np.int32)
    qc, qs = ix.indexer_q(q, pos, rope)
    w = ix.indexer_weights(dsv4.bf16_encode(rng.standard_normal((3, h)).astype(np.float32)), d)
    idx, ln = ix.indexer_select(qc, qs, w, cache_c, cache_s, pos, k)
    assert list(ln) == [k, k, 1]
    qv, _ = q_oracle(q, pos, rope)
    exact, mag = score_oracle(qv, w, kref, pos)
    for i in range(3):
        kth = np.sort(exact[i][np.isfinite(exact[i])])[::-1][ln[i] - 1]
        # FP4 flips between this chain and the oracle's (see hadamard_fp4_check) move scores by a few %
        assert np.all(exact[i, idx[i, : ln[i]]] >= kth - 0.05 * mag[i].max())


def test_bad_inputs_leave_outputs_untouched():
    rng = oracles.rng("indexer bad")
    c = make_case(rng, 2, 8, 128, 50, positions=[199, 20])
    idx0 = oracles.poison((2, 8), np.int32)
    ln0 = oracles.poison((2,), np.int32)

    def attempt(fn, **kw):
        idx, ln = idx0.copy(), ln0.copy()
        args = dict(q_codes=c["qc"], q_scales=c["qs"], weights=c["w"], k_codes=c["kc"], k_scales=c["ks"],
                    positions=c["positions"])
        args.update(kw)
        with pytest.raises(ValueError):
            if fn == "select":
                ix.indexer_select(topk=args.pop("topk", 8), out=(idx, ln), **args)
            else:
                ix.indexer_scores(out=args.pop("out"), **args)
        assert np.array_equal(idx, idx0) and np.array_equal(ln, ln0)

    attempt("select", positions=np.array([203, 20], np.int32))    # 51 candidates, cache holds 50
    attempt("select", positions=np.array([-1, 20], np.int32))
    attempt("select", topk=0)
    attempt("select", weights=c["w"][:, :7])
    attempt("select", k_scales=c["ks"][:, :3])
    attempt("select", q_codes=c["qc"][:, :, :32], q_scales=c["qs"][:, :, :2])  # d = 64 vs cache d = 128
    sc = oracles.poison((2, 50), np.float32)
    attempt("scores", out=sc[:, :49])
    attempt("scores", out=sc, k_codes=sc.view(np.uint8)[:50, :64])  # output overlaps an input
    assert np.all(np.isnan(sc))
    with pytest.raises(ValueError):
        ix.indexer_topk(np.zeros((2, 10), np.float32), 4, n_valid=np.array([3, 11], np.int32))
    q = dsv4.bf16_encode(np.ones((1, 2, 96), np.float32))
    with pytest.raises(ValueError):
        ix.indexer_q(q, np.zeros(1, np.int32), c["rope"])                 # d = 96
    out = (oracles.poison((1, 2, 64), np.uint8), oracles.poison((1, 2, 4), np.uint8))
    q = dsv4.bf16_encode(np.ones((1, 2, 128), np.float32))
    with pytest.raises(ValueError):
        ix.indexer_q(q, np.array([10 ** 6], np.int32), c["rope"], out=out)  # past the rope table
    assert np.all(out[0] == 0xA5) and np.all(out[1] == 0xA5)
