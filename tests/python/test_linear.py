"""Quantized linear layers against float64 oracles written from the docs
(docs/model.md §2.1-§2.2, docs/kernels.md §5.3, include/dsv4/linear.h), not from the C code.

The oracle of every quantized format is exact: activations go through the act128 / mx32 rule
(oracles.quantize), weights are dequantized (code x 2^(byte-127)), and y = xq . wq^T in float64
is the reference formula sum_blocks (sum xq_code*wq_code) * sx * sw with exact arithmetic. The
kernels differ from it only by fp32 summation order, so each output must be within
TOL * sum_k |xq_k wq_k| of it (TOL below), and a BF16 output within one half-ulp of BF16 (2^-8
relative) more.

TOL = 96 * 2^-24 (~5.7e-6). The classical worst case of a chain of n fp32 additions, (n-1) 2^-24
sum|terms|, is no use here (n is up to K = 4256 on the scalar path: 2.5e-4) and is never
approached: each rounding is at most 2^-24 of the partial sum, the partial sums of these random-
sign terms grow like sqrt(j) * rms(term), so the accumulated error is a random walk of size about
2^-24 * K * rms(term) ~ 2^-24 * sum|terms| -- a few ulps of sum|terms|, whatever K. Measured:
at most 14 ulps (8.3e-7) over 40 seeds x every path x format x K in {96, 352, 1248, 4256} x
m in {1, 7, 64} and 12 full runs of this file (f32 outputs); 96 ulps leaves a margin of ~7x."""
import os

import numpy as np
import pytest

import dsv4
import oracles as O
from dsv4.linear_ops import linear_stage, linear_staged, workspace_size

FMTS = ["fp8_b128", "mxfp8", "fp4", "bf16", "f32"]
QUANT = ["fp8_b128", "mxfp8", "fp4"]
TOL = 96 * 2.0**-24  # relative to sum |terms|: only the fp32 summation order differs (docstring)
# Every test taking `backend` (conftest.py) runs on cpu-ref and on each ISA path of cpu.


def path_of(backend):
    """The path the `backend` fixture set up (for seeds and messages)."""
    return f"{backend}/{os.environ.get('DSV4_CPU_ISA', 'ref')}"


# ---- float64 oracle ------------------------------------------------------------------------
def dequant_act(x32, fmt):
    """x float32 [M, K] -> float64 dequantized activations per the format's rule (the last
    act128 group of a K with an edge block is its own group: zero padding does not change amax)."""
    if fmt in ("bf16", "f32"):
        return x32.astype(np.float64)
    rule = "mx32" if fmt == "mxfp8" else "act128"
    g = O.RULES[rule][0]
    m, k = x32.shape
    kp = -(-k // g) * g
    xp = np.zeros((m, kp), np.float32)
    xp[:, :k] = x32
    codes, scales = O.quantize(xp, rule)
    return O.dequantize(codes, scales, rule)[:, :k]


def dequant_weight(w, scale, fmt, k):
    if fmt == "bf16":
        return O.bf16_decode(w)
    if fmt == "f32":
        return w.astype(np.float64)
    n = w.shape[0]
    if fmt == "fp4":
        nib = np.empty((n, k), np.uint8)
        nib[:, 0::2] = w & 0xF
        nib[:, 1::2] = w >> 4
        return O.e2m1_decode(nib) * np.repeat(O.e8m0_decode(scale), 32, axis=1)
    s = O.e8m0_decode(scale)
    if fmt == "fp8_b128":
        s = np.repeat(np.repeat(s, 128, axis=0), 128, axis=1)[:n, :k]
    else:
        s = np.repeat(s, 32, axis=1)
    return O.e4m3_decode(w) * s


def oracle(x, w, scale, fmt, bias=None):
    """float64 y and the per-output sum of |terms| (for the summation-order bound)."""
    x32 = O.bf16_decode(x).astype(np.float32) if x.dtype == np.uint16 else x
    k = x32.shape[-1]
    xq = dequant_act(x32, fmt)
    wq = dequant_weight(w, scale, fmt, k)
    y = xq @ wq.T
    mag = np.abs(xq) @ np.abs(wq).T
    if bias is not None:
        b = O.bf16_decode(bias) if bias.dtype == np.uint16 else bias.astype(np.float64)
        y = y + b
        mag = mag + np.abs(b)
    return y, mag


def as_f64(y):
    return O.bf16_decode(y) if y.dtype == np.uint16 else y.astype(np.float64)


def check_close(y, ref, mag, what):
    got = as_f64(y)
    bound = TOL * mag + 1e-30
    if y.dtype == np.uint16:
        bound = bound + 2.0**-8 * np.abs(ref)  # BF16 output: one rounding of the fp32 result
    bad = ~(np.abs(got - ref) <= bound)
    assert not bad.any(), f"{what}: {bad.sum()} outputs off, worst {np.max(np.abs(got - ref) / bound):.3g}x bound"


# ---- random inputs in checkpoint layouts ------------------------------------------------
def padded(shape, dtype, pad, rng):
    """An array of `shape` that is a view with row padding (row stride > width) when pad."""
    if not pad:
        return np.empty(shape, dtype)
    return np.empty(shape[:-1] + (shape[-1] + int(rng.integers(1, 40)),), dtype)[..., : shape[-1]]


def rand_weight(fmt, n, k, rng, pad=False, transposed_scale=False):
    """(weight, scale) with random codes (finite: no NaN codes) and scale bytes around 2^-8."""
    if fmt in ("bf16", "f32"):
        w32 = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
        w = padded((n, k), np.uint16 if fmt == "bf16" else np.float32, pad, rng)
        w[...] = O.bf16_encode(w32) if fmt == "bf16" else w32
        return w, None
    if fmt == "fp4":
        w = padded((n, k // 2), np.uint8, pad, rng)
        w[...] = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
        sshape = (n, k // 32)
    else:
        codes = rng.integers(0, 256, (n, k), dtype=np.uint8)
        codes[(codes & 0x7F) == 0x7F] ^= 1  # no NaN codes here (tested separately)
        w = padded((n, k), np.uint8, pad, rng)
        w[...] = codes
        sshape = ((n + 127) // 128, (k + 127) // 128) if fmt == "fp8_b128" else (n, k // 32)
    sb = rng.integers(112, 128, sshape, dtype=np.uint8)
    if transposed_scale:  # the transposed view of a contiguous [K/32, N] buffer (strides (1, N))
        return w, np.ascontiguousarray(sb.T).T
    return w, sb


def rand_x(m, k, bf16, rng, pad=False, lead=()):
    x32 = (rng.standard_normal(lead + (m, k)) * rng.choice([0.01, 1.0, 30.0])).astype(np.float32)
    x32[..., : k // 3] *= 20.0  # uneven block maxima
    x = padded(lead + (m, k), np.uint16 if bf16 else np.float32, pad, rng)
    x[...] = O.bf16_encode(x32) if bf16 else x32
    return x


def k_for(fmt, rng):
    """K with edge blocks: not a multiple of 128 (B128 edge block; a 32-tail in the 64-wide
    FP8 steps), sometimes > 1024 (the kernels' scale chunk)."""
    return int(rng.choice([96, 352, 1248, 4096 + 160]))


# ---- tests ---------------------------------------------------------------------------------
@pytest.mark.parametrize("m", [1, 2, 7, 64, 257])
@pytest.mark.parametrize("fmt", FMTS)
def test_linear_matches_oracle(fmt, m, backend):
    rng = O.rng(f"linear {fmt} m={m} {path_of(backend)}")
    n = int(rng.choice([77, 129, 255]))  # odd N: partial tiles, B128 edge row block
    k = k_for(fmt, rng) if m < 64 else int(rng.choice([96, 352]))
    w, s = rand_weight(fmt, n, k, rng, pad=bool(rng.integers(2)), transposed_scale=bool(rng.integers(2)))
    x = rand_x(m, k, bool(rng.integers(2)), rng, pad=True)
    bias = None
    if rng.integers(2):
        bias = (rng.standard_normal(n)).astype(np.float32)
        if rng.integers(2):
            bias = O.bf16_encode(bias)
    ref, mag = oracle(x, w, s, fmt, bias)
    for out in ("bf16", "f32"):
        y = O.poison((m, n), np.uint16 if out == "bf16" else np.float32)
        dsv4.linear(x, w, s, fmt, bias=bias, y=y, backend=backend)
        check_close(y, ref, mag, f"{path_of(backend)} {fmt} m={m} n={n} k={k} out={out}")


@pytest.mark.parametrize("fmt", FMTS)
def test_threads_bit_identical(fmt, backend):
    rng = O.rng(f"threads {fmt} {path_of(backend)}")
    n, k = 301, 1024 + 96
    w, s = rand_weight(fmt, n, k, rng)
    for m in (1, 5):
        x = rand_x(m, k, True, rng)
        y1 = dsv4.linear(x, w, s, fmt, out="f32", backend=backend, threads=1)
        y2 = dsv4.linear(x, w, s, fmt, out="f32", backend=backend, threads=2)
        assert np.array_equal(y1.view(np.uint32), y2.view(np.uint32)), f"{fmt} m={m}: 1 vs 2 threads differ"
        # a row's result does not depend on the other rows of the call either
        y_row = dsv4.linear(x[m - 1:], w, s, fmt, out="f32", backend=backend, threads=2)
        assert np.array_equal(y_row.view(np.uint32), y1[m - 1:].view(np.uint32))


@pytest.mark.parametrize("fmt", ["fp8_b128", "mxfp8", "fp4"])
def test_transposed_scale_view_identical(fmt, backend):
    rng = O.rng(f"transposed {fmt}")
    n, k = 200, 640
    w, s = rand_weight(fmt, n, k, rng)
    st = np.ascontiguousarray(s.T).T  # same values, strides (1, rows)
    assert st.strides != s.strides
    x = rand_x(3, k, False, rng)
    a = dsv4.linear(x, w, s, fmt, out="f32", backend=backend)
    b = dsv4.linear(x, w, st, fmt, out="f32", backend=backend)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("fmt", FMTS)
def test_grouped_equals_separate(fmt, backend):
    rng = O.rng(f"grouped {fmt} {path_of(backend)}")
    t, g, r = int(rng.choice([1, 3])), 4, int(rng.choice([64, 160]))
    k = int(rng.choice([256, 352]))
    w, s = rand_weight(fmt, g * r, k, rng, transposed_scale=bool(rng.integers(2)))
    x = rand_x(g, k, bool(rng.integers(2)), rng, lead=(t,))  # [T, G, K]
    y = O.poison((t, g, r), np.float32)
    dsv4.grouped_linear(x, w, s, fmt, groups=g, y=y, backend=backend)
    for gi in range(g):
        rows = slice(gi * r, (gi + 1) * r)
        if fmt == "fp8_b128":  # the scale rows of group gi: only when R is a multiple of 128
            if r % 128:
                continue
            sg = s[gi * r // 128:(gi + 1) * r // 128]
        else:
            sg = None if s is None else s[rows]
        sep = dsv4.linear(x[:, gi], w[rows], sg, fmt, out="f32", backend=backend)
        assert np.array_equal(sep.view(np.uint32), y[:, gi].view(np.uint32)), f"group {gi}"
    # and against the oracle (covers R not a multiple of 128 for fp8_b128)
    for gi in range(g):
        full, fmag = oracle(x[:, gi], w, s, fmt)
        cols = slice(gi * r, (gi + 1) * r)
        check_close(y[:, gi], full[:, cols], fmag[:, cols], f"grouped {fmt} group {gi}")


def identity_weight(fmt, k):
    """W = I (k x k) in the format: every output is one activation times 1.0, exactly."""
    if fmt == "fp4":
        nib = np.zeros((k, k), np.uint8)
        nib[np.arange(k), np.arange(k)] = 2  # E2M1 1.0
        return (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8), np.full((k, k // 32), 127, np.uint8)
    w = np.zeros((k, k), np.uint8)
    w[np.arange(k), np.arange(k)] = 0x38  # E4M3 1.0
    sshape = ((k + 127) // 128,) * 2 if fmt == "fp8_b128" else (k, k // 32)
    return w, np.full(sshape, 127, np.uint8)


@pytest.mark.parametrize("fmt", QUANT)
def test_activation_rounding_exact(fmt, backend):
    """The staged activations are exactly the act128 / mx32 quantize-dequantize of the oracle:
    E4M3 ties (normal and subnormal) and random values, read back through an identity weight."""
    rng = O.rng(f"rounding {fmt}")
    k = 256
    grid = O.e4m3_decode(np.arange(0x7F, dtype=np.uint8))  # 0 .. 448
    mids = (grid[:-1] + grid[1:]) / 2  # every tie between neighbours, subnormal ones included
    x = np.empty((6, k), np.float32)
    x[0] = np.resize(np.concatenate([mids, -mids]), k)
    x[1] = np.resize(grid, k) * np.where(rng.integers(2, size=k), 1, -1)
    x[2:] = rng.standard_normal((4, k)) * np.array([[1e-3], [1.0], [1e3], [1e-7]])
    x[:2, ::32] = 448.0  # pins every group's scale to 1, so the ties stay ties
    w, s = identity_weight(fmt, k)
    y = dsv4.linear(x, w, s, fmt, out="f32", backend=backend)
    ref = dequant_act(x, fmt)
    assert np.array_equal(y, ref.astype(np.float32)), f"{np.sum(y != ref)} staged values differ"


def test_nonfinite_activations(backend):
    """Documented: a NaN or +-Inf in a row of x makes that row of y NaN for the quantized
    formats (NaN code, or a NaN scale for an Inf group); BF16/F32 weights follow IEEE."""
    rng = O.rng("nonfinite")
    n, k = 40, 256
    for fmt in QUANT:
        w, s = rand_weight(fmt, n, k, rng)
        x = rand_x(4, k, False, rng)
        x[1, 5] = np.nan
        x[2, 200] = np.inf
        x[3, 17] = -np.inf
        y = dsv4.linear(x, w, s, fmt, out="f32", backend=backend)
        assert np.isnan(y[1:]).all(), fmt
        assert np.isfinite(y[0]).all(), fmt
        ref, mag = oracle(x[:1], w, s, fmt)
        check_close(y[:1], ref, mag, fmt)
    w, _ = rand_weight("f32", n, k, rng)
    x = rand_x(2, k, False, rng)
    x[1, 3] = np.inf
    y = dsv4.linear(x, w, None, "f32", out="f32", backend=backend)
    expect = np.where(w[:, 3] > 0, np.inf, np.where(w[:, 3] < 0, -np.inf, np.nan))
    np.testing.assert_array_equal(y[1], expect)


def test_nan_weight_code_and_scale(backend):
    rng = O.rng("nan weight")
    n, k = 300, 256
    for fmt in ("fp8_b128", "mxfp8"):
        w, s = rand_weight(fmt, n, k, rng)
        w[3, 10] = 0x7F  # NaN code
        w[7, 100] = 0xFF
        s[-1, 0] = 255  # NaN scale: rows of the last scale row (b128: the last row block)
        y = dsv4.linear(rand_x(2, k, True, rng), w, s, fmt, out="f32", backend=backend)
        nan_rows = {3, 7} | (set(range(256, n)) if fmt == "fp8_b128" else {n - 1})
        for r in range(n):
            assert np.isnan(y[:, r]).all() == (r in nan_rows), (fmt, r)
    w, s = rand_weight("fp4", n, k, rng)
    s[5, 2] = 255
    y = dsv4.linear(rand_x(1, k, True, rng), w, s, "fp4", out="f32", backend=backend)
    assert np.isnan(y[0, 5]) and np.isfinite(np.delete(y[0], 5)).all()


def test_extreme_activation_scales(backend):
    """Tiny and huge activations: the scale floors (act128 1e-4, mx32 1e-10) and large scales."""
    rng = O.rng("extreme")
    n, k = 33, 384
    for fmt in QUANT:
        w, s = rand_weight(fmt, n, k, rng)
        x = rand_x(3, k, False, rng)
        x[0] *= 1e-9  # below both floors
        x[1, :128] = 0.0  # an all-zero group
        x[2] *= 1e20
        ref, mag = oracle(x, w, s, fmt)
        y = dsv4.linear(x, w, s, fmt, out="f32", backend=backend)
        check_close(y, ref, mag, fmt)


def test_huge_weight_scales(backend):
    """Weight scale bytes above 246 (2^120 and more, where 256 x scale overflows fp32) in some
    blocks, on small activations so that y stays finite: the same products as with moderate scales."""
    rng = O.rng("huge weight scales")
    n, k = 21, 384
    for fmt in ("fp8_b128", "mxfp8"):
        w, s = rand_weight(fmt, n, k, rng)
        s[0, 1] = 250
        s[-1, 0] = 247
        x = (rng.standard_normal((3, k)) * 1e-6).astype(np.float32)
        ref, mag = oracle(x, w, s, fmt)
        assert np.isfinite(ref).all() and (np.abs(ref) > 1e30).any()  # the case bites: outputs near 2^100+
        y = dsv4.linear(x, w, s, fmt, out="f32", backend=backend)
        check_close(y, ref, mag, fmt)


def test_m_zero_and_workspace_query():
    w, s = rand_weight("mxfp8", 8, 64, np.random.default_rng(0))
    y = dsv4.linear(np.zeros((0, 64), np.float32), w, s, "mxfp8")
    assert y.shape == (0, 8)
    assert workspace_size("bf16", 10, 64) == 0
    assert workspace_size("mxfp8", 10, 4096) >= 10 * 4096 * 2


# ---- staging once for several weights (docs/kernels.md §5.2) -----------------------------
OTHER_ACT128 = {"fp8_b128": "fp4", "fp4": "fp8_b128"}  # the formats that share an act128 staging


def bits(y):
    return y.view(np.uint32 if y.dtype == np.float32 else np.uint16)


@pytest.mark.parametrize("fmt", FMTS)
def test_staged_equals_unstaged(fmt, backend):
    """linear_stage + linear_staged == linear bit for bit, 1 and 2 threads: one staging feeds two
    weights (an expert's w1 and w3), and an act128 staging the other act128 format too (between
    the two, so the staging is rearranged there and back where the layouts differ). The quantized
    formats read x for its shape only."""
    rng = O.rng(f"staged {fmt} {path_of(backend)}")
    k = int(rng.choice([352, 1248]))
    w1, s1 = rand_weight(fmt, 77, k, rng, pad=True, transposed_scale=True)
    w3, s3 = rand_weight(fmt, 130, k, rng)
    other = OTHER_ACT128.get(fmt)
    if other:
        wo, so = rand_weight(other, 40, k, rng)
    bias = O.bf16_encode(rng.standard_normal(77).astype(np.float32))
    for threads in (1, 2):
        for m in (1, 6, 200):  # 200 rows: staged (and rearranged) by 2 threads
            x = rand_x(m, k, bool(rng.integers(2)), rng, pad=True)
            run = dict(backend=backend, threads=threads)
            want1 = dsv4.linear(x, w1, s1, fmt, bias=bias, **run)
            want3 = dsv4.linear(x, w3, s3, fmt, out="f32", **run)
            ws = linear_stage(x, fmt, **run)
            shape_only = np.zeros(x.shape, np.float32) if fmt in QUANT else x
            got1 = linear_staged(shape_only, w1, s1, fmt, ws, bias=bias, **run)
            if other:
                got_o = linear_staged(shape_only, wo, so, other, ws, out="f32", **run)
                want_o = dsv4.linear(x, wo, so, other, out="f32", **run)
                assert np.array_equal(bits(got_o), bits(want_o)), f"{other} from a {fmt} staging, m={m} t={threads}"
            got3 = linear_staged(shape_only, w3, s3, fmt, ws, out="f32", **run)
            assert np.array_equal(bits(got1), bits(want1)), f"w1 m={m} t={threads}"
            assert np.array_equal(bits(got3), bits(want3)), f"w3 m={m} t={threads}"


def test_staged_bad_inputs():
    """A staging that does not fit the call: ValueError, y (and a failed stage's work space)
    untouched; the staging still serves the calls it fits."""
    rng = O.rng("staged bad inputs")
    n, k = 24, 256
    x = rand_x(3, k, False, rng)
    w, s = rand_weight("fp4", n, k, rng)
    wb, sb = rand_weight("fp8_b128", n, k, rng)
    wm, sm = rand_weight("mxfp8", n, k, rng)
    y = O.poison((3, n), np.float32)
    # stage: work space too small, unknown format, x not 2-D / K not a multiple of 32
    small = np.full(workspace_size("fp4", 3, k) - 1, 0x5A, np.uint8)
    with pytest.raises(ValueError, match="work space"):
        linear_stage(x, "fp4", workspace=small)
    assert (small == 0x5A).all(), "a failed stage wrote the work space"
    with pytest.raises(ValueError):
        linear_stage(x, "nvfp4")
    with pytest.raises(ValueError):
        linear_stage(x[None], "fp4")
    with pytest.raises(ValueError, match="multiple of 32"):
        linear_stage(x[:, :48], "fp4")
    # staged: no staging, another family, other rows, another K, a work space too small
    fresh = np.zeros(workspace_size("fp4", 3, k), np.uint8)
    assert "no staging" in bad_case(linear_staged, x, w, s, "fp4", fresh, y=y)
    ws = linear_stage(x, "fp4")
    assert "mxfp8" in bad_case(linear_staged, x, wm, sm, "mxfp8", ws, y=y)
    assert "rows" in bad_case(linear_staged, x[:2], w, s, "fp4", ws, y=y[:2])
    w2, s2 = rand_weight("fp4", n, k + 128, rng)
    bad_case(linear_staged, rand_x(3, k + 128, False, rng), w2, s2, "fp4", ws, y=y)
    assert "work space" in bad_case(linear_staged, x, w, s, "fp4", ws[:64], y=y)
    bad_case(linear_staged, x, w, s, "nvfp4", ws, y=y)
    # staged by the scalar reference, consumed by the AVX2 kernels
    if dsv4.cpu_isa() != "scalar":
        ws_ref = linear_stage(x, "fp4", backend="cpu-ref")
        os.environ["DSV4_CPU_ISA"] = "avx2"
        try:
            assert "kernels" in bad_case(linear_staged, x, w, s, "fp4", ws_ref, y=y, backend="cpu")
        finally:
            del os.environ["DSV4_CPU_ISA"]
    # an mx32 staging does not feed act128 weights; after all that, the staging still works
    wsm = linear_stage(x, "mxfp8")
    bad_case(linear_staged, x, wb, sb, "fp8_b128", wsm, y=y)
    ref = dsv4.linear(x, wm, sm, "mxfp8", out="f32")
    assert np.array_equal(bits(linear_staged(x, wm, sm, "mxfp8", wsm, out="f32")), bits(ref))
    ref = dsv4.linear(x, wb, sb, "fp8_b128", out="f32")
    assert np.array_equal(bits(linear_staged(x, wb, sb, "fp8_b128", ws, out="f32")), bits(ref))
    # bf16/f32: nothing to stage (the work space is not touched), the product reads x
    wf, _ = rand_weight("bf16", n, k, rng)
    poison = np.full(64, 0xA5, np.uint8)
    linear_stage(x, "bf16", workspace=poison)
    assert (poison == 0xA5).all()
    ref = dsv4.linear(x, wf, None, "bf16", out="f32")
    assert np.array_equal(bits(linear_staged(x, wf, None, "bf16", poison, out="f32")), bits(ref))


# ---- bad input: ValueError with the library's message, outputs untouched -------------------
def bad_case(fn, *args, **kw):
    y = kw["y"]
    before = y.copy()
    with pytest.raises(ValueError) as e:
        fn(*args, **kw)
    assert np.array_equal(y.view(np.uint8), before.view(np.uint8)), "output written on error"
    return str(e.value)


def test_bad_inputs():
    rng = O.rng("bad inputs")
    n, k = 16, 256
    x = rand_x(2, k, False, rng)
    w, s = rand_weight("mxfp8", n, k, rng)
    y = O.poison((2, n), np.float32)
    # K not a multiple of 32
    msg = bad_case(dsv4.linear, x[:, :48], w[:, :48], s[:, :1], "mxfp8", y=y)
    assert "multiple of 32" in msg
    # scale shape mismatch (and a B128 scale for an MX weight)
    assert "scale" in bad_case(dsv4.linear, x, w, s[:, :4], "mxfp8", y=y)
    assert "scale" in bad_case(dsv4.linear, x, w, np.zeros((1, 2), np.uint8), "mxfp8", y=y)
    # wrong dtypes: BF16 weight as FP8, float64 x, int output
    assert "weight" in bad_case(dsv4.linear, x, w.view(np.int8), s, "mxfp8", y=y)
    bad_case(dsv4.linear, x.astype(np.float64), w, s, "mxfp8", y=y)
    bad_case(dsv4.linear, x, w, s, "mxfp8", y=np.zeros((2, n), np.int32))
    # x / weight K mismatch, y shape mismatch, unknown format, scale for a BF16 weight
    bad_case(dsv4.linear, x[:, :128], w, s, "mxfp8", y=y)
    bad_case(dsv4.linear, x, w, s, "mxfp8", y=O.poison((2, n + 1), np.float32)[:, :n + 1])
    bad_case(dsv4.linear, x, w, s, "nvfp4", y=y)
    wb, _ = rand_weight("bf16", n, k, rng)
    assert "no scale" in bad_case(dsv4.linear, x, wb, s, "bf16", y=y)
    # strided last dim of x / y
    bad_case(dsv4.linear, np.repeat(x, 2, axis=1)[:, ::2], w, s, "mxfp8", y=y)
    yy = O.poison((2, 2 * n), np.float32)
    before = yy.copy()
    with pytest.raises(ValueError):
        dsv4.linear(x, w, s, "mxfp8", y=yy[:, ::2])
    assert np.array_equal(yy.view(np.uint32), before.view(np.uint32))
    # work space too small, and y overlapping x
    msg = bad_case(dsv4.linear, x, w, s, "mxfp8", y=y, workspace=np.zeros(64, np.uint8))
    assert "work space" in msg
    buf = O.poison((2, k + n), np.float32)
    buf[:, :k] = x
    before = buf.copy()
    with pytest.raises(ValueError):
        dsv4.linear(buf[:, :k], w, s, "mxfp8", y=buf[:, k - 1:k - 1 + n])
    assert np.array_equal(buf.view(np.uint32), before.view(np.uint32))
    # grouped: rows not a multiple of the groups, groups mismatch
    yg = O.poison((1, 3, 5), np.float32)
    bad_case(dsv4.grouped_linear, x[None, :, :].repeat(3, 1)[:, :3], w, s, "mxfp8", y=yg)
    bad_case(dsv4.grouped_linear, x[None], w, s, "mxfp8", groups=4, y=O.poison((1, 2, 8), np.float32))
