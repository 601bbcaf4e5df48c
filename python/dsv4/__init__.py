"""dsv4: Python binding of libdsv4 (ctypes over libdsv4.so, numpy arrays in and out).

BF16 data travels as uint16 bit patterns, FP8/E8M0/FP4 as uint8. Bad input raises ValueError
(DSV4Error) carrying the library's message. Every function takes `backend=` ("cpu", "cpu-ref",
"cuda") and `threads=`; None means the library default ($DSV4_BACKEND, $DSV4_THREADS)."""
from ._lib import DSV4Error, backends, lib  # noqa: F401
from .formats import (bf16_decode, bf16_encode, dequantize, dequantize_weight, e2m1_decode,  # noqa: F401
                      e2m1_encode, e4m3_decode, e4m3_encode, e8m0_decode, fp4_pack, fp4_unpack,
                      quantize, scale_byte)


def cpu_isa():
    return lib.dsv4_cpu_isa().decode()
