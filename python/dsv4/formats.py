"""Number formats (include/dsv4/formats.h): element codecs and block quantization rules."""
import ctypes

import numpy as np

from ._lib import (E8M0, F32, F8_E4M3, FP4X2, U8, DSV4Error, as_array, check, ctx, lib, new_output, ptr,
                   tensor)

_FMT = {"e4m3": 0, "bf16": 1, "e2m1": 2, "e8m0": 3}
RULES = {"kv64": 0, "act128": 1, "mx32": 2, "fp4_32": 3}
GROUPS = {"kv64": 64, "act128": 128, "mx32": 32, "fp4_32": 32}

lib.dsv4_encode_array.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
lib.dsv4_decode_array.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
for _f in ("dsv4_quantize", "dsv4_dequantize"):
    getattr(lib, _f).argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
lib.dsv4_dequantize_weight.argtypes = [ctypes.c_void_p] * 4
lib.dsv4_qrule_scale_byte.argtypes = [ctypes.c_int, ctypes.c_float]
lib.dsv4_qrule_scale_byte.restype = ctypes.c_uint8


def _encode(fmt, x, out_dtype, backend, threads):
    x = np.ascontiguousarray(as_array(x, np.float32, "x"))
    out = new_output(x.shape, out_dtype)
    check(lib.dsv4_encode_array(ctx(backend, threads), _FMT[fmt], ptr(x), x.size, ptr(out)))
    return out


def _decode(fmt, codes, in_dtype, backend, threads):
    codes = np.ascontiguousarray(as_array(codes, in_dtype, "codes"))
    out = new_output(codes.shape, np.float32)
    check(lib.dsv4_decode_array(ctx(backend, threads), _FMT[fmt], ptr(codes), codes.size, ptr(out)))
    return out


def e4m3_encode(x, backend=None, threads=None):
    """float32 array -> OCP E4M3FN codes (uint8): round to nearest even, saturating to +-448, NaN kept."""
    return _encode("e4m3", x, np.uint8, backend, threads)


def e4m3_decode(codes, backend=None, threads=None):
    """E4M3FN codes (uint8) -> float32, exactly."""
    return _decode("e4m3", codes, np.uint8, backend, threads)


def bf16_encode(x, backend=None, threads=None):
    """float32 array -> BF16 bit patterns (uint16), round to nearest even."""
    return _encode("bf16", x, np.uint16, backend, threads)


def bf16_decode(bits, backend=None, threads=None):
    """BF16 bit patterns (uint16) -> float32, exactly."""
    return _decode("bf16", bits, np.uint16, backend, threads)


def e2m1_encode(x, backend=None, threads=None):
    """float32 array -> E2M1 (FP4) codes, one per uint8 (0..15): round to nearest even on the FP4
    grid, saturating to +-6, NaN -> +0."""
    return _encode("e2m1", x, np.uint8, backend, threads)


def e2m1_decode(codes, backend=None, threads=None):
    """E2M1 codes (uint8 nibbles 0..15) -> float32, exactly."""
    codes = as_array(codes, np.uint8, "codes")
    if codes.size and codes.max() > 15:
        raise DSV4Error(5, "e2m1_decode: codes must be nibbles (0..15)")
    return _decode("e2m1", codes, np.uint8, backend, threads)


def e8m0_decode(codes, backend=None, threads=None):
    """UE8M0 scale bytes -> float32 2^(b-127) (255 is NaN)."""
    return _decode("e8m0", codes, np.uint8, backend, threads)


def scale_byte(rule, amax):
    """The scale byte `rule` gives a group whose max |x| is `amax`."""
    return int(lib.dsv4_qrule_scale_byte(_rule(rule), float(amax)))


def _rule(rule):
    if rule not in RULES:
        raise DSV4Error(1, f"unknown rule {rule!r}; one of {sorted(RULES)}")
    return RULES[rule]


def quantize(x, rule, backend=None, threads=None, out=None):
    """x f32 [rows, K] -> (codes u8 [rows, K], scales u8 [rows, K/G]). `out=(codes, scales)` may
    give the outputs (any row strides); they are untouched on error."""
    r = _rule(rule)
    x = as_array(x, np.float32, "x")
    if x.ndim != 2:
        raise DSV4Error(2, f"quantize: x must be 2-D [rows, K], got {x.ndim}-D")
    g = GROUPS[rule]
    if out is None:
        codes = new_output(x.shape, np.uint8)
        scales = new_output((x.shape[0], x.shape[1] // g), np.uint8)
    else:
        codes, scales = out
    tx, tc, ts = tensor(x, F32), tensor(codes, U8), tensor(scales, U8)
    check(lib.dsv4_quantize(ctx(backend, threads), r, ctypes.byref(tx), ctypes.byref(tc), ctypes.byref(ts)))
    return codes, scales


def dequantize(codes, scales, rule, backend=None, threads=None, out=None):
    """(codes u8 [rows, K], scales u8 [rows, K/G]) -> f32 [rows, K]."""
    r = _rule(rule)
    codes = as_array(codes, np.uint8, "codes")
    scales = as_array(scales, np.uint8, "scales")
    if codes.ndim != 2:
        raise DSV4Error(2, f"dequantize: codes must be 2-D [rows, K], got {codes.ndim}-D")
    x = new_output(codes.shape, np.float32) if out is None else out
    tx, tc, ts = tensor(x, F32), tensor(codes, U8), tensor(scales, U8)
    check(lib.dsv4_dequantize(ctx(backend, threads), r, ctypes.byref(tc), ctypes.byref(ts), ctypes.byref(tx)))
    return x


def dequantize_weight(w, scale, fmt, backend=None, threads=None):
    """FP8 [N, K] + E8M0 [ceil(N/128), ceil(K/128)] (fmt "fp8_b128") or packed FP4 [N, K/2] +
    E8M0 [N, K/32] (fmt "fp4") -> f32 [N, K]. Scales may be strided views."""
    w = as_array(w, np.uint8, "w")
    scale = as_array(scale, np.uint8, "scale")
    if fmt not in ("fp8_b128", "fp4"):
        raise DSV4Error(1, f"dequantize_weight: fmt must be 'fp8_b128' or 'fp4', not {fmt!r}")
    if w.ndim != 2:
        raise DSV4Error(2, "dequantize_weight: w must be 2-D")
    k = w.shape[1] * (2 if fmt == "fp4" else 1)
    out = new_output((w.shape[0], k), np.float32)
    tw = tensor(w, FP4X2 if fmt == "fp4" else F8_E4M3)
    check(lib.dsv4_dequantize_weight(ctx(backend, threads), ctypes.byref(tw), ctypes.byref(tensor(scale, E8M0)),
                                     ctypes.byref(tensor(out, F32))))
    return out


def fp4_pack(codes):
    """n E2M1 codes (one per byte, n even along the last axis) -> n/2 bytes, low nibble first."""
    c = np.ascontiguousarray(as_array(codes, np.uint8, "codes"))
    if c.shape[-1] % 2:
        raise DSV4Error(2, "fp4_pack: last dim must be even")
    out = new_output(c.shape[:-1] + (c.shape[-1] // 2,), np.uint8)
    lib.dsv4_fp4_pack.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    check(lib.dsv4_fp4_pack(ptr(c), c.size, ptr(out)))
    return out


def fp4_unpack(packed):
    """Packed FP4 bytes [..., n] -> one E2M1 code per byte [..., 2n] (the low nibble is the even element)."""
    p = np.ascontiguousarray(as_array(packed, np.uint8, "packed"))
    out = new_output(p.shape[:-1] + (p.shape[-1] * 2,), np.uint8)
    lib.dsv4_fp4_unpack.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    check(lib.dsv4_fp4_unpack(ptr(p), out.size, ptr(out)))
    return out
