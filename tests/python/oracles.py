"""Independent float64 / ml_dtypes oracles of the number formats, written from the docs
(docs/formats.md, docs/contracts.md §2-§4), not from the C code. Shared by every Python test."""
import os
import time

import ml_dtypes
import numpy as np

E4M3 = ml_dtypes.float8_e4m3fn
BF16 = ml_dtypes.bfloat16
E2M1 = ml_dtypes.float4_e2m1fn
E8M0 = ml_dtypes.float8_e8m0fnu

# shared/ (specs and outside test data) lies beside the repository, in development and in CI
SHARED = os.environ.get("DSV4_SHARED",
                        os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared")))
TESTDATA = os.path.join(SHARED, "testdata")

RULES = {  # group, max code, amax floor, quotient floor
    "kv64": (64, 448.0, 1e-4, 0.0),
    "act128": (128, 448.0, 1e-4, 0.0),
    "mx32": (32, 448.0, 1e-10, 1e-10),
    "fp4_32": (32, 6.0, 6.0 * 2.0**-126, 0.0),
}


def rng(request_name=""):
    """A fresh generator per test; the seed is printed (pytest -s / on failure) for replay."""
    seed = int(os.environ.get("DSV4_TEST_SEED", time.time_ns() % (2**32)))
    print(f"seed {seed} {request_name}")
    return np.random.default_rng(seed)


def cpu_isa_mismatch(isa):
    """None when the cpu backend, capped at `isa` through DSV4_CPU_ISA (already set), runs that
    path's kernels on this machine; otherwise the reason it does not (the cap is only a ceiling:
    without the ISA the backend falls back). "avx512" means the whole AVX-512 path: the linear
    kernels and the attention unit need avx512_bf16 (dsv4_cpu_isa() then says "avx512+bf16") and
    the indexer's need avx512_vnni; without them those ops run their AVX2 kernels."""
    import dsv4
    want = {"scalar": "scalar", "avx2": "avx2", "avx512": "avx512+bf16"}[isa]
    got = dsv4.cpu_isa("cpu")  # the binding's context under this environment
    if got != want:
        return f"DSV4_CPU_ISA={isa}: this machine runs the {got} kernels, not {want}"
    if isa == "avx512" and "avx512_vnni" not in dsv4.lib.dsv4_cpu_features().decode():
        return "DSV4_CPU_ISA=avx512: no avx512_vnni here, the indexer kernels would fall back to AVX2"
    return None


def poison(shape, dtype, value=None):
    """An output buffer full of a recognizable bad pattern (NaN for floats, 0xA5.. otherwise)."""
    a = np.empty(shape, dtype)
    if np.dtype(dtype).kind == "f":
        a.fill(np.nan if value is None else value)
    else:
        a.view(np.uint8).fill(0xA5 if value is None else value)
    return a


# ---- element codecs ----------------------------------------------------------------------
def e4m3_decode(codes):
    return np.asarray(codes, np.uint8).view(E4M3).astype(np.float64)


def e4m3_encode(x):
    """float -> E4M3FN code with the contract's saturation (|x| >= 448 and +-Inf -> +-448)."""
    x = np.asarray(x, np.float32)
    sat = np.where(np.isnan(x), x, np.clip(x, -448.0, 448.0)).astype(np.float32)
    with np.errstate(invalid="ignore"):
        return sat.astype(E4M3).view(np.uint8)


def bf16_encode(x):
    with np.errstate(invalid="ignore", over="ignore"):
        return np.asarray(x, np.float32).astype(BF16).view(np.uint16)


def bf16_decode(bits):
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def bf16_round(x):
    """float64/32 -> nearest BF16 value (via float32, as the kernels round fp32 results)."""
    return bf16_decode(bf16_encode(np.asarray(x, np.float32)))


def e2m1_encode(x):
    x = np.asarray(x, np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        return np.where(np.isnan(x), np.float32(0), x).astype(E2M1).view(np.uint8) & 0xF


def e2m1_decode(codes):
    return (np.asarray(codes, np.uint8) & 0xF).view(E2M1).astype(np.float64)


def e8m0_decode(b):
    b = np.asarray(b, np.int64)
    return np.where(b == 255, np.nan, np.ldexp(1.0, b - 127))


# ---- scale rules -------------------------------------------------------------------------
def ceil_log2_exact(y):
    """ceil(log2(y)) for positive float32 values, from the bits (frexp is exact)."""
    y = np.asarray(y, np.float64)
    m, e = np.frexp(y)  # y = m * 2^e, m in [0.5, 1)
    return np.where(m == 0.5, e - 1, e).astype(np.int64)


def scale_exponent(rule, amax):
    _, max_code, amax_floor, quot_floor = RULES[rule]
    amax = np.maximum(np.asarray(amax, np.float32), np.float32(amax_floor))
    y = (amax / np.float32(max_code)).astype(np.float32)  # fp32 division, as the kernels do
    y = np.maximum(y, np.float32(quot_floor))
    inf = np.isinf(y)
    e = ceil_log2_exact(np.where(inf, 1.0, y))
    return np.clip(np.where(inf, 128, e), -127, 128)


def quantize(x, rule):
    """x float32 [rows, K] -> (codes u8, scale bytes u8 [rows, K/G]) per the rule."""
    g, max_code, _, _ = RULES[rule]
    x = np.asarray(x, np.float32)
    rows, k = x.shape
    xg = x.reshape(rows, k // g, g)
    amax = np.nanmax(np.abs(xg), axis=-1) if np.isnan(xg).any() else np.abs(xg).max(axis=-1)
    amax = np.where(np.isnan(amax), 0, amax)
    e = scale_exponent(rule, amax)
    scaled = (xg.astype(np.float64) * np.ldexp(1.0, -e)[..., None]).astype(np.float32)
    codes = e2m1_encode(scaled) if rule == "fp4_32" else e4m3_encode(scaled)
    return codes.reshape(rows, k), (e + 127).astype(np.uint8)


def dequantize(codes, scales, rule):
    g = RULES[rule][0]
    vals = e2m1_decode(codes) if rule == "fp4_32" else e4m3_decode(codes)
    rows, k = vals.shape
    return (vals.reshape(rows, k // g, g) * e8m0_decode(scales)[..., None]).reshape(rows, k)


def fp8_sim(x, rule="kv64"):
    """Quantize -> dequantize round trip (the reference's in-place quantization simulation)."""
    c, s = quantize(x, rule)
    return dequantize(c, s, rule)


def rel_l2(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


# ---- block quantization simulation on any shape, Hadamard (used by the model reference) -----
def block_sim(x, rule):
    """Quantize -> dequantize round trip along the last axis in groups of the rule's size, for
    any leading shape. A last group shorter than the rule's (K not a multiple of it) is its own
    group, exactly as if the row were zero-padded to a whole group (zeros change no amax)."""
    x = np.asarray(x, np.float64)
    g = RULES[rule][0]
    k = x.shape[-1]
    pad = (-k) % g
    rows = x.reshape(-1, k)
    if pad:
        rows = np.concatenate([rows, np.zeros((rows.shape[0], pad))], axis=1)
    return fp8_sim(rows, rule)[:, :k].reshape(x.shape)


def fp4_sim(x):
    """FP4 E2M1 simulation (rule fp4_32: groups of 32, scale 2^ceil(log2(amax/6)))."""
    return block_sim(x, "fp4_32")


def hadamard(n):
    """Sylvester-ordered Hadamard matrix H_n (H_1 = [1], H_2n = [[H, H], [H, -H]]), unnormalized."""
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    if h.shape[0] != n:
        raise ValueError(f"Hadamard size {n} is not a power of two")
    return h


def hadamard_rotate(x):
    """y = H_n x / sqrt(n) along the last axis (H is symmetric)."""
    x = np.asarray(x, np.float64)
    n = x.shape[-1]
    return x @ hadamard(n) * n**-0.5


def kernel_testdata():
    """$DSV4_KERNEL_TESTDATA, else testdata/kernels of the shared folder every test uses
    (TESTDATA: $DSV4_SHARED, default beside the checkout); without $DSV4_SHARED also a
    shared/ inside the checkout."""
    env = os.environ.get("DSV4_KERNEL_TESTDATA")
    cands = [env] if env else [os.path.join(TESTDATA, "kernels")]
    if not env and "DSV4_SHARED" not in os.environ:
        here = os.path.dirname(os.path.abspath(__file__))
        cands.append(os.path.join(here, "..", "..", "shared", "testdata", "kernels"))
    for d in cands:
        if os.path.isdir(d):
            return os.path.normpath(d)
    return None
