"""Compressor (architecture.md §5.5) against a float64 oracle of the reference's per-token state
machine, written from the spec: state rows, ape on the score only, per-channel softmax pooling
over the (overlapping) window, BF16 cast, RMSNorm, RoPE at the block start, FP8 simulation (main)
or Hadamard + FP4 simulation (indexer). Also: the batched form leaves exactly the state and
entries of token-by-token calls, cpu == cpu-ref bit for bit, 1 thread == 2 threads."""
import numpy as np
import pytest

import dsv4
from dsv4 import indexer as ix

import oracles

BACKENDS = ["cpu", "cpu-ref"]


# ---- oracles (float64, from the spec) -------------------------------------------------------
def rope_table(max_pos, base=160000.0, yarn=True):
    """architecture.md §5.4: f_i = base^(-2i/64), YaRN blend (factor 16, original 65536, beta
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


class RefCompressor:
    """The reference's decode-time state machine (OF model.py Compressor.forward, start_pos > 0),
    run one token at a time from a fresh state; states in float32 as the reference keeps them."""

    def __init__(self, ratio, d):
        self.r, self.d, self.overlap = ratio, d, ratio == 4
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
        w = np.exp(sc - sc.max(axis=0))
        v = (w * kv).sum(axis=0) / w.sum(axis=0)
        if self.overlap:
            self.kv[:r], self.score[:r] = self.kv[r:], self.score[r:]
        return v


def make_inputs(rng, n, ratio, d, scale=1.0):
    c = 2 if ratio == 4 else 1
    kv = (rng.standard_normal((n, c * d)) * scale).astype(np.float32)
    gate = (rng.standard_normal((n, c * d)) * 2).astype(np.float32)
    ape = rng.standard_normal((ratio, c * d)).astype(np.float32)
    norm = dsv4.bf16_encode((1 + 0.2 * rng.standard_normal(d)).astype(np.float32))
    return kv, gate, ape, norm


def run_oracle(kv, gate, ape, norm_bits, rope, ratio, kind):
    d = kv.shape[1] // (2 if ratio == 4 else 1)
    ref = RefCompressor(ratio, d)
    w = oracles.bf16_decode(norm_bits)
    plain, final, packed = [], [], []
    for p in range(kv.shape[0]):
        v = ref.step(p, kv[p], gate[p], ape)
        if v is not None:
            x, y, pk = finish(v, p // ratio, ratio, w, rope, kind)
            plain.append(x)
            final.append(y)
            packed.append(pk)
    return ref, np.array(plain).reshape(-1, d), np.array(final).reshape(-1, d), packed


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
CASES = [  # (ratio, d, kind, n tokens)
    (4, 512, "main", 23),       # CSA main: overlap, 5 entries, 3 leftover tokens
    (128, 512, "main", 300),    # HCA: 2 entries and a partial block of 44
    (8, 512, "main", 19),       # small-config HCA ratio (no overlap)
    (4, 128, "indexer", 22),    # CSA indexer compressor
    (4, 64, "indexer", 9),
    (4, 256, "indexer", 12),
]


@pytest.mark.parametrize("ratio,d,kind,n", CASES)
def test_against_oracle(ratio, d, kind, n):
    rng = oracles.rng(f"compressor r{ratio} d{d} {kind}")
    rope = rope_table(n + ratio)
    kv, gate, ape, norm = make_inputs(rng, n, ratio, d)
    ref, plain, final, packed = run_oracle(kv, gate, ape, norm, rope, ratio, kind)
    m = n // ratio
    for be in BACKENDS:
        skv, ss = ix.compressor_state(ratio, d)
        if kind == "main":
            out = oracles.poison((m, d), np.uint16)
            ix.compressor_forward(kv, gate, ape, norm, rope, skv, ss, 0, ratio, backend=be, out=out)
            bf16_close(out, plain)
            skv2, ss2 = ix.compressor_state(ratio, d)
            sim = ix.compressor_forward(kv, gate, ape, norm, rope, skv2, ss2, 0, ratio, fp8_sim=True, backend=be)
            # the FP8 step is exact given its BF16 input: compare with the oracle's simulation of
            # this backend's own BF16 output, and the rope dims pass through unchanged
            want = oracles.bf16_decode(out).copy()
            want[:, : d - 64] = oracles.fp8_sim(want[:, : d - 64], "kv64")
            assert np.array_equal(oracles.bf16_decode(sim), want)
            # and against the oracle's full chain: at most one FP8 step where BF16 inputs differed
            got = oracles.bf16_decode(sim)
            assert np.mean(got == final) > 0.97
        else:
            codes = oracles.poison((m, d // 2), np.uint8)
            scales = oracles.poison((m, d // 32), np.uint8)
            ix.compressor_forward(kv, gate, ape, norm, rope, skv, ss, 0, ratio, kind="indexer", packed=True,
                                  backend=be, out=(codes, scales))
            vals = oracles.dequantize(dsv4.fp4_unpack(codes), scales, "fp4_32")
            fp4_close(vals, final, scales, np.array([p[1] for p in packed]).reshape(m, -1))
            skv2, ss2 = ix.compressor_state(ratio, d)
            flat = ix.compressor_forward(kv, gate, ape, norm, rope, skv2, ss2, 0, ratio, kind="indexer", backend=be)
            assert np.array_equal(oracles.bf16_decode(flat), vals)  # BF16 form = the packed values
        # the state is the reference's, bit for bit (copies and fp32 sums g + ape)
        assert np.array_equal(skv, ref.kv) and np.array_equal(ss, ref.score)


def fp4_close(got, want, got_scales, want_scales):
    """FP4-simulated values: the Hadamard runs in fp32 (oracle: float64) before the BF16 rounding,
    so a value next to an E2M1 rounding boundary may take the neighbouring code (at most one grid
    step, 2 x scale at the top of the grid), and a group whose amax sits at a power-of-two boundary
    may take the next scale. Such flips are rare: >= 95% of values must match exactly."""
    d = got.shape[-1]
    s = np.maximum(oracles.e8m0_decode(got_scales), oracles.e8m0_decode(want_scales))
    step = np.repeat(s, 32, axis=-1).reshape(got.shape) * 2.0
    assert np.all(np.abs(got - want) <= step * 1.0001), "FP4 values more than one step apart"
    assert np.mean(got == want) >= 0.95, f"only {np.mean(got == want):.3f} of {d}-wide FP4 values match"


@pytest.mark.parametrize("ratio,d,kind", [(4, 512, "main"), (128, 512, "main"), (4, 128, "indexer"), (8, 64, "indexer")])
def test_batched_equals_token_by_token(ratio, d, kind):
    """Random chunkings (prefill, chunked prefill, decode) leave identical states and entries."""
    rng = oracles.rng(f"chunks r{ratio} d{d}")
    n = 3 * ratio + 5 if ratio < 128 else 2 * ratio + 17
    rope = rope_table(n + ratio)
    kv, gate, ape, norm = make_inputs(rng, n, ratio, d)
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
            skv, ss = ix.compressor_state(ratio, d, kind)
            outs = []
            for a, b in zip(cuts[:-1], cuts[1:]):
                o = ix.compressor_forward(kv[a:b], gate[a:b], ape, norm, rope, skv, ss, a, ratio, kind=kind,
                                          fp8_sim=not pk, packed=pk, backend=be)
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
    kv, gate, ape, norm = make_inputs(rng, n, ratio, d, scale=3.0)
    outs = []
    for isa in ["avx512", "avx2", "scalar"]:
        monkeypatch.setenv("DSV4_CPU_ISA", isa)
        for th in [1, 2]:
            skv, ss = ix.compressor_state(ratio, d)
            outs.append(ix.compressor_forward(kv, gate, ape, norm, rope, skv, ss, 0, ratio, backend="cpu", threads=th))
    for o in outs[1:]:
        assert np.array_equal(o, outs[0])


def test_before_first_emission_and_partial_block():
    """r = 128: 100 tokens emit nothing; the next 60 emit entry 0 (from the state's 100 rows and
    28 new ones) and leave 32 tokens of block 1 in the state."""
    rng = oracles.rng("hca partial")
    ratio, d = 128, 512
    rope = rope_table(300)
    kv, gate, ape, norm = make_inputs(rng, 160, ratio, d)
    ref, plain, _, _ = run_oracle(kv, gate, ape, norm, rope, ratio, "main")
    for be in BACKENDS:
        skv, ss = ix.compressor_state(ratio, d)
        first = ix.compressor_forward(kv[:100], gate[:100], ape, norm, rope, skv, ss, 0, ratio, backend=be)
        assert first.shape == (0, d)
        second = ix.compressor_forward(kv[100:], gate[100:], ape, norm, rope, skv, ss, 100, ratio, backend=be)
        assert second.shape == (1, d)
        bf16_close(second, plain)
        assert np.array_equal(skv, ref.kv) and np.array_equal(ss, ref.score)
    assert ix.compressor_emit_count(128, 0, 127) == 0 and ix.compressor_emit_count(128, 127, 1) == 1
    assert ix.compressor_emit_count(4, 5, 8) == 2


def test_masked_first_window_uses_no_state():
    """Entry 0 of an overlapping compressor has no previous block: stale state rows 0..3 must not
    leak in (positions < 0 are masked, whatever the state holds)."""
    rng = oracles.rng("overlap c0")
    ratio, d = 4, 128
    rope = rope_table(16)
    kv, gate, ape, norm = make_inputs(rng, 4, ratio, d)
    skv, ss = ix.compressor_state(ratio, d)
    a = ix.compressor_forward(kv, gate, ape, norm, rope, skv, ss, 0, ratio, kind="indexer")
    skv, ss = ix.compressor_state(ratio, d)
    skv[:4] = 7.0
    ss[:4] = 50.0
    b = ix.compressor_forward(kv, gate, ape, norm, rope, skv, ss, 0, ratio, kind="indexer")
    assert np.array_equal(a, b)


def test_bad_inputs_leave_outputs_untouched():
    rng = oracles.rng("compressor bad")
    ratio, d = 4, 128
    rope = rope_table(8)
    kv, gate, ape, norm = make_inputs(rng, 8, ratio, d)
    skv, ss = ix.compressor_state(ratio, d)
    skv0, ss0 = skv.copy(), ss.copy()
    out = oracles.poison((2, d), np.uint16)

    def attempt(**kw):
        args = dict(kv=kv, gate=gate, ape=ape, norm=norm, rope=rope, state_kv=skv, state_score=ss, start_pos=0,
                    ratio=ratio, out=out)
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
    attempt(out=skv.view(np.uint16)[:2, :d])             # output overlaps the state
