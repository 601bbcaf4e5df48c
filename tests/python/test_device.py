"""Device memory (dsv4.device) and device-resident attention on the cuda backend.

The host fallback of the memory API runs everywhere; the cuda cases skip with the library's
reason when no CUDA device is present (CI). On a GPU machine they check byte-exact round trips,
and a decode whose cache, indices and outputs stay in device memory across calls against the
FlashMLA golden vectors and a float64 evaluation of docs/contracts.md §6."""
import ctypes
import os

import numpy as np
import pytest

import oracles as o
from dsv4 import DSV4Error, device
from dsv4 import attention as A
from dsv4._lib import BF16, F32, I32, U8, ctx, lib

CUDA_OK, CUDA_WHY = device.available("cuda")
needs_cuda = pytest.mark.skipif(not CUDA_OK, reason=f"no CUDA device: {CUDA_WHY}")
KD = o.kernel_testdata()
golden = pytest.mark.skipif(KD is None, reason="testdata/kernels not found (set DSV4_SHARED or DSV4_KERNEL_TESTDATA)")


@pytest.mark.parametrize("backend", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_round_trip(backend, request):
    rng = o.rng(request.node.name)
    for shape, dt in (((1000, 3), np.float32), ((7, 513), np.uint16), ((0,), np.uint8), ((33,), np.int64)):
        a = (rng.standard_normal(shape) * 100).astype(dt)
        d = device.upload(a, backend)
        back = o.poison(shape, dt)
        assert d.download(back) is back
        assert np.array_equal(back.view(np.uint8), a.view(np.uint8))
        d.fill(0x5A)
        assert (d.download().view(np.uint8) == 0x5A).all()
        d.free()
    with pytest.raises(DSV4Error):
        device.upload(np.zeros(4, np.float32), backend).upload(np.zeros(5, np.float32))


def test_stream_api_on_the_cpu():
    """The stream of a context: NULL (the default) on a CPU backend; a handle is refused there,
    and the default context (NULL ctx) keeps its stream."""
    c = ctx("cpu")
    out = ctypes.c_void_p(12345)
    assert lib.dsv4_device_stream_get(c, ctypes.byref(out)) == 0 and out.value is None
    assert lib.dsv4_device_stream_set(c, None) == 0
    assert lib.dsv4_device_stream_set(c, ctypes.c_void_p(0x1000)) == 10  # DSV4_ERR_UNSUPPORTED
    assert "no streams" in lib.dsv4_last_error().decode()
    assert lib.dsv4_device_stream_get(c, ctypes.byref(out)) == 0 and out.value is None  # unchanged
    assert lib.dsv4_device_stream_set(None, None) == 1  # DSV4_ERR_INVALID_ARG
    assert lib.dsv4_device_stream_get(c, None) == 1


def test_kinds_and_info():
    assert device.device_kind("cpu") == 0
    assert device.info("cpu")["name"].startswith("host")
    if CUDA_OK:
        assert device.device_kind("cuda") == 1
        info = device.info("cuda")
        assert info["compute_major"] >= 9 and info["multiprocessors"] > 0 and info["total_memory"] > 0
    else:
        assert CUDA_WHY  # the reason is spelled out


def _dev_cache(arr, bs):
    d = device.upload(arr)
    kc = A.KVCache()
    kc.pages = d.tensor(U8)
    kc.block_size = bs
    return d, kc


@needs_cuda
@golden
def test_device_resident_decode_golden():
    # the cache and index data are uploaded once and reused by two calls; the outputs are
    # poisoned on the device first. Tolerances are the golden file's (README): rel L2 8e-3,
    # lse 1e-5 max(1, |lse|), exact zeros and +inf for the empty queries.
    d = np.load(os.path.join(KD, "sparse_decode_h64.npz"))
    T, H = d["q_bits"].shape[:2]
    bs = int(d["block_size"])
    keep = []
    cache_d, kc = _dev_cache(d["cache"], bs)
    q = device.upload(d["q_bits"])
    scopes = []
    for name in ("swa", "extra"):
        i = device.upload(d[f"{name}_indices"].astype(np.int32))
        ln = device.upload(d[f"{name}_lengths"].astype(np.int32))
        ti, tl = i.tensor(I32), ln.tensor(I32)
        keep += [i, ln, ti, tl]
        scopes.append(A.SparseScope(ctypes.pointer(kc), ctypes.pointer(ti), ctypes.pointer(tl)))
    sink = device.upload(d["attn_sink"].astype(np.float32))
    out = device.empty((T, H, 512), np.uint16)
    lse = device.empty((T, H), np.float32)
    nws = A.decode_workspace_bytes(T, H, 128, 256, backend="cuda")
    ws = device.empty((max(nws, 1),), np.uint8)
    c = ctx("cuda")
    tq, ts, to, tl, tw = q.tensor(BF16), sink.tensor(F32), out.tensor(BF16), lse.tensor(F32), ws.tensor(U8)
    want_o = o.bf16_decode(d["out_bits"])
    for _ in range(2):
        out.fill(0xFF)
        lse.fill(0xFF)
        st = lib.dsv4_sparse_mla_decode(c, ctypes.byref(tq), ctypes.byref(scopes[0]), ctypes.byref(scopes[1]),
                                        ctypes.byref(ts), float(d["softmax_scale"]), ctypes.byref(to),
                                        ctypes.byref(tl), ctypes.byref(tw) if nws else None)
        assert st == 0, lib.dsv4_last_error().decode()
        got_o, got_l = o.bf16_decode(out.download()), lse.download()
        assert o.rel_l2(got_o, want_o) <= 8e-3
        fin = np.isfinite(d["lse"])
        assert np.array_equal(np.isinf(got_l), ~fin) and (got_l[~fin] > 0).all()
        assert (np.abs(got_l[fin] - d["lse"][fin]) <= 1e-5 * np.maximum(1, np.abs(d["lse"][fin]))).all()
        assert (out.download()[[4, 6]] == 0).all()
    del keep, cache_d


@needs_cuda
# the large-T cases give each CTA several 64-entry blocks (the split plan splits less), which is the
# only way to exercise the warp-specialized kernel's multi-block pipeline and its cluster copies
@pytest.mark.parametrize("H,T,extra", [(1, 3, False), (22, 5, True), (64, 1, True), (128, 9, True),
                                       (64, 300, True), (100, 120, True), (128, 200, True), (192, 64, False)])
def test_decode_float64_oracle(H, T, extra, request):
    # docs/contracts.md §6 in float64 on the dequantized cache; relative L2 <= 8e-3 (BF16 P and output),
    # lse <= 1e-5 max(1, |lse|) (fp32 logits and sums)
    rng = o.rng(request.node.name)
    bs, pages, W, K = 64, 12, 128, 512
    cache = np.zeros((pages, A.page_bytes(bs)), np.uint8)
    codes = rng.integers(0, 256, (pages, bs, 448)).astype(np.uint8)
    codes[(codes & 0x7F) == 0x7F] ^= 1
    for p in range(pages):
        cache[p, :bs * 576].reshape(bs, 576)[:, :448] = codes[p]
        cache[p, :bs * 576].reshape(bs, 576)[:, 448:] = o.bf16_encode(
            rng.standard_normal((bs, 64)).astype(np.float32) * 0.5).view(np.uint8).reshape(bs, 128)
        cache[p, bs * 576:bs * 584].reshape(bs, 8)[:, :7] = rng.integers(112, 125, (bs, 7))
    slots = pages * bs
    dq = np.empty((slots, 512))
    for s in range(slots):
        p, r = divmod(s, bs)
        e = cache[p, r * 576:(r + 1) * 576]
        sc = cache[p, bs * 576 + 8 * r: bs * 576 + 8 * r + 7].astype(np.float64) - 127
        dq[s, :448] = o.e4m3_decode(e[:448]) * np.repeat(2.0 ** sc, 64)
        dq[s, 448:] = o.bf16_decode(e[448:].view(np.uint16))
    q = o.bf16_encode(rng.standard_normal((T, H, 512)).astype(np.float32) * 0.3)
    i0 = rng.integers(-3, slots + 3, (T, W)).astype(np.int32)
    i1 = rng.integers(-3, slots + 3, (T, K)).astype(np.int32)
    l0 = rng.integers(0, W + 1, T).astype(np.int32)
    l1 = rng.integers(0, K + 1, T).astype(np.int32)
    sink = rng.standard_normal(H).astype(np.float32)
    qf = o.bf16_decode(q)
    want_o, want_l = np.zeros((T, H, 512)), np.full((T, H), np.inf)
    for t in range(T):
        ent = [v for v in i0[t, :l0[t]] if 0 <= v < slots]
        if extra:
            ent += [v for v in i1[t, :l1[t]] if 0 <= v < slots]
        if not ent:
            continue
        k = dq[ent]
        s = (qf[t] @ k.T) * 512 ** -0.5
        m = s.max(1, keepdims=True)
        e = np.exp(s - m)
        lse = m[:, 0] + np.log(e.sum(1))
        want_l[t] = lse
        want_o[t] = (e @ k) / (e.sum(1) + np.exp(sink.astype(np.float64) - m[:, 0]))[:, None]
    out = o.poison((T, H, 512), np.uint16)
    lse = o.poison((T, H), np.float32)
    kw = dict(extra_cache=cache, extra_indices=i1, extra_lengths=l1, extra_block_size=bs) if extra else {}
    got_o, got_l = A.sparse_mla_decode(q, cache, i0, l0, bs, sink=sink, backend="cuda", out=out, lse=lse, **kw)
    assert o.rel_l2(o.bf16_decode(got_o), want_o) <= 8e-3
    fin = np.isfinite(want_l)
    assert np.array_equal(np.isinf(got_l), ~fin)
    assert (np.abs(got_l[fin] - want_l[fin]) <= 1e-5 * np.maximum(1, np.abs(want_l[fin]))).all()
    assert (got_o[~fin] == 0).all()
