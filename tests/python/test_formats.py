"""Number formats against ml_dtypes and float64 oracles (tests/python/oracles.py).

Every check is exact (bit for bit): the formats are defined to the bit, so there is no tolerance.
Each test runs on the scalar reference (cpu-ref) and on every vector path of the cpu backend
(DSV4_CPU_ISA caps the ISA, so AVX2 and scalar run on an AVX-512 machine too)."""
import os

import numpy as np
import pytest

import dsv4
import oracles as o


def f32_from_bits(u):
    return np.asarray(u, np.uint32).view(np.float32)


def random_floats(rng, n):
    """Floats over the whole range: random bit patterns (subnormals, huge, NaN, Inf) and
    E4M3-scale values, plus the special values."""
    bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    x = f32_from_bits(bits).copy()
    k = n // 2
    x[:k] = (rng.standard_normal(k) * np.exp2(rng.uniform(-14, 11, k))).astype(np.float32)
    x[:8] = [np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0, 448.0, 464.0]
    return x


# ---- E4M3 ------------------------------------------------------------------------------
def test_e4m3_decode_all_codes(backend):
    codes = np.arange(256, dtype=np.uint8)
    got = dsv4.e4m3_decode(codes, backend=backend)
    want = codes.view(o.E4M3).astype(np.float32)
    assert np.array_equal(got.view(np.uint32)[~np.isnan(want)], want.view(np.uint32)[~np.isnan(want)])
    assert np.isnan(got[[0x7F, 0xFF]]).all() and np.isnan(got).sum() == 2


def test_e4m3_encode_codes_midpoints_and_neighbours(backend):
    vals = np.arange(256, dtype=np.uint8).view(o.E4M3).astype(np.float64)
    finite = np.sort(np.unique(vals[np.isfinite(vals)]))  # -448 .. 448
    mids = (finite[:-1] + finite[1:]) / 2  # exact in float32 (4-bit significands)
    pts = np.concatenate([finite, mids]).astype(np.float32)
    up = np.nextafter(pts, np.float32(np.inf))
    dn = np.nextafter(pts, np.float32(-np.inf))
    x = np.concatenate([pts, up, dn, [0.0, -0.0]]).astype(np.float32)
    got = dsv4.e4m3_encode(x, backend=backend)
    assert np.array_equal(got, o.e4m3_encode(x))
    # ties go to the even code: every midpoint lands on an even mantissa
    assert (dsv4.e4m3_encode(mids.astype(np.float32), backend=backend) & 1 == 0).all()
    # every code (but NaN) encodes back to itself
    codes = np.array([c for c in range(256) if c & 0x7F != 0x7F], np.uint8)
    assert np.array_equal(dsv4.e4m3_encode(codes.view(o.E4M3).astype(np.float32), backend=backend), codes)


def test_e4m3_encode_random_whole_range(backend):
    rng = o.rng("e4m3 random")
    x = random_floats(rng, 1_000_000)
    got = dsv4.e4m3_encode(x, backend=backend)
    want = o.e4m3_encode(x)
    nan = np.isnan(x)
    assert np.array_equal(got[~nan], want[~nan])
    # NaN -> NaN code with the input's sign
    assert np.array_equal(got[nan], np.where(np.signbit(x[nan]), 0xFF, 0x7F).astype(np.uint8))
    # saturation: +-Inf and anything >= 448 -> +-448
    assert dsv4.e4m3_encode(np.array([np.inf, -np.inf, 1e30, -500.0], np.float32), backend=backend).tolist() == [
        0x7E, 0xFE, 0x7E, 0xFE]


# ---- BF16 ------------------------------------------------------------------------------
def test_bf16_random_and_ties(backend):
    rng = o.rng("bf16")
    x = random_floats(rng, 1_000_000)
    # exact ties: low 16 bits 0x8000, with even and odd kept parts
    tie_bits = (rng.integers(0, 2**16, 2000, dtype=np.uint64).astype(np.uint32) << 16) | 0x8000
    tie_bits &= ~np.uint32(0x7F800000) | np.uint32(0x3F800000)  # keep them finite
    x = np.concatenate([x, f32_from_bits(tie_bits)])
    got = dsv4.bf16_encode(x, backend=backend)
    want = o.bf16_encode(x)
    assert np.array_equal(got, want)
    assert np.array_equal(dsv4.bf16_decode(got, backend=backend).view(np.uint32), got.astype(np.uint32) << 16)


# ---- E2M1 ------------------------------------------------------------------------------
def test_e2m1_codes_ties_and_saturation(backend):
    codes = np.arange(16, dtype=np.uint8)
    grid = dsv4.e2m1_decode(codes, backend=backend)
    assert np.array_equal(grid, o.e2m1_decode(codes).astype(np.float32))
    assert np.array_equal(np.signbit(grid), codes >= 8)
    assert np.array_equal(dsv4.e2m1_encode(grid, backend=backend), codes)
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], np.float32)
    assert dsv4.e2m1_encode(ties, backend=backend).tolist() == [0, 2, 2, 4, 4, 6, 6]  # -> 0, 1, 1, 2, 2, 4, 4
    assert dsv4.e2m1_encode(-ties, backend=backend).tolist() == [8, 10, 10, 12, 12, 14, 14]
    rng = o.rng("e2m1")
    x = (rng.standard_normal(200_000) * 4).astype(np.float32)
    x = np.concatenate([x, np.nextafter(ties, 0), np.nextafter(ties, 10), [7.0, 1e9, np.inf, -np.inf]]).astype(np.float32)
    assert np.array_equal(dsv4.e2m1_encode(x, backend=backend), o.e2m1_encode(x))
    nans = np.array([np.nan, -np.nan] * 20, np.float32)  # long enough for the vector paths
    assert (dsv4.e2m1_encode(nans, backend=backend) == 0).all()


# ---- E8M0 ------------------------------------------------------------------------------
def test_e8m0_all_bytes(backend):
    b = np.arange(256, dtype=np.uint8)
    got = dsv4.e8m0_decode(b, backend=backend)
    want = o.e8m0_decode(b)
    assert np.isnan(got[255]) and np.array_equal(got[:255].astype(np.float64), want[:255])
    assert got[0] == 2.0**-127 and got[127] == 1.0 and got[254] == 2.0**127
    assert np.array_equal(b[:255].view(o.E8M0).astype(np.float64), want[:255])  # same as ml_dtypes


# ---- scale rules -----------------------------------------------------------------------
RULE_MAX = {"kv64": 448.0, "act128": 448.0, "mx32": 448.0, "fp4_32": 6.0}


@pytest.mark.parametrize("rule", sorted(o.RULES))
def test_scale_rule_power_of_two_edges(rule):
    g, max_code, floor, qfloor = o.RULES[rule]
    for k in range(-20, 40):
        # amax whose quotient amax/max_code is exactly 2^k in fp32, then one float ulp either side
        amax = np.float32(max_code * 2.0**k)
        for a in (amax, np.nextafter(amax, np.float32(np.inf)), np.nextafter(amax, np.float32(0))):
            want = int(o.scale_exponent(rule, a)) + 127
            assert dsv4.scale_byte(rule, a) == want, (rule, k, a)
        if max(float(amax), floor) / max_code >= qfloor:
            assert dsv4.scale_byte(rule, amax) == max(k, int(o.scale_exponent(rule, 0))) + 127
    assert dsv4.scale_byte(rule, np.inf) == 255


def test_all_zero_groups_and_floors():
    assert dsv4.scale_byte("kv64", 0.0) == 105
    assert dsv4.scale_byte("act128", 0.0) == 105
    assert dsv4.scale_byte("mx32", 0.0) == 94
    assert dsv4.scale_byte("fp4_32", 0.0) == 1
    # just at / just above the KV floor
    assert dsv4.scale_byte("kv64", 1e-4) == 105
    assert dsv4.scale_byte("kv64", 0.0448) == int(o.scale_exponent("kv64", 0.0448)) + 127


def group_data(rng, rows, k, g):
    """Rows whose groups span many magnitudes, with edge groups: zeros, -0, exact powers of two,
    midpoints, NaN, Inf and values above 448 before scaling."""
    x = rng.standard_normal((rows, k)).astype(np.float32)
    x *= np.exp2(rng.integers(-30, 30, (rows, k // g, 1))).repeat(g, -1).reshape(rows, k).astype(np.float32)
    x[0, :g] = 0.0
    if rows > 1:
        x[1, :g] = -0.0
    if rows > 3:
        x[2, :g] = 448.0 * 2.0**-5  # amax/448 an exact power of two
        x[3, :g] = np.nextafter(np.float32(448.0 * 2.0**3), np.float32(np.inf))
    if rows > 5:
        x[4, 3] = np.nan
        x[5, 7] = np.inf
    return x


@pytest.mark.parametrize("rule", sorted(o.RULES))
def test_quantize_matches_oracle(backend, rule):
    rng = o.rng(f"quantize {rule}")
    g = o.RULES[rule][0]
    for rows, k in [(1, g), (7, 4 * g), (33, 1024)]:
        x = group_data(rng, rows, k, g)
        codes = o.poison((rows, k), np.uint8)
        scales = o.poison((rows, k // g), np.uint8)
        dsv4.quantize(x, rule, backend=backend, out=(codes, scales))
        wc, ws = o.quantize(x, rule)
        assert np.array_equal(scales, ws), rule
        nan = np.isnan(x)
        assert np.array_equal(codes[~nan], wc[~nan])
        assert ((codes[nan] & 0x7F) == (0x00 if rule == "fp4_32" else 0x7F)).all()
        if rows > 5:
            assert scales[5, 0] == 255  # a group holding Inf has a NaN scale


@pytest.mark.parametrize("rule", sorted(o.RULES))
def test_round_trip_within_half_step(backend, rule):
    rng = o.rng(f"round trip {rule}")
    g = o.RULES[rule][0]
    x = rng.standard_normal((64, 512)).astype(np.float32) * np.exp2(rng.integers(-12, 12, (64, 1))).astype(np.float32)
    codes, scales = dsv4.quantize(x, rule, backend=backend)
    y = o.poison(x.shape, np.float32)
    dsv4.dequantize(codes, scales, rule, backend=backend, out=y)
    assert np.array_equal(y, o.dequantize(codes, scales, rule).astype(np.float32))
    # half a step of the format at each element's magnitude, in units of its group scale
    s = o.e8m0_decode(scales).repeat(g, axis=1)
    a = np.abs(x.astype(np.float64)) / s
    if rule == "fp4_32":
        half = np.where(a < 2, 0.25, np.where(a < 4, 0.5, 1.0))
    else:
        half = np.where(a < 2.0**-6, 2.0**-10, np.exp2(np.floor(np.log2(np.maximum(a, 2.0**-6)))) / 16)
    assert (np.abs(y - x.astype(np.float64)) <= half * s * (1 + 1e-12)).all()
    # scales are the smallest power of two that fits the group's max
    amax = np.abs(x).reshape(64, -1, g).max(-1)
    assert (amax <= RULE_MAX[rule] * o.e8m0_decode(scales)).all()


def test_strided_rows_and_fast_equals_ref():
    rng = o.rng("strided")
    base = rng.standard_normal((40, 384)).astype(np.float32)
    x = base[::3, :256]  # strided rows
    c1, s1 = dsv4.quantize(x, "act128", backend="cpu")
    c2, s2 = dsv4.quantize(np.ascontiguousarray(x), "act128", backend="cpu-ref")
    assert np.array_equal(c1, c2) and np.array_equal(s1, s2)


# ---- weights ---------------------------------------------------------------------------
def test_dequantize_weight_fp8_edge_blocks_and_strided_scales(backend):
    rng = o.rng("weights fp8")
    n, k = 300, 200  # edge blocks in both dims
    w = rng.integers(0, 256, (n, k), dtype=np.uint8)
    w[(w & 0x7F) == 0x7F] = 0  # no NaN codes
    sb = rng.integers(110, 140, ((n + 127) // 128, (k + 127) // 128), dtype=np.uint8)
    got = dsv4.dequantize_weight(w, sb, "fp8_b128", backend=backend)
    want = o.e4m3_decode(w) * o.e8m0_decode(sb).repeat(128, 0).repeat(128, 1)[:n, :k]
    assert np.array_equal(got.astype(np.float64), want)
    st = np.ascontiguousarray(sb.T).T  # same values, transposed storage
    assert np.array_equal(dsv4.dequantize_weight(w, st, "fp8_b128", backend=backend), got)


def test_dequantize_weight_fp4(backend):
    rng = o.rng("weights fp4")
    n, k = 70, 256
    codes = rng.integers(0, 16, (n, k), dtype=np.uint8)
    packed = dsv4.fp4_pack(codes)
    assert np.array_equal(packed, (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8))
    assert np.array_equal(dsv4.fp4_unpack(packed), codes)
    s = rng.integers(100, 150, (n, k // 32), dtype=np.uint8)
    got = dsv4.dequantize_weight(packed, s, "fp4", backend=backend)
    want = o.e2m1_decode(codes) * o.e8m0_decode(s).repeat(32, 1)
    assert np.array_equal(got.astype(np.float64), want)


# ---- bad input -------------------------------------------------------------------------
def test_bad_input_errors_and_untouched():
    x = np.ones((4, 100), np.float32)
    codes = o.poison((4, 100), np.uint8)
    scales = o.poison((4, 1), np.uint8)
    with pytest.raises(ValueError, match="multiple of the kv64 group"):
        dsv4.quantize(x, "kv64", out=(codes, scales))
    assert (codes == 0xA5).all() and (scales == 0xA5).all()
    with pytest.raises(ValueError, match="unknown rule"):
        dsv4.quantize(np.ones((1, 64), np.float32), "kv65")
    with pytest.raises(ValueError, match="dtype"):
        dsv4.quantize(np.ones((1, 64), np.int32), "kv64")
    x = np.ones((2, 128), np.float32)
    codes = o.poison((2, 128), np.uint8)
    scales = o.poison((2, 2), np.uint8)
    with pytest.raises(ValueError, match="unit stride"):
        dsv4.quantize(np.ones((2, 256), np.float32)[:, ::2], "kv64", out=(codes, scales))
    with pytest.raises(ValueError, match="scales has shape"):
        dsv4.quantize(x, "kv64", out=(codes, o.poison((2, 3), np.uint8)))
    assert (codes == 0xA5).all() and (scales == 0xA5).all()
    with pytest.raises(ValueError, match="nibbles"):
        dsv4.e2m1_decode(np.array([16], np.uint8))
    with pytest.raises(ValueError):
        dsv4.dequantize_weight(np.zeros((4, 16), np.uint8), np.zeros((4, 2), np.uint8), "fp4")  # K=32: scale is [4, 1]
    with pytest.raises(ValueError, match="not built in"):
        dsv4.e4m3_encode(np.ones(4, np.float32), backend="nope")


def test_backends_listed():
    assert dsv4.backends()[:2] == ["cpu", "cpu-ref"]
