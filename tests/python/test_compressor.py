"""Compressor (docs/model.md §5.5) against a float64 oracle of the reference's per-token state
machine, written from the docs: state rows, ape on the score only, per-channel softmax pooling
over the (overlapping) window, BF16 cast, RMSNorm, RoPE at the block start, FP8 simulation (main)
or Hadamard + FP4 simulation (indexer). Also: the batched form leaves exactly the state and
entries of token-by-token calls, cpu == cpu-ref bit for bit, 1 thread == 2 threads."""
import numpy as np
import pytest

import dsv4
from dsv4 import indexer as ix

import oracles

BACKENDS = ["cpu", "cpu-ref"]


# ---- oracles (float64, from the docs) -------------------------------------------------------
def rope_table(max_pos, base=160000.0, yarn=True):
    """docs/model.md §5.4: f_i = base^(-2i/64), YaRN blend (factor 16, original 65536, beta
    32/1) for compressed layers; rows cos(p f) || sin(p f), angles in float32 as the reference."""
    i = np.arange(32, dtype=np.float64)
    f = base ** (-2.0 * i / 64)
    if yarn:
        def corr(rot):
            return 64 * np.log(65536 / (rot * 2 * np.pi)) / (2 * np.log(base))
        low, high = max(np.floor(corr(32)), 0), min(np.ceil(corr(1)), 63)
        ramp = np.clip((i - low) / (high - low), 0, 1)
        f = f * (1 - ramp) + f / 16 * ramp
    ang = np.outer(np.arange(max_pos, dtype=np.float32), f.astype(np.float32)).astype(np.float32)
    return np.concatenate([np.cos(ang), np.sin(ang)], axis=1).astype(np.float32)


def rope64(x, cs):
    """GPT-J interleaved rotation of the 64 values x (float64) by a cos||sin row."""
    c, s = cs[:32].astype(np.float64), cs[32:].astype(np.float64)
    a, b = x[0::2], x[1::2]
    y = np.empty(64)
    y[0::2] = a * c - b * s
    y[1::2] = a * s + b * c
    return y


def hadamard(n):
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def fp4_sim(x):
    """FP4 E2M1 with one UE8M0 scale per 32 (rule fp4_32): (codes, scale bytes, values)."""
    codes, scales = oracles.quantize(np.asarray(x, np.float32)[None, :], "fp4_32")
    return codes[0], scales[0], oracles.dequantize(codes, scales, "fp4_32")[0]


def pack_nibbles(codes):
    codes = np.asarray(codes, np.uint8)
    return (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8)


def finish(v, entry, ratio, norm_w, rope, kind, eps=1e-6):
    """Post-processing of a pooled f64 vector: returns (plain BF16 values, final values, packed)."""
    d = v.shape[0]
    x = oracles.bf16_round(v)
    x = oracles.bf16_round(norm_w * (x / np.sqrt(np.mean(x * x) + eps)))
    x[d - 64:] = oracles.bf16_round(rope64(x[d - 64:], rope[entry * ratio]))
    if kind == "main":
        y = x.copy()
        y[: d - 64] = oracles.fp8_sim(x[None, : d - 64], "kv64")[0]
        return x, y, None
    h = oracles.bf16_round(x @ hadamard(d) / np.sqrt(d))
    codes, scales, vals = fp4_sim(h)
    return x, vals, (pack_nibbles(codes), scales)


U = 2.0**-24  # the fp32 unit roundoff


def pool_error_bound(w, t, kv, v):
    """A bound on |v_fp32 - v| per channel for the kernels' pooling (scores s in fp32, exactly the
    oracle's; t = s - max rounded once; w = expf(t) within 8 ulps; den = sum w and num = sum w*kv
    added in any order in fp32, each product rounded; v = num / den rounded), to first order with
    a 0.1% allowance for the rest: the rounding error of each step at most U of its value."""
    n = np.sum(w > 0, axis=0)
    eta = U * np.abs(np.where(w > 0, t, 0.0)) + 8 * U  # relative error of each weight
    den = w.sum(axis=0)
    wa = w * np.abs(kv)
    dnum = (wa * (eta + U)).sum(axis=0) + (n - 1) * U * wa.sum(axis=0)
    dden = (w * eta).sum(axis=0) + (n - 1) * U * den
    return 1.001 * (dnum + np.abs(v) * dden) / den + U * np.abs(v)


def bf16_span(lo, hi):
    """The BF16 values an fp32 result lying in the real interval [lo, hi] can round to: from the
    rounding of lo to that of hi (fp32 and BF16 rounding are monotone)."""
    return oracles.bf16_round(lo), oracles.bf16_round(hi)


def rope_interval(x_lo, x_hi, cs):
    """BF16 spans of the fp32 GPT-J rotation of 64 values known to lie in [x_lo, x_hi] (pairs
    (2i, 2i+1)) by a cos||sin row: interval arithmetic over the inputs (float64), widened by 3
    ulps of |a c| + |b s| (two products and a difference, each rounded once, FMA or not)."""
    c, s = cs[..., :32].astype(np.float64), cs[..., 32:].astype(np.float64)
    a, b = (x_lo[..., 0::2], x_hi[..., 0::2]), (x_lo[..., 1::2], x_hi[..., 1::2])

    def lin(p, cp, q, cq):  # the interval of p*cp + q*cq
        pp, qq = (p[0] * cp, p[1] * cp), (q[0] * cq, q[1] * cq)
        lo = np.minimum(*pp) + np.minimum(*qq)
        hi = np.maximum(*pp) + np.maximum(*qq)
        mag = np.maximum(np.abs(p[0]), np.abs(p[1])) * np.abs(cp) + np.maximum(np.abs(q[0]), np.abs(q[1])) * np.abs(cq)
        return lo - 3 * U * mag, hi + 3 * U * mag

    y0, y1 = lin(a, c, b, -s), lin(a, s, b, c)
    lo, hi = np.empty(x_lo.shape), np.empty(x_lo.shape)
    lo[..., 0::2], hi[..., 0::2] = y0
    lo[..., 1::2], hi[..., 1::2] = y1
    return bf16_span(lo, hi)


def finish_interval(v, dv, entry, ratio, norm_w, rope, eps=1e-6):
    """The spans [lo, hi] of BF16 values the kernels' plain output row (pooled -> BF16 -> RMSNorm
    -> BF16 -> RoPE -> BF16) can hold when the pooled fp32 value lies within dv of v: each fp32
    step's error bounded as in pool_error_bound, propagated by interval arithmetic, each BF16
    rounding turning an interval into the span of values it can round to. Also whether the row
    may cascade: a pooled value's own span holds two values, so it may flip unseen (its BF16
    rounding is internal) and move the row's RMS, and with it a few other values of the row."""
    d = v.shape[0]
    a_lo, a_hi = bf16_span(v - dv, v + dv)
    cross = (a_lo <= 0) & (a_hi >= 0)
    sq_lo = np.where(cross, 0.0, np.minimum(a_lo * a_lo, a_hi * a_hi))
    sq_hi = np.maximum(a_lo * a_lo, a_hi * a_hi)
    # rs = 1/sqrtf(sum(x^2)/d + eps): the positive sum within d ulps of itself, / d and + eps one
    # ulp each, halved by the square root (+ half an ulp), the reciprocal one: (d/2 + 4) ulps
    rho = (d / 2 + 4) * U
    rs = (1 / np.sqrt(sq_hi.sum() / d + eps) * (1 - rho), 1 / np.sqrt(sq_lo.sum() / d + eps) * (1 + rho))
    corners = np.array([norm_w * a * r for a in (a_lo, a_hi) for r in rs])
    lo, hi = corners.min(axis=0), corners.max(axis=0)
    mag = np.maximum(np.abs(lo), np.abs(hi)) * 2.001 * U  # x * rs, then w * (x * rs): two roundings
    x_lo, x_hi = bf16_span(lo - mag, hi + mag)
    x_lo[d - 64:], x_hi[d - 64:] = rope_interval(x_lo[d - 64:], x_hi[d - 64:], rope[entry * ratio])
    return x_lo, x_hi, bool((a_lo != a_hi).any())


def quantize_at(x, e, rule):
    """float64 values x [rows, K] quantized with the given scale exponents e [rows, K/G] (the rule's
    element step: x * 2^-e in fp32, RNE to E4M3 / E2M1, saturating) -> dequantized values."""
    g = oracles.RULES[rule][0]
    rows, k = x.shape
    sc = np.ldexp(1.0, np.asarray(e, np.int64))[..., None]
    q = (x.reshape(rows, k // g, g) * (1.0 / sc)).astype(np.float32)
    vals = oracles.e2m1_decode(oracles.e2m1_encode(q)) if rule == "fp4_32" else oracles.e4m3_decode(oracles.e4m3_encode(q))
    return (vals * sc).reshape(rows, k)


def flip_cap(n):
    """Flip events (a result on the other side of a rounding or scale boundary from the float64
    oracle's value, allowed only where the kernels' error bound reaches across it) allowed in a
    check of n values: 2 plus 0.1% of the values. Measured on correct code over 100 runs of this
    file and test_indexer.py (both backends): BF16 plain rows 92 events in 1.02M values (0.009%;
    at most 2 in one check, 0.12 per 1024-value check on average, so a third is a ~1e-5 event),
    FP8 rows 8 in 0.8M, FP4 compressor rows 0 in 0.3M, FP4 query rows 4 in 10.9M."""
    return 2 + n // 1000


def check_in_span(got, nom, lo, hi, what, cascade=None):
    """BF16 rows got: inside [lo, hi] everywhere, equal to the oracle's nominal value nom except
    at flips (where the span holds more than one value). Flip events at most flip_cap: each flip
    is one, except that all flips of a row marked cascade (finish_interval) count once.
    Returns the flips' mask."""
    out = ~((got >= lo) & (got <= hi))
    assert not out.any(), (f"{what}: {out.sum()} of {got.size} values outside the oracle's error span, e.g. "
                           f"{got[out][:3]} vs {nom[out][:3]}")
    flips = got != nom
    casc = np.zeros(got.shape[0], bool) if cascade is None else np.asarray(cascade, bool)
    n = int(flips[~casc].sum() + flips[casc].any(-1).sum())
    assert n <= flip_cap(got.size), f"{what}: {n} flip events ({flips.sum()} values) of {got.size} values"
    return flips


def check_quantized(got, lo, hi, nom, nom_scales, rule, what, got_scales=None, upstream=None):
    """Block-quantized values got [rows, K] of an input known to lie in the BF16 spans [lo, hi]
    (nominal quantization nom with scale bytes nom_scales): each group's scale exponent must be one
    the spans allow (amax anywhere in its span), and each element, with that scale, between the
    quantizations of lo and hi (monotone). Without got_scales, any allowed exponent that explains
    the whole group. Flip events at most flip_cap: an element != nom under the nominal scale, or a
    group under another scale, is one; in rows marked upstream (their input may itself have
    flipped, moving the whole row) all flips of the row count once."""
    g = oracles.RULES[rule][0]
    rows, k = got.shape
    m_lo = np.where((lo <= 0) & (hi >= 0), 0.0, np.minimum(np.abs(lo), np.abs(hi))).reshape(rows, k // g, g).max(-1)
    m_hi = np.maximum(np.abs(lo), np.abs(hi)).reshape(rows, k // g, g).max(-1)
    e_min = oracles.scale_exponent(rule, m_lo.astype(np.float32))
    e_max = oracles.scale_exponent(rule, m_hi.astype(np.float32))
    e_nom = nom_scales.astype(np.int64) - 127
    e_got = None if got_scales is None else got_scales.astype(np.int64) - 127

    def explains(e):  # [rows, groups]: exponent e is allowed and puts every element in its span
        ok = (e_min <= e) & (e <= e_max) & (True if e_got is None else e_got == e)
        inside = (got >= quantize_at(lo, e, rule)) & (got <= quantize_at(hi, e, rule))
        return ok & inside.reshape(rows, k // g, g).all(-1)

    at_nom = explains(e_nom)
    other = np.zeros_like(at_nom)
    for e in range(int(e_min.min()), int(e_max.max()) + 1):
        other |= ~at_nom & explains(np.full_like(e_nom, e))
    bad = ~(at_nom | other)
    assert not bad.any(), (f"{what}: {bad.sum()} of {bad.size} groups not explained by any allowed scale with "
                           f"every element within the oracle's error span")
    elem = ((got != nom).reshape(rows, k // g, g) & at_nom[..., None]).sum(-1) + other
    up = np.zeros(rows, bool) if upstream is None else np.asarray(upstream, bool)
    n = int(elem[~up].sum() + (elem[up].sum(-1) > 0).sum())
    assert n <= flip_cap(got.size), f"{what}: {n} flip events ({other.sum()} scales) of {got.size} values"
    return n


def hadamard_fp4_check(got, got_scales, x_nom, x_lo, x_hi, what):
    """FP4 values (and scale bytes) of the Hadamard + BF16 + fp4_32 tail of rows whose BF16 input
    lies in [x_lo, x_hi] (nominal x_nom). h = H x / sqrt(d): every input element's span moves each
    h by its width / sqrt(d); the fp32 butterflies (log2 d levels) and the scaling (the fp32
    constant 1/sqrt(d) and the product) add at most (log2 d + 2) ulps of sum|x| / sqrt(d); BF16
    rounding of that interval, then check_quantized. Returns the number of flips."""
    d = x_nom.shape[-1]
    hm = hadamard(d) / np.sqrt(d)
    h = x_nom @ hm
    width = np.maximum(x_hi - x_nom, x_nom - x_lo).sum(-1, keepdims=True) / np.sqrt(d)
    fw = 1.001 * (np.log2(d) + 2) * U * np.maximum(np.abs(x_lo), np.abs(x_hi)).sum(-1, keepdims=True) / np.sqrt(d)
    lo, hi = bf16_span(h - width - fw, h + width + fw)
    nom_codes, nom_scales = oracles.quantize(oracles.bf16_round(h).astype(np.float32), "fp4_32")
    nom = oracles.dequantize(nom_codes, nom_scales, "fp4_32")
    # a row whose input may have flipped moves as a whole: its flips count as one event
    return check_quantized(got, lo, hi, nom, nom_scales, "fp4_32", what, got_scales, (x_lo != x_hi).any(-1))


class RefCompressor:
    """The reference's decode-time state machine (OF model.py Compressor.forward, start_pos > 0),
    run one token at a time from a fresh state; states in float32 as the reference keeps them."""

    def __init__(self, ratio, d, overlap):
        self.r, self.d, self.overlap = ratio, d, bool(overlap)
        c = 2 if self.overlap else 1
        self.kv = np.zeros((c * ratio, c * d), np.float32)
        self.score = np.full((c * ratio, c * d), -np.inf, np.float32)

    def step(self, p, a, g, ape):
        r, d = self.r, self.d
        s = (g + ape[p % r]).astype(np.float32)
        row = (r if self.overlap else 0) + p % r
        self.kv[row], self.score[row] = a, s
        if (p + 1) % r:
            return None
        if self.overlap:
            kv = np.concatenate([self.kv[:r, :d], self.kv[r:, d:]]).astype(np.float64)
            sc = np.concatenate([self.score[:r, :d], self.score[r:, d:]]).astype(np.float64)
        else:
            kv, sc = self.kv.astype(np.float64), self.score.astype(np.float64)
        t = sc - sc.max(axis=0)
        w = np.exp(t)
        v = (w * kv).sum(axis=0) / w.sum(axis=0)
        self.dv = pool_error_bound(w, t, kv, v)
        if self.overlap:
            self.kv[:r], self.score[:r] = self.kv[r:], self.score[r:]
        return v


def make_inputs(rng, n, ratio, d, overlap, scale=1.0):
    c = 2 if overlap else 1
    kv = (rng.standard_normal((n, c * d)) * scale).astype(np.float32)
    gate = (rng.standard_normal((n, c * d)) * 2).astype(np.float32)
    ape = rng.standard_normal((ratio, c * d)).astype(np.float32)
    norm = dsv4.bf16_encode((1 + 0.2 * rng.standard_normal(d)).astype(np.float32))
    return kv, gate, ape, norm


def run_oracle(kv, gate, ape, norm_bits, rope, ratio, kind, overlap):
    """(final state, plain BF16 rows, final rows, packed FP4 (indexer), (lo, hi) spans of the
    plain rows the kernels may produce and which rows may cascade: see finish_interval)."""
    d = kv.shape[1] // (2 if overlap else 1)
    ref = RefCompressor(ratio, d, overlap)
    w = oracles.bf16_decode(norm_bits)
    plain, final, packed, lo, hi, casc = [], [], [], [], [], []
    for p in range(kv.shape[0]):
        v = ref.step(p, kv[p], gate[p], ape)
        if v is not None:
            x, y, pk = finish(v, p // ratio, ratio, w, rope, kind)
            plain.append(x)
            final.append(y)
            packed.append(pk)
            xl, xh, c = finish_interval(v, ref.dv, p // ratio, ratio, w, rope)
            lo.append(xl)
            hi.append(xh)
            casc.append(c)
    rows = [np.array(a).reshape(-1, d) for a in (plain, final, lo, hi)]
    return ref, rows[0], rows[1], packed, (rows[2], rows[3], np.array(casc, bool))


def bf16_close(got_bits, want):
    """BF16 outputs vs float64 values: the kernels pool in fp32 and round at the same points as the
    reference, so an element may land one BF16 ulp away where the oracle sits near a rounding
    boundary; RoPE mixes two such values (cancellation), so the bound is 2 ulps of the element
    plus 1 ulp of the row's RMS."""
    got = oracles.bf16_decode(got_bits)
    rms = np.sqrt(np.mean(want * want, axis=-1, keepdims=True))
    tol = 2.0 ** -7 * np.abs(want) + 2.0 ** -8 * rms
    bad = np.abs(got - want) > tol
    assert not bad.any(), f"{bad.sum()} elements off, worst {np.max(np.abs(got - want) - tol)}"


# ---- tests ------------------------------------------------------------------------------------
CASES = [  # (ratio, d, kind, overlap, n tokens)
    (4, 512, "main", True, 23),       # CSA main: overlap, 5 entries, 3 leftover tokens
    (128, 512, "main", False, 300),   # HCA: 2 entries and a partial block of 44
    (8, 512, "main", False, 19),      # small-config HCA ratio (no overlap)
    (4, 512, "main", False, 23),      # HCA of ratio 4: the overlap follows the kind, not the ratio
    (8, 512, "main", True, 37),       # CSA of ratio 8: windows of 16 tokens, 4 entries
    (4, 128, "indexer", True, 86),    # CSA indexer compressor: 21 entries, 2 leftover tokens
    (4, 64, "indexer", True, 41),     # 10 entries, 1 leftover
    (4, 256, "indexer", True, 30),    # 7 entries, 2 leftover
    (2, 128, "indexer", True, 25),    # the indexer of a CSA layer of ratio 2
]


@pytest.mark.parametrize("ratio,d,kind,overlap,n", CASES)
def test_against_oracle(ratio, d, kind, overlap, n):
    """Strict: every BF16 / FP8 / FP4 result equals the float64 oracle's, except a "flip" to the
    neighbouring value where the oracle's value lies so close to a rounding (or scale) boundary
    that the kernels' bounded fp32 error reaches across it (finish_interval, check_quantized,
    hadamard_fp4_check); flips are capped (flip_cap). On correct code they are rare; a missing or
    extra rounding step flips values far from any boundary and fails."""
    rng = oracles.rng(f"compressor r{ratio} d{d} {kind} o{int(overlap)}")
    rope = rope_table(n + ratio)
    kv, gate, ape, norm = make_inputs(rng, n, ratio, d, overlap)
    ref, plain, final, packed, (lo, hi, casc) = run_oracle(kv, gate, ape, norm, rope, ratio, kind, overlap)
    m = n // ratio
    for be in BACKENDS:
        skv, ss = ix.compressor_state(ratio, d, overlap=overlap)
        if kind == "main":
            out = oracles.poison((m, d), np.uint16)
            ix.compressor_forward(kv, gate, ape, norm, rope, skv, ss, 0, ratio, backend=be, out=out, overlap=overlap)
            bf16_close(out, plain)
            flips = check_in_span(oracles.bf16_decode(out), plain, lo, hi, f"{be} plain rows", casc)
            skv2, ss2 = ix.compressor_state(ratio, d, overlap=overlap)
            sim = ix.compressor_forward(kv, gate, ape, norm, rope, skv2, ss2, 0, ratio, fp8_sim=True, backend=be,
                                        overlap=overlap)
            # the FP8 step is exact given its BF16 input: compare with the oracle's simulation of
            # this backend's own BF16 output, and the rope dims pass through unchanged
            want = oracles.bf16_decode(out).copy()
            want[:, : d - 64] = oracles.fp8_sim(want[:, : d - 64], "kv64")
            got = oracles.bf16_decode(sim)
            assert np.array_equal(got, want)
            # and against the oracle's full chain: the FP8 values differ only in the kv64 groups
            # of a BF16 flip above (the flipped element, or the whole group if its scale moved),
            # and each is the quantization of a value in the oracle's span
            k = d - 64
            _, nom_s = oracles.quantize(plain[:, :k].astype(np.float32), "kv64")
            check_quantized(got[:, :k], lo[:, :k], hi[:, :k], final[:, :k], nom_s, "kv64", f"{be} fp8 rows",
                            upstream=flips.any(-1))
            grp = flips[:, :k].reshape(m, -1, 64).any(-1)
            moved = (got[:, :k] != final[:, :k]).reshape(m, -1, 64)
            assert not (moved.any(-1) & ~grp).any(), f"{be}: FP8 values moved in a group without a BF16 flip"
        else:
            codes = oracles.poison((m, d // 2), np.uint8)
            scales = oracles.poison((m, d // 32), np.uint8)
            ix.compressor_forward(kv, gate, ape, norm, rope, skv, ss, 0, ratio, kind="indexer", packed=True,
                                  backend=be, out=(codes, scales), overlap=overlap)
            vals = oracles.dequantize(dsv4.fp4_unpack(codes), scales, "fp4_32")
            hadamard_fp4_check(vals, scales, plain, lo, hi, f"{be} FP4 rows")
            skv2, ss2 = ix.compressor_state(ratio, d, overlap=overlap)
            flat = ix.compressor_forward(kv, gate, ape, norm, rope, skv2, ss2, 0, ratio, kind="indexer", backend=be,
                                         overlap=overlap)
            assert np.array_equal(oracles.bf16_decode(flat), vals)  # BF16 form = the packed values
        # the state is the reference's, bit for bit (copies and fp32 sums g + ape)
        assert np.array_equal(skv, ref.kv) and np.array_equal(ss, ref.score)


@pytest.mark.parametrize("ratio,d,kind,overlap", [(4, 512, "main", True), (128, 512, "main", False),
                                                  (4, 512, "main", False), (8, 512, "main", True),
                                                  (4, 128, "indexer", True), (8, 64, "indexer", False)])
def test_batched_equals_token_by_token(ratio, d, kind, overlap):
    """Random chunkings (prefill, chunked prefill, decode) leave identical states and entries."""
    rng = oracles.rng(f"chunks r{ratio} d{d} o{int(overlap)}")
    n = 3 * ratio + 5 if ratio < 128 else 2 * ratio + 17
    rope = rope_table(n + ratio)
    kv, gate, ape, norm = make_inputs(rng, n, ratio, d, overlap)
    pk = kind == "indexer"
    results = []
    for split in ["one", "tokens", "random"]:
        if split == "one":
            cuts = [0, n]
        elif split == "tokens":
            cuts = list(range(n + 1))
        else:
            cuts = sorted(set([0, n] + list(rng.integers(1, n, size=5))))
        for be in BACKENDS:
            skv, ss = ix.compressor_state(ratio, d, kind, overlap=overlap)
            outs = []
            for a, b in zip(cuts[:-1], cuts[1:]):
                o = ix.compressor_forward(kv[a:b], gate[a:b], ape, norm, rope, skv, ss, a, ratio, kind=kind,
                                          fp8_sim=not pk, packed=pk, backend=be, overlap=overlap)
                outs.append(np.concatenate(o, axis=1) if pk else o)
            results.append((split, be, np.concatenate(outs), skv, ss))
    _, _, out0, skv0, ss0 = results[0]
    assert out0.shape[0] == n // ratio
    for split, be, out, skv, ss in results[1:]:
        assert np.array_equal(out, out0), f"{split} {be}: entries differ"
        assert np.array_equal(skv, skv0) and np.array_equal(ss, ss0), f"{split} {be}: state differs"


def test_threads_and_isa_bit_identical(monkeypatch):
    rng = oracles.rng("compressor threads")
    ratio, d, n = 4, 512, 64
    rope = rope_table(n + ratio)
    kv, gate, ape, norm = make_inputs(rng, n, ratio, d, True, scale=3.0)
    outs = []
    for isa in ["avx512", "avx2", "scalar"]:
        monkeypatch.setenv("DSV4_CPU_ISA", isa)
        for th in [1, 2]:
            skv, ss = ix.compressor_state(ratio, d, overlap=True)
            outs.append(ix.compressor_forward(kv, gate, ape, norm, rope, skv, ss, 0, ratio, backend="cpu", threads=th,
                                              overlap=True))
    for o in outs[1:]:
        assert np.array_equal(o, outs[0])


def test_before_first_emission_and_partial_block():
    """r = 128: 100 tokens emit nothing; the next 60 emit entry 0 (from the state's 100 rows and
    28 new ones) and leave 32 tokens of block 1 in the state."""
    rng = oracles.rng("hca partial")
    ratio, d = 128, 512
    rope = rope_table(300)
    kv, gate, ape, norm = make_inputs(rng, 160, ratio, d, False)
    ref, plain, _, _, (lo, hi, casc) = run_oracle(kv, gate, ape, norm, rope, ratio, "main", False)
    for be in BACKENDS:
        skv, ss = ix.compressor_state(ratio, d, overlap=False)
        first = ix.compressor_forward(kv[:100], gate[:100], ape, norm, rope, skv, ss, 0, ratio, backend=be, overlap=False)
        assert first.shape == (0, d)
        second = ix.compressor_forward(kv[100:], gate[100:], ape, norm, rope, skv, ss, 100, ratio, backend=be,
                                       overlap=False)
        assert second.shape == (1, d)
        bf16_close(second, plain)
        check_in_span(oracles.bf16_decode(second), plain, lo, hi, f"{be} entry 0", casc[:1])
        assert np.array_equal(skv, ref.kv) and np.array_equal(ss, ref.score)
    assert ix.compressor_emit_count(128, 0, 127) == 0 and ix.compressor_emit_count(128, 127, 1) == 1
    assert ix.compressor_emit_count(4, 5, 8) == 2


def test_masked_first_window_uses_no_state():
    """Entry 0 of an overlapping compressor has no previous block: stale state rows 0..3 must not
    leak in (positions < 0 are masked, whatever the state holds)."""
    rng = oracles.rng("overlap c0")
    ratio, d = 4, 128
    rope = rope_table(16)
    kv, gate, ape, norm = make_inputs(rng, 4, ratio, d, True)
    skv, ss = ix.compressor_state(ratio, d, overlap=True)
    a = ix.compressor_forward(kv, gate, ape, norm, rope, skv, ss, 0, ratio, kind="indexer", overlap=True)
    skv, ss = ix.compressor_state(ratio, d, overlap=True)
    skv[:4] = 7.0
    ss[:4] = 50.0
    b = ix.compressor_forward(kv, gate, ape, norm, rope, skv, ss, 0, ratio, kind="indexer", overlap=True)
    assert np.array_equal(a, b)


def test_bad_inputs_leave_outputs_untouched():
    rng = oracles.rng("compressor bad")
    ratio, d = 4, 128
    rope = rope_table(8)
    kv, gate, ape, norm = make_inputs(rng, 8, ratio, d, True)
    skv, ss = ix.compressor_state(ratio, d, overlap=True)
    skv0, ss0 = skv.copy(), ss.copy()
    out = oracles.poison((2, d), np.uint16)

    def attempt(**kw):
        args = dict(kv=kv, gate=gate, ape=ape, norm=norm, rope=rope, state_kv=skv, state_score=ss, start_pos=0,
                    ratio=ratio, out=out, overlap=True)
        args.update(kw)
        with pytest.raises(ValueError):
            ix.compressor_forward(**args)
        assert np.array_equal(skv, skv0, equal_nan=True) and np.array_equal(ss, ss0)
        assert np.all(out == oracles.poison((1,), np.uint16)[0])

    attempt(rope=rope[:4])                               # entry 1 starts at position 4: no rope row
    attempt(gate=gate[:7])                               # rows disagree
    attempt(ape=ape[:3])                                 # ape must have ratio rows
    attempt(start_pos=-1)
    attempt(ratio=1)
    attempt(out=oracles.poison((3, d), np.uint16))       # 2 entries, not 3
    attempt(kv=kv[:, :200], gate=gate[:, :200])          # width not coff * d for any allowed d
    attempt(state_kv=np.zeros((8, 256), np.float64))     # wrong dtype
    attempt(norm=np.ones(d + 1, np.float32))
    attempt(fp8_sim=True, kind="indexer")                # fp8 simulation is for the main kind
    attempt(state_kv=ss)                                 # state buffers overlap
    attempt(overlap=False)                               # the overlap sets the widths: kv is 2d wide
    attempt(overlap=2)                                   # overlap is 0 or 1
    attempt(out=skv.view(np.uint16)[:2, :d])             # output overlaps the state
