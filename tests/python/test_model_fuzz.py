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


def _campaign():
    """A long campaign instead of the bounded pass (docs/testing.md §6): $DSV4_FUZZ_RUNS executions
    in all, shared by $DSV4_FUZZ_WORKERS libFuzzer workers (-jobs) over one corpus."""
    workers = int(os.environ.get("DSV4_FUZZ_WORKERS", "1"))
    runs = int(os.environ["DSV4_FUZZ_RUNS"]) if "DSV4_FUZZ_RUNS" in os.environ else 0
    assert workers >= 1 and runs >= 0, "DSV4_FUZZ_WORKERS must be >= 1 and DSV4_FUZZ_RUNS >= 0"
    args = [f"-runs={-(-runs // workers)}"] if runs else []
    if workers > 1:
        args += [f"-jobs={workers}", f"-workers={workers}"]
    return runs, workers, args


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
    build = subprocess.run([clang, "-g", "-O2", "-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=undefined",
                            "-std=c17", "-D_POSIX_C_SOURCE=200809L", "-I", str(ROOT / "include"), "-I", str(ROOT / "src"),
                            *[str(ROOT / s) for s in sources], *libs, "-o", str(exe)],
                           capture_output=True, text=True, env=env)
    if build.returncode != 0 and ("fuzzer" in build.stderr and ("cannot find" in build.stderr or "not found" in build.stderr)):
        pytest.skip("libFuzzer runtime is not installed: " + build.stderr.strip().splitlines()[-1])
    assert build.returncode == 0, build.stderr
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    seconds = _seconds()
    runs, workers, extra = _campaign()
    run = subprocess.run([str(exe), f"-max_total_time={seconds}", "-max_len=8192", "-rss_limit_mb=2048", "-timeout=10",
                          f"-dict={ROOT / 'tests/fuzz' / dictionary}", f"-artifact_prefix={tmp_path}/", "-print_final_stats=1",
                          *extra, str(corpus), str(ROOT / "tests/fuzz" / seeds)],
                         capture_output=True, text=True, env=env, timeout=seconds + 120, cwd=tmp_path)
    # with -jobs each worker writes fuzz-N.log in the working folder
    logs = [run.stderr] + [p.read_text(errors="replace") for p in sorted(tmp_path.glob("fuzz-*.log"))]
    tail = "\n".join(logs[-1].splitlines()[-30:])
    crashes = [p.name for p in tmp_path.iterdir() if p.name.startswith(("crash-", "leak-", "timeout-", "oom-"))]
    assert run.returncode == 0 and not crashes, f"fuzzer found {crashes}:\n{tail}"
    done = [int(line.split(":")[-1]) for log in logs[1 if workers > 1 else 0:] for line in log.splitlines()
            if "number_of_executed_units" in line]
    print(f"fuzz_{target}: {sum(done)} executions by {len(done)} worker(s) in at most {seconds} s")
    assert done and sum(done) >= runs, f"only {sum(done)} of {runs} executions in {seconds} s:\n{tail}"
