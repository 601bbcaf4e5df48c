"""Builds the libFuzzer target of the checkpoint parsers (tests/fuzz/fuzz_model.c) with clang and
runs it for a bounded time from the seed corpus. Skipped when clang or libFuzzer is missing
(scripts/install-deps.sh installs both)."""
import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCES = ["tests/fuzz/fuzz_model.c", "src/core/json.c", "src/model/safetensors.c", "src/model/config.c",
           "src/core/error.c", "src/core/file.c", "src/core/tensor.c"]


def _seconds():
    # 20 s in the normal suite; under the sanitizer run (LD_PRELOAD=libasan) the same target has
    # already been exercised, so a shorter pass keeps the doubled suite fast.
    if "DSV4_FUZZ_SECONDS" in os.environ:
        return int(os.environ["DSV4_FUZZ_SECONDS"])
    return 8 if "asan" in os.environ.get("LD_PRELOAD", "") else 20


def test_fuzz_checkpoint_parsers(tmp_path):
    clang = shutil.which("clang")
    if not clang:
        pytest.skip("clang is not installed")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS")}
    exe = tmp_path / "fuzz_model"
    build = subprocess.run([clang, "-g", "-O1", "-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=undefined",
                            "-std=c17", "-D_POSIX_C_SOURCE=200809L", "-I", str(ROOT / "include"), "-I", str(ROOT / "src"),
                            *[str(ROOT / s) for s in SOURCES], "-lm", "-o", str(exe)],
                           capture_output=True, text=True, env=env)
    if build.returncode != 0 and ("fuzzer" in build.stderr and ("cannot find" in build.stderr or "not found" in build.stderr)):
        pytest.skip("libFuzzer runtime is not installed: " + build.stderr.strip().splitlines()[-1])
    assert build.returncode == 0, build.stderr
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    seconds = _seconds()
    run = subprocess.run([str(exe), f"-max_total_time={seconds}", "-max_len=8192", "-rss_limit_mb=2048", "-timeout=10",
                          f"-dict={ROOT / 'tests/fuzz/model.dict'}", f"-artifact_prefix={tmp_path}/", "-print_final_stats=1",
                          str(corpus), str(ROOT / "tests/fuzz/corpus")],
                         capture_output=True, text=True, env=env, timeout=seconds + 120)
    tail = "\n".join(run.stderr.splitlines()[-30:])
    crashes = [p.name for p in tmp_path.iterdir() if p.name.startswith(("crash-", "leak-", "timeout-", "oom-"))]
    assert run.returncode == 0 and not crashes, f"fuzzer found {crashes}:\n{tail}"
    runs = [line for line in run.stderr.splitlines() if "number_of_executed_units" in line]
    print(runs[0] if runs else tail)
