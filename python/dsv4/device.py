"""Device memory (include/dsv4/device.h): numpy arrays uploaded to the memory of a backend
("cuda": GPU memory; the CPU backends: host memory) and downloaded back, as tensor views the
ops of that backend accept.

    d = upload(np_array, backend="cuda")      # DeviceArray
    lib.dsv4_some_op(ctx("cuda"), ctypes.byref(d.tensor(BF16)), ...)
    host = d.download()                        # numpy array, same dtype and shape

`available(backend)` says whether a backend can run here (a CUDA device is present)."""
import ctypes

import numpy as np

from ._lib import c_struct
from ._lib import _NUMPY_KINDS, BF16, MAX_DIMS, DSV4Error, Tensor, check, ctx, lib, new_output

_P = ctypes.c_void_p
_SIZE = ctypes.c_size_t


@c_struct("dsv4_device_info")
class DeviceInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * 128), ("ordinal", ctypes.c_int), ("multiprocessors", ctypes.c_int),
                ("compute_major", ctypes.c_int), ("compute_minor", ctypes.c_int), ("total_memory", _SIZE),
                ("free_memory", _SIZE), ("l2_bytes", _SIZE), ("shared_per_block", _SIZE)]


lib.dsv4_backend_available.argtypes = [ctypes.c_char_p]
lib.dsv4_ctx_device_kind.argtypes = [_P]
lib.dsv4_ctx_device_kind.restype = ctypes.c_int
lib.dsv4_device_info_get.argtypes = [_P, ctypes.POINTER(DeviceInfo)]
lib.dsv4_device_alloc.argtypes = [_P, _SIZE, ctypes.POINTER(_P)]
lib.dsv4_device_free.argtypes = [_P, _P]
lib.dsv4_device_upload.argtypes = [_P, _P, _P, _SIZE]
lib.dsv4_device_download.argtypes = [_P, _P, _P, _SIZE]
lib.dsv4_device_copy.argtypes = [_P, _P, _P, _SIZE]
lib.dsv4_device_memset.argtypes = [_P, _P, ctypes.c_int, _SIZE]
lib.dsv4_device_sync.argtypes = [_P]
lib.dsv4_device_stream_set.argtypes = [_P, _P]
lib.dsv4_device_stream_get.argtypes = [_P, ctypes.POINTER(_P)]


def available(backend="cuda"):
    """(True, "") when the backend can run here, else (False, the library's reason)."""
    if backend not in [lib.dsv4_backend_name(i).decode() for i in range(lib.dsv4_backend_count())]:
        return False, f"backend '{backend}' is not built into this library"
    status = lib.dsv4_backend_available(backend.encode())
    return (status == 0, "" if status == 0 else lib.dsv4_last_error().decode("utf-8", "replace"))


def info(backend="cuda"):
    """The device's facts as a dict (name, multiprocessors, memory, L2, ...)."""
    d = DeviceInfo()
    check(lib.dsv4_device_info_get(ctx(backend), ctypes.byref(d)))
    return {f: (getattr(d, f).decode() if f == "name" else getattr(d, f)) for f, _ in DeviceInfo._fields_}


def device_kind(backend="cuda"):
    """0 = host memory, 1 = CUDA memory (dsv4_device_kind)."""
    return lib.dsv4_ctx_device_kind(ctx(backend))


class DeviceArray:
    """A contiguous array in the memory of `backend` (freed with the object or by free())."""

    def __init__(self, shape, dtype, backend="cuda"):
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        if len(self.shape) > MAX_DIMS or any(s < 0 for s in self.shape):
            raise DSV4Error(2, f"bad shape {self.shape}")
        self.backend = backend
        self._ctx = ctx(backend)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        p = _P()
        check(lib.dsv4_device_alloc(self._ctx, self.nbytes, ctypes.byref(p)))
        self.ptr = p.value

    def tensor(self, dtype):
        """A dsv4_tensor view (library dtype `dtype`, e.g. BF16 for uint16 data) in device memory."""
        want = np.dtype(_NUMPY_KINDS[dtype])
        if want.itemsize != self.dtype.itemsize:
            raise DSV4Error(3, f"array of {self.dtype} cannot hold library dtype {dtype}")
        t = Tensor()
        t.data = self.ptr
        t.dtype = dtype
        t.ndim = len(self.shape)
        stride = 1
        for i in reversed(range(len(self.shape))):
            t.shape[i] = self.shape[i]
            t.stride[i] = stride
            stride *= self.shape[i]
        t.device = device_kind(self.backend)
        t.device_index = 0
        return t

    def upload(self, arr):
        """Copy a numpy array of the same shape and dtype into this buffer."""
        a = np.ascontiguousarray(arr)
        if a.shape != self.shape or a.dtype != self.dtype:
            raise DSV4Error(2, f"upload: array {a.dtype}{a.shape} does not match {self.dtype}{self.shape}")
        if self.nbytes:
            check(lib.dsv4_device_upload(self._ctx, self.ptr, a.ctypes.data, self.nbytes))
        return self

    def download(self, out=None):
        """The buffer's contents as a numpy array (into `out` when given)."""
        if out is None:
            out = new_output(self.shape, self.dtype)
        elif out.shape != self.shape or out.dtype != self.dtype or not out.flags.c_contiguous:
            raise DSV4Error(2, "download: `out` must be a contiguous array of the same shape and dtype")
        if self.nbytes:
            check(lib.dsv4_device_download(self._ctx, out.ctypes.data, self.ptr, self.nbytes))
        return out

    def fill(self, byte):
        """Set every byte to `byte` (e.g. to poison outputs)."""
        if self.nbytes:
            check(lib.dsv4_device_memset(self._ctx, self.ptr, int(byte), self.nbytes))
        return self

    def free(self):
        """Free the buffer now (also done when the array is collected); a second call does nothing."""
        if self.ptr:
            lib.dsv4_device_free(self._ctx, self.ptr)
            self.ptr = None

    def __del__(self):
        try:
            self.free()
        except Exception:  # interpreter shutdown
            pass


def upload(arr, backend="cuda"):
    """A DeviceArray holding a copy of `arr`."""
    a = np.ascontiguousarray(arr)
    return DeviceArray(a.shape, a.dtype, backend).upload(a)


def empty(shape, dtype, backend="cuda"):
    """An uninitialized DeviceArray of `shape` and numpy `dtype` in the backend's memory."""
    return DeviceArray(shape, dtype, backend)


def sync(backend="cuda"):
    """Wait for the work queued on the backend's stream."""
    check(lib.dsv4_device_sync(ctx(backend)))


__all__ = ["DeviceArray", "available", "device_kind", "empty", "info", "sync", "upload", "BF16"]
