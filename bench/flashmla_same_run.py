#!/usr/bin/env python3
"""FlashMLA's SM90 sparse FP8 decode (MODEL1 = DeepSeek-V4 KV format) and dsv4's CUDA sparse MLA
decode, side by side in ONE process on the same inputs with ONE timing method (docs/kernels.md
§12.1; the numbers are in BENCHMARKS.md, "CUDA sparse decode vs FlashMLA, same run").

This is the project's own timing script. It needs a GPU machine with PyTorch and nvcc, this
repository's build (libdsv4.so) and FlashMLA's sources reduced to the SM90 sparse decode, unpacked
into SRC from their .tar.xz (tests/gpu/run_gpu_tests.sh step `peer` unpacks the tarball found in
$DSV4_PEER_FLASHMLA and runs this script). No FlashMLA code is part of the repository.

  python3 bench/flashmla_same_run.py --build-only SRC        # build the extension (~40 s, 16 cores)
  python3 bench/flashmla_same_run.py SRC REPO_ROOT LIBDSV4   # check and time; tables under $OUT

Timing (the method of dsv4's `bench attention-cuda`, applied to both): per shape, NSETS = 8 calls
over 8 different random index sets drawn from one 613 MB page pool (16384 pages x 64 entries,
page stride 37440 B, i.e. far larger than the 60 MB L2), captured in one CUDA graph per
implementation; one warm-up replay, then 5 timed replays (CUDA events around each replay),
median / 8 = microseconds per call. Both implementations read the SAME pool bytes, the SAME q,
sink and index tensors (the page layout of dsv4 and FlashMLA's MODEL1 is the same), and both are
given full per-row lengths (topk_length / extra_topk_length; dsv4 lengths) and the sink. Two
passes over all shapes; pass 2 times the implementations in the reverse order.

FlashMLA is called through its own Python wrapper (flash_mla_with_kvcache) on the reduced SM90
extension; "reused" = one FlashMLASchedMeta per shape initialised by an eager call before capture
(so the graph holds split-KV + combine only), "fresh" (timed too with FMLA_FRESH=1) = a new
FlashMLASchedMeta for every call (each call also runs get_mla_metadata_kernel). dsv4 is called
through its C API (dsv4_sparse_mla_decode) with ctypes on torch-owned device memory, its context
stream set to the capture stream.

Environment: OUT (the folder of same_run.log and results.json), FMLA_BUILD (the extension's build
folder), DSV4_VARIANTS="w1;w2" (one more dsv4 context per word, created with $DSV4_CUDA_DECODE set
to it, i.e. a cuda_decode option such as "v1" or "no-pdl" (include/dsv4/core.h), each timed on the
decode shapes in the same process as the default; with DSV4_VARIANTS_ALL=1 on the MODEL1 shapes too), FMLA_PROFILE=1 (after the timing, the kernels of
one replay of a few shapes and their device times, through torch.profiler).
"""
import ctypes
import importlib.util
import json
import os
import statistics
import sys
import time
import types

import tempfile
OUT = os.environ.get("OUT") or os.path.join(tempfile.gettempdir(), "flashmla-same-run")
os.makedirs(OUT, exist_ok=True)
_log = open(os.path.join(OUT, "same_run.log"), "a")


def P(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    _log.write(s + "\n")
    _log.flush()


# ---------------------------------------------------------------------------------------------
# dsv4 through its C API (pointers + the context's device kind; no staging copies)
class Dsv4:
    def __init__(self, root, libpath, backend):
        os.environ["DSV4_LIB"] = libpath
        sys.path.insert(0, os.path.join(root, "python"))
        from dsv4 import _lib, attention, device  # noqa: F401  (device sets the stream argtypes)
        self.L, self.A, self.lib = _lib, attention, _lib.lib
        self.ctx = _lib.ctx(backend)
        self.kind = self.lib.dsv4_ctx_device_kind(self.ctx)
        self.lib.dsv4_kv_cache_view.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                                ctypes.c_int, ctypes.c_int]
        self.lib.dsv4_version.restype = ctypes.c_char_p

    def tensor(self, ptr, dtype, shape, strides=None):
        t = self.L.Tensor()
        t.data = ptr
        t.dtype = dtype
        t.ndim = len(shape)
        if strides is None:
            strides, s = [], 1
            for d in reversed(shape):
                strides.insert(0, s)
                s *= d
        for i, (d, st) in enumerate(zip(shape, strides)):
            t.shape[i] = int(d)
            t.stride[i] = int(st)
        t.device = self.kind
        t.device_index = 0
        return t

    def cache(self, ptr, num_pages, block_size):
        kc = self.A.KVCache()
        self.L.check(self.lib.dsv4_kv_cache_view(ctypes.byref(kc), ptr, num_pages, block_size, self.kind, 0))
        return kc

    def workspace_bytes(self, t, h, w, k):
        n = ctypes.c_size_t()
        self.L.check(self.lib.dsv4_sparse_mla_decode_workspace(self.ctx, t, h, w, k, ctypes.byref(n)))
        return n.value

    def graph(self, calls):
        """dsv4's own graph API (what `dsv4 bench attention-cuda` uses): capture `calls`, return a replay."""
        lib, check = self.lib, self.L.check
        for fn, at in (("dsv4_device_graph_begin", [ctypes.c_void_p]),
                       ("dsv4_device_graph_end", [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]),
                       ("dsv4_device_graph_launch", [ctypes.c_void_p]), ("dsv4_device_graph_destroy", [ctypes.c_void_p])):
            getattr(lib, fn).argtypes = at
        check(lib.dsv4_device_graph_begin(self.ctx))
        for c in calls:
            c()
        gp = ctypes.c_void_p()
        check(lib.dsv4_device_graph_end(self.ctx, ctypes.byref(gp)))
        return (lambda: check(lib.dsv4_device_graph_launch(gp))), (lambda: lib.dsv4_device_graph_destroy(gp))

    def stream_set(self, stream):
        self.L.check(self.lib.dsv4_device_stream_set(self.ctx, ctypes.c_void_p(stream)))

    def call(self, q, t, h, cache, i0, w, ld0, len0, i1, k, ld1, len1, sink, out, lse, ws, ws_bytes, scale):
        """A closure doing one dsv4_sparse_mla_decode; every argument is a device pointer (or None)."""
        BF16, F32, I32, U8 = self.L.BF16, self.L.F32, self.L.I32, self.L.U8
        tq = self.tensor(q, BF16, (t, h, 512))
        to = self.tensor(out, BF16, (t, h, 512))
        tl = self.tensor(lse, F32, (t, h))
        tsk = self.tensor(sink, F32, (h,)) if sink else None
        tw = self.tensor(ws, U8, (max(ws_bytes, 1),))
        ti0 = self.tensor(i0, I32, (t, w), (ld0, 1))
        tn0 = self.tensor(len0, I32, (t,)) if len0 else None
        s0 = self.A.SparseScope(ctypes.pointer(cache), ctypes.pointer(ti0),
                                ctypes.pointer(tn0) if tn0 is not None else None)
        s1 = None
        if k:
            ti1 = self.tensor(i1, I32, (t, k), (ld1, 1))
            tn1 = self.tensor(len1, I32, (t,)) if len1 else None
            s1 = self.A.SparseScope(ctypes.pointer(cache), ctypes.pointer(ti1),
                                    ctypes.pointer(tn1) if tn1 is not None else None)
            keep_x = [ti1, tn1]
        else:
            keep_x = []
        keep = [tq, to, tl, tsk, tw, ti0, tn0, s0, s1, cache] + keep_x
        args = (self.ctx, ctypes.byref(tq), ctypes.byref(s0), ctypes.byref(s1) if s1 is not None else None,
                ctypes.byref(tsk) if tsk is not None else None, ctypes.c_float(scale), ctypes.byref(to),
                ctypes.byref(tl), ctypes.byref(tw))
        lib, check = self.lib, self.L.check

        def f():
            check(lib.dsv4_sparse_mla_decode(*args))
        f.keep = keep
        return f


# ---------------------------------------------------------------------------------------------
def build_flashmla(src, build_dir):
    from torch.utils.cpp_extension import load
    nvcc = ["-O3", "-std=c++20", "-DNDEBUG", "-D_USE_MATH_DEFINES", "-Wno-deprecated-declarations",
            "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__",
            "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "--expt-relaxed-constexpr", "--expt-extended-lambda",
            "--use_fast_math",
            "--ptxas-options=-v,--register-usage-level=10,--warn-on-spills,--warn-on-local-memory-usage,"
            "--warn-on-double-precision-use",
            "-lineinfo", "--source-in-ptx", "-gencode", "arch=compute_90a,code=sm_90a", "--threads", "32"]
    c = os.path.join(src, "csrc")
    srcs = [os.path.join(c, p) for p in (
        "api/api_sm90.cpp",
        "smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu",
        "smxx/decode/combine/combine.cu",
        "sm90/decode/sparse_fp8/instantiations/model1_persistent_h64.cu",
        "sm90/decode/sparse_fp8/instantiations/model1_persistent_h128.cu")]
    inc = [c, os.path.join(c, "kerutils", "include"), os.path.join(c, "sm90"),
           os.path.join(c, "cutlass", "include"), os.path.join(c, "cutlass", "tools", "util", "include")]
    os.makedirs(build_dir, exist_ok=True)
    t0 = time.time()
    ext = load(name="flash_mla_sm90", sources=srcs, extra_cflags=["-O3", "-std=c++20", "-DNDEBUG",
                                                                  "-Wno-deprecated-declarations"],
               extra_cuda_cflags=nvcc, extra_include_paths=inc, build_directory=build_dir, verbose=True)
    P(f"flashmla extension ready in {time.time() - t0:.1f} s")
    pkg = types.ModuleType("flash_mla")
    pkg.__path__ = []
    pkg.cuda = ext
    sys.modules["flash_mla"] = pkg
    sys.modules["flash_mla.cuda"] = ext
    spec = importlib.util.spec_from_file_location("flash_mla.flash_mla_interface",
                                                  os.path.join(src, "flash_mla", "flash_mla_interface.py"))
    fmi = importlib.util.module_from_spec(spec)
    sys.modules["flash_mla.flash_mla_interface"] = fmi
    spec.loader.exec_module(fmi)
    spec = importlib.util.spec_from_file_location("fmla_quant", os.path.join(src, "tests", "quant.py"))
    quant = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quant)
    return fmi, quant


# ---------------------------------------------------------------------------------------------
def main():
    import torch
    src, dsv4_root, dsv4_lib = sys.argv[1], sys.argv[2], sys.argv[3]
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(0)
    res = {"device": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
           "torch_cuda": torch.version.cuda, "l2_bytes": getattr(props, "L2_cache_size", None)}
    P("device", res)
    fmi, quant = build_flashmla(src, os.environ.get("FMLA_BUILD", os.path.join(tempfile.gettempdir(), "flashmla-build")))
    D = Dsv4(dsv4_root, dsv4_lib, "cuda")
    res["dsv4_version"] = D.lib.dsv4_version().decode()

    NSETS, BS, NPAGES, WMAX, KMAX, TMAX, HMAX = 8, 64, 16384, 128, 1024, 256, 128
    PB = D.lib.dsv4_kv_page_bytes(BS)
    assert PB == 37440, PB
    SLOTS = NPAGES * BS
    SCALE = 512 ** -0.5
    g = torch.Generator(device=dev)
    g.manual_seed(20261201)

    # --- the page pool: random valid MODEL1 bytes (no NaN codes, scale bytes 117..123, rope ~U(-.5,.5))
    pool = torch.randint(0, 256, (NPAGES, PB), dtype=torch.uint8, device=dev, generator=g)
    data = pool[:, :BS * 576].view(NPAGES, BS, 576)
    nope = data[:, :, :448]
    nope.bitwise_xor_(((nope & 0x7F) == 0x7F).to(torch.uint8))
    data[:, :, 448:].view(torch.bfloat16).copy_(
        (torch.rand((NPAGES, BS, 64), device=dev, generator=g) - 0.5).to(torch.bfloat16))
    sc = pool[:, BS * 576:BS * 584].view(NPAGES, BS, 8)
    sc[:, :, :7] = 117 + sc[:, :, :7] % 7
    sc[:, :, 7] = 0
    kc_fm = pool.as_strided((NPAGES, BS, 1, 584), (PB, 584, 584, 1))
    kc_d = D.cache(pool.data_ptr(), NPAGES, BS)
    P(f"pool {pool.numel() / 1e6:.0f} MB, page stride {PB} B, {SLOTS} slots")

    qbuf = (torch.rand(TMAX * HMAX * 512, device=dev, generator=g) - 0.5).to(torch.bfloat16)
    sink = (torch.rand(HMAX, device=dev, generator=g) * 2 - 1).float()
    idx0 = torch.randint(0, SLOTS, (NSETS, TMAX, WMAX), dtype=torch.int32, device=dev, generator=g)
    idx1 = torch.randint(0, SLOTS, (NSETS, TMAX, KMAX), dtype=torch.int32, device=dev, generator=g)
    len_w = torch.full((TMAX,), WMAX, dtype=torch.int32, device=dev)
    lens_k = {k: torch.full((TMAX,), k, dtype=torch.int32, device=dev) for k in (512, 1024)}
    len_w128 = torch.full((TMAX,), 128, dtype=torch.int32, device=dev)
    d_out = torch.empty(TMAX * HMAX * 512, dtype=torch.bfloat16, device=dev)
    d_lse = torch.empty(TMAX * HMAX, dtype=torch.float32, device=dev)

    shapes = []  # (section, h, s_q, b, W, K)
    for K in (512, 0):
        for T in (1, 8, 64, 128):
            shapes.append(("decode", 64, 1, T, 128, K))
    for h in (64, 128):
        for K in (512, 1024):
            for b in (64, 128):
                shapes.append(("model1", h, 2, b, 128, K))
    wsmax = max(D.workspace_bytes(b * s_q, h, W, K) for _, h, s_q, b, W, K in shapes)
    ws = torch.empty(max(wsmax, 256), dtype=torch.uint8, device=dev)
    P(f"dsv4 workspace {wsmax} B")

    stream = torch.cuda.Stream()
    D.stream_set(stream.cuda_stream)
    # DSV4_VARIANTS="w1;w2": more dsv4 contexts, each with $DSV4_CUDA_DECODE = one of the words
    import copy
    VARS = [v for v in os.environ.get("DSV4_VARIANTS", "").split(";") if v]
    DV = {}
    saved = os.environ.get("DSV4_CUDA_DECODE")
    for v in VARS:
        os.environ["DSV4_CUDA_DECODE"] = v
        Dv = copy.copy(D)
        Dv.ctx = D.L.ctx("cuda")
        Dv.stream_set(stream.cuda_stream)
        DV[v] = Dv
    if saved is None:
        os.environ.pop("DSV4_CUDA_DECODE", None)
    else:
        os.environ["DSV4_CUDA_DECODE"] = saved
    P("variants", VARS)

    def fm_calls(h, s_q, b, W, K, meta_mode):
        T = b * s_q
        q = qbuf[:T * h * 512].view(b, s_q, h, 512)
        lenb_w = len_w128[:b]
        lenb_k = lens_k[K][:b] if K else None
        shared = [fmi.get_mla_metadata()[0]]
        calls = []
        for s in range(NSETS):
            i0 = idx0[s, :T, :W].view(b, s_q, W)
            i1 = idx1[s, :T, :K].reshape(b, s_q, K) if K else None  # a view: row stride KMAX

            def f(i0=i0, i1=i1):
                meta = shared[0] if meta_mode == "reused" else fmi.get_mla_metadata()[0]
                return fmi.flash_mla_with_kvcache(
                    q, kc_fm, None, None, 512, meta, None, softmax_scale=SCALE, is_fp8_kvcache=True,
                    indices=i0, attn_sink=sink[:h], extra_k_cache=kc_fm if K else None,
                    extra_indices_in_kvcache=i1, topk_length=lenb_w, extra_topk_length=lenb_k)
            calls.append(f)
        return calls

    def d_calls(h, s_q, b, W, K, with_lens=True, Dx=None):
        T = b * s_q
        calls = []
        for s in range(NSETS):
            calls.append((Dx or D).call(qbuf.data_ptr(), T, h, kc_d, idx0[s].data_ptr(), W, WMAX,
                                len_w128.data_ptr() if with_lens else None,
                                idx1[s].data_ptr() if K else None, K, KMAX,
                                (lens_k[K].data_ptr() if with_lens else None) if K else None,
                                sink.data_ptr(), d_out.data_ptr(), d_lse.data_ptr(), ws.data_ptr(), ws.numel(), SCALE))
        return calls

    def make_graph(calls, native=False):
        with torch.cuda.stream(stream):
            for c in calls:
                c()
        torch.cuda.synchronize()
        if native:
            with torch.cuda.stream(stream):
                replay, destroy = D.graph(calls)
        else:
            gr = torch.cuda.CUDAGraph()
            with torch.cuda.graph(gr, stream=stream):
                for c in calls:
                    c()
            replay, destroy = gr.replay, (lambda: None)
        torch.cuda.synchronize()
        return replay, destroy

    def profile_graph(calls):
        """Kernel names, counts and mean device us per launch over one replay (CUPTI via torch.profiler)."""
        from torch.profiler import profile, ProfilerActivity
        replay, destroy = make_graph(calls)
        with torch.cuda.stream(stream):
            replay()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            with torch.cuda.stream(stream):
                replay()
            torch.cuda.synchronize()
        out = {}
        for e in prof.key_averages():
            t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0) or 0
            if t and e.count:
                out[e.key[:110]] = [e.count, t / e.count]
        destroy()
        return out

    def time_graph(calls, reps=5, native=False):
        """Median us per call: one graph of the calls, a warm-up replay, `reps` timed replays (events on
        the capture stream around each replay). native: capture with dsv4's own graph API."""
        replay, destroy = make_graph(calls, native)
        v = []
        with torch.cuda.stream(stream):
            replay()
            for _ in range(reps):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                replay()
                e1.record()
                e1.synchronize()
                v.append(e0.elapsed_time(e1) * 1e3 / len(calls))
        torch.cuda.synchronize()
        destroy()
        return statistics.median(v), v

    # --- warm the clocks (and read the bf16 matmul rate)
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    bm = torch.randn_like(a)
    for _ in range(3):
        a @ bm
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(20):
        a @ bm
    e1.record()
    torch.cuda.synchronize()
    res["bf16_mm_tflops"] = 20 * 2 * 8192 ** 3 / (e0.elapsed_time(e1) * 1e-3) / 1e12
    del a, bm
    P(f"bf16 matmul 8192^3: {res['bf16_mm_tflops']:.0f} TFLOP/s")

    try:
        # --- correctness 1: both implementations on the timing pool, set 0 of every shape
        corr = []
        for sec, h, s_q, b, W, K in shapes:
            T = b * s_q
            fo, fl = fm_calls(h, s_q, b, W, K, "reused")[0]()
            d_calls(h, s_q, b, W, K)[0]()
            torch.cuda.synchronize()
            fo = fo.reshape(T, h, 512).float()
            do = d_out[:T * h * 512].view(T, h, 512).float()
            fl = fl.transpose(1, 2).reshape(T, h)  # FlashMLA lse [b, h, s_q] -> [b*s_q, h]
            dl = d_lse[:T * h].view(T, h)
            rel = ((fo - do).norm() / do.norm()).item()
            corr.append({"shape": [sec, h, s_q, b, W, K], "out_rel_l2": rel,
                         "out_max_abs": (fo - do).abs().max().item(),
                         "lse_max_abs": (fl - dl).abs().max().item(), "nan": bool(fo.isnan().any() or do.isnan().any())})
        res["corr_pool"] = corr
        P("correctness on the timing pool (FlashMLA vs dsv4, set 0): max out rel L2 %.2e, max lse abs %.2e" %
          (max(c["out_rel_l2"] for c in corr), max(c["lse_max_abs"] for c in corr)))

        # --- correctness 2: a cache quantized by FlashMLA's own tests/quant.py from randn/10 data, 5 % of
        # the indices -1, both implementations vs an fp64 reference over the dequantized cache
        NB2 = 2048
        kv = (torch.randn((NB2, BS, 1, 512), device=dev, generator=g) / 10).clamp(-1, 1).to(torch.bfloat16)
        kq = quant.quantize_k_cache(kv, quant.FP8KVCacheLayout.MODEL1_FP8Sparse)  # [NB2, 64, 1, 584], stride 37440
        assert kq.stride(0) == PB and kq.stride(1) == 584
        kdeq = quant.dequantize_k_cache(kq, quant.FP8KVCacheLayout.MODEL1_FP8Sparse).view(-1, 512).double()
        kc2_d = D.cache(kq.data_ptr(), NB2, BS)
        kq8 = kq.view(torch.uint8)
        corr2 = []
        for h, s_q, b, K in ((64, 1, 64, 512), (128, 2, 16, 1024), (64, 1, 8, 0)):
            T, W = b * s_q, 128
            q2 = (torch.randn((b, s_q, h, 512), device=dev, generator=g) / 10).to(torch.bfloat16)
            sk2 = (torch.randn(h, device=dev, generator=g)).float()
            i0 = torch.randint(0, NB2 * BS, (T, W), dtype=torch.int32, device=dev, generator=g)
            i1 = torch.randint(0, NB2 * BS, (T, max(K, 1)), dtype=torch.int32, device=dev, generator=g)[:, :K].contiguous()
            i0[torch.rand(i0.shape, device=dev, generator=g) < 0.05] = -1
            i1[torch.rand(i1.shape, device=dev, generator=g) < 0.05] = -1
            lw = torch.full((b,), W, dtype=torch.int32, device=dev)
            lk = torch.full((b,), K, dtype=torch.int32, device=dev) if K else None
            meta = fmi.get_mla_metadata()[0]
            fo, fl = fmi.flash_mla_with_kvcache(q2, kq8, None, None, 512, meta, None, softmax_scale=SCALE,
                                                is_fp8_kvcache=True, indices=i0.view(b, s_q, W), attn_sink=sk2,
                                                extra_k_cache=kq8 if K else None,
                                                extra_indices_in_kvcache=i1.view(b, s_q, K) if K else None,
                                                topk_length=lw, extra_topk_length=lk)
            do2 = torch.empty((T, h, 512), dtype=torch.bfloat16, device=dev)
            dl2 = torch.empty((T, h), dtype=torch.float32, device=dev)
            lt_w = torch.full((T,), W, dtype=torch.int32, device=dev)
            lt_k = torch.full((T,), K, dtype=torch.int32, device=dev)
            ws2n = D.workspace_bytes(T, h, W, K)
            ws2 = torch.empty(max(ws2n, 256), dtype=torch.uint8, device=dev)
            with torch.cuda.stream(stream):
                D.call(q2.data_ptr(), T, h, kc2_d, i0.data_ptr(), W, W, lt_w.data_ptr(), i1.data_ptr() if K else None,
                       K, max(K, 1), lt_k.data_ptr() if K else None, sk2.data_ptr(), do2.data_ptr(), dl2.data_ptr(),
                       ws2.data_ptr(), ws2.numel(), SCALE)()
            torch.cuda.synchronize()
            idx = torch.cat([i0, i1], 1) if K else i0
            valid = idx >= 0
            kg = kdeq[idx.clamp(min=0).long()]  # [T, E, 512]
            s = torch.einsum("thd,ted->the", q2.view(T, h, 512).double(), kg) * SCALE
            s = s.masked_fill(~valid[:, None, :], float("-inf"))
            lse = torch.logsumexp(s, -1)
            o = torch.einsum("the,ted->thd", torch.exp(s - lse[..., None]), kg)
            o = o / (1 + torch.exp(sk2.double()[None, :] - lse))[..., None]
            fo = fo.reshape(T, h, 512).double()
            fl = fl.transpose(1, 2).reshape(T, h).double()
            dd = do2.double()
            ob = o.to(torch.bfloat16).double()
            r = {"h": h, "s_q": s_q, "b": b, "W": W, "K": K,
                 "fm_vs_ref_rel_l2": ((fo - o).norm() / o.norm()).item(),
                 "dsv4_vs_ref_rel_l2": ((dd - o).norm() / o.norm()).item(),
                 "bf16_ref_vs_ref_rel_l2": ((ob - o).norm() / o.norm()).item(),
                 "fm_vs_dsv4_rel_l2": ((fo - dd).norm() / dd.norm()).item(),
                 "fm_max_abs": (fo - o).abs().max().item(), "dsv4_max_abs": (dd - o).abs().max().item(),
                 "fm_lse_max_abs": (fl - lse).abs().max().item(), "dsv4_lse_max_abs": (dl2.double() - lse).abs().max().item()}
            corr2.append(r)
            P("correctness vs fp64 ref", json.dumps(r))
        res["corr_ref"] = corr2
        del kv, kq, kdeq, kq8
    except Exception as e:
        import traceback
        P("CORRECTNESS FAILED:", traceback.format_exc())
        torch.cuda.synchronize()

    # --- timing: two passes over all shapes (pass 2 in the reverse implementation order)
    rows = []
    for p in (1, 2):
        for sec, h, s_q, b, W, K in shapes:
            T = b * s_q
            E = W + K
            flop = 2.0 * T * h * E * 1024
            order = ["fm"] + (["fm_fresh"] if os.environ.get("FMLA_FRESH") == "1" else []) + ["dsv4"] + (
                ["v:" + v for v in VARS] if sec == "decode" or os.environ.get("DSV4_VARIANTS_ALL") == "1" else [])
            if p == 2:
                order = order[::-1]
            r = {"pass": p, "section": sec, "h": h, "s_q": s_q, "b": b, "T": T, "W": W, "K": K, "flop": flop}
            for name in order:
                try:
                    if name == "fm":
                        med, v = time_graph(fm_calls(h, s_q, b, W, K, "reused"))
                    elif name == "fm_fresh":
                        med, v = time_graph(fm_calls(h, s_q, b, W, K, "fresh"))
                    elif name == "dsv4":
                        med, v = time_graph(d_calls(h, s_q, b, W, K, True))
                    elif name.startswith("v:"):
                        med, v = time_graph(d_calls(h, s_q, b, W, K, True, DV[name[2:]]))
                    else:
                        raise ValueError(name)
                except Exception as e:  # keep going: report what failed
                    P(f"FAILED {name} {sec} h{h} b{b} K{K}: {type(e).__name__}: {e}")
                    torch.cuda.synchronize()
                    med, v = float("nan"), []
                r[name] = med
                r[name + "_reps"] = v
            rows.append(r)
            P(f"pass {p} {sec:6s} h{h:<3d} s_q {s_q} b {b:4d} T {T:4d} {W}+{K:<4d}: FlashMLA {r['fm']:7.1f} us"
              + (f" (fresh meta {r['fm_fresh']:7.1f})" if "fm_fresh" in r else "") +
              f" dsv4 {r['dsv4']:7.1f} us  dsv4/FlashMLA {r['dsv4'] / r['fm']:.2f}  TFLOP/s"
              f" {flop / r['fm'] * 1e-6:6.1f} / {flop / r['dsv4'] * 1e-6:6.1f} | " +
              "  ".join(f"{v}: {r['v:' + v]:.1f} us {r['v:' + v] / r['fm']:.2f}" for v in VARS if 'v:' + v in r))
            with open(os.path.join(OUT, "results.json"), "w") as f:
                json.dump(dict(res, rows=rows), f, indent=1)
    res["rows"] = rows
    if os.environ.get("FMLA_PROFILE") == "1":
        prof = []
        for sec, h, s_q, b, W, K in [shapes[i] for i in (0, 2, 3, 6, 8, 15)]:
            for name, mk in [("fm", lambda: fm_calls(h, s_q, b, W, K, "reused")),
                             ("dsv4", lambda: d_calls(h, s_q, b, W, K, True))] + [
                             ("v:" + v, (lambda v=v: d_calls(h, s_q, b, W, K, True, DV[v]))) for v in VARS[:1]]:
                try:
                    k = profile_graph(mk())
                except Exception as e:
                    k = {"error": f"{type(e).__name__}: {e}"}
                    torch.cuda.synchronize()
                prof.append({"shape": [sec, h, s_q, b, W, K], "impl": name, "kernels": k})
                P(f"profile {sec} h{h} s_q {s_q} b {b} {W}+{K} {name}: " +
                  "; ".join(f"{n.split('(')[0][-60:]} x{v[0]} {v[1]:.1f} us" for n, v in k.items() if isinstance(v, list)))
        res["profile"] = prof
    with open(os.path.join(OUT, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    P("done")


if __name__ == "__main__":
    if sys.argv[1] == "--build-only":
        build_flashmla(sys.argv[2], os.environ.get("FMLA_BUILD", os.path.join(tempfile.gettempdir(), "flashmla-build")))
    else:
        main()
