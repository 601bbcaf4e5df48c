"""The library as a program that embeds it gets it: `cmake --install` of the build under test (the
folder of $DSV4_LIB) into a temporary prefix; only the public API exported (every DSV4_API function
of include/, nothing else); libdsv4.so and dsv4 needing neither the CUDA runtime nor a BLAS; the C
example built against the installed package with pkg-config and with find_package(dsv4), and the
Python example, each chatting two turns with the tiny model, all three printing the same and the
second turn continuing the first exactly; the backend modules' loader when a module is absent or
does not load; and `pip install .` into a temporary folder, whose package finds its own library."""
import importlib
import inspect
import os
import pathlib
import pkgutil
import re
import shutil
import subprocess
import sys

import pytest

import dsv4
from dsv4._lib import lib

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(lib._name).resolve().parent
UNDER_ASAN = "asan" in os.environ.get("LD_PRELOAD", "")


def tool_env(**extra):
    """Environment for build tools: without the sanitizer runtime the suite may preload."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS")}
    env.update(extra)
    return env


def run(cmd, env=None, timeout=120, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env or tool_env(), timeout=timeout,
                       **kw)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    if not (BUILD / "CMakeCache.txt").exists():
        pytest.skip(f"{lib._name} is not in a CMake build folder")
    p = tmp_path_factory.mktemp("prefix")
    run(["cmake", "--install", BUILD, "--prefix", p])
    return p


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    dsv4.model.make_tiny(d, 5)
    return d


def test_version_from_cmake():
    m = re.search(r"project\(dsv4 VERSION ([0-9.]+)", (ROOT / "CMakeLists.txt").read_text())
    assert m and dsv4.__version__ == m.group(1)


def public_modules():
    return [importlib.import_module(f"dsv4.{m.name}") for m in pkgutil.iter_modules(dsv4.__path__)
            if not m.name.startswith("_")]


def test_no_module_shadowed():
    """dsv4.NAME is the submodule NAME for every submodule (no function of the same name hides it)."""
    for mod in public_modules():
        assert getattr(dsv4, mod.__name__.split(".")[-1]) is mod


def test_every_public_function_has_a_docstring():
    missing = []
    for mod in [dsv4, *public_modules()]:
        for name, obj in vars(mod).items():
            if name.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            if not obj.__module__.startswith("dsv4"):
                continue
            if not inspect.getdoc(obj):
                missing.append(f"{obj.__module__}.{name}")
            if inspect.isclass(obj):
                for mname, m in vars(obj).items():
                    f = m.fget if isinstance(m, property) else getattr(m, "__func__", m)
                    if not mname.startswith("_") and inspect.isfunction(f) and not f.__doc__:
                        missing.append(f"{obj.__module__}.{name}.{mname}")
    assert sorted(set(missing)) == []


def libdir(prefix):
    (d,) = [x for x in (prefix / "lib", prefix / "lib64") if (x / "libdsv4.a").exists()]
    return d


def needed(path):
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", run(["readelf", "-d", path]))


def test_installed_files(prefix):
    ld = libdir(prefix)
    version = dsv4.__version__
    major = version.split(".")[0]
    for f in ["include/dsv4.h", "include/dsv4/core.h", "include/dsv4/engine.h", "bin/dsv4"]:
        assert (prefix / f).is_file(), f
    assert (ld / f"libdsv4.so.{version}").is_file() and (ld / "libdsv4.a").is_file()
    assert os.readlink(ld / "libdsv4.so") == f"libdsv4.so.{major}"
    assert os.readlink(ld / f"libdsv4.so.{major}") == f"libdsv4.so.{version}"
    soname = re.search(r"\(SONAME\)\s+Library soname: \[([^\]]+)\]", run(["readelf", "-d", ld / "libdsv4.so"]))
    assert soname and soname.group(1) == f"libdsv4.so.{major}"
    pc = run(["pkg-config", "--modversion", "dsv4"], env=tool_env(PKG_CONFIG_PATH=str(ld / "pkgconfig")))
    assert pc.strip() == version
    assert f'PACKAGE_VERSION "{version}"' in (ld / "cmake/dsv4/dsv4ConfigVersion.cmake").read_text()
    assert run([prefix / "bin/dsv4", "info"]).startswith(f"dsv4 {version}\n")
    if (BUILD / "libdsv4-cuda.so").exists():
        assert (ld / "libdsv4-cuda.so").is_file()


def public_api():
    """Every function the public headers declare DSV4_API."""
    names = set()
    for h in [ROOT / "include/dsv4.h", *sorted((ROOT / "include/dsv4").glob("*.h"))]:
        names |= set(re.findall(r"\bDSV4_API\b[^;{()]*?\b(dsv4_\w+)\s*\(", h.read_text()))
    return names


def exported(path):
    out = run(["nm", "-D", "--defined-only", path])
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def test_only_the_public_api_is_exported(prefix):
    api = public_api()
    assert len(api) > 100, "the header scan found too few DSV4_API functions"
    got = exported(libdir(prefix) / "libdsv4.so")
    assert sorted(got - api) == [], "exported but not public API"
    assert sorted(api - got) == [], "declared DSV4_API but not exported (no definition?)"
    mod = BUILD / "libdsv4-cuda.so"
    if mod.exists():
        assert exported(mod) == {"dsv4_module_backend"}


def test_no_cuda_runtime_or_blas_needed(prefix):
    for f in [libdir(prefix) / "libdsv4.so", prefix / "bin/dsv4"]:
        bad = [n for n in needed(f) if re.search(r"cuda|cublas|nvrtc|blas|lapack", n)]
        assert bad == [], f"{f.name} needs {bad}"


@pytest.fixture(scope="module")
def examples(prefix, tmp_path_factory):
    """The C example built against the installed package with pkg-config and with find_package."""
    ld = libdir(prefix)
    tmp = tmp_path_factory.mktemp("examples")
    cc = os.environ.get("CC", "cc")
    pc_env = tool_env(PKG_CONFIG_PATH=str(ld / "pkgconfig"))
    flags = run(["pkg-config", "--cflags", "--libs", "dsv4"], env=pc_env).split()
    exe_pc = tmp / "chat_pc"
    run([cc, "-std=c17", "-Wall", "-Werror", ROOT / "examples/chat.c", *flags, f"-Wl,-rpath,{ld}", "-o", exe_pc])
    bdir = tmp / "build-example"
    run(["cmake", "-S", ROOT / "examples", "-B", bdir, f"-DCMAKE_PREFIX_PATH={prefix}", "-DCMAKE_BUILD_TYPE=Release"],
        timeout=300)
    run(["cmake", "--build", bdir], timeout=300)
    return {"pkg-config": [exe_pc], "find_package": [bdir / "chat"], "python": [sys.executable, ROOT / "examples/chat.py"]}


def chat_outputs(prefix, examples, model):
    """stdout (bytes) of the C example built with pkg-config, with find_package(dsv4), and of chat.py."""
    # one thread: results do not depend on it, and a busy 2-core machine runs the tiny model faster so
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"), DSV4_LIB=str(libdir(prefix) / "libdsv4.so"), DSV4_THREADS="1")
    outs = {}
    for name, cmd in examples.items():
        r = subprocess.run([str(c) for c in cmd + [model]], capture_output=True, env=env, timeout=300)
        assert r.returncode == 0, f"{name}: {r.stderr.decode(errors='replace')[-3000:]}"
        outs[name] = r.stdout
    return outs


def test_examples_chat(prefix, examples, tiny):
    outs = chat_outputs(prefix, examples, tiny)
    assert outs["pkg-config"] == outs["find_package"] == outs["python"], outs
    # token-id mode (the test model has no tokenizer.json): two turns, then the sequence length
    m = re.fullmatch(r"turn 1: 4 ids in, reply:((?: \d+)+)\nturn 2: 5 ids in, reply:((?: \d+)+)\n"
                     r"sequence holds (\d+) tokens\n", outs["python"].decode())
    assert m, outs["python"]
    r1, r2 = [int(x) for x in m.group(1).split()], [int(x) for x in m.group(2).split()]
    with dsv4.Engine(tiny, threads=1) as e:
        v = e.vocab
        p1 = [(5 * i + 3) % v for i in range(4)]
        p2 = [(17 + 5 * i + 3) % v for i in range(4)]
        assert int(m.group(3)) == len(p1) + len(r1) + len(p2) + len(r2) - 1
        # the second turn continued the first exactly: one sequence fed all of it at once gives it
        ref, _, _ = e.generate(p1 + r1 + p2, 16, stop_at_eos=True)
        assert list(ref) == r2
        first, _, _ = e.generate(p1, 16, stop_at_eos=True)
        assert list(first) == r1


@pytest.mark.skipif(UNDER_ASAN, reason="the release run chats in text (a 129,280-token vocabulary is slow under "
                    "the sanitizers; the token-id chat runs in both)")
def test_examples_chat_text(prefix, examples, tmp_path):
    """The installed `dsv4 make-tiny` writes the tiny model with DeepSeek-V4's tokenizer beside it;
    the examples then chat in text, all three alike, and the second reply is what one sequence
    given the whole rendered conversation generates."""
    fetched = ROOT / "scripts/fetch_tokenizer.py"
    tok_json = run([sys.executable, fetched], timeout=600).strip()
    model = tmp_path / "tiny-text"
    run([prefix / "bin/dsv4", "make-tiny", "--out", model, "--tokenizer", tok_json, "--seed", "3"], timeout=300)
    outs = chat_outputs(prefix, examples, model)
    assert outs["pkg-config"] == outs["find_package"] == outs["python"], outs
    parts = re.fullmatch(rb"user: (.*)\nassistant: (.*)\nuser: (.*)\nassistant: (.*)\n", outs["python"], re.S)
    assert parts and parts.group(1) == b"Hello! Who are you?", outs["python"]
    tok = dsv4.Tokenizer(str(model / "tokenizer.json"))
    msgs = [{"role": "user", "content": parts.group(1)}, {"role": "assistant", "content": parts.group(2)},
            {"role": "user", "content": parts.group(3)}]
    with dsv4.Engine(model, threads=1) as e:
        first, _, _ = e.generate(tok.encode_chat(msgs[:1]), 16, stop_at_eos=True)
        assert tok.decode_bytes(first, skip_special=True) == parts.group(2)
        second, _, _ = e.generate(tok.encode_chat(msgs), 16, stop_at_eos=True)
        assert tok.decode_bytes(second, skip_special=True) == parts.group(4)


@pytest.fixture
def cuda_built():
    if "cuda" not in dsv4.backends():
        pytest.skip("built without the cuda module (no nvcc)")


def available(env):
    code = "import dsv4; from dsv4._lib import lib; s = lib.dsv4_backend_available(b'cuda'); " \
           "print(s, lib.dsv4_last_error().decode()); print(dsv4.backends())"
    return run([sys.executable, "-c", code], env=env)


def test_module_missing_or_broken(cuda_built, tmp_path):
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(lib._name, alone / "libdsv4.so")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"), DSV4_LIB=str(alone / "libdsv4.so"))
    env.pop("DSV4_MODULE_DIR", None)
    out = available(env)
    if "/libdsv4-cuda.so" in out and "was not found" not in out:
        pytest.skip("a libdsv4-cuda.so is installed in the build's install libdir")
    assert out.startswith("10 backend 'cuda': its module libdsv4-cuda.so was not found (looked in "), out
    assert "['cpu', 'cpu-ref', 'cuda']" in out
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "libdsv4-cuda.so").write_bytes(b"not a shared object")
    out = available(dict(env, DSV4_MODULE_DIR=str(broken)))
    assert out.startswith(f"10 backend 'cuda': its module {broken}/libdsv4-cuda.so cannot be loaded: "), out
    # the cpu backends work all the same
    code = "import numpy as np, dsv4; print(dsv4.bf16_decode(dsv4.bf16_encode(np.float32([1.5]), backend='cpu')))"
    assert run([sys.executable, "-c", code], env=dict(env, DSV4_MODULE_DIR=str(broken))).strip() == "[1.5]"


def test_module_loads_beside_the_library(cuda_built):
    s = lib.dsv4_backend_available(b"cuda")
    msg = lib.dsv4_last_error().decode()
    # with a GPU it is available; without one the loaded module says so (the CUDA runtime's
    # words), never that the module is missing or refused
    assert s == 0 or (s == 10 and msg.startswith("cuda: ") and "CUDA device" in msg), msg


@pytest.mark.skipif(UNDER_ASAN, reason="the release run builds and checks the wheel")
@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_pip_install(tmp_path):
    """`pip install .` into a target folder, unoptimized and without the CUDA module to keep the
    build short (the package is the same); the installed package imports from another folder and
    uses the library it carries, without DSV4_LIB."""
    pytest.importorskip("scikit_build_core", reason="scripts/install-deps.sh installs scikit-build-core")
    site = tmp_path / "site"
    run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-cache-dir", "-q",
         "--target", site, "-C", "cmake.define.DSV4_WITH_CUDA=OFF", "-C", "cmake.define.CMAKE_C_FLAGS_RELEASE=-O0",
         "-C", f"build-dir={tmp_path / 'build'}", ROOT], timeout=600)
    assert (site / "dsv4/libdsv4.so").is_file()
    env = {k: v for k, v in os.environ.items() if k not in ("DSV4_LIB", "PYTHONPATH")}
    env["PYTHONPATH"] = str(site)
    code = ("import dsv4, numpy as np; from dsv4._lib import lib; print(dsv4.__version__, lib._name); "
            "print(dsv4.bf16_decode(dsv4.bf16_encode(np.float32([0.25, -3.0]))))")
    out = run([sys.executable, "-c", code], env=env, cwd=tmp_path).splitlines()
    assert out[0] == f"{dsv4.__version__} {site / 'dsv4/libdsv4.so'}"
    assert out[1] == "[ 0.25 -3.  ]"
