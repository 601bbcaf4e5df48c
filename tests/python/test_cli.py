"""The `dsv4` command line, through subprocess: the one parser (every command's --help, --version,
unknown options, --opt=value, --, malformed values named), the environment warnings, and text in /
text out on the built-in tiny model with DeepSeek-V4's tokenizer (run --chat, --output json, the
prompt from stdin and from a file, the stop at end-of-sequence, chat driven through a pipe).

The tiny model's weights are random, so no output text is checked against a fixed string: each path
is checked against another one that must agree with it (streamed text against the decode of the
JSON ids, chat's second turn against `run` on the whole conversation, stdin against the argument).
Generation runs greedy and a few tokens long: the whole file takes well under a minute."""
import json
import os
import pathlib
import re
import subprocess

import pytest

import tokenizer_data

EXE = pathlib.Path(os.environ.get("DSV4_LIB", "build/libdsv4.so")).resolve().parent / "dsv4"
pytestmark = pytest.mark.skipif(not EXE.exists(), reason=f"{EXE} not built")
# the binary links its own sanitizer runtime; the tokenizer and threads come from the arguments
ENV = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "DSV4_TOKENIZER", "DSV4_THREADS", "DSV4_CPU_ISA")}
COMMANDS = ["info", "run", "chat", "tokenize", "inspect", "make-tiny", "bench"]


def dsv4(*args, stdin=None, env=None, timeout=120):
    r = subprocess.run([str(EXE), *map(str, args)], input=stdin, capture_output=True, env={**ENV, **(env or {})},
                       timeout=timeout)
    r.out, r.err = r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")
    return r


def benchmarks():
    r = dsv4("bench", "--help")
    assert r.returncode == 0, r.err
    names = re.findall(r"^  (\S+)\s", r.out.split("benchmarks:")[1], re.M)
    assert "run" in names and "formats" in names and len(names) >= 9, r.out
    return names


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The built-in model with DeepSeek-V4's tokenizer (vocabulary 129,280)."""
    d = tmp_path_factory.mktemp("cli") / "tiny"
    r = dsv4("make-tiny", "--out", d, "--tokenizer", tokenizer_data.tokenizer_json())
    assert r.returncode == 0 and "vocab 129280" in r.out, r.out + r.err
    return d


@pytest.fixture(scope="module")
def tiny_ids(tmp_path_factory):
    """The token-id model (512 ids, no tokenizer)."""
    d = tmp_path_factory.mktemp("cli") / "ids"
    assert dsv4("make-tiny", "--out", d, "--no-tokenizer").returncode == 0
    return d


def test_help_and_version_of_every_command():
    for args in [[], *[[c] for c in COMMANDS], *[["bench", b] for b in benchmarks()]]:
        for h in ("--help", "-h"):
            r = dsv4(*args, h)
            assert r.returncode == 0 and r.out.startswith("usage: dsv4") and not r.err, (args, r.out, r.err)
        r = dsv4(*args, "--version")
        assert r.returncode == 0 and re.fullmatch(r"dsv4 \d+\.\d+\.\d+\n", r.out), (args, r.out, r.err)
    assert "--max-tokens N" in dsv4("run", "--help").out and "/reset" in dsv4("chat", "--help").out
    assert "--steps N" in dsv4("bench", "run", "--help").out
    r = dsv4()  # no command: the usage on stderr
    assert r.returncode == 2 and "usage" in r.err and not r.out


def test_unknown_options_are_named():
    for args in [[c] for c in COMMANDS if c != "bench"] + [["bench", b] for b in benchmarks()]:
        r = dsv4(*args, "--no-such-option=3")
        assert r.returncode == 2 and "unknown option '--no-such-option'" in r.err and len(r.err.splitlines()) == 1, (args, r.err)
    for args, said in [(["frobnicate"], "unknown command 'frobnicate'"), (["--frob"], "unknown option '--frob'"),
                       (["bench", "nope"], "unknown benchmark 'nope'"), (["run", "-x"], "unknown option '-x'"),
                       (["run", "--m", "x"], "'--m' is ambiguous"), (["bench", "run", "--quick=1"], "'--quick' takes no value")]:
        r = dsv4(*args)
        assert r.returncode == 2 and said in r.err, (args, r.err)


def test_malformed_and_missing_values_are_named(tiny_ids):
    cases = [(["run", "--model"], "'--model' needs a value"),
             (["run", "-m"], "'-m' needs a value"),
             (["run", "--model", "--max-tokens", "3"], "'--model' needs a value"),
             (["run", "-m", tiny_ids, "--prompt-ids", "1", "--max-tokens", "abc"], "--max-tokens 'abc'"),
             (["run", "-m", tiny_ids, "--prompt-ids", "1", "--max-tokens=0"], "--max-tokens '0'"),
             (["run", "-m", tiny_ids, "--prompt-ids", "1", "--seed=+1"], "--seed '+1'"),
             (["run", "-m", tiny_ids, "--prompt-ids", "1", "--temperature", " 1"], "--temperature ' 1'"),
             (["run", "-m", tiny_ids, "--prompt-ids", "1", "--top-p", "nan"], "--top-p 'nan'"),
             (["run", "-m", tiny_ids, "--prompt-ids", "1", "--output", "xml"], "--output 'xml'"),
             (["run", "-m", tiny_ids], "give exactly one of"),
             (["run", "-m", tiny_ids, "--prompt-ids", "1", "--think"], "--think"),
             (["make-tiny", "--seed", "-1", "--out", "x"], "--seed '-1'"),
             (["bench", "run", "--threads", "x"], "--threads 'x'"),
             (["bench", "bandwidth", "--threads", "1000000000"], "--threads '1000000000'"),
             (["inspect"], "missing argument"),
             (["inspect", "a", "b"], "unexpected argument 'b'")]
    for args, said in cases:
        r = dsv4(*args)
        assert r.returncode == 2 and said in r.err and len(r.err.splitlines()) == 1, (args, r.err)


def test_prompt_ids_are_strict(tiny_ids):
    for bad in [" 1, 2", "+1", "1,,2", "1,", "", "1 2", "0x10", "512", "-1"]:
        r = dsv4("run", "--model", tiny_ids, "--prompt-ids", bad, "-n", "1")
        assert r.returncode == 1 and f"'{bad}' is not a list of ids" in r.err, (bad, r.err)
    # --opt=value and --opt value give the same run
    a = dsv4("run", f"--model={tiny_ids}", "--prompt-ids=1,2,3", "--max-tokens=3", "--ignore-eos", "--output=json")
    b = dsv4("run", "-m", tiny_ids, "--prompt-ids", "1,2,3", "-n", "3", "--ignore-eos", "-o", "json")
    assert a.returncode == 0 and b.returncode == 0, a.err + b.err
    ja, jb = json.loads(a.out), json.loads(b.out)
    assert ja["prompt_ids"] == [1, 2, 3] and len(ja["generated_ids"]) == 3 and ja["generated_ids"] == jb["generated_ids"]


def test_double_dash_ends_the_options(tiny):
    r = dsv4("tokenize", "--tokenizer", tiny, "--ids", "--", "--help")
    want = dsv4("tokenize", "--tokenizer", tiny, "--ids", "-", stdin=b"--help")
    assert r.returncode == 0 and want.returncode == 0 and r.out.split() and r.out == want.out, r.out + r.err + want.err
    r = dsv4("tokenize", "--tokenizer", tiny, "--decode", "--", "-1")
    assert r.returncode == 1 and "-1" in r.err, r.err  # an id now, and outside the vocabulary


def test_environment_warnings(tiny_ids):
    cores = os.cpu_count()
    r = dsv4("info", env={"DSV4_THREADS": "abc"})
    assert r.returncode == 0 and "DSV4_THREADS='abc'" in r.err and "warning" in r.err, r.err
    assert re.search(r"threads:\s+(\d+)", r.out).group(1) == str(len(os.sched_getaffinity(0))), r.out
    r = dsv4("info", env={"DSV4_THREADS": "1000000000"})
    assert r.returncode == 0 and "DSV4_THREADS=1000000000" in r.err, r.err
    assert int(re.search(r"threads:\s+(\d+)", r.out).group(1)) <= cores, r.out
    # pinned to one core (as `taskset -c N` does): the default and the warning's count follow the mask
    last = max(os.sched_getaffinity(0))
    r = subprocess.run([str(EXE), "info"], capture_output=True, text=True, env={**ENV, "DSV4_THREADS": "abc"},
                       preexec_fn=lambda: os.sched_setaffinity(0, {last}), timeout=120)
    assert r.returncode == 0 and "using 1, the cores" in r.stderr, r.stderr
    assert re.search(r"threads:\s+(\d+)", r.stdout).group(1) == "1", r.stdout
    r = dsv4("info", env={"DSV4_CPU_ISA": "avx9000"})
    assert r.returncode == 0 and "DSV4_CPU_ISA='avx9000'" in r.err, r.err
    r = dsv4("info", env={"DSV4_THREADS": "2"})
    assert r.returncode == 0 and not r.err, r.err
    r = dsv4("run", "-m", tiny_ids, "--prompt-ids", "1", "-n", "1", "--max-context", "8192")
    assert r.returncode == 0 and "--max-context 8192 is beyond the model's max_position_embeddings (4096)" in r.err, r.err


def test_run_chat_text_and_json(tiny, tmp_path):
    """Streamed text equals the decode of the generated ids; the JSON parses with a `"` in the model
    path; the seed is printed and --seed is taken."""
    r = dsv4("run", "--model", tiny, "--chat", "Hello!", "-n", "6", "--ignore-eos", "--seed", "7")
    assert r.returncode == 0 and "decode 5 tokens" in r.err and "seed 7" in r.err and "random" not in r.err, r.err
    odd = tmp_path / 'ti"ny \\ model'
    odd.symlink_to(tiny, target_is_directory=True)
    j = dsv4("run", "--model", odd, "--chat", "Hello!", "-n", "6", "--ignore-eos", "--output", "json")
    assert j.returncode == 0 and "(random)" in j.err, j.err
    out = json.loads(j.stdout)
    assert out["model"] == str(odd) and len(out["generated_ids"]) == 6
    # 64-bit counts are exact integers (a JSON writer of doubles would print 1.5e+15)
    assert type(out["seed"]) is int and f"seed {out['seed']} (random)" in j.err, (out["seed"], j.err)
    assert all(type(v) is int for v in out["memory"].values()) and out["memory"]["weights_mapped"] > 100e6
    ids = " ".join(map(str, out["generated_ids"]))
    dec = dsv4("tokenize", "--tokenizer", tiny, "--decode", *ids.split())
    assert dec.returncode == 0 and r.stdout == dec.stdout, (r.stdout, dec.stdout)  # both end with one "\n"
    assert out["text"] == r.stdout[:-1].decode("utf-8", "replace")
    want = dsv4("tokenize", "--tokenizer", tiny, "--chat", "--ids", "Hello!").out.split()
    assert out["prompt_ids"] == [int(x) for x in want]
    assert [t for s in out["steps"] for t in s["tokens"]] == out["generated_ids"]


def test_prompt_from_stdin_and_file(tiny, tmp_path):
    msg = "Bonjour, ça va ? 你好"
    (tmp_path / "msg.txt").write_text(msg, encoding="utf-8")
    base = ["run", "--model", tiny, "-n", "1", "-o", "json", "--system", "Be brief."]
    ref = json.loads(dsv4(*base, "--chat", msg).stdout)["prompt_ids"]
    assert json.loads(dsv4(*base, "--chat", "-", stdin=msg.encode()).stdout)["prompt_ids"] == ref
    assert json.loads(dsv4(*base, "--chat-file", tmp_path / "msg.txt").stdout)["prompt_ids"] == ref
    want = dsv4("tokenize", "--tokenizer", tiny, "--chat", "--system", "Be brief.", "--ids", msg).out.split()
    assert ref == [int(x) for x in want]
    think = json.loads(dsv4(*base, "--chat", msg, "--think").stdout)["prompt_ids"]
    assert think != ref and think == [int(x) for x in dsv4("tokenize", "--tokenizer", tiny, "--think", "--system",
                                                             "Be brief.", "--ids", msg).out.split()]
    plain = ["run", "--model", tiny, "-n", "1", "-o", "json"]
    a = json.loads(dsv4(*plain, "--prompt-file", "-", stdin=msg.encode()).stdout)["prompt_ids"]
    b = json.loads(dsv4(*plain, "--prompt", msg).stdout)["prompt_ids"]
    enc = dsv4("tokenize", "--tokenizer", tiny, "--no-special", "--ids", msg).out.split()
    assert a == b == [0] + [int(x) for x in enc]  # BOS, then the text
    r = dsv4(*plain, "--prompt-file", tmp_path / "nope.txt")
    assert r.returncode == 1 and "nope.txt" in r.err


def test_stop_at_end_of_sequence(tiny_ids, tmp_path):
    """A copy of the model whose EOS is the token greedy decoding produces third: the run stops
    there (that token included), and with --ignore-eos goes on."""
    args = ["--prompt-ids", "5,6,7", "-n", "8", "-o", "json"]
    full = json.loads(dsv4("run", "-m", tiny_ids, *args, "--ignore-eos").stdout)["generated_ids"]
    eos = full[2]
    stop = full.index(eos) + 1
    d = tmp_path / "eos"
    d.mkdir()
    for f in tiny_ids.iterdir():
        (d / f.name).symlink_to(f)
    cfg = json.loads((tiny_ids / "config.json").read_text())
    cfg["eos_token_id"] = eos
    (d / "config.json").unlink()
    (d / "config.json").write_text(json.dumps(cfg))
    assert json.loads(dsv4("run", "-m", d, *args).stdout)["generated_ids"] == full[:stop]
    assert json.loads(dsv4("run", "-m", d, *args, "--ignore-eos").stdout)["generated_ids"] == full


def test_chat_through_a_pipe(tiny):
    """Two turns, /reset, the first message again: the third answer equals the first, and the second
    equals `run` on the whole conversation as one prompt (the turn continued the sequence)."""
    n = "4"
    script = "Hello!\n/think off\nWhat is 2+2?\n/help\n/reset\nHello!\n/bogus\n/quit\nnever read\n"
    r = dsv4("chat", "--model", tiny, "-n", n, "--ignore-eos", "--seed", "3", stdin=script.encode())
    assert r.returncode == 0, r.err
    assert r.err.count("decode 3 tokens") == 3 and "/reset" in r.err and "unknown command '/bogus'" in r.err, r.err
    assert "a new conversation" in r.err and "seed 3" in r.err
    run = lambda *a: json.loads(dsv4("run", "--model", tiny, "-n", n, "--ignore-eos", "-o", "json", *a).stdout)
    t1 = run("--chat", "Hello!")
    user2 = [int(x) for x in dsv4("tokenize", "--tokenizer", tiny, "--chat", "--ids", "What is 2+2?").out.split()]
    end = int(dsv4("tokenize", "--tokenizer", tiny, "--ids", "<｜end▁of▁sentence｜>").out.split()[-1])
    whole = t1["prompt_ids"] + t1["generated_ids"] + [end] + user2[1:]
    t2 = run("--prompt-ids", ",".join(map(str, whole)))
    dec = lambda ids: dsv4("tokenize", "--tokenizer", tiny, "--decode", *map(str, ids)).stdout[:-1]
    want = dec(t1["generated_ids"]) + b"\n" + dec(t2["generated_ids"]) + b"\n" + dec(t1["generated_ids"]) + b"\n"
    assert r.stdout == want, (r.stdout, want)
    ctx = [int(x) for x in re.findall(r"context (\d+)/", r.err)]
    assert ctx == [len(t1["prompt_ids"]) + 4, len(whole) + 4, len(t1["prompt_ids"]) + 4], (ctx, r.err)
    r = dsv4("chat", "--model", tiny, "--tokenizer", tiny / "nope.json", stdin=b"hi\n")
    assert r.returncode == 1 and "nope.json" in r.err


def test_progress_on_a_terminal(tiny_ids):
    """With stderr on a terminal: the loading line and a long prefill fed in chunks with a progress
    line; the tokens are those of the run without a terminal (the engine's state does not depend on
    how the prompt was batched)."""
    import pty
    ids = ",".join(str((7 * i) % 500 + 1) for i in range(100))
    args = [str(EXE), "run", "-m", str(tiny_ids), "--prompt-ids", ids, "-n", "4", "--max-batch", "16", "--mtp", "1",
            "--ignore-eos", "-o", "json"]
    master, slave = pty.openpty()
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=slave, env=ENV)
    os.close(slave)
    err = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        err += chunk
    out = p.communicate(timeout=120)[0]
    os.close(master)
    err = err.decode("utf-8", "replace")
    assert p.returncode == 0 and "loading" in err and "prefill 96/100 tokens" in err and "prefill 100 tokens" in err, err
    plain = dsv4(*args[1:])
    assert plain.returncode == 0 and "loading" not in plain.err and "/100" not in plain.err, plain.err
    assert json.loads(out)["generated_ids"] == json.loads(plain.stdout)["generated_ids"]
