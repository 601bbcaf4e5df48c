"""Builds the libFuzzer targets with clang and runs each for a bounded time from its seed corpus:
the checkpoint parsers (tests/fuzz/fuzz_model.c) and the chat format, its renderer and its reader of
completions (tests/fuzz/fuzz_chat.c), and the tokenizer loader with encode / decode of what loads
(tests/fuzz/fuzz_tokenizer.c). Skipped when clang or libFuzzer is missing
(scripts/install-deps.sh installs both)."""
import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TARGETS = {  # name: (sources, dictionary, seed corpus)
    "model": (["tests/fuzz/fuzz_model.c", "src/core/json.c", "src/model/safetensors.c", "src/model/config.c",
               "src/core/error.c", "src/core/file.c", "src/core/tensor.c"], "model.dict", "corpus"),
    "chat": (["tests/fuzz/fuzz_chat.c", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "src/tokenizer").glob("*.c")),
              "src/core/json.c", "src/core/error.c", "src/core/file.c"], "chat.dict", "corpus_chat"),
    "tokenizer": (["tests/fuzz/fuzz_tokenizer.c", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "src/tokenizer").glob("*.c")),
                   "src/core/json.c", "src/core/error.c", "src/core/file.c"], "tokenizer.dict", "corpus_tokenizer"),
}


def _seconds():
    # 20 s in the normal suite; under the sanitizer run (LD_PRELOAD=libasan) the same target has
    # already been exercised, so a shorter pass keeps the doubled suite fast.
    if "DSV4_FUZZ_SECONDS" in os.environ:
        return int(os.environ["DSV4_FUZZ_SECONDS"])
    return 8 if "asan" in os.environ.get("LD_PRELOAD", "") else 20


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_fuzz(tmp_path, target):
    sources, dictionary, seeds = TARGETS[target]
    clang = shutil.which("clang")
    if not clang:
        pytest.skip("clang is not installed")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS")}
    exe = tmp_path / f"fuzz_{target}"
    libs = ["-lm", "-lpthread"]
    if target in ("chat", "tokenizer"):
        pc = subprocess.run(["pkg-config", "--cflags", "--libs", "libpcre2-8"], capture_output=True, text=True)
        assert pc.returncode == 0, "libpcre2-8 not found by pkg-config (scripts/install-deps.sh installs it)"
        libs = pc.stdout.split() + libs
    build = subprocess.run([clang, "-g", "-O1", "-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=undefined",
                            "-std=c17", "-D_POSIX_C_SOURCE=200809L", "-I", str(ROOT / "include"), "-I", str(ROOT / "src"),
                            *[str(ROOT / s) for s in sources], *libs, "-o", str(exe)],
                           capture_output=True, text=True, env=env)
    if build.returncode != 0 and ("fuzzer" in build.stderr and ("cannot find" in build.stderr or "not found" in build.stderr)):
        pytest.skip("libFuzzer runtime is not installed: " + build.stderr.strip().splitlines()[-1])
    assert build.returncode == 0, build.stderr
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    seconds = _seconds()
    run = subprocess.run([str(exe), f"-max_total_time={seconds}", "-max_len=8192", "-rss_limit_mb=2048", "-timeout=10",
                          f"-dict={ROOT / 'tests/fuzz' / dictionary}", f"-artifact_prefix={tmp_path}/", "-print_final_stats=1",
                          str(corpus), str(ROOT / "tests/fuzz" / seeds)],
                         capture_output=True, text=True, env=env, timeout=seconds + 120)
    tail = "\n".join(run.stderr.splitlines()[-30:])
    crashes = [p.name for p in tmp_path.iterdir() if p.name.startswith(("crash-", "leak-", "timeout-", "oom-"))]
    assert run.returncode == 0 and not crashes, f"fuzzer found {crashes}:\n{tail}"
    runs = [line for line in run.stderr.splitlines() if "number_of_executed_units" in line]
    print(runs[0] if runs else tail)
