"""Attention decode path (include/dsv4/attention.h): the paged FP8 KV cache (uint8
[num_pages, page_bytes], 584 bytes per entry), RoPE tables, the fused q-norm + RoPE + KV insert,
dequant-gather, the sparse MLA decode (FlashMLA semantics) and the inverse RoPE.

numpy in and out: BF16 as uint16 bits, the cache as uint8 [num_pages, page_bytes], slot mappings
and positions int64, attention indices and lengths int32. In-place arguments (q, cache, o) must
be writable numpy arrays. On a backend that computes in device memory (e.g. "cuda") the arrays
are copied to the device for the call and the results copied back, so the same calls and tests
run on every backend."""
import ctypes

import numpy as np

from ._lib import c_struct
from ._lib import (BF16, F32, I32, I64, U8, DSV4Error, Tensor, as_array, check, ctx, lib, new_output, tensor)

SCALE = 512 ** -0.5
ROPE_KINDS = {"plain": 0, "yarn": 1}
DEVICE_CPU = 0


@c_struct("dsv4_kv_cache")
class KVCache(ctypes.Structure):
    _fields_ = [("pages", Tensor), ("block_size", ctypes.c_int64)]


@c_struct("dsv4_sparse_scope")
class SparseScope(ctypes.Structure):
    _fields_ = [("cache", ctypes.POINTER(KVCache)), ("indices", ctypes.POINTER(Tensor)),
                ("lengths", ctypes.POINTER(Tensor))]


@c_struct("dsv4_rope_params")
class RopeParams(ctypes.Structure):
    _fields_ = [("theta", ctypes.c_double), ("factor", ctypes.c_double), ("original_max_pos", ctypes.c_double),
                ("beta_fast", ctypes.c_double), ("beta_slow", ctypes.c_double)]


_P = ctypes.c_void_p
lib.dsv4_kv_page_bytes.argtypes = [ctypes.c_int64]
lib.dsv4_kv_page_bytes.restype = ctypes.c_int64
lib.dsv4_rope_v4_params.argtypes = [ctypes.c_int]
lib.dsv4_rope_v4_params.restype = RopeParams
lib.dsv4_rope_frequencies.argtypes = [_P, _P]
lib.dsv4_rope_table.argtypes = [_P, _P, _P]
lib.dsv4_qnorm_rope_kv_insert.argtypes = [_P] * 7 + [ctypes.c_float]
lib.dsv4_kv_insert.argtypes = [_P] * 6
lib.dsv4_dequant_gather.argtypes = [_P] * 4
lib.dsv4_sparse_mla_decode_workspace.argtypes = [_P, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                                 ctypes.POINTER(ctypes.c_size_t)]
lib.dsv4_sparse_mla_decode.argtypes = [_P] * 5 + [ctypes.c_float] + [_P] * 3
lib.dsv4_sparse_attn_bf16.argtypes = [_P] * 6 + [ctypes.c_float] + [_P] * 3
lib.dsv4_inv_rope.argtypes = [_P] * 4


def page_bytes(block_size):
    """block_size * 584 rounded up to a multiple of 576."""
    n = lib.dsv4_kv_page_bytes(int(block_size))
    if n <= 0:
        raise DSV4Error(1, f"block_size {block_size} must be >= 1")
    return n


def new_cache(num_pages, block_size):
    """A zeroed cache pool uint8 [num_pages, page_bytes(block_size)]."""
    return np.zeros((num_pages, page_bytes(block_size)), np.uint8)


# ---- staging between numpy and the backend's memory -----------------------------------------
def _device_kind(c):
    fn = getattr(lib, "dsv4_ctx_device_kind", None)
    if fn is None:
        return DEVICE_CPU
    fn.argtypes = [_P]
    fn.restype = ctypes.c_int
    return fn(c)


class _Stage:
    """Tensor views of numpy arrays in the memory of the context's backend. On the CPU these are
    the arrays themselves; on a device, copies that `finish` brings back into the `out` arrays."""

    def __init__(self, c):
        self.c = c
        self.kind = _device_kind(c)
        self.allocated = []
        self.outs = []
        self.keep = []

    def view(self, arr, dtype, out=False):
        t = tensor(arr, dtype)
        self.keep.append(arr)  # the view points into arr: keep it alive until the call is done
        if self.kind == DEVICE_CPU:
            return t
        if not (arr.flags.c_contiguous or arr.size == 0):
            raise DSV4Error(4, "device staging needs contiguous arrays")
        for f in ("dsv4_device_tensor_alloc", "dsv4_device_upload", "dsv4_device_download",
                  "dsv4_device_tensor_free"):
            getattr(lib, f).argtypes = {"dsv4_device_tensor_alloc": [_P, _P, ctypes.c_int, ctypes.c_int, _P],
                                        "dsv4_device_tensor_free": [_P, _P]}.get(f, [_P, _P, _P, ctypes.c_size_t])
        d = Tensor()
        shape = (ctypes.c_int64 * 5)(*arr.shape)
        check(lib.dsv4_device_tensor_alloc(self.c, ctypes.byref(d), dtype, arr.ndim, shape))
        self.allocated.append(d)
        if arr.nbytes:
            check(lib.dsv4_device_upload(self.c, d.data, arr.ctypes.data, arr.nbytes))
        if out:
            self.outs.append((d, arr))
        return d

    def finish(self, status):
        """Bring the outputs back (device backends) and raise on a failed status."""
        if status == 0:
            for d, arr in self.outs:
                if arr.nbytes:
                    check(lib.dsv4_device_download(self.c, arr.ctypes.data, d.data, arr.nbytes))
        check(status)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for d in self.allocated:
            lib.dsv4_device_tensor_free(self.c, ctypes.byref(d))
        self.allocated = []
        return False


def _ref(x):
    return ctypes.byref(x) if x is not None else None


def _writable(a, name):
    if not isinstance(a, np.ndarray) or not a.flags.writeable:
        raise DSV4Error(1, f"{name} must be a writable numpy array (it is updated in place)")
    return a


def _cache(stage, cache, block_size, name="cache"):
    cache = as_array(cache, np.uint8, name)
    if cache.ndim != 2:
        raise DSV4Error(2, f"{name} must be uint8 [num_pages, page_bytes], got {cache.ndim}-D")
    kc = KVCache()
    kc.pages = stage.view(cache, U8, out=True)
    kc.block_size = int(block_size)
    return kc


# ---- RoPE -------------------------------------------------------------------------------------
def _kind(kind):
    if kind not in ROPE_KINDS:
        raise DSV4Error(1, f"unknown rope kind {kind!r}; one of {sorted(ROPE_KINDS)}")
    return ROPE_KINDS[kind]


def rope_frequencies(kind="plain"):
    """The 32 RoPE frequencies (float64) of a DeepSeek-V4 rope kind ("plain" or "yarn")."""
    p = lib.dsv4_rope_v4_params(_kind(kind))
    f = new_output(32, np.float64)
    check(lib.dsv4_rope_frequencies(ctypes.byref(p), f.ctypes.data))
    return f


def rope_table(max_pos, kind="plain", backend=None, threads=None):
    """f32 [max_pos, 64]: row p = cos(p*f_0..f_31) || sin(p*f_0..f_31)."""
    p = lib.dsv4_rope_v4_params(_kind(kind))
    if int(max_pos) < 0:
        raise DSV4Error(2, f"max_pos {max_pos} must be >= 0")
    out = new_output((int(max_pos), 64), np.float32)
    c = ctx(backend, threads)
    with _Stage(c) as st:
        t = st.view(out, F32, out=True)
        st.finish(lib.dsv4_rope_table(c, ctypes.byref(p), ctypes.byref(t)))
    return out


# ---- insert -----------------------------------------------------------------------------------
def qnorm_rope_kv_insert(q, kv, cache, slot_mapping, positions, rope, block_size, eps=1e-6, backend=None,
                         threads=None):
    """q u16 [N, H, 512] and cache updated in place; kv u16 [N, 512]; slot_mapping i64 [N_ins];
    positions i64 [N]; rope f32 [max_pos, 64]."""
    _writable(q, "q")
    _writable(cache, "cache")
    c = ctx(backend, threads)
    with _Stage(c) as st:
        args = [st.view(as_array(q, np.uint16, "q"), BF16, out=True), st.view(as_array(kv, np.uint16, "kv"), BF16),
                _cache(st, cache, block_size), st.view(as_array(slot_mapping, np.int64, "slot_mapping"), I64),
                st.view(as_array(positions, np.int64, "positions"), I64),
                st.view(as_array(rope, np.float32, "rope"), F32)]
        st.finish(lib.dsv4_qnorm_rope_kv_insert(c, *[ctypes.byref(a) for a in args], float(eps)))


def kv_insert(kv, cache, slot_mapping, block_size, positions=None, rope=None, backend=None, threads=None):
    """The KV side alone; without positions/rope the rows are inserted as they are."""
    _writable(cache, "cache")
    c = ctx(backend, threads)
    with _Stage(c) as st:
        tkv = st.view(as_array(kv, np.uint16, "kv"), BF16)
        kc = _cache(st, cache, block_size)
        ts = st.view(as_array(slot_mapping, np.int64, "slot_mapping"), I64)
        tp = st.view(as_array(positions, np.int64, "positions"), I64) if positions is not None else None
        tr = st.view(as_array(rope, np.float32, "rope"), F32) if rope is not None else None
        st.finish(lib.dsv4_kv_insert(c, ctypes.byref(tkv), ctypes.byref(kc), ctypes.byref(ts), _ref(tp), _ref(tr)))


def _i32(x, name):
    a = np.asarray(x)
    if a.dtype == np.int32:
        return a
    if a.dtype.kind not in "iu":
        raise DSV4Error(3, f"{name}: expected an integer array, got {a.dtype}")
    if a.size and (a.min() < -2**31 or a.max() >= 2**31):
        raise DSV4Error(5, f"{name}: values do not fit in int32")
    return a.astype(np.int32)


def dequant_gather(cache, slots, block_size, backend=None, threads=None, out=None):
    """u16 [S, 512]: the dequantized entries at slots (negative -> zeros)."""
    slots = _i32(slots, "slots")
    if out is None:
        out = new_output((slots.shape[0] if slots.ndim == 1 else 0, 512), np.uint16)
    c = ctx(backend, threads)
    with _Stage(c) as st:
        kc = _cache(st, cache, block_size)
        ts, to = st.view(slots, I32), st.view(out, BF16, out=True)
        st.finish(lib.dsv4_dequant_gather(c, ctypes.byref(kc), ctypes.byref(ts), ctypes.byref(to)))
    return out


# ---- sparse decode ----------------------------------------------------------------------------
def decode_workspace_bytes(t, h, width, extra_width=0, backend=None, threads=None):
    """Bytes of scratch sparse_mla_decode needs for t queries of h heads whose scopes have
    `width` + `extra_width` index columns, on the backend."""
    n = ctypes.c_size_t()
    check(lib.dsv4_sparse_mla_decode_workspace(ctx(backend, threads), int(t), int(h), int(width), int(extra_width),
                                               ctypes.byref(n)))
    return n.value


def _decode_io(st, q, sink, out, lse, ws_bytes):
    q = as_array(q, np.uint16, "q")
    if q.ndim != 3:
        raise DSV4Error(2, f"q must be u16 [T, H, 512], got {q.ndim}-D")
    T, H = q.shape[0], q.shape[1]
    out = new_output(q.shape, np.uint16) if out is None else out
    lse = new_output((T, H), np.float32) if lse is None else lse
    ws = np.empty(ws_bytes, np.uint8)
    tq = st.view(q, BF16)
    ts = st.view(as_array(sink, np.float32, "sink"), F32) if sink is not None else None
    to, tl, tw = st.view(out, BF16, out=True), st.view(lse, F32, out=True), st.view(ws, U8)
    return tq, ts, to, tl, tw, out, lse


def sparse_mla_decode(q, cache, indices, lengths, block_size, extra_cache=None, extra_indices=None, extra_lengths=None,
                      extra_block_size=None, sink=None, scale=SCALE, backend=None, threads=None, out=None, lse=None):
    """-> (o u16 [T, H, 512], lse f32 [T, H]). q u16 [T, H, 512]; indices i32 [T, W] with lengths
    i32 [T] (None: all W) into cache; optionally a second (compressed) scope; sink f32 [H]."""
    c = ctx(backend, threads)
    idx = _i32(indices, "indices")
    has_extra = extra_indices is not None
    if has_extra and (extra_cache is None or extra_block_size is None):
        raise DSV4Error(1, "the extra scope needs extra_cache and extra_block_size")
    xidx = _i32(extra_indices, "extra_indices") if has_extra else None
    T, H = _th(q)
    ws_bytes = decode_workspace_bytes(T, H, _width(idx), _width(xidx) if has_extra else 0, backend, threads)
    with _Stage(c) as st:
        tq, ts, to, tl, tw, out, lse = _decode_io(st, q, sink, out, lse, ws_bytes)
        keep, ptrs = [], []
        for cc, ii, ll, bs in ((cache, idx, lengths, block_size), (extra_cache, xidx, extra_lengths,
                                                                   extra_block_size))[:1 + has_extra]:
            kc = _cache(st, cc, bs)
            ti = st.view(ii, I32)
            tln = st.view(_i32(ll, "lengths"), I32) if ll is not None else None
            sc = SparseScope(ctypes.pointer(kc), ctypes.pointer(ti), ctypes.pointer(tln) if tln is not None else None)
            keep += [kc, ti, tln]
            ptrs.append(sc)
        st.finish(lib.dsv4_sparse_mla_decode(c, ctypes.byref(tq), ctypes.byref(ptrs[0]),
                                             ctypes.byref(ptrs[1]) if has_extra else None, _ref(ts), float(scale),
                                             ctypes.byref(to), ctypes.byref(tl), ctypes.byref(tw)))
    return out, lse


def _th(q):
    a = np.asarray(q)
    return (a.shape[0], max(a.shape[1], 1)) if a.ndim == 3 else (0, 1)


def _width(idx):
    return idx.shape[-1] if idx is not None and idx.ndim == 2 else 0


def sparse_attn_bf16(q, kv, indices, lengths=None, sink=None, scale=SCALE, backend=None, threads=None, out=None,
                     lse=None):
    """The two-pass design's second pass (docs/kernels.md §3.4): attention over BF16 rows kv u16
    [R, 512] at indices i32 [T, P]."""
    c = ctx(backend, threads)
    idx = _i32(indices, "indices")
    T, H = _th(q)
    ws_bytes = decode_workspace_bytes(T, H, _width(idx), 0, backend, threads)
    with _Stage(c) as st:
        tq, ts, to, tl, tw, out, lse = _decode_io(st, q, sink, out, lse, ws_bytes)
        tkv = st.view(as_array(kv, np.uint16, "kv"), BF16)
        ti = st.view(idx, I32)
        tln = st.view(_i32(lengths, "lengths"), I32) if lengths is not None else None
        st.finish(lib.dsv4_sparse_attn_bf16(c, ctypes.byref(tq), ctypes.byref(tkv), ctypes.byref(ti), _ref(tln),
                                            _ref(ts), float(scale), ctypes.byref(to), ctypes.byref(tl),
                                            ctypes.byref(tw)))
    return out, lse


def inv_rope(o, positions, rope, backend=None, threads=None):
    """o u16 [T, H, 512] in place: dims 448..511 rotated back by the angle of positions[t]."""
    _writable(o, "o")
    c = ctx(backend, threads)
    with _Stage(c) as st:
        to = st.view(as_array(o, np.uint16, "o"), BF16, out=True)
        tp = st.view(as_array(positions, np.int64, "positions"), I64)
        tr = st.view(as_array(rope, np.float32, "rope"), F32)
        st.finish(lib.dsv4_inv_rope(c, ctypes.byref(to), ctypes.byref(tp), ctypes.byref(tr)))
