import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))

# Outputs the binding allocates itself (calls without out=) come back poisoned (NaN / 0xA5 bytes)
# instead of np.empty, so an element the library leaves unwritten cannot pass for a stale result
# (python/dsv4/_lib.py new_output). Set before any test imports dsv4; it is read at every call.
os.environ["DSV4_TEST_POISON"] = "1"

import oracles  # noqa: E402  (needs the paths above)

# The scalar reference and every path of the cpu backend (DSV4_CPU_ISA caps the ISA, so the
# AVX2 and scalar kernels run on an AVX-512 machine too).
PATHS = [("cpu-ref", None), ("cpu", "scalar"), ("cpu", "avx2"), ("cpu", "avx512")]


@pytest.fixture(params=PATHS, ids=lambda p: f"{p[0]}-{p[1] or 'ref'}")
def backend(request, monkeypatch):
    name, isa = request.param
    if isa:
        monkeypatch.setenv("DSV4_CPU_ISA", isa)
        # a cap is only a ceiling: on a machine without the ISA the cpu backend falls back to a
        # lower path, and the case would test that one under this one's name
        why = oracles.cpu_isa_mismatch(isa)
        if why:
            pytest.skip(why)
    return name
