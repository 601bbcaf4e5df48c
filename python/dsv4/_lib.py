"""ctypes plumbing shared by every module of the binding: library loading, errors, contexts and
tensor views over numpy arrays. Nothing here is DeepSeek-specific."""
import ctypes
import os
import pathlib

import numpy as np

MAX_DIMS = 5

# dsv4_dtype (include/dsv4/tensor.h)
F32, BF16, F8_E4M3, E8M0, FP4X2, I32, I64, U8 = range(8)

_NUMPY_KINDS = {
    F32: np.float32, BF16: np.uint16, F8_E4M3: np.uint8, E8M0: np.uint8, FP4X2: np.uint8,
    I32: np.int32, I64: np.int64, U8: np.uint8,
}


class DSV4Error(ValueError):
    """A failed libdsv4 call; `status` is the dsv4_status code, the message is the library's."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def _find_library():
    """$DSV4_LIB, else the library installed with the package (`pip install .`), else the one of a
    build in the source tree (PYTHONPATH=python)."""
    env = os.environ.get("DSV4_LIB")
    if env:
        return env
    here = pathlib.Path(__file__).resolve().parent
    cands = [here / "libdsv4.so"]
    root = here.parents[1]
    if (root / "CMakeLists.txt").exists() and (root / "python" / "dsv4").is_dir():
        cands += [root / "build" / "libdsv4.so", root / "build-san" / "libdsv4.so"]
    for cand in cands:
        if cand.exists():
            return str(cand)
    raise OSError("libdsv4.so not found: `pip install .`, or run `make` first, or set DSV4_LIB")


lib = ctypes.CDLL(_find_library())
lib.dsv4_last_error.restype = ctypes.c_char_p
lib.dsv4_version.restype = ctypes.c_char_p
VERSION = lib.dsv4_version().decode()


def check(status):
    """Raise DSV4Error with the library's message unless `status` is 0 (DSV4_OK)."""
    if status != 0:
        raise DSV4Error(status, lib.dsv4_last_error().decode("utf-8", "replace"))


try:
    lib.dsv4_abi_struct.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_int)]
    lib.dsv4_abi_field.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p),
                                   ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
except AttributeError as e:
    raise ImportError(f"dsv4: {lib._name} has no dsv4_abi_struct (built from older sources?): rebuild it") from e


def layout_mismatch(cls, c_name):
    """None when ctypes structure `cls` has the size of C struct `c_name` and its fields in order,
    each with the C field's name, offset and size (src/core/abi.c reports them); else what differs."""
    size, n = ctypes.c_size_t(), ctypes.c_int()
    if lib.dsv4_abi_struct(c_name.encode(), ctypes.byref(size), ctypes.byref(n)) != 0:
        return lib.dsv4_last_error().decode("utf-8", "replace")
    problems = []
    if ctypes.sizeof(cls) != size.value:
        problems.append(f"size {ctypes.sizeof(cls)} bytes, C has {size.value}")
    fields = [f[0] for f in cls._fields_]
    if len(fields) != n.value:
        problems.append(f"{len(fields)} fields, C has {n.value}")
    for i in range(min(len(fields), n.value)):
        name, off, fsize = ctypes.c_char_p(), ctypes.c_size_t(), ctypes.c_size_t()
        check(lib.dsv4_abi_field(c_name.encode(), i, ctypes.byref(name), ctypes.byref(off), ctypes.byref(fsize)))
        cname, py = name.value.decode(), getattr(cls, fields[i])
        if fields[i] != cname:
            problems.append(f"field {i} is '{fields[i]}', C has '{cname}'")
        elif py.offset != off.value or py.size != fsize.value:
            problems.append(f"field '{cname}' at offset {py.offset} ({py.size} bytes), C has {off.value} "
                            f"({fsize.value} bytes)")
    return "; ".join(problems) or None


def c_struct(c_name):
    """Class decorator of a ctypes.Structure that mirrors C struct `c_name` (include/dsv4/*.h):
    its layout is checked against the library's when the class is defined (at import), and a
    mismatch is an ImportError naming both sides. A new mirrored struct: this decorator here, one
    line in ABI_STRUCTS of src/core/abi.c there."""
    def checked(cls):
        why = layout_mismatch(cls, c_name)
        if why:
            raise ImportError(f"dsv4: the ctypes structure {cls.__module__}.{cls.__name__} does not match C {c_name} "
                              f"of {lib._name}: {why} (rebuild the library, or update python/dsv4 to the headers)")
        cls._dsv4_c_name = c_name
        return cls
    return checked


@c_struct("dsv4_tensor")
class Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * MAX_DIMS),
        ("stride", ctypes.c_int64 * MAX_DIMS),
        ("device", ctypes.c_int),
        ("device_index", ctypes.c_int32),
    ]


@c_struct("dsv4_ctx_options")
class CtxOptions(ctypes.Structure):
    _fields_ = [("backend", ctypes.c_char_p), ("threads", ctypes.c_int), ("device", ctypes.c_int),
                ("cpu_isa", ctypes.c_char_p), ("cuda_decode", ctypes.c_char_p)]


lib.dsv4_last_error.restype = ctypes.c_char_p
lib.dsv4_backend_name.restype = ctypes.c_char_p
lib.dsv4_ctx_backend_name.restype = ctypes.c_char_p
lib.dsv4_cpu_isa.restype = ctypes.c_char_p
lib.dsv4_ctx_cpu_isa.restype = ctypes.c_char_p
lib.dsv4_ctx_cpu_isa.argtypes = [ctypes.c_void_p]
lib.dsv4_cpu_features.restype = ctypes.c_char_p
lib.dsv4_ctx_create.argtypes = [ctypes.POINTER(CtxOptions), ctypes.POINTER(ctypes.c_void_p)]
lib.dsv4_ctx_destroy.argtypes = [ctypes.c_void_p]


_contexts = {}

# The environment variables a context reads its kernel choices from when it is created
# (include/dsv4/core.h); a cached context is one per value they have at the call.
_KERNEL_ENV = ("DSV4_CPU_ISA", "DSV4_CUDA_DECODE", "DSV4_CUDA_MMA_SYNC", "DSV4_CUDA_NO_PAIR")


def ctx(backend=None, threads=None):
    """A cached library context for (backend, threads) and the kernel choices the environment
    makes now ($DSV4_CPU_ISA, $DSV4_CUDA_*); None means the library default."""
    if backend is None and threads is None:
        return None
    key = (backend, threads or 0) + tuple(os.environ.get(v) for v in _KERNEL_ENV)
    c = _contexts.get(key)
    if c is None:
        opts = CtxOptions(backend.encode() if backend else None, threads or 0, 0)
        handle = ctypes.c_void_p()
        check(lib.dsv4_ctx_create(ctypes.byref(opts), ctypes.byref(handle)))
        c = _contexts[key] = handle
    return c


def backends():
    """The registered backends' names, in registration order (a backend built as a module is listed
    even when it did not load: dsv4.device.available says why)."""
    return [lib.dsv4_backend_name(i).decode() for i in range(lib.dsv4_backend_count())]


def tensor(arr, dtype, shape=None):
    """A dsv4_tensor view of a numpy array (no copy). `dtype` is the library dtype; the numpy
    array must have the matching item size. Strides must be non-negative whole elements."""
    if not isinstance(arr, np.ndarray):
        raise DSV4Error(1, f"expected a numpy array, got {type(arr).__name__}")
    want = np.dtype(_NUMPY_KINDS[dtype])
    if arr.dtype.itemsize != want.itemsize or arr.dtype.kind != want.kind:
        raise DSV4Error(3, f"array dtype {arr.dtype} does not hold {_dtype_name(dtype)} (expected {want})")
    if arr.ndim > MAX_DIMS:
        raise DSV4Error(2, f"{arr.ndim} dims; at most {MAX_DIMS}")
    t = Tensor()
    t.data = arr.ctypes.data if arr.size else None
    t.dtype = dtype
    t.ndim = arr.ndim
    for i in range(arr.ndim):
        st = arr.strides[i]
        if st < 0 or st % arr.itemsize:
            raise DSV4Error(4, f"stride {st} bytes of dim {i} is negative or not a whole element")
        t.shape[i] = arr.shape[i]
        t.stride[i] = st // arr.itemsize
    return t


def _dtype_name(d):
    return ["f32", "bf16", "f8_e4m3", "e8m0", "fp4x2", "i32", "i64", "u8"][d]


def as_array(x, np_dtype, name):
    """The array with exactly `np_dtype`; float64 input for a float32 argument is rounded to
    float32 (the one conversion allowed), anything else of another dtype is an error."""
    a = np.asarray(x)
    want = np.dtype(np_dtype)
    if a.dtype == want:
        return a
    if want == np.float32 and a.dtype == np.float64:
        return a.astype(np.float32)
    raise DSV4Error(3, f"{name}: expected dtype {want}, got {a.dtype}")


def float_tensor(a, name):
    """A float input as (array, tensor view): uint16 arrays are BF16 bits, anything else F32."""
    a = np.asarray(a)
    if a.dtype == np.uint16:
        return a, tensor(a, BF16)
    a = as_array(a, np.float32, name)
    return a, tensor(a, F32)


def ptr(a):
    """The data pointer of numpy array `a` for ctypes (NULL when it is empty)."""
    return ctypes.c_void_p(a.ctypes.data if a.size else 0)


def new_output(shape, dtype):
    """A fresh output array the binding allocates itself (when the caller passes no `out=`).

    np.empty, except under DSV4_TEST_POISON=1 (the test suite sets it): then it is filled with a
    recognizable bad pattern, NaN for floating dtypes and 0xA5 bytes otherwise (BF16 held as
    uint16, integers, codes), so an element the library fails to write cannot pass for a result
    that freed memory happened to still hold."""
    a = np.empty(shape, dtype)
    if os.environ.get("DSV4_TEST_POISON") == "1" and a.size:
        if a.dtype.kind in "fc":
            a.fill(np.nan)
        else:
            a.view(np.uint8).fill(0xA5)
    return a
