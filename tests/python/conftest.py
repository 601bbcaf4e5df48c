import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))

# The scalar reference and every path of the cpu backend (DSV4_CPU_ISA caps the ISA, so the
# AVX2 and scalar kernels run on an AVX-512 machine too).
PATHS = [("cpu-ref", None), ("cpu", "scalar"), ("cpu", "avx2"), ("cpu", "avx512")]


@pytest.fixture(params=PATHS, ids=lambda p: f"{p[0]}-{p[1] or 'ref'}")
def backend(request, monkeypatch):
    name, isa = request.param
    if isa:
        monkeypatch.setenv("DSV4_CPU_ISA", isa)
    return name
