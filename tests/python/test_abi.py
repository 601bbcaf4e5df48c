"""The binding's ctypes structures against the C layout (src/core/abi.c, python/dsv4/_lib.py
c_struct), and the kernel-choice options of a context (include/dsv4/core.h dsv4_ctx_options)."""
import ctypes
import os
import subprocess
import sys

import pytest

import dsv4
from dsv4 import _lib


def mirrored():
    """Every ctypes.Structure of the binding that mirrors a C struct (decorated with c_struct)."""
    import dsv4.attention, dsv4.device, dsv4.engine, dsv4.indexer, dsv4.layer, dsv4.model, dsv4.tokenizer  # noqa
    mods = [_lib, dsv4.attention, dsv4.device, dsv4.engine, dsv4.indexer, dsv4.layer, dsv4.model, dsv4.tokenizer]
    return [obj for m in mods for obj in vars(m).values()
            if isinstance(obj, type) and issubclass(obj, ctypes.Structure) and obj is not ctypes.Structure
            and obj.__module__ == m.__name__]


def test_every_structure_is_checked_and_matches():
    classes = mirrored()
    assert len(classes) >= 27
    for cls in classes:
        assert getattr(cls, "_dsv4_c_name", None), f"{cls.__name__} is not checked against C (no @c_struct)"
        assert _lib.layout_mismatch(cls, cls._dsv4_c_name) is None


def test_wrong_structures_are_caught():
    class WrongType(ctypes.Structure):  # dtype as int64: every later offset moves
        _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int64), ("ndim", ctypes.c_int32),
                    ("shape", ctypes.c_int64 * 5), ("stride", ctypes.c_int64 * 5), ("device", ctypes.c_int),
                    ("device_index", ctypes.c_int32)]

    why = _lib.layout_mismatch(WrongType, "dsv4_tensor")
    assert why and "dtype" in why and "size" in why
    with pytest.raises(ImportError, match="WrongType.*dsv4_tensor"):
        _lib.c_struct("dsv4_tensor")(WrongType)

    class Missing(ctypes.Structure):  # a field C added and the binding lacks
        _fields_ = [("backend", ctypes.c_char_p), ("threads", ctypes.c_int), ("device", ctypes.c_int),
                    ("cpu_isa", ctypes.c_char_p)]

    why = _lib.layout_mismatch(Missing, "dsv4_ctx_options")
    assert "4 fields, C has 5" in why and "size" in why

    class Renamed(ctypes.Structure):  # same layout, a field under another name
        _fields_ = [("temperature", ctypes.c_float), ("top_k", ctypes.c_float), ("seed", ctypes.c_uint64)]

    assert "'top_k', C has 'top_p'" in _lib.layout_mismatch(Renamed, "dsv4_sampling")

    class Tail(ctypes.Structure):  # the same size, the last field narrower (padding hides it)
        _fields_ = [("temperature", ctypes.c_float), ("top_p", ctypes.c_float), ("seed", ctypes.c_uint32)]

    assert "'seed'" in _lib.layout_mismatch(Tail, "dsv4_sampling")
    assert "not a struct" in _lib.layout_mismatch(Renamed, "dsv4_no_such_struct")


def test_mismatch_fails_the_import(tmp_path):
    """A module of the binding whose structure disagrees with the library does not import."""
    (tmp_path / "badmod.py").write_text(
        "import ctypes\nfrom dsv4._lib import c_struct\n\n\n@c_struct('dsv4_sampling')\n"
        "class Sampling(ctypes.Structure):\n    _fields_ = [('temperature', ctypes.c_double)]\n")
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(dsv4.__file__)))
    r = subprocess.run([sys.executable, "-c", "import badmod"], cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{pkg}"})
    assert r.returncode != 0 and "ImportError" in r.stderr and "dsv4_sampling" in r.stderr, r.stderr


def test_abi_entry_points_reject_bad_input():
    size, n = ctypes.c_size_t(), ctypes.c_int()
    assert dsv4.lib.dsv4_abi_struct(b"dsv4_tensor", ctypes.byref(size), ctypes.byref(n)) == 0 and n.value == 7
    name, off, fs = ctypes.c_char_p(), ctypes.c_size_t(), ctypes.c_size_t()
    assert dsv4.lib.dsv4_abi_field(b"dsv4_tensor", 7, ctypes.byref(name), ctypes.byref(off), ctypes.byref(fs)) != 0
    assert b"7 fields" in dsv4.lib.dsv4_last_error()
    assert dsv4.lib.dsv4_abi_struct(b"nope", ctypes.byref(size), ctypes.byref(n)) != 0


# ---- kernel choices of a context --------------------------------------------------------------
def test_cpu_isa_from_the_environment_per_context(monkeypatch):
    monkeypatch.setenv("DSV4_CPU_ISA", "scalar")
    assert dsv4.cpu_isa("cpu", 1) == "scalar" and dsv4.cpu_isa() == "scalar"
    monkeypatch.setenv("DSV4_CPU_ISA", "avx2")
    want = "avx2" if dsv4.lib.dsv4_cpu_features().decode().startswith("avx2") else "scalar"
    assert dsv4.cpu_isa("cpu", 1) == want  # another context: the one above keeps scalar
    monkeypatch.delenv("DSV4_CPU_ISA")


def test_bad_option_is_an_error():
    opts = _lib.CtxOptions(b"cpu", 1, 0, b"sse9", None)
    handle = ctypes.c_void_p()
    with pytest.raises(dsv4.DSV4Error, match="sse9"):
        _lib.check(dsv4.lib.dsv4_ctx_create(ctypes.byref(opts), ctypes.byref(handle)))
