"""The attention decode path against float64/numpy oracles written from the contracts
(docs/contracts.md §5-§6, docs/kernels.md §1-§4, docs/model.md §5.4), not from the C code, plus the golden
vectors from vLLM and FlashMLA in shared/testdata/kernels.

Backends come from $DSV4_TEST_BACKENDS (default "cpu,cpu-ref"; e.g. "cuda,cpu-ref" on a GPU
machine); "cpu" runs every ISA path of the cpu backend (scalar, avx2, avx512 capped through
$DSV4_CPU_ISA). Each case computes its oracle once and checks every path, with fresh random
inputs (seed printed; DSV4_TEST_SEED replays) and outputs poisoned before every run."""
import os

import numpy as np
import pytest

import oracles as o
from dsv4._lib import ctx
from dsv4 import attention as A

KD = o.kernel_testdata()
golden = pytest.mark.skipif(KD is None, reason="testdata/kernels not found (set DSV4_SHARED or DSV4_KERNEL_TESTDATA)")


def _isa_mismatch(isa):
    """oracles.cpu_isa_mismatch with DSV4_CPU_ISA set to isa for the question only."""
    old = os.environ.get("DSV4_CPU_ISA")
    os.environ["DSV4_CPU_ISA"] = isa
    try:
        return o.cpu_isa_mismatch(isa)
    finally:
        if old is None:
            del os.environ["DSV4_CPU_ISA"]
        else:
            os.environ["DSV4_CPU_ISA"] = old


def _paths():
    """(paths that run, {cpu ISA path that does not run on this machine: why})."""
    out, missing = [], {}
    for b in os.environ.get("DSV4_TEST_BACKENDS", "cpu,cpu-ref").split(","):
        b = b.strip()
        if b == "cpu":
            for isa in ("avx512", "avx2", "scalar"):
                why = _isa_mismatch(isa)
                if why:  # the cap would fall back: the case would test another path under this name
                    missing[f"cpu-{isa}"] = why
                else:
                    out.append(("cpu", isa))
        elif b:
            out.append((b, None))
    return out, missing


PATHS, MISSING_PATHS = _paths()


@pytest.mark.parametrize("path", ["cpu-avx512", "cpu-avx2", "cpu-scalar"])
def test_cpu_isa_path_runs(path):
    """Each cpu ISA path every test below checks runs its own kernels; a path this machine lacks
    is left out of each_path and reported here as a skip (never silently tested as another)."""
    if path in MISSING_PATHS:
        pytest.skip(MISSING_PATHS[path])
    if "cpu" not in [b.strip() for b in os.environ.get("DSV4_TEST_BACKENDS", "cpu,cpu-ref").split(",")]:
        pytest.skip("the cpu backend is not among $DSV4_TEST_BACKENDS")
    assert ("cpu", path[4:]) in PATHS


def each_path(fn):
    """fn(backend) for every path; the cpu ISA cap is set through the environment."""
    res = {}
    old = os.environ.get("DSV4_CPU_ISA")
    try:
        for name, isa in PATHS:
            if isa:
                os.environ["DSV4_CPU_ISA"] = isa
            elif "DSV4_CPU_ISA" in os.environ:
                del os.environ["DSV4_CPU_ISA"]
            res[f"{name}-{isa}" if isa else name] = fn(name)
    finally:
        if old is None:
            os.environ.pop("DSV4_CPU_ISA", None)
        else:
            os.environ["DSV4_CPU_ISA"] = old
    return res


def bf16_bits(x):
    return o.bf16_encode(np.asarray(x, np.float32))


# ---- oracles of the cache layout (docs/contracts.md §5) -----------------------------------
def oracle_rope_f32(x_bits, cs, inverse=False):
    """GPT-J rotation of the last 64 dims in fp32 (each product rounded, no FMA), as the contract
    states (docs/kernels.md §2.2: fp32 math, one BF16 rounding)."""
    x = o.bf16_decode(x_bits).astype(np.float32)
    a, b = x[..., 0::2], x[..., 1::2]
    c, s = cs[..., :32].astype(np.float32), cs[..., 32:].astype(np.float32)
    y = np.empty_like(x)
    if inverse:
        y[..., 0::2], y[..., 1::2] = a * c + b * s, b * c - a * s
    else:
        y[..., 0::2], y[..., 1::2] = a * c - b * s, b * c + a * s
    return bf16_bits(y)


def oracle_insert(cache, bs, kv_bits, slots):
    """Write rows (BF16 bits [n, 512], rope dims already final) at slots into cache (in place)."""
    for row, slot in zip(kv_bits, slots):
        if slot < 0:
            continue
        codes, scales = o.quantize(o.bf16_decode(row[:448]).astype(np.float32)[None], "kv64")
        page, r = divmod(int(slot), bs)
        cache[page, r * 576:r * 576 + 448] = codes[0]
        cache[page, r * 576 + 448:r * 576 + 576] = row[448:].astype("<u2").view(np.uint8)
        cache[page, bs * 576 + r * 8:bs * 576 + r * 8 + 8] = np.append(scales[0], 0)


def oracle_dequant(cache, bs):
    """float64 [num_slots, 512]: every entry of the cache, dequantized (exact)."""
    npg = cache.shape[0]
    slots = np.arange(npg * bs)
    page, r = slots // bs, slots % bs
    data = cache[page[:, None], r[:, None] * 576 + np.arange(576)]
    sc = cache[page[:, None], bs * 576 + r[:, None] * 8 + np.arange(7)]
    nope = o.e4m3_decode(data[:, :448]).reshape(-1, 7, 64) * o.e8m0_decode(sc)[..., None]
    rope = o.bf16_decode(np.ascontiguousarray(data[:, 448:]).view("<u2"))
    return np.concatenate([nope.reshape(-1, 448), rope], axis=1)


def random_cache(rng, num_pages, bs, scale_lo=121, scale_hi=129):
    """A cache of random valid entries: E4M3 codes of randn (no NaN), random scale bytes, random
    BF16 rope values, and random bytes in the pad byte and page padding (never read)."""
    pb = A.page_bytes(bs)
    cache = rng.integers(0, 256, (num_pages, pb), dtype=np.uint8)
    n = num_pages * bs
    codes = o.e4m3_encode(rng.standard_normal((n, 448)).astype(np.float32) * 8)
    rope = bf16_bits(rng.standard_normal((n, 64)) * 2.0)
    sc = rng.integers(scale_lo, scale_hi + 1, (n, 7), dtype=np.uint8)
    for s in range(n):
        page, r = divmod(s, bs)
        cache[page, r * 576:r * 576 + 448] = codes[s]
        cache[page, r * 576 + 448:r * 576 + 576] = rope[s].view(np.uint8)
        cache[page, bs * 576 + r * 8:bs * 576 + r * 8 + 7] = sc[s]
    return cache


# ---- page geometry and RoPE ---------------------------------------------------------------
@pytest.mark.parametrize("bs,want", [(64, 37440), (2, 1728), (1, 1152), (69, 40320), (576, 336384)])
def test_page_bytes(bs, want):
    # block_size*584 rounded up to a multiple of 576 (docs/contracts.md §5)
    assert A.page_bytes(bs) == want == -(-bs * 584 // 576) * 576


def oracle_freqs(kind):
    """docs/model.md §5.4, in float64."""
    i = np.arange(32)
    if kind == "plain":
        return 10000.0 ** (-2 * i / 64)
    base, factor, orig, bf, bsl = 160000.0, 16.0, 65536.0, 32.0, 1.0
    f = base ** (-2 * i / 64)
    low = max(np.floor(64 * np.log(orig / (bf * 2 * np.pi)) / (2 * np.log(base))), 0)
    high = min(np.ceil(64 * np.log(orig / (bsl * 2 * np.pi)) / (2 * np.log(base))), 63)
    ramp = np.clip((i - low) / (high - low), 0, 1)
    return f * (1 - ramp) + f / factor * ramp


def test_rope_frequencies_match_spec_values():
    # the values docs/model.md §5.4 lists (7 significant digits there)
    f = A.rope_frequencies("yarn")
    spec = {1: 0.6876560, 15: 0.003635539, 16: 2.265625e-3, 20: 2.969778e-4, 24: 1.953125e-5, 25: 5.372313e-6,
            31: 5.680529e-7}
    for i, v in spec.items():
        assert abs(f[i] / v - 1) < 1e-6, (i, f[i], v)
    assert abs(A.rope_frequencies("plain")[1] / 0.7498942 - 1) < 1e-6
    np.testing.assert_allclose(A.rope_frequencies("yarn"), oracle_freqs("yarn"), rtol=1e-14)


@pytest.mark.parametrize("kind", ["plain", "yarn"])
def test_rope_table(kind, request):
    # float64 angles p*f_i: a float32 result is within half an ulp (<= 6e-8) of cos/sin, so 1e-6
    # (the bound this suite was given) has a wide margin; positions up to 70000 exercise large angles.
    rng = o.rng(request.node.name)
    max_pos = int(rng.integers(65600, 70000))
    th = np.arange(max_pos)[:, None] * oracle_freqs(kind)[None]
    ref = np.concatenate([np.cos(th), np.sin(th)], axis=1)
    for name, got in each_path(lambda b: A.rope_table(max_pos, kind, backend=b)).items():
        assert got.shape == (max_pos, 64) and got.dtype == np.float32
        assert np.max(np.abs(got - ref)) < 1e-6, name


# ---- insert -------------------------------------------------------------------------------
@golden
def test_kv_insert_golden_vllm_bytes():
    # vLLM's Triton quantize_and_insert_k_kernel output: bytes identical (kernels/README.md)
    d = np.load(os.path.join(KD, "kv_insert.npz"))
    for name, cache in each_path(lambda b: _insert_golden(d, b)).items():
        diff = np.count_nonzero(cache != d["cache_expected"])
        assert diff == 0, f"{name}: {diff} bytes differ"


def _insert_golden(d, backend):
    cache = d["cache_init"].copy()
    A.kv_insert(d["kv_bits"], cache, d["slots"], int(d["block_size"]), backend=backend)
    return cache


def random_kv_rows(rng, n):
    """BF16 rows with per-group magnitudes over many binades, zero groups, tiny groups, and
    groups whose amax/448 is an exact power of two."""
    x = rng.standard_normal((n, 512)) * np.exp2(rng.uniform(-14, 3, (n, 8)).repeat(64, axis=1)[:, :512])
    x[0, 64:128] = 0.0
    if n > 2:
        x[1, :448] = rng.standard_normal(448) * 1e-7
        x[2, :64] = rng.uniform(-1, 1, 64)
        x[2, 5] = 1.75 * 2.0 ** 3  # amax/448 = 2^-5 exactly
    return bf16_bits(x)


@pytest.mark.parametrize("bs,n", [(64, 37), (2, 9), (69, 20)])
@pytest.mark.parametrize("rotate", [False, True])
def test_kv_insert_layout(bs, n, rotate, request):
    # byte-exact against the layout oracle: scattered slots across pages, slot -1 and other
    # negatives skipped, untouched bytes (other entries, pad bytes, page padding) unchanged
    rng = o.rng(request.node.name)
    num_pages = n // bs + 4
    kv = random_kv_rows(rng, n)
    slots = rng.permutation(num_pages * bs)[:n].astype(np.int64)
    slots[rng.choice(n, 3, replace=False)] = [-1, -2, -(2**62)]
    positions = rng.integers(0, 5000, n).astype(np.int64)
    rope = A.rope_table(5000, "yarn")
    init = rng.integers(0, 256, (num_pages, A.page_bytes(bs)), dtype=np.uint8)
    want = init.copy()
    rows = kv.copy()
    if rotate:
        rows[:, 448:] = oracle_rope_f32(kv[:, 448:], rope[positions])
    oracle_insert(want, bs, rows, slots)

    def run(b):
        cache = init.copy()
        A.kv_insert(kv, cache, slots, bs, positions if rotate else None, rope if rotate else None, backend=b)
        return cache
    for name, cache in each_path(run).items():
        assert np.count_nonzero(cache != want) == 0, name


def ulp_bf16(x):
    x = np.abs(np.asarray(x, np.float64))
    e = np.floor(np.log2(np.where(x > 0, x, 1.0)))
    return np.exp2(np.maximum(e, -133) - 7)


@pytest.mark.parametrize("n,h,bs,pad", [(1, 8, 64, 0), (17, 64, 16, 5), (4, 22, 2, 1), (64, 1, 64, 0)])
def test_qnorm_rope_kv_insert(n, h, bs, pad, request):
    # q: RMS over all 512 dims, eps 1e-6, GPT-J rope on 448..511, fp32 throughout, one BF16
    # rounding -> within 1 BF16 ulp of float64 (half an ulp of rounding + fp32 error), plus
    # 2^-22 of the rotation's terms for the rare cancellations a*c - b*s.
    # kv: the first N_ins = n - pad tokens inserted, bytes exact (fp32 rotation per contract).
    rng = o.rng(request.node.name)
    q0 = bf16_bits(rng.standard_normal((n, h, 512)) * np.exp2(rng.uniform(-3, 3, (n, h, 1))))
    kv = random_kv_rows(rng, n)
    num_pages = n // bs + 3
    slots = rng.permutation(num_pages * bs)[:n - pad].astype(np.int64)
    if n - pad > 2:
        slots[1] = -1
    positions = rng.integers(0, 4096, n).astype(np.int64)
    rope = A.rope_table(4096, "plain")
    init = rng.integers(0, 256, (num_pages, A.page_bytes(bs)), dtype=np.uint8)

    x = o.bf16_decode(q0)
    r = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)
    y = x * r
    cs = rope[positions].astype(np.float64)[:, None, :]
    a, b = y[..., 448::2], y[..., 449::2]
    ref = y.copy()
    ref[..., 448::2] = a * cs[..., :32] - b * cs[..., 32:]
    ref[..., 449::2] = a * cs[..., 32:] + b * cs[..., :32]
    terms = np.zeros_like(ref)
    terms[..., 448::2] = np.abs(a * cs[..., :32]) + np.abs(b * cs[..., 32:])
    terms[..., 449::2] = np.abs(a * cs[..., 32:]) + np.abs(b * cs[..., :32])
    want = init.copy()
    rows = kv[:n - pad].copy()
    rows[:, 448:] = oracle_rope_f32(kv[:n - pad, 448:], rope[positions[:n - pad]])
    oracle_insert(want, bs, rows, slots)

    def run(bk):
        q, cache = q0.copy(), init.copy()
        A.qnorm_rope_kv_insert(q, kv, cache, slots, positions, rope, bs, eps=1e-6, backend=bk)
        return q, cache
    res = each_path(run)
    for name, (q, cache) in res.items():
        err = np.abs(o.bf16_decode(q) - ref)
        bad = err > ulp_bf16(ref) + 2.0**-22 * terms
        assert not bad.any(), f"{name}: {bad.sum()} q values off by > 1 ulp, worst {err[bad].max()}"
        assert np.count_nonzero(cache != want) == 0, f"{name}: cache bytes differ"
    first = next(iter(res.values()))
    for name, (q, cache) in res.items():  # the fast paths are bit-identical to the reference
        if name.startswith("cpu"):
            assert np.array_equal(q, first[0]), name


def test_insert_duplicate_slot_last_wins(request):
    # a slot written twice in one call ends with the later row (as a sequential loop would); the
    # cache starts as random bytes, so slots never written, pad bytes and page padding must
    # keep theirs
    rng = o.rng(request.node.name)
    kv = random_kv_rows(rng, 200)
    slots = rng.integers(0, 64, 200).astype(np.int64)
    init = rng.integers(0, 256, (1, A.page_bytes(64)), dtype=np.uint8)
    want = init.copy()
    oracle_insert(want, 64, kv, slots)

    def run(b):
        cache = init.copy()
        A.kv_insert(kv, cache, slots, 64, backend=b, threads=2)
        return cache
    for name, cache in each_path(run).items():
        assert np.array_equal(cache, want), name


def test_dequant_gather(request):
    # exact: E4M3 * 2^(b-127) is a BF16 value; negative slots give zeros; random scale bytes
    # over the whole range the fast paths special-case (tiny, huge, NaN byte 255)
    rng = o.rng(request.node.name)
    bs, pages = 64, 3
    cache = random_cache(rng, pages, bs, 1, 254)
    cache[1, bs * 576 + 8 * 5] = 255  # NaN scale: that group dequantizes to NaN
    slots = np.concatenate([rng.integers(0, pages * bs, 50), [-1, -5, 0, pages * bs - 1]]).astype(np.int32)
    full = oracle_dequant(cache, bs)
    ref = np.where(slots[:, None] >= 0, full[np.maximum(slots, 0)], 0.0)
    with np.errstate(over="ignore"):  # 448 * 2^127 is +-inf in BF16 as in float32
        want = bf16_bits(ref)

    def run(b):
        out = o.poison((len(slots), 512), np.uint16)
        return A.dequant_gather(cache, slots, bs, backend=b, out=out)
    for name, got in each_path(run).items():
        assert np.array_equal(got, want), name


# ---- sparse decode ------------------------------------------------------------------------
def oracle_decode(q_bits, scopes, sink, scale):
    """float64 FlashMLA sparse decode with sink (docs/contracts.md §6): scopes = [(K [slots, 512], indices
    [T, W], lengths [T] or None)]."""
    q = o.bf16_decode(q_bits)
    T, H, _ = q.shape
    out = np.zeros((T, H, 512))
    lse = np.full((T, H), np.inf)
    for t in range(T):
        ks = []
        for K, idx, ln in scopes:
            L = idx.shape[1] if ln is None else int(ln[t])
            sel = idx[t, :L].astype(np.int64)
            ks.append(K[sel[(sel >= 0) & (sel < K.shape[0])]])
        K = np.concatenate(ks)
        if len(K) == 0:
            continue
        s = scale * q[t] @ K.T
        m = s.max(1, keepdims=True)
        e = np.exp(s - m)
        l = e.sum(1, keepdims=True)
        lse[t] = (m + np.log(l))[:, 0]
        den = l + (np.exp(sink[:, None].astype(np.float64) - m) if sink is not None else 0.0)
        out[t] = (e @ K) / den
    return out, lse


MASKED = [-1, -1, -2, -64, "nslots", "nslots+", 2**31 - 1]


def make_indices(rng, T, width, nslots, lengths, plant=True, dup=False):
    """[T, width] int32: distinct valid slots inside each prefix, the masked values planted in
    prefixes of >= 12 entries, and garbage (valid-looking and arbitrary int32) beyond them."""
    idx = np.empty((T, width), np.int64)
    for t in range(T):
        L = int(lengths[t])
        row = rng.choice(nslots, size=min(L, nslots), replace=False) if L else np.empty(0, np.int64)
        if len(row) < L:
            row = np.concatenate([row, rng.integers(0, nslots, L - len(row))])
        if dup and L >= 4:
            row[L // 2:L // 2 + 3] = row[0]  # the same entry three more times
        if plant and L >= 12:
            pos = rng.choice(L, len(MASKED), replace=False)
            for p, v in zip(pos, MASKED):
                row[p] = nslots if v == "nslots" else nslots + int(rng.integers(1, 1000)) if v == "nslots+" else v
        rest = width - L
        tail = np.where(rng.random(rest) < 0.75, rng.integers(0, nslots, rest),
                        rng.integers(-2**31, 2**31, rest))
        idx[t] = np.concatenate([row, tail])
    return idx.astype(np.int32)


# Relative L2 bound of each (t, h) output row by itself: the whole-output bound (docs/testing.md §4), applied
# per row. A row's error is its 512 BF16 output roundings (each <= 2^-8 of its value, so <= 3.9e-3
# of the row, ~1.1e-3 typical) plus the BF16 rounding of its probabilities in p.v (about as much)
# and fp32 sums (~1e-6): measured worst row 3.7e-3 over ~50 runs of these tests on every path
# (2.2x margin). A wrong sink moves its rows by ~ (share of the sink) x (error of the sink's
# weight): a sink weight 5% off, or a sink left out, fails every sink-carrying test.
ROW_TOL = 8e-3


def check_decode(name, o_bits, lse, ref_o, ref_lse):
    """o: relative L2 <= 8e-3 over the whole output (docs/testing.md §4; BF16 output rounding
    alone is ~1e-3 and BF16 probabilities in p.v add about as much), and also of every (t, h)
    row by itself <= ROW_TOL, so one wrong row (a wrong sink, a missed entry) cannot hide in the
    average; rows whose reference is zero (sink +inf) must be exactly zero. lse: within
    1e-5 * max(1, |lse|) (fp32 softmax sums are ~1e-7 relative); +inf and exact zeros for
    queries without a valid entry."""
    got = o.bf16_decode(o_bits)
    empty = np.isinf(ref_lse)
    assert np.array_equal(np.isinf(lse) & (lse > 0), empty), f"{name}: +inf lse pattern differs"
    assert np.all(got[empty] == 0), f"{name}: empty queries are not zero"
    rel = o.rel_l2(got, ref_o) if np.any(ref_o) else float(np.abs(got).max())
    assert rel <= 8e-3, f"{name}: relative L2 {rel}"
    norm = np.sqrt((ref_o * ref_o).sum(-1))
    err = np.sqrt(((got - ref_o) ** 2).sum(-1))
    zero = norm == 0
    assert np.all(err[zero] == 0), f"{name}: {np.sum(err[zero] != 0)} rows nonzero where the reference is zero"
    row = np.where(zero, 0.0, err / np.where(zero, 1.0, norm))
    bad = ~(row <= ROW_TOL)
    assert not bad.any(), f"{name}: {bad.sum()} (t, h) rows off, worst relative L2 {row.max():.3g}"
    fin = ~empty
    err = np.abs(lse[fin] - ref_lse[fin]) / np.maximum(1.0, np.abs(ref_lse[fin]))
    assert err.size == 0 or err.max() <= 1e-5, f"{name}: lse error {err.max()}"


def run_decode_paths(q, scopes, sink, scale, threads_check=True):
    """The decode on every path with poisoned outputs; also 1 vs 2 threads bit-identical."""
    (c0, i0, l0, b0) = scopes[0]
    extra = scopes[1] if len(scopes) > 1 else (None, None, None, None)

    def call(b, threads):
        out = o.poison(q.shape, np.uint16)
        lse = o.poison(q.shape[:2], np.float32)
        return A.sparse_mla_decode(q, c0, i0, l0, b0, extra[0], extra[1], extra[2], extra[3], sink=sink, scale=scale,
                                   backend=b, threads=threads, out=out, lse=lse)

    def run(b):
        r1 = call(b, 1)
        if threads_check and b != "cpu-ref":
            r2 = call(b, 2)
            assert np.array_equal(r1[0], r2[0]) and np.array_equal(r1[1].view(np.uint32), r2[1].view(np.uint32)), \
                f"{b}: 1 and 2 threads differ"
        return r1
    return each_path(run)


def decode_case(rng, T, H, W, bs, K=0, bsx=64, sink="randn", lengths="random", plant=True, dup=False,
                scale=A.SCALE, pages=None, xpages=None):
    nslots = (pages or (W // bs + 4)) * bs
    cache = random_cache(rng, nslots // bs, bs)
    if lengths in ("random", "none"):
        ln = rng.integers(1, W + 1, T).astype(np.int32) if lengths == "random" else np.full(T, W, np.int32)
    elif lengths == "full":
        ln = np.full(T, W, np.int32)
    else:
        ln = np.asarray(lengths[0], np.int32)
    scopes = [(cache, make_indices(rng, T, W, nslots, ln, plant, dup), None if lengths == "none" else ln, bs)]
    if K:
        xs = (xpages or (K // bsx + 4)) * bsx
        xc = random_cache(rng, xs // bsx, bsx)
        xl = rng.integers(1, K + 1, T).astype(np.int32) if lengths == "random" else \
            np.full(T, K, np.int32) if lengths in ("full", "none") else np.asarray(lengths[1], np.int32)
        scopes.append((xc, make_indices(rng, T, K, xs, xl, plant, dup), xl, bsx))
    q = bf16_bits(rng.standard_normal((T, H, 512)) * 0.5)
    ref_scopes = [(oracle_dequant(c, b), i, l) for c, i, l, b in scopes]
    s = draw_sink(rng, sink, oracle_decode(q, ref_scopes, None, scale)[1])
    ref = oracle_decode(q, ref_scopes, s, scale)
    return q, scopes, s, ref


def draw_sink(rng, kind, lse):
    """Sinks f32 [H] given the float64 lse [T, H] of the case without a sink ("randn": drawn
    relative to it; None, "-inf", "+inf"; "mixed": heads cycling -inf, +inf, "randn").

    The sink takes the share sigmoid(sink - lse[t, h]) of row (t, h)'s softmax mass. The logits
    here reach 10-20, so a sink of N(0, 1) would carry ~e^-15 of the weight and leaving it out
    would go unnoticed; a head's sink is therefore the median over its queries of lse plus N(0, 1).
    One sink serves all queries of a head and each query has its own keys and lse, so the share
    is 10-90% for ~95% of the rows of single-query cases and ~60% overall; 90% of all rows give
    the sink >= 2% of the mass (measured over the grid and any-heads cases)."""
    H = lse.shape[1]
    fin = np.isfinite(lse)
    mid = np.array([np.median(lse[fin[:, h], h]) if fin[:, h].any() else 0.0 for h in range(H)])
    rel = (mid + rng.standard_normal(H)).astype(np.float32)
    return {"randn": rel, None: None, "-inf": np.full(H, -np.inf, np.float32), "+inf": np.full(H, np.inf, np.float32),
            "mixed": np.where(np.arange(H) % 3 == 0, -np.inf,
                              np.where(np.arange(H) % 3 == 1, np.inf, rel)).astype(np.float32)}[kind]


# docs/kernels.md §10, item 5: FlashMLA's grid (h 64/128, topk up to 2048, block sizes 2/64/69/576/61), with
# and without the extra scope; s_q = 1 per sequence, a few sequences.
GRID = [  # T, H, topk, bs, extra topk, extra bs
    (2, 64, 64, 2, 0, 0), (2, 64, 64, 64, 0, 0), (2, 64, 64, 69, 0, 0), (2, 128, 64, 64, 64, 2),
    (2, 64, 576, 61, 576, 2), (1, 64, 2048, 2, 0, 0), (1, 128, 2048, 576, 2048, 64),
]


@pytest.mark.parametrize("T,H,W,bs,K,bsx", GRID)
def test_sparse_decode_flashmla_grid(T, H, W, bs, K, bsx, request):
    rng = o.rng(request.node.name)
    q, scopes, s, ref = decode_case(rng, T, H, W, bs, K, bsx or 64)
    for name, (out, lse) in run_decode_paths(q, scopes, s, A.SCALE, threads_check=H <= 64).items():
        check_decode(name, out, lse, *ref)


@pytest.mark.parametrize("H", [1, 8, 22])
@pytest.mark.parametrize("extra", [False, True])
def test_sparse_decode_any_heads(H, extra, request):
    rng = o.rng(request.node.name)
    q, scopes, s, ref = decode_case(rng, 3, H, 128, 64, 256 if extra else 0, 2)
    for name, (out, lse) in run_decode_paths(q, scopes, s, A.SCALE).items():
        check_decode(name, out, lse, *ref)


@pytest.mark.parametrize("sink", [None, "-inf", "+inf", "mixed"])
def test_sparse_decode_edges(sink, request):
    # per query: 0 swa length (extra only), both lengths 0 (empty), prefixes whose entries are all
    # masked (empty), duplicates, full widths, a single entry
    rng = o.rng(request.node.name)
    W, K, nsw, nx = 48, 80, 64 * 3, 2 * 40
    lw = np.array([0, 0, 3, W, 17, 1], np.int32)
    lx = np.array([K, 0, 4, K, 0, 0], np.int32)
    q, scopes, s, ref = decode_case(rng, 6, 16, W, 64, K, 2, sink=sink, lengths=(lw, lx), dup=True,
                                    pages=nsw // 64, xpages=nx // 2)
    for i, (c, idx, ln, b) in enumerate(scopes):  # query 2: only masked entries in both prefixes
        idx[2, :ln[2]] = [-1, c.shape[0] * b, -2, 2**31 - 1][:ln[2]]
    ref = oracle_decode(q, [(oracle_dequant(c, b), i, ln) for c, i, ln, b in scopes], s, A.SCALE)
    for name, (out, lse) in run_decode_paths(q, scopes, s, A.SCALE).items():
        check_decode(name, out, lse, *ref)
        assert np.all(out[[1, 2]] == 0) and np.all(np.isposinf(lse[[1, 2]])), name
        if sink == "+inf":
            assert np.all(o.bf16_decode(out) == 0), name


def test_sparse_decode_no_lengths_and_scale(request):
    # lengths None = the whole width; another softmax scale (FlashMLA's tests use d^-0.55)
    rng = o.rng(request.node.name)
    q, scopes, s, ref = decode_case(rng, 4, 8, 96, 64, lengths="none", scale=512**-0.55)
    for name, (out, lse) in run_decode_paths(q, scopes, s, 512**-0.55).items():
        check_decode(name, out, lse, *ref)


def test_sparse_decode_zero_width(request):
    # scopes without any index column: every query is empty (zeros, lse +inf)
    rng = o.rng(request.node.name)
    cache = random_cache(rng, 1, 64)
    q = bf16_bits(rng.standard_normal((3, 4, 512)))

    def run(b):
        out, lse = o.poison(q.shape, np.uint16), o.poison((3, 4), np.float32)
        return A.sparse_mla_decode(q, cache, np.zeros((3, 0), np.int32), np.zeros(3, np.int32), 64, cache,
                                   np.zeros((3, 0), np.int32), None, 64, backend=b, out=out, lse=lse)
    for name, (out, lse) in each_path(run).items():
        assert np.all(out == 0) and np.all(np.isposinf(lse)), name


@golden
def test_sparse_decode_golden_flashmla():
    # FlashMLA's SM90 MODEL1 output on the vLLM cache, with the original planted indices
    # (kernels/README.md: rel L2 <= 8e-3, lse within 1e-5 * max(1, |lse|), empty -> zeros, +inf)
    g = np.load(os.path.join(KD, "sparse_decode_h64.npz"))
    bs = int(g["block_size"])
    ref_o = o.bf16_decode(g["out_bits"])
    scopes = [(g["cache"], g["swa_indices"], g["swa_lengths"], bs), (g["cache"], g["extra_indices"],
                                                                      g["extra_lengths"], bs)]
    res = run_decode_paths(g["q_bits"], scopes, g["attn_sink"], float(g["softmax_scale"]))
    for name, (out, lse) in res.items():
        check_decode(name, out, lse, ref_o, g["lse"].astype(np.float64))
        assert np.all(out[[4, 6]] == 0)


def test_two_pass_bf16_matches(request):
    # the two-pass design (docs/kernels.md §3.4: dequant_gather into a BF16 workspace, then attention
    # over it) gives the same attention: both against the float64 oracle
    rng = o.rng(request.node.name)
    T, H, W, K = 3, 16, 64, 96
    q, scopes, s, ref = decode_case(rng, T, H, W, 64, K, 2)
    (c0, i0, l0, b0), (c1, i1, l1, b1) = scopes
    def gather(c, i, b):  # an out-of-range slot is an error for the gather: send -1 (zeros)
        i = i.reshape(-1)
        return A.dequant_gather(c, np.where(i < c.shape[0] * b, i, -1), b)
    rows = np.concatenate([gather(c0, i0, b0), gather(c1, i1, b1)])
    idx = np.full((T, W + K), -1, np.int32)
    lens = np.zeros(T, np.int32)
    for t in range(T):  # valid entries first, as the original two-pass kernels pack them
        a = [t * W + j for j in range(l0[t]) if 0 <= i0[t, j] < c0.shape[0] * b0]
        b = [T * W + t * K + j for j in range(l1[t]) if 0 <= i1[t, j] < c1.shape[0] * b1]
        idx[t, :len(a) + len(b)] = a + b
        lens[t] = len(a) + len(b)

    def run(bk):
        out, lse = o.poison(q.shape, np.uint16), o.poison((T, H), np.float32)
        return A.sparse_attn_bf16(q, rows, idx, lens, sink=s, backend=bk, out=out, lse=lse)
    for name, (out, lse) in each_path(run).items():
        check_decode(name, out, lse, *ref)


def test_inv_rope(request):
    # inverse rotation of dims 448..511 (fp32, one rounding): within 1 BF16 ulp of float64 plus
    # 2^-22 of the terms (cancellation), other dims untouched; rope then inverse ~ identity
    rng = o.rng(request.node.name)
    T, H = 5, 12
    x = bf16_bits(rng.standard_normal((T, H, 512)))
    pos = rng.integers(0, 70000, T).astype(np.int64)
    rope = A.rope_table(70000, "yarn")
    cs = rope[pos].astype(np.float64)[:, None, :]
    v = o.bf16_decode(x)
    a, b = v[..., 448::2], v[..., 449::2]
    ref = v.copy()
    ref[..., 448::2] = a * cs[..., :32] + b * cs[..., 32:]
    ref[..., 449::2] = b * cs[..., :32] - a * cs[..., 32:]
    terms = np.zeros_like(ref)
    terms[..., 448::2] = np.abs(a * cs[..., :32]) + np.abs(b * cs[..., 32:])
    terms[..., 449::2] = terms[..., 448::2]

    def run(bk):
        y = x.copy()
        A.inv_rope(y, pos, rope, backend=bk)
        return y
    for name, y in each_path(run).items():
        assert np.array_equal(y[..., :448], x[..., :448]), name
        err = np.abs(o.bf16_decode(y) - ref)
        assert np.all(err <= ulp_bf16(ref) + 2.0**-22 * terms), f"{name}: worst {err.max()}"


# ---- bad input: ValueError, outputs untouched -----------------------------------------------
RANGE_CASES = {"slot beyond the cache", "position beyond the table", "negative position", "length > width",
               "negative length"}


def test_bad_inputs_leave_outputs_untouched(request):
    rng = o.rng(request.node.name)
    bs = 64
    cache0 = random_cache(rng, 2, bs)
    rope = A.rope_table(100)
    kv = random_kv_rows(rng, 4)
    q0 = bf16_bits(rng.standard_normal((4, 2, 512)))
    pos = np.arange(4, dtype=np.int64)
    for name, _ in PATHS:
        # index ranges are checked only for host data (device backends skip such entries instead)
        host = A._device_kind(ctx(name)) == A.DEVICE_CPU
        cases = [
            ("slot beyond the cache", lambda c, q: A.kv_insert(kv, c, np.array([0, 1, 2, 128]), bs, backend=name)),
            ("position beyond the table", lambda c, q: A.qnorm_rope_kv_insert(q, kv, c, np.arange(4), pos + 97, rope,
                                                                               bs, backend=name)),
            ("N_ins > N", lambda c, q: A.qnorm_rope_kv_insert(q, kv[:2], c, np.arange(4), pos, rope, bs,
                                                              backend=name)),
            ("kv float32", lambda c, q: A.kv_insert(kv.astype(np.float32), c, np.arange(4), bs, backend=name)),
            ("kv dims 511", lambda c, q: A.kv_insert(kv[:, :511], c, np.arange(4), bs, backend=name)),
            ("page too small", lambda c, q: A.kv_insert(kv, c[:, :bs * 584 - 1], np.arange(4), bs, backend=name)),
            ("q and cache overlap", lambda c, q: A.qnorm_rope_kv_insert(c[:1, :4 * 2 * 1024].view(np.uint16).reshape(
                4, 2, 512), kv, c, np.arange(4), pos, rope, bs, backend=name)),
            ("rope and positions apart", lambda c, q: A.kv_insert(kv, c, np.arange(4), bs, positions=pos,
                                                                  backend=name)),
            ("negative position", lambda c, q: A.inv_rope(q, pos - 1, rope, backend=name)),
            ("rope table 63 wide", lambda c, q: A.inv_rope(q, pos, rope[:, :63], backend=name)),
        ]
        for what, fn in cases:
            # a device backend gets each array staged into its own buffer, so aliasing is invisible there
            if not host and (what in RANGE_CASES or what == "q and cache overlap"):
                continue
            c, q = cache0.copy(), q0.copy()
            with pytest.raises(ValueError):
                fn(c, q)
            assert np.array_equal(c, cache0) and np.array_equal(q, q0), f"{name}: {what} changed an output"

        qd = bf16_bits(rng.standard_normal((2, 4, 512)))
        idx = np.zeros((2, 8), np.int32)
        lens = np.array([8, 3], np.int32)
        out0 = o.poison((2, 4, 512), np.uint16)
        lse0 = o.poison((2, 4), np.float32)
        bad = [
            ("length > width", dict(lengths=np.array([9, 1], np.int32))),
            ("negative length", dict(lengths=np.array([-1, 1], np.int32))),
            ("lengths of 3 queries", dict(lengths=np.array([1, 1, 1], np.int32))),
            ("sink of 3 heads", dict(sink=np.zeros(3, np.float32))),
            ("indices int64 beyond int32", dict(indices=np.full((2, 8), 2**40))),
            ("extra scope without its cache", dict(extra_indices=idx)),
            ("q 511 wide", dict(q=qd[..., :511])),
            ("lse of 3 heads", dict(lse=o.poison((2, 3), np.float32))),
        ]
        for what, kw in bad:
            if not host and what in RANGE_CASES:
                continue
            args = dict(q=qd, cache=cache0, indices=idx, lengths=lens, block_size=bs, backend=name)
            args.update(kw)
            out, lse = out0.copy(), args.pop("lse", lse0.copy())
            lse_before = lse.copy()
            with pytest.raises(ValueError):
                A.sparse_mla_decode(out=out, lse=lse, **args)
            assert np.array_equal(out.view(np.uint8), out0.view(np.uint8)), f"{name}: {what} changed out"
            assert np.array_equal(lse.view(np.uint8), lse_before.view(np.uint8)), f"{name}: {what} changed lse"
        if host:
            with pytest.raises(ValueError):  # out aliases q
                A.sparse_mla_decode(qd, cache0, idx, lens, bs, backend=name, out=qd)
        with pytest.raises(ValueError):
            A.rope_table(10, "neox")
        if host:
            with pytest.raises(ValueError):
                A.dequant_gather(cache0, np.array([128], np.int32), bs, backend=name)
