"""dsv4: Python binding of libdsv4 (ctypes over libdsv4.so, numpy arrays in and out).

BF16 data travels as uint16 bit patterns, FP8/E8M0/FP4 as uint8. Bad input raises ValueError
(DSV4Error) carrying the library's message. Every function takes `backend=` ("cpu", "cpu-ref",
"cuda") and `threads=`; None means the library default ($DSV4_BACKEND, $DSV4_THREADS)."""
from ._lib import DSV4Error, backends, lib  # noqa: F401
from ._lib import VERSION as __version__  # noqa: F401  (the library's: CMakeLists.txt project(VERSION))
from . import attention  # noqa: F401  (dsv4.attention.sparse_mla_decode, ...)
from . import device  # noqa: F401  (dsv4.device.upload, DeviceArray, ...)
from .formats import (bf16_decode, bf16_encode, dequantize, dequantize_weight, e2m1_decode,  # noqa: F401
                      e2m1_encode, e4m3_decode, e4m3_encode, e8m0_decode, fp4_pack, fp4_unpack,
                      quantize, scale_byte)
from .indexer import (compressor_emit_count, compressor_forward, compressor_state,  # noqa: F401
                      indexer_q, indexer_scores, indexer_select, indexer_topk, indexer_weights)
from .layer import hc_head, hc_post, hc_post_pre, hc_pre, moe, rms_norm, route, swiglu  # noqa: F401
from .linear_ops import grouped_linear, linear  # noqa: F401  (module dsv4.linear_ops: linear_stage, ...)
from .tensor_ops import add_bf16, copy_rows, embed_rows  # noqa: F401
from . import model  # noqa: F401  (dsv4.model.Model, config_parse, make_tiny, ...)
from .engine import Engine  # noqa: F401  (dsv4.engine: generate, forward, sample, MTP)
from .tokenizer import DecodeStream, Tokenizer, parse_completion, render_chat  # noqa: F401


def cpu_isa(backend=None, threads=None):
    """The kernels the cpu backend runs: of a context created now (no arguments; $DSV4_CPU_ISA is
    read at this call), or of the binding's context for (backend, threads)."""
    if backend is None and threads is None:
        return lib.dsv4_cpu_isa().decode()
    from ._lib import ctx
    return lib.dsv4_ctx_cpu_isa(ctx(backend, threads)).decode()
