"""Data movement ops (include/dsv4/tensor_ops.h): embedding rows, the broadcast BF16 add, row
copies. BF16 arrays are uint16 bit patterns. Every function takes `backend=` / `threads=` and an
optional `out=` buffer (left untouched when the call fails)."""
import ctypes

import numpy as np

from ._lib import BF16, F32, I32, I64, U8, DSV4Error, as_array, check, ctx, lib, new_output, tensor

_P = ctypes.c_void_p
lib.dsv4_embed_rows.argtypes = [_P] * 4
lib.dsv4_add_bf16.argtypes = [_P] * 4
lib.dsv4_copy_rows.argtypes = [_P] * 4

# numpy dtype of a copy_rows array -> library dtype (a byte copy: any of one item size works)
_COPY_DTYPES = {np.dtype(np.float32): F32, np.dtype(np.uint16): BF16, np.dtype(np.int32): I32,
                np.dtype(np.int64): I64, np.dtype(np.uint8): U8}


def _ref(t):
    return ctypes.byref(t) if t is not None else None


def embed_rows(table, ids, copies=None, backend=None, threads=None, out=None):
    """out[t, j] = table[ids[t]]: table u16 [V, D], ids int32 [T] -> u16 [T, copies, D], or
    [T, D] when copies is None."""
    table = as_array(table, np.uint16, "table")
    ids = as_array(ids, np.int32, "ids")
    if table.ndim != 2 or ids.ndim != 1:
        raise DSV4Error(2, "embed_rows: table is [V, D] and ids [T]")
    shape = (ids.shape[0], table.shape[1]) if copies is None else (ids.shape[0], copies, table.shape[1])
    y = new_output(shape, np.uint16) if out is None else out
    check(lib.dsv4_embed_rows(ctx(backend, threads), ctypes.byref(tensor(table, BF16)), ctypes.byref(tensor(ids, I32)),
                              ctypes.byref(tensor(y, BF16))))
    return y


def add_bf16(a, b, backend=None, threads=None, out=None):
    """y[t, j] = bf16(a[t, j] + b[t]): a u16 [T, n, D] or [T, D], b u16 [T, D] -> y of a's shape
    (out=a: in place)."""
    a = as_array(a, np.uint16, "a")
    b = as_array(b, np.uint16, "b")
    y = new_output(a.shape, np.uint16) if out is None else out
    check(lib.dsv4_add_bf16(ctx(backend, threads), ctypes.byref(tensor(a, BF16)), ctypes.byref(tensor(b, BF16)),
                            ctypes.byref(tensor(y, BF16))))
    return y


def copy_rows(src, idx=None, backend=None, threads=None, out=None):
    """dst[i] = src[idx[i]] (idx int32 [n]) or dst = src (idx None): src [R, C] of float32, uint16
    (BF16), int32, int64 or uint8 -> dst [n, C] of src's dtype."""
    src = np.asarray(src)
    if src.dtype not in _COPY_DTYPES:
        raise DSV4Error(3, f"copy_rows: src dtype {src.dtype} is not one of {sorted(str(d) for d in _COPY_DTYPES)}")
    dt = _COPY_DTYPES[src.dtype]
    ti = None
    if idx is not None:
        idx = as_array(idx, np.int32, "idx")
        ti = tensor(idx, I32)
    n = src.shape[0] if idx is None or idx.ndim != 1 else idx.shape[0]
    y = new_output((n,) + src.shape[1:], src.dtype) if out is None else out
    if y.dtype != src.dtype:
        raise DSV4Error(3, f"copy_rows: out has dtype {y.dtype}, src {src.dtype}")
    check(lib.dsv4_copy_rows(ctx(backend, threads), ctypes.byref(tensor(src, dt)), _ref(ti),
                             ctypes.byref(tensor(y, dt))))
    return y
