"""Compressor and lightning indexer (include/dsv4/indexer.h). BF16 arrays are uint16 bit
patterns; packed FP4 (two E2M1 codes per byte, low nibble = even element) and UE8M0 scales are
uint8. Every function takes `backend=` / `threads=`; outputs given with `out=` are untouched
when the call fails. The compressor state arrays are updated in place."""
import ctypes

import numpy as np

from ._lib import c_struct
from ._lib import float_tensor, BF16, E8M0, F32, FP4X2, I32, I64, DSV4Error, as_array, check, ctx, lib, new_output, tensor

_P = ctypes.c_void_p
_KINDS = {"main": 0, "indexer": 1}


@c_struct("dsv4_compressor_desc")
class CompressorDesc(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("ratio", ctypes.c_int), ("dim", ctypes.c_int), ("eps", ctypes.c_float),
                ("fp8_sim", ctypes.c_int), ("overlap", ctypes.c_int), ("position", _P)]


@c_struct("dsv4_indexer_args")
class IndexerArgs(ctypes.Structure):
    _fields_ = [("q", _P), ("q_scales", _P), ("weights", _P), ("k", _P), ("k_scales", _P), ("positions", _P),
                ("ratio", ctypes.c_int)]


lib.dsv4_compressor_emit_count.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
lib.dsv4_compressor_emit_count.restype = ctypes.c_int64
lib.dsv4_compressor_state_init.argtypes = [_P, _P, _P]
lib.dsv4_compressor_forward.argtypes = [_P, _P, ctypes.c_int64] + [_P] * 9
lib.dsv4_indexer_q.argtypes = [_P] * 6
lib.dsv4_indexer_weights.argtypes = [_P, _P, ctypes.c_int, _P]
lib.dsv4_indexer_scores.argtypes = [_P] * 3
lib.dsv4_indexer_workspace_size.argtypes = [_P, ctypes.c_int64, ctypes.c_int64]
lib.dsv4_indexer_workspace_size.restype = ctypes.c_size_t
lib.dsv4_indexer_select.argtypes = [_P, _P, ctypes.c_int64, _P, _P, _P, ctypes.c_size_t]
lib.dsv4_indexer_topk.argtypes = [_P, _P, _P, ctypes.c_int64, _P, _P, _P, ctypes.c_size_t]


def _ref(t):
    return ctypes.byref(t) if t is not None else None


def _desc(kind, ratio, dim, overlap, eps=1e-6, fp8_sim=False):
    if kind not in _KINDS:
        raise DSV4Error(1, f"compressor kind must be 'main' or 'indexer', not {kind!r}")
    return CompressorDesc(_KINDS[kind], int(ratio), int(dim), float(eps), int(bool(fp8_sim)), _overlap(overlap))


def _overlap(overlap):
    if overlap is None or not isinstance(overlap, (bool, int, np.integer)):
        raise DSV4Error(1, f"compressor: overlap must be given as a bool (CSA True, HCA False), not {overlap!r}")
    return int(overlap)


def _coff(overlap):
    return 2 if _overlap(overlap) else 1


def compressor_emit_count(ratio, start_pos, n_tokens):
    """How many entries tokens start_pos .. start_pos+n_tokens-1 emit (the first is start_pos // ratio)."""
    n = lib.dsv4_compressor_emit_count(int(ratio), int(start_pos), int(n_tokens))
    if n < 0:
        raise DSV4Error(1, "compressor_emit_count: bad argument")
    return int(n)


def compressor_state(ratio, dim, kind="main", *, overlap):
    """A fresh state (state_kv, state_score): f32 [coff*ratio, coff*dim] of 0 and -inf
    (coff = 2 with overlapping windows, the CSA compressors; 1 without, HCA)."""
    c = _coff(overlap)
    skv = new_output((c * ratio, c * dim), np.float32)
    ss = new_output(skv.shape, np.float32)
    d = _desc(kind, ratio, dim, overlap)
    check(lib.dsv4_compressor_state_init(ctypes.byref(d), ctypes.byref(tensor(skv, F32)), ctypes.byref(tensor(ss, F32))))
    return skv, ss


def compressor_forward(kv, gate, ape, norm, rope, state_kv, state_score, start_pos, ratio, kind="main",
                       fp8_sim=False, packed=False, eps=1e-6, backend=None, threads=None, out=None, *, overlap):
    """Run tokens start_pos .. start_pos+n-1 (kv, gate: f32 [n, coff*d]) through the compressor
    (overlap: the overlapping windows of CSA layers, coff = 2; else coff = 1).
    Updates state_kv / state_score in place and returns the emitted entries:
      main:              u16 BF16 [m, d] (fp8_sim: after the FP8 round trip of dims 0..d-65);
      indexer, packed:   (codes u8 [m, d/2], scales u8 [m, d/32]) — indexer cache rows;
      indexer, unpacked: u16 BF16 [m, d] (the FP4-simulated values).
    `out` may give those arrays (any row stride, e.g. views of a cache)."""
    kv = as_array(kv, np.float32, "kv")
    gate = as_array(gate, np.float32, "gate")
    ape = as_array(ape, np.float32, "ape")
    rope = as_array(rope, np.float32, "rope")
    norm, tn = float_tensor(norm, "norm")
    if kv.ndim != 2:
        raise DSV4Error(2, "compressor_forward: kv must be 2-D [n, coff*d]")
    d = kv.shape[1] // _coff(overlap)
    desc = _desc(kind, ratio, d, overlap, eps, fp8_sim)
    m = compressor_emit_count(ratio, start_pos, kv.shape[0]) if start_pos >= 0 else 0
    pk = kind == "indexer" and packed
    if out is None:
        out = (new_output((m, d // 2), np.uint8), new_output((m, d // 32), np.uint8)) if pk else \
            new_output((m, d), np.uint16)
    if pk:
        to, ts = tensor(out[0], FP4X2), tensor(out[1], E8M0)
    else:
        to, ts = tensor(out, BF16), None
    check(lib.dsv4_compressor_forward(ctx(backend, threads), ctypes.byref(desc), int(start_pos),
                                      ctypes.byref(tensor(kv, F32)), ctypes.byref(tensor(gate, F32)),
                                      ctypes.byref(tensor(ape, F32)), ctypes.byref(tn), ctypes.byref(tensor(rope, F32)),
                                      ctypes.byref(tensor(state_kv, F32)), ctypes.byref(tensor(state_score, F32)),
                                      ctypes.byref(to), _ref(ts)))
    return out


def _positions(p):
    p = np.asarray(p)
    if p.dtype not in (np.int32, np.int64):
        raise DSV4Error(3, f"positions: expected int32 or int64, got {p.dtype}")
    return p, tensor(p, I64 if p.dtype == np.int64 else I32)


def indexer_q(q, positions, rope, packed=True, backend=None, threads=None, out=None):
    """Indexer queries u16 BF16 [T, H, d] -> RoPE (last 64 dims at positions) -> Hadamard -> FP4.
    Returns (codes u8 [T, H, d/2], scales u8 [T, H, d/32]) or, packed=False, u16 BF16 [T, H, d]."""
    q = as_array(q, np.uint16, "q")
    rope = as_array(rope, np.float32, "rope")
    positions, tp = _positions(positions)
    if q.ndim != 3:
        raise DSV4Error(2, "indexer_q: q must be 3-D [T, H, d]")
    t, h, d = q.shape
    if out is None:
        out = (new_output((t, h, d // 2), np.uint8), new_output((t, h, d // 32), np.uint8)) if packed else \
            new_output((t, h, d), np.uint16)
    to, ts = (tensor(out[0], FP4X2), tensor(out[1], E8M0)) if packed else (tensor(out, BF16), None)
    check(lib.dsv4_indexer_q(ctx(backend, threads), ctypes.byref(tensor(q, BF16)), ctypes.byref(tp),
                             ctypes.byref(tensor(rope, F32)), ctypes.byref(to), _ref(ts)))
    return out


def indexer_weights(proj, head_dim, backend=None, threads=None, out=None):
    """proj (u16 BF16 or f32 [T, H]) -> f32 [T, H] = bf16(proj * head_dim^-0.5 * H^-0.5)."""
    proj, tpj = float_tensor(proj, "proj")
    if proj.ndim != 2:
        raise DSV4Error(2, "indexer_weights: proj must be 2-D [T, H]")
    out = new_output(proj.shape, np.float32) if out is None else out
    check(lib.dsv4_indexer_weights(ctx(backend, threads), ctypes.byref(tpj), int(head_dim),
                                   ctypes.byref(tensor(out, F32))))
    return out


def _args(q_codes, q_scales, weights, k_codes, k_scales, positions, ratio):
    keep = [as_array(q_codes, np.uint8, "q_codes"), as_array(q_scales, np.uint8, "q_scales"),
            as_array(weights, np.float32, "weights"), as_array(k_codes, np.uint8, "k_codes"),
            as_array(k_scales, np.uint8, "k_scales")]
    pos, tp = _positions(positions)
    ts = [tensor(keep[0], FP4X2), tensor(keep[1], E8M0), tensor(keep[2], F32), tensor(keep[3], FP4X2),
          tensor(keep[4], E8M0), tp]
    a = IndexerArgs(*[ctypes.addressof(t) for t in ts], int(ratio))
    return a, (keep, pos, ts)


def indexer_scores(q_codes, q_scales, weights, k_codes, k_scales, positions, ratio=4, backend=None, threads=None,
                   out=None):
    """Scores f32 [T, N]: sum_h w[t,h] relu(q[t,h] . k[c]) for c < (positions[t]+1)//ratio, -inf beyond."""
    a, keep = _args(q_codes, q_scales, weights, k_codes, k_scales, positions, ratio)
    t, n = np.asarray(q_codes).shape[0], np.asarray(k_codes).shape[0]
    out = new_output((t, n), np.float32) if out is None else out
    check(lib.dsv4_indexer_scores(ctx(backend, threads), ctypes.byref(a), ctypes.byref(tensor(out, F32))))
    del keep
    return out


def _topk_outputs(t, topk, out):
    if out is None:
        return new_output((t, max(int(topk), 0)), np.int32), new_output(t, np.int32)
    return out


def workspace_size(tokens, topk, backend=None, threads=None):
    """Bytes of workspace indexer_select / indexer_topk need for `tokens` query rows and this topk."""
    return int(lib.dsv4_indexer_workspace_size(ctx(backend, threads), int(tokens), int(topk)))


def _workspace(tokens, topk, backend, threads):
    return np.empty(max(workspace_size(tokens, topk, backend, threads), 1), np.uint8)


def indexer_select(q_codes, q_scales, weights, k_codes, k_scales, positions, topk, ratio=4, backend=None,
                   threads=None, out=None):
    """Fused scores + streaming top-k: (indices i32 [T, topk], lengths i32 [T]); indices by decreasing
    score (equal scores: lower index first), -1 after lengths[t] = min(topk, n_t)."""
    a, keep = _args(q_codes, q_scales, weights, k_codes, k_scales, positions, ratio)
    t = np.asarray(q_codes).shape[0]
    idx, ln = _topk_outputs(t, topk, out)
    ws = _workspace(t, topk, backend, threads)
    check(lib.dsv4_indexer_select(ctx(backend, threads), ctypes.byref(a), int(topk), ctypes.byref(tensor(idx, I32)),
                                  ctypes.byref(tensor(ln, I32)), ws.ctypes.data, ws.nbytes))
    del keep
    return idx, ln


def indexer_topk(scores, topk, n_valid=None, backend=None, threads=None, out=None):
    """Top-k of f32 scores [T, N] over the first n_valid[t] (default N) entries of each row."""
    scores = as_array(scores, np.float32, "scores")
    if scores.ndim != 2:
        raise DSV4Error(2, "indexer_topk: scores must be 2-D [T, N]")
    tv = None
    if n_valid is not None:
        n_valid = as_array(n_valid, np.int32, "n_valid")
        tv = tensor(n_valid, I32)
    idx, ln = _topk_outputs(scores.shape[0], topk, out)
    ws = _workspace(scores.shape[0], topk, backend, threads)
    check(lib.dsv4_indexer_topk(ctx(backend, threads), ctypes.byref(tensor(scores, F32)), _ref(tv), int(topk),
                                ctypes.byref(tensor(idx, I32)), ctypes.byref(tensor(ln, I32)), ws.ctypes.data,
                                ws.nbytes))
    return idx, ln

