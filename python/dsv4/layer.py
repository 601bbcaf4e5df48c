"""Layer ops (include/dsv4/layer.h): RMSNorm, mHC (hc_pre, hc_post, fused post+pre, hc_head),
the MoE router and the MoE block. BF16 arrays are uint16 bit patterns. Every function takes
`backend=` / `threads=` and optional `out=` buffers (left untouched when the call fails)."""
import ctypes

import numpy as np

from ._lib import c_struct
from ._lib import float_tensor, BF16, F32, I32, I64, DSV4Error, Tensor, as_array, check, ctx, lib, new_output, ptr, tensor
from .linear_ops import FORMATS, _weight_tensors


@c_struct("dsv4_ffn_weights")
class FfnWeights(ctypes.Structure):
    _fields_ = [("fmt", ctypes.c_int)] + [(n, ctypes.POINTER(Tensor)) for n in
                                          ("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale")]


@c_struct("dsv4_hc_site")
class HcSite(ctypes.Structure):
    _fields_ = [("fn", Tensor), ("scale", Tensor), ("base", Tensor), ("sinkhorn_iters", ctypes.c_int),
                ("eps", ctypes.c_float), ("norm_eps", ctypes.c_float)]


_P = ctypes.c_void_p
lib.dsv4_rms_norm.argtypes = [_P, _P, _P, ctypes.c_float, _P]
lib.dsv4_hc_pre.argtypes = [_P] * 6
lib.dsv4_hc_post.argtypes = [_P] * 6
lib.dsv4_hc_post_pre.argtypes = [_P] * 10
lib.dsv4_hc_head.argtypes = [_P] * 4
lib.dsv4_route.argtypes = [_P] * 6 + [ctypes.c_float, _P, _P]
lib.dsv4_swiglu.argtypes = [_P] * 4 + [ctypes.c_float, _P]
lib.dsv4_moe_workspace_size.argtypes = [_P, ctypes.c_int64, ctypes.c_int, ctypes.c_int, _P, _P,
                                        ctypes.POINTER(ctypes.c_size_t)]
lib.dsv4_moe.argtypes = [_P] * 5 + [ctypes.c_int, _P, ctypes.c_float, _P, _P, ctypes.c_size_t]


def _ref(t):
    return ctypes.byref(t) if t is not None else None


def _index_tensor(a, name):
    a = np.asarray(a)
    if a.dtype not in (np.int32, np.int64):
        raise DSV4Error(3, f"{name}: expected int32 or int64, got {a.dtype}")
    return a, tensor(a, I64 if a.dtype == np.int64 else I32)


def _out(out, shape, dtype):
    return new_output(shape, dtype) if out is None else out


def rms_norm(x, w=None, eps=1e-6, out_dtype="bf16", backend=None, threads=None, out=None):
    """Weighted (w given) or unweighted RMSNorm over the last axis of x (u16 BF16 or f32).
    Returns u16 BF16 (out_dtype "bf16") or f32 ("f32") of x's shape."""
    x, _ = float_tensor(x, "x")
    if x.ndim < 1 or x.shape[-1] == 0:
        raise DSV4Error(2, "rms_norm: x needs a non-empty last axis")
    if out_dtype not in ("bf16", "f32"):
        raise DSV4Error(1, f"rms_norm: out_dtype must be 'bf16' or 'f32', not {out_dtype!r}")
    ynp = np.uint16 if out_dtype == "bf16" else np.float32
    y = _out(out, x.shape, ynp)
    d = x.shape[-1]
    x2 = x.reshape(-1, d)
    y2 = y.reshape(-1, d)  # a view for any out= of x's shape with row-compatible strides
    if not np.shares_memory(y2, y) and y.size:
        raise DSV4Error(4, "rms_norm: out cannot be viewed as rows")
    tx = tensor(x2, BF16 if x2.dtype == np.uint16 else F32)
    ty = tensor(y2, BF16 if y2.dtype == np.uint16 else F32)
    tw = None
    if w is not None:
        w, tw = float_tensor(w, "w")
    check(lib.dsv4_rms_norm(ctx(backend, threads), ctypes.byref(tx), _ref(tw), eps, ctypes.byref(ty)))
    return y


def _site(fn, scale, base, iters, eps, norm_eps):
    keep = [as_array(fn, np.float32, "fn"), as_array(scale, np.float32, "scale"), as_array(base, np.float32, "base")]
    s = HcSite(tensor(keep[0], F32), tensor(keep[1], F32), tensor(keep[2], F32), iters, eps, norm_eps)
    return s, keep


def _streams(x, name):
    x = as_array(x, np.uint16, name)
    if x.ndim != 3:
        raise DSV4Error(2, f"{name}: expected [T, n, D] BF16 (u16) streams, got {x.ndim}-D")
    return x, tensor(x, BF16)


def hc_pre(x, fn, scale, base, iters=20, eps=1e-6, norm_eps=1e-6, backend=None, threads=None, out=None):
    """x u16 [T, n, D] -> (y u16 [T, D], post f32 [T, n], comb f32 [T, n, n])."""
    x, tx = _streams(x, "x")
    site, _keep = _site(fn, scale, base, iters, eps, norm_eps)
    T, n, D = x.shape
    y, post, comb = out if out is not None else (new_output((T, D), np.uint16), new_output((T, n), np.float32),
                                                  new_output((T, n, n), np.float32))
    check(lib.dsv4_hc_pre(ctx(backend, threads), ctypes.byref(site), ctypes.byref(tx), ctypes.byref(tensor(y, BF16)),
                          ctypes.byref(tensor(post, F32)), ctypes.byref(tensor(comb, F32))))
    return y, post, comb


def _post_inputs(x, residual, post, comb):
    x = as_array(x, np.uint16, "x")
    residual, tr = _streams(residual, "residual")
    post = as_array(post, np.float32, "post")
    comb = as_array(comb, np.float32, "comb")
    return (x, residual, post, comb), (tensor(x, BF16), tr, tensor(post, F32), tensor(comb, F32))


def hc_post(x, residual, post, comb, backend=None, threads=None, out=None):
    """new[t, k, d] = bf16(post[t, k]·x[t, d] + Σ_j comb[t, j, k]·residual[t, j, d]) -> u16 [T, n, D].
    out may be residual itself (in place)."""
    keep, ts = _post_inputs(x, residual, post, comb)
    o = _out(out, keep[1].shape, np.uint16)
    check(lib.dsv4_hc_post(ctx(backend, threads), *[ctypes.byref(t) for t in ts], ctypes.byref(tensor(o, BF16))))
    return o


def hc_post_pre(x, residual, post, comb, fn, scale, base, iters=20, eps=1e-6, norm_eps=1e-6, backend=None,
                threads=None, out=None):
    """hc_post then hc_pre of the next site in one call -> (streams u16 [T, n, D], y, post', comb')."""
    keep, ts = _post_inputs(x, residual, post, comb)
    site, _keep = _site(fn, scale, base, iters, eps, norm_eps)
    T, n, D = keep[1].shape
    if out is None:
        out = (new_output((T, n, D), np.uint16), new_output((T, D), np.uint16), new_output((T, n), np.float32),
               new_output((T, n, n), np.float32))
    s, y, p, c = out
    check(lib.dsv4_hc_post_pre(ctx(backend, threads), *[ctypes.byref(t) for t in ts], ctypes.byref(site),
                               ctypes.byref(tensor(s, BF16)), ctypes.byref(tensor(y, BF16)),
                               ctypes.byref(tensor(p, F32)), ctypes.byref(tensor(c, F32))))
    return s, y, p, c


def hc_head(x, fn, scale, base, eps=1e-6, norm_eps=1e-6, backend=None, threads=None, out=None):
    """x u16 [T, n, D], fn [n, n·D], scale [1], base [n] -> y u16 [T, D]."""
    x, tx = _streams(x, "x")
    site, _keep = _site(fn, scale, base, 1, eps, norm_eps)
    y = _out(out, (x.shape[0], x.shape[2]), np.uint16)
    check(lib.dsv4_hc_head(ctx(backend, threads), ctypes.byref(site), ctypes.byref(tx), ctypes.byref(tensor(y, BF16))))
    return y


def route(x, gate_w, bias, topk, route_scale, tid2eid=None, token_ids=None, backend=None, threads=None, out=None):
    """Router: x [T, D] and gate_w [E, D] (u16 BF16 or f32), bias f32 [E] or None; hash routing
    when tid2eid [V, topk] (int32/int64) and token_ids [T] are given -> (ids int32 [T, topk],
    weights f32 [T, topk])."""
    x, tx = float_tensor(x, "x")
    gate_w, tw = float_tensor(gate_w, "gate_w")
    tb = tt = tk = None
    if bias is not None:
        bias = as_array(bias, np.float32, "bias")
        tb = tensor(bias, F32)
    if tid2eid is not None:
        tid2eid, tt = _index_tensor(tid2eid, "tid2eid")
        if token_ids is None:
            raise DSV4Error(1, "route: hash routing (tid2eid) needs token_ids")
        token_ids, tk = _index_tensor(token_ids, "token_ids")
    T = x.shape[0] if x.ndim else 0
    ids, weights = out if out is not None else (new_output((T, topk), np.int32), new_output((T, topk), np.float32))
    check(lib.dsv4_route(ctx(backend, threads), ctypes.byref(tx), ctypes.byref(tw), _ref(tb), _ref(tt), _ref(tk),
                         route_scale, ctypes.byref(tensor(ids, I32)), ctypes.byref(tensor(weights, F32))))
    return ids, weights


def swiglu(g, u, limit=10.0, row_weights=None, backend=None, threads=None, out=None):
    """h = bf16(silu(min(g, L)) * clamp(u, -L, L) * row_weights[:, None]) for g, u u16 [rows, I]."""
    g = as_array(g, np.uint16, "g")
    u = as_array(u, np.uint16, "u")
    tw = None
    if row_weights is not None:
        row_weights = as_array(row_weights, np.float32, "row_weights")
        tw = tensor(row_weights, F32)
    h = _out(out, g.shape, np.uint16)
    check(lib.dsv4_swiglu(ctx(backend, threads), ctypes.byref(tensor(g, BF16)), ctypes.byref(tensor(u, BF16)),
                          _ref(tw), limit, ctypes.byref(tensor(h, BF16))))
    return h


def _ffn(expert, keep):
    """expert = (fmt, w1, s1, w3, s3, w2, s2) with weights/scales as for dsv4.linear."""
    if len(expert) != 7 or expert[0] not in FORMATS:
        raise DSV4Error(1, f"an expert is (fmt, w1, s1, w3, s3, w2, s2) with fmt one of {sorted(FORMATS)}")
    fmt = expert[0]
    ts = []
    for w, s in zip(expert[1::2], expert[2::2]):
        ts.extend(_weight_tensors(w, s, fmt))
    keep.append(ts)
    return FfnWeights(FORMATS[fmt], *[ctypes.pointer(t) if t is not None else None for t in ts])


def moe(x, ids, weights, experts, limit=10.0, shared=None, backend=None, threads=None, out=None):
    """MoE block: x u16 [T, D], ids int32 [T, topk], weights f32 [T, topk], experts a list of
    (fmt, w1, s1, w3, s3, w2, s2) (all one format and shape), shared one more or None
    -> y u16 [T, D]. The work space is allocated here (the C API takes the caller's)."""
    x = as_array(x, np.uint16, "x")
    ids = as_array(ids, np.int32, "ids")
    weights = as_array(weights, np.float32, "weights")
    if x.ndim != 2 or ids.ndim != 2:
        raise DSV4Error(2, "moe: x is [T, D] and ids [T, topk]")
    keep = []
    arr = (FfnWeights * len(experts))(*[_ffn(e, keep) for e in experts])
    sh = ctypes.byref(_ffn(shared, keep)) if shared is not None else None
    c = ctx(backend, threads)
    n = ctypes.c_size_t()
    check(lib.dsv4_moe_workspace_size(c, x.shape[0], ids.shape[1], len(experts), arr, sh, ctypes.byref(n)))
    ws = np.empty(n.value, np.uint8)
    y = _out(out, x.shape, np.uint16)
    check(lib.dsv4_moe(c, ctypes.byref(tensor(x, BF16)), ctypes.byref(tensor(ids, I32)),
                       ctypes.byref(tensor(weights, F32)), arr, len(experts), sh, limit,
                       ctypes.byref(tensor(y, BF16)), ptr(ws), ws.size))
    return y
