"""Linear layers on quantized weights in their checkpoint layout (include/dsv4/linear.h).

Weights and scales are passed in their checkpoint dtypes as numpy arrays (any non-negative
strides; the last dim of x, weight and y must be contiguous):
  "fp8_b128"  weight u8 (E4M3) [N, K],      scale u8 (E8M0) [ceil(N/128), ceil(K/128)]
  "mxfp8"     weight u8 (E4M3) [N, K],      scale u8 (E8M0) [N, K/32]
  "fp4"       weight u8 (2 x E2M1) [N, K/2], scale u8 (E8M0) [N, K/32]
  "bf16"      weight u16 (BF16) [N, K],     scale None
  "f32"       weight f32 [N, K],            scale None
x is u16 (BF16 bits) or f32; the result is u16 (BF16 bits, out="bf16") or f32 (out="f32")."""
import ctypes

import numpy as np

from ._lib import BF16, E8M0, F32, F8_E4M3, FP4X2, DSV4Error, check, ctx, lib, new_output, tensor

FORMATS = {"fp8_b128": 0, "mxfp8": 1, "fp4": 2, "bf16": 3, "f32": 4}
_WEIGHT = {"fp8_b128": (np.uint8, F8_E4M3), "mxfp8": (np.uint8, F8_E4M3), "fp4": (np.uint8, FP4X2),
           "bf16": (np.uint16, BF16), "f32": (np.float32, F32)}
_OUT = {"bf16": (np.uint16, BF16), "f32": (np.float32, F32)}

lib.dsv4_linear_workspace_size.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                                           ctypes.POINTER(ctypes.c_size_t)]
lib.dsv4_linear.argtypes = [ctypes.c_void_p, ctypes.c_int] + [ctypes.c_void_p] * 6 + [ctypes.c_size_t]
lib.dsv4_grouped_linear.argtypes = [ctypes.c_void_p, ctypes.c_int] + [ctypes.c_void_p] * 5 + [ctypes.c_size_t]
lib.dsv4_linear_stage.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
lib.dsv4_linear_staged.argtypes = lib.dsv4_linear.argtypes


def _fmt(fmt):
    if fmt not in FORMATS:
        raise DSV4Error(1, f"unknown weight format {fmt!r}; one of {sorted(FORMATS)}")
    return FORMATS[fmt]


def _float_tensor(a, name):
    a = np.asarray(a)
    if a.dtype == np.uint16:
        return tensor(a, BF16)
    if a.dtype == np.float32:
        return tensor(a, F32)
    raise DSV4Error(3, f"{name}: expected uint16 (BF16 bits) or float32, got {a.dtype}")


def _weight_tensors(weight, scale, fmt):
    np_dt, dt = _WEIGHT[fmt]
    weight = np.asarray(weight)
    if weight.dtype != np_dt:
        raise DSV4Error(3, f"weight: {fmt} weights are {np.dtype(np_dt)}, got {weight.dtype}")
    tw = tensor(weight, dt)
    if scale is None:
        return tw, None
    scale = np.asarray(scale)
    if scale.dtype != np.uint8 and scale.dtype.name != "float8_e8m0fnu":
        raise DSV4Error(3, f"scale: expected uint8 (E8M0 bytes), got {scale.dtype}")
    return tw, tensor(scale.view(np.uint8), E8M0)


def workspace_size(fmt, rows, k, backend=None, threads=None):
    """Bytes of work space for `rows` rows of x of length k."""
    n = ctypes.c_size_t()
    check(lib.dsv4_linear_workspace_size(ctx(backend, threads), _fmt(fmt), rows, k, ctypes.byref(n)))
    return n.value


def _run(fn, fmt, x, weight, scale, y_shape, out, y, workspace, backend, threads, extra=()):
    f = _fmt(fmt)
    tx = _float_tensor(x, "x")
    tw, ts = _weight_tensors(weight, scale, fmt)
    if y is None:
        if out not in _OUT:
            raise DSV4Error(1, f"out must be 'bf16' or 'f32', not {out!r}")
        y = new_output(y_shape, _OUT[out][0])
    ty = _float_tensor(y, "y")
    if workspace is None:
        rows = int(np.prod(np.asarray(x).shape[:-1])) if np.asarray(x).ndim else 0
        workspace = np.empty(max(workspace_size(fmt, rows, np.asarray(x).shape[-1], backend, threads), 1), np.uint8)
    c = ctx(backend, threads)
    ref = ctypes.byref
    check(fn(c, f, ref(tx), ref(tw), ref(ts) if ts is not None else None, *extra, ref(ty),
             ctypes.c_void_p(workspace.ctypes.data), workspace.nbytes))
    return y


def linear_stage(x, fmt, workspace=None, backend=None, threads=None):
    """Quantize the rows of x [M, K] into a work space (uint8 array, made when None) for
    linear_staged with weights of `fmt` or of its staging family (fp8_b128 and fp4 share one,
    mxfp8 has its own); bf16/f32 stage nothing. Returns the work space."""
    x = np.asarray(x)
    if x.ndim != 2:
        raise DSV4Error(2, f"linear_stage: x must be 2-D [M, K], got {x.ndim}-D")
    f = _fmt(fmt)
    tx = _float_tensor(x, "x")
    if workspace is None:
        workspace = np.empty(max(workspace_size(fmt, x.shape[0], x.shape[1], backend, threads), 1), np.uint8)
    check(lib.dsv4_linear_stage(ctx(backend, threads), f, ctypes.byref(tx), ctypes.c_void_p(workspace.ctypes.data),
                                workspace.nbytes))
    return workspace


def linear_staged(x, weight, scale, fmt, workspace, out="bf16", bias=None, y=None, backend=None, threads=None):
    """linear() on the activations that linear_stage put in `workspace`: bit for bit the same
    result. For the quantized formats x gives only the shape [M, K] of the staged rows (its values
    are not read); bf16/f32 read x. A staging that does not match (rows, K, family, backend or ISA
    path) raises ValueError, y untouched. The call may rearrange the staging in place."""
    return _run_2d("linear_staged", lib.dsv4_linear_staged, x, weight, scale, fmt, out, bias, y, workspace, backend,
                   threads)


def _run_2d(name, fn, x, weight, scale, fmt, out, bias, y, workspace, backend, threads):
    x = np.asarray(x)
    if x.ndim != 2:
        raise DSV4Error(2, f"{name}: x must be 2-D [M, K], got {x.ndim}-D")
    n = np.asarray(weight).shape[0] if np.asarray(weight).ndim else 0
    tb = _float_tensor(bias, "bias") if bias is not None else None
    extra = (ctypes.byref(tb) if tb is not None else None,)
    return _run(fn, fmt, x, weight, scale, (x.shape[0], n), out, y, workspace, backend, threads, extra)


def linear(x, weight, scale, fmt, out="bf16", bias=None, y=None, workspace=None, backend=None, threads=None):
    """y [M, N] = x [M, K] . weight^T (+ bias [N], f32 or u16 BF16). `y` may be given (any row
    stride; its dtype then sets the output format); it is untouched on error."""
    return _run_2d("linear", lib.dsv4_linear, x, weight, scale, fmt, out, bias, y, workspace, backend, threads)


def grouped_linear(x, weight, scale, fmt, groups=None, out="bf16", y=None, workspace=None, backend=None,
                   threads=None):
    """y [T, G, R]: y[t, g] = x[t, g] . weight[g*R:(g+1)*R]^T with x [T, G, K] and the whole
    checkpoint weight [G*R, K] (FP4: [G*R, K/2]) and its scale."""
    x = np.asarray(x)
    if x.ndim != 3:
        raise DSV4Error(2, f"grouped_linear: x must be 3-D [T, G, K], got {x.ndim}-D")
    g = x.shape[1]
    if groups is not None and groups != g:
        raise DSV4Error(2, f"grouped_linear: groups={groups} but x has {g} groups")
    rows = np.asarray(weight).shape[0] if np.asarray(weight).ndim else 0
    if g == 0 or rows % g:
        raise DSV4Error(2, f"grouped_linear: weight rows {rows} are not a multiple of the {g} groups")
    return _run(lib.dsv4_grouped_linear, fmt, x, weight, scale, (x.shape[0], g, rows // g), out, y, workspace,
                backend, threads)
