"""bench/ggml_peer.sh, the ggml peer of `dsv4 bench linear`: without a built peer it must skip with
a message and exit 0 (the benchmark suite runs it on machines without ggml), and its usage errors
must fail. The timed run itself needs ggml and is not part of the tests (BENCHMARKS.md)."""
import os
import subprocess

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SCRIPT = os.path.join(ROOT, "bench", "ggml_peer.sh")


def run(args, tmp_path, **env):
    e = dict(os.environ, DSV4_GGML_DIR=str(tmp_path / "ggml"), **env)
    e.pop("DSV4_GGML_SRC", None)
    return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, env=e, timeout=60)


def test_skips_without_peer(tmp_path):
    lib = os.path.dirname(os.environ.get("DSV4_LIB", os.path.join(ROOT, "build", "libdsv4.so")))
    r = run([], tmp_path, DSV4_BUILD=lib)
    assert r.returncode == 0, r.stderr
    assert "skipped: ggml is not built" in r.stdout
    assert not (tmp_path / "ggml").exists() or not any((tmp_path / "ggml").iterdir())


def test_build_needs_a_snapshot(tmp_path):
    r = run(["build"], tmp_path)
    assert r.returncode == 2
    assert "needs a ggml snapshot" in r.stderr


def test_missing_dsv4_build_is_an_error(tmp_path):
    r = run([], tmp_path, DSV4_BUILD=str(tmp_path / "nowhere"))
    assert r.returncode == 1
    assert "build dsv4 first" in r.stderr
