"""`dsv4 serve` end to end on 127.0.0.1 (docs/server.md): the official `openai` client against the
built-in tiny model (random weights, DeepSeek-V4's tokenizer), its tokens against `dsv4 run` and
against float64 log-softmax of the engine's logits, concurrent streams against each alone, prefix
reuse, limits (400 / 413 / 415 / 503), hostile HTTP over raw sockets, disconnects, SIGTERM.

Behaviour that needs particular model output (tool calls, thinking, malformed DSML) goes through the
test-only request field "dsv4_forced_tokens" (accepted only with `serve --test-hooks`): the engine
still runs every step, and the ids given replace the sampled ones, so the server's parsing and
streaming of them is what is tested."""
import concurrent.futures as cf
import json
import os
import pathlib
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

openai = pytest.importorskip("openai")

LIB = os.environ.get("DSV4_LIB", "build/libdsv4.so")
EXE = pathlib.Path(LIB).resolve().parent / "dsv4"
pytestmark = pytest.mark.skipif(not EXE.exists(), reason="the dsv4 executable is not beside DSV4_LIB")

PROMPT = [0, 17, 42, 7, 99, 3]
EOS = 1


class Server:
    def __init__(self, model, tmp, *args):
        self.port_file = tmp / f"port-{time.monotonic_ns()}"
        self.log = open(tmp / f"serve-{time.monotonic_ns()}.log", "w+")
        self.proc = subprocess.Popen([str(EXE), "serve", "--model", str(model), "--port", "0", "--port-file",
                                      str(self.port_file), *args], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not self.port_file.exists():
            assert self.proc.poll() is None, self.output()
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)
        self.port = int(self.port_file.read_text())
        self.base = f"http://127.0.0.1:{self.port}"
        self.client = openai.OpenAI(base_url=self.base + "/v1", api_key="none", max_retries=0, timeout=120)

    def output(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def get(self, path):
        with urllib.request.urlopen(self.base + path, timeout=30) as r:
            return r.status, r.read().decode()

    def post(self, path, body, ctype="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, headers={"Content-Type": ctype})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, dict(r.headers), json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), json.loads(e.read())

    def health(self):
        return json.loads(self.get("/health")[1])

    def idle(self, timeout=20):
        """Every slot free and nothing queued (cancellations land within a step)."""
        deadline = time.monotonic() + timeout
        while True:
            h = self.health()
            if h["active"] == 0 and h["queued"] == 0:
                return h
            assert time.monotonic() < deadline, f"slots still busy: {h}"
            time.sleep(0.05)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=60)
        assert rc == 0, self.output()
        assert "stopped" in self.output()


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    r = subprocess.run([str(EXE), "make-tiny", "--out", str(d)], capture_output=True, text=True, timeout=300)
    if r.returncode or not (d / "tokenizer.json").exists():
        pytest.fail(f"make-tiny with the DeepSeek-V4 tokenizer failed (scripts/install-deps.sh fetches it): {r.stderr}")
    return d


@pytest.fixture(scope="module")
def srv(model, tmp_path_factory):
    s = Server(model, tmp_path_factory.mktemp("srv"), "--test-hooks", "--max-seqs", "8", "--max-queue", "96",
               "--max-tokens", "16", "--max-context", "512", "--prefix-min", "8", "--max-body", "65536",
               "--timeout", "5", "--prefill-chunk", "16")
    yield s
    s.idle()
    s.stop()


@pytest.fixture(scope="module")
def tok(model):
    from dsv4.tokenizer import Tokenizer
    return Tokenizer(str(model / "tokenizer.json"))


def run_ids(model, ids, n, temperature=0.0, top_p=1.0, seed=0, mtp=0):
    """`dsv4 run`'s tokens for the same prompt and sampling."""
    r = subprocess.run([str(EXE), "run", "--model", str(model), "--prompt-ids", ",".join(map(str, ids)), "--max-tokens",
                        str(n), "--temperature", str(temperature), "--top-p", str(top_p), "--seed", str(seed),
                        "--mtp", str(mtp), "--max-context", "512", "--output", "json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["generated_ids"]


def ids_of(choice):
    """dsv4's addition to a choice (also to every stream chunk with new tokens)."""
    return choice.model_extra.get("token_ids", [])


# ---- the openai client -------------------------------------------------------------------------------------
def test_models_health_metrics(srv):
    models = srv.client.models.list()
    assert len(models.data) == 1 and models.data[0].id.startswith("tiny") and models.data[0].owned_by == "dsv4"
    assert srv.health()["status"] == "ok"
    status, text = srv.get("/metrics")
    for name in ("dsv4_requests_total", "dsv4_prompt_tokens_total", "dsv4_generation_tokens_total", "dsv4_queue_depth",
                 "dsv4_active_sequences", "dsv4_generation_tokens_per_second", "dsv4_time_to_first_token_seconds_bucket",
                 "dsv4_inter_token_seconds_bucket", "dsv4_mtp_acceptance_ratio"):
        assert name in text, name


def test_completions_equal_run(srv, model):
    """Sampled (greedy is test_logprobs_against_float64's argmax check)."""
    sampling = dict(temperature=0.9, top_p=0.95, seed=11)
    r = srv.client.completions.create(model="tiny", prompt=PROMPT, max_tokens=10, **sampling)
    want = run_ids(model, PROMPT, 10, **sampling)
    got = ids_of(r.choices[0])
    assert got == [t for t in want if t != EOS]
    assert r.usage.prompt_tokens == len(PROMPT) and r.usage.completion_tokens == len(want)
    assert r.choices[0].finish_reason == ("stop" if want[-1] == EOS else "length")


def test_chat_equals_run(srv, model, tok):
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello, who are you?"}]
    r = srv.client.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, temperature=0.7, seed=5)
    ids = tok.encode_chat(msgs).tolist()
    want = run_ids(model, ids, 8, temperature=0.7, seed=5)
    assert ids_of(r.choices[0]) == [t for t in want if t != EOS]
    assert r.usage.prompt_tokens == len(ids)
    assert r.choices[0].message.content == tok.decode([t for t in want if t != EOS], skip_special=True)


def test_stream_equals_nonstream(srv):
    kw = dict(model="tiny", messages=[{"role": "user", "content": "Count to ten."}], max_tokens=12, temperature=0.8, seed=3)
    whole = srv.client.chat.completions.create(**kw)
    chunks = list(srv.client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]
    assert chunks[-1].usage is not None and not chunks[-1].choices
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])
    # completions streaming too
    s = "".join(c.choices[0].text for c in srv.client.completions.create(model="tiny", prompt="Once upon", max_tokens=6,
                                                                        temperature=0, stream=True) if c.choices)
    assert s == srv.client.completions.create(model="tiny", prompt="Once upon", max_tokens=6, temperature=0).choices[0].text


def test_seeds(srv):
    kw = dict(model="tiny", prompt=PROMPT, max_tokens=8, temperature=1.0)
    a, b = (ids_of(srv.client.completions.create(seed=42, **kw).choices[0]) for _ in range(2))
    assert a == b
    others = [ids_of(srv.client.completions.create(seed=s, **kw).choices[0]) for s in (1, 2, 3)]
    assert any(o != a for o in others)


def test_logprobs_against_float64(srv, model):
    """Chat logprobs and completions logprobs against float64 log-softmax of the engine's logits
    (the Python binding, one forward per token). Tolerance 2e-5: the server's values are float32
    roundings of a float64 log-softmax of the same float32 logits."""
    from dsv4.engine import Engine
    r = srv.client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, temperature=0, logprobs=3)
    got = ids_of(r.choices[0])
    lp = r.choices[0].logprobs
    with Engine(str(model), max_context=64) as e:
        s = e.seq_create()
        logits = e.forward(s, PROMPT, n_logits=1)[0][0]
        for i, t in enumerate(got):
            x = logits.astype(np.float64)
            ls = x - (x.max() + np.log(np.exp(x - x.max()).sum()))
            assert t == int(np.argmax(x))
            assert abs(lp.token_logprobs[i] - ls[t]) < 2e-5
            top = np.argsort(-x, kind="stable")[:3]
            assert np.allclose(sorted(lp.top_logprobs[i].values(), reverse=True), ls[top], atol=2e-5)
            logits = e.forward(s, [t], n_logits=1)[0][0]
    c = srv.client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=3,
                                           temperature=0, logprobs=True, top_logprobs=2)
    ent = c.choices[0].logprobs.content
    assert len(ent) == len(ids_of(c.choices[0])) and all(len(e.top_logprobs) == 2 for e in ent)
    assert all(abs(e.logprob - e.top_logprobs[0].logprob) < 1e-6 for e in ent)  # greedy: the top token


def test_stop_strings(srv):
    kw = dict(model="tiny", messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=16, temperature=0)
    full = srv.client.chat.completions.create(**kw).choices[0].message.content
    cut = len(full) // 2
    stop = full[cut:cut + 3].strip() or full[cut:cut + 3]
    at = full.index(stop)
    r = srv.client.chat.completions.create(stop=[stop, "never-appears"], **kw)
    assert r.choices[0].message.content == full[:at] and r.choices[0].finish_reason == "stop"
    s = srv.client.chat.completions.create(stop=stop, stream=True, **kw)
    assert "".join(c.choices[0].delta.content or "" for c in s if c.choices) == full[:at]


def forced(tok, text, eos=True):
    return tok.encode(text).tolist() + ([EOS] if eos else [])


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                                                           "days": {"type": "integer"}}}}}]


def assistant_text(tok, msg, thinking=False):
    """The text the model writes for an assistant message, as the prompt format renders it."""
    user = [{"role": "system", "content": "", "tools": TOOLS}, {"role": "user", "content": "q"}]
    before = tok.render_chat(user, thinking=thinking)
    full = tok.render_chat(user + [msg], thinking=thinking, keep_reasoning=True)
    assert full.startswith(before)
    return full[len(before):].removesuffix("<｜end▁of▁sentence｜>")


def test_tool_calls(srv, tok):
    text = assistant_text(tok, {"role": "assistant", "content": "Let me check.", "tool_calls": [
        {"id": "c1", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}}]})
    body = dict(model="tiny", messages=[{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS, max_tokens=200,
                extra_body={"dsv4_forced_tokens": forced(tok, text)})
    r = srv.client.chat.completions.create(**body)
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and m.content == "Let me check."
    assert len(m.tool_calls) == 1 and m.tool_calls[0].function.name == "get_weather"
    assert json.loads(m.tool_calls[0].function.arguments) == {"city": "Paris", "days": 3} and m.tool_calls[0].id
    chunks = list(srv.client.chat.completions.create(stream=True, **body))
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [tc.function.name for tc in calls] == ["get_weather"] and calls[0].index == 0
    assert json.loads("".join(tc.function.arguments for tc in calls)) == {"city": "Paris", "days": 3}
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Let me check."
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    # the call and its result go back in: the prompt is the format's (tool_calls in, tool role)
    follow = [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": "Let me check.",
              "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather",
                                                                            "arguments": "{\"city\": \"Paris\", \"days\": 3}"}}]},
              {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    r2 = srv.client.chat.completions.create(model="tiny", messages=follow, tools=TOOLS, max_tokens=1)
    want = tok.encode_chat([{"role": "system", "content": "", "tools": TOOLS}] + follow)
    assert r2.usage.prompt_tokens == len(want)


def test_malformed_dsml_is_content(srv, tok):
    text = assistant_text(tok, {"role": "assistant", "content": "Sure.", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]})
    broken = text[:text.index("</｜DSML｜parameter>")]  # cut inside the first parameter
    r = srv.client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "q"}], tools=TOOLS,
                                           max_tokens=200, extra_body={"dsv4_forced_tokens": forced(tok, broken)})
    m = r.choices[0].message
    assert not m.tool_calls and r.choices[0].finish_reason == "stop"
    assert "DSML" not in m.content and m.content.startswith("Sure.") and "Rome" in m.content


def test_thinking(srv, tok):
    text = assistant_text(tok, {"role": "assistant", "reasoning_content": "2 and 2 make 4.", "content": "Four."},
                          thinking=True)
    body = dict(model="tiny", messages=[{"role": "user", "content": "2+2?"}], max_tokens=100,
                extra_body={"thinking": {"type": "enabled"}, "dsv4_forced_tokens": forced(tok, text)})
    r = srv.client.chat.completions.create(**body)
    m = r.choices[0].message
    assert m.content == "Four." and m.model_extra["reasoning_content"] == "2 and 2 make 4."
    chunks = list(srv.client.chat.completions.create(stream=True, **body))
    assert "".join(c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks if c.choices) == "2 and 2 make 4."
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Four."
    want = tok.encode_chat([{"role": "user", "content": "2+2?"}], thinking=True)
    assert r.usage.prompt_tokens == len(want)


# ---- batching and prefix reuse ------------------------------------------------------------------------------
def test_concurrent_streams_equal_alone(srv):
    reqs = [dict(prompt=[0] + [(7 * i + 3 * k) % 500 + 2 for k in range(5 + 13 * i)], seed=i, temperature=0.8 if i % 2 else 0.0)
            for i in range(5)]

    def one(q, stream):
        kw = dict(model="tiny", max_tokens=8, **q)
        if not stream:
            return ids_of(srv.client.completions.create(**kw).choices[0])
        return [t for c in srv.client.completions.create(stream=True, **kw) if c.choices for t in ids_of(c.choices[0])]

    alone = [one(q, False) for q in reqs]
    with cf.ThreadPoolExecutor(len(reqs)) as ex:
        together = list(ex.map(lambda q: one(q, False), reqs))
    assert together == alone
    with cf.ThreadPoolExecutor(len(reqs)) as ex:
        streams = list(ex.map(lambda q: one(q, True), reqs))
    assert streams == alone


def test_prefix_reuse(srv, model):
    """A prompt that extends a finished sequence (the next turn of a conversation: its prompt, the
    tokens it generated but the last, then more) starts from the saved state; one that shares only
    a part of it is cut there (exactly, docs/server.md §3) and saves what the cut does not rerun.
    Either way the tokens are those of `dsv4 run` from nothing."""
    a = [0] + [(13 * k) % 400 + 5 for k in range(60)]
    first = ids_of(srv.client.completions.create(model="tiny", prompt=a, max_tokens=4, temperature=0,
                                                 extra_body={"ignore_eos": True}).choices[0])
    b = a + first[:3] + [(11 * k) % 300 + 7 for k in range(12)]
    r = srv.client.completions.create(model="tiny", prompt=b, max_tokens=8, temperature=0.5, seed=9)
    assert r.usage.prompt_tokens_details.cached_tokens == len(a) + 3
    assert ids_of(r.choices[0]) == [t for t in run_ids(model, b, 8, temperature=0.5, seed=9) if t != EOS]
    c = a[:40] + [(5 * k) % 200 + 3 for k in range(30)]
    r2 = srv.client.completions.create(model="tiny", prompt=c, max_tokens=6, temperature=0)
    assert 0 <= r2.usage.prompt_tokens_details.cached_tokens <= 40
    assert ids_of(r2.choices[0]) == [t for t in run_ids(model, c, 6) if t != EOS]


# ---- errors and limits -------------------------------------------------------------------------------------
def test_bad_requests(srv):
    cases = [({"prompt": PROMPT, "temperature": "hot"}, "temperature"),
             ({"prompt": PROMPT, "max_tokens": 0}, "max_tokens"),
             ({"prompt": PROMPT, "top_p": 2}, "top_p"),
             ({"prompt": [0, 10 ** 7]}, "prompt"),
             ({"prompt": PROMPT, "stop": [1]}, "stop"),
             ({"prompt": PROMPT, "n": 3}, "n"),
             ({"prompt": {"x": 1}}, "prompt")]
    for body, param in cases:
        code, _, err = srv.post("/v1/completions", body)
        assert code == 400 and err["error"]["param"] == param, (body, err)
        assert err["error"]["type"] == "invalid_request_error" and err["error"]["message"]
    for body, param in [({"messages": []}, "messages"), ({"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
                        ({"messages": [{"role": "user", "content": "x"}], "tools": "all"}, "tools"),
                        ({"messages": [{"role": "user", "content": "x"}], "logprobs": 1}, "logprobs"),
                        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages")]:
        code, _, err = srv.post("/v1/chat/completions", body)
        assert code == 400 and err["error"]["param"] == param, (body, err)
    with pytest.raises(openai.BadRequestError) as e:
        srv.client.completions.create(model="tiny", prompt=[5] * 600, max_tokens=1)
    assert e.value.body["code"] == "context_length_exceeded"
    assert srv.post("/v1/completions", b"{not json")[0] == 400
    assert srv.post("/v1/completions", b"[1, 2]")[0] == 400
    assert srv.post("/v1/completions", json.dumps({"prompt": PROMPT}).encode(), "text/plain")[0] == 415
    code, _, err = srv.post("/v1/completions", json.dumps({"prompt": PROMPT, "pad": "x" * 70000}).encode())
    assert code == 413 and "limit" in err["error"]["message"]
    code, _, _ = srv.post("/v1/nothing", {})
    assert code == 404


def raw(srv, data, read=True, timeout=10):
    with socket.create_connection(("127.0.0.1", srv.port), timeout=timeout) as s:
        s.sendall(data)
        if not read:
            return b""
        out = b""
        try:
            while True:
                b = s.recv(65536)
                if not b:
                    break
                out += b
        except (socket.timeout, ConnectionResetError):
            pass
        return out


def http(path, body, extra=b"", ctype=b"application/json"):
    return (b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: " + ctype +
            b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body)


def test_hostile_http(srv):
    good = json.dumps({"prompt": PROMPT, "max_tokens": 2}).encode()
    raw(srv, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le", read=False)         # truncated headers
    raw(srv, http(b"/v1/completions", good)[:-10], read=False)                              # truncated body
    assert raw(srv, b"\x00\xff\xfe garbage\r\n\r\n").split(b" ")[1:2] in ([b"400"], [])     # not HTTP
    huge = raw(srv, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200000 + b"\r\n\r\n")
    assert huge == b"" or huge.split(b" ")[1] in (b"413", b"431", b"400")                    # huge header
    assert raw(srv, http(b"/v1/completions", b'{"prompt": "\xff\xfe"}')).split(b" ")[1] == b"400"   # invalid UTF-8
    assert raw(srv, http(b"/v1/completions", good, ctype=b"text/xml")).split(b" ")[1] == b"415"
    chunked = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n" + b"".join(b"8000\r\n" + b"a" * 0x8000 + b"\r\n" for _ in range(4)) +
               b"0\r\n\r\n")
    assert raw(srv, chunked).split(b" ")[1] == b"413"                                          # huge chunked body
    # a slow client: the request a few bytes at a time
    with socket.create_connection(("127.0.0.1", srv.port), timeout=20) as s:
        req = http(b"/v1/completions", good)
        for i in range(0, len(req), 16):
            s.sendall(req[i:i + 16])
            time.sleep(0.01)
        resp = b""
        while (b := s.recv(65536)):
            resp += b
        assert resp.split(b" ")[1] == b"200" and b"token_ids" in resp
    # a client that hangs up mid-stream, and one that never reads: both cancel and free their slot
    before = srv.get("/metrics")[1]
    for _ in range(2):
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=20)
        s.sendall(http(b"/v1/completions", json.dumps({"prompt": PROMPT, "max_tokens": 400, "stream": True,
                                                       "temperature": 0}).encode()))
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        s.close()
    srv.idle()
    cancelled = lambda t: int(next(l for l in t.splitlines() if l.startswith("dsv4_requests_cancelled_total")).split()[1])
    assert cancelled(srv.get("/metrics")[1]) >= cancelled(before) + 2
    # 64 connections at once, all answered
    with cf.ThreadPoolExecutor(64) as ex:
        res = list(ex.map(lambda i: raw(srv, http(b"/v1/completions", json.dumps(
            {"prompt": [0, i + 2, 9], "max_tokens": 2, "temperature": 0}).encode()), timeout=120), range(64)))
    assert all(r.split(b" ")[1] == b"200" for r in res), [r[:40] for r in res if r.split(b" ")[1:2] != [b"200"]]
    assert srv.client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2).choices  # still serving
    srv.idle()


def test_mtp_busy_then_drain(model, tmp_path):
    """With MTP drafts (--mtp 2): greedy tokens equal `dsv4 run`'s without MTP, and drafts are
    counted. One slot, one queue place, a 1 s idle timeout: a stream that waits in the queue longer
    than the timeout is not cut (the timeout counts the client's silence, not the engine's); a third
    request gets 503 with Retry-After; a disconnect frees the slot; SIGTERM lets the stream in flight
    finish, then the server exits 0."""
    s = Server(model, tmp_path, "--max-seqs", "1", "--max-queue", "1", "--max-context", "512", "--mtp", "2",
               "--timeout", "1", "--drain", "300")
    try:
        r = s.client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0)
        assert ids_of(r.choices[0]) == [t for t in run_ids(model, PROMPT, 12) if t != EOS]
        drafted = next(l for l in s.get("/metrics")[1].splitlines() if l.startswith("dsv4_mtp_drafted_total"))
        assert int(drafted.split()[1]) > 0
        code, _, err = s.post("/v1/completions", {"prompt": PROMPT, "logprobs": 1})
        assert code == 400 and err["error"]["param"] == "logprobs"

        long = dict(model="tiny", prompt=PROMPT, max_tokens=300, temperature=0, stream=True, extra_body={"ignore_eos": True})
        first = s.client.completions.create(**long)
        next(iter(first))
        t0 = time.monotonic()
        queued = s.client.completions.create(**{**long, "max_tokens": 4})  # headers now, tokens after `first`
        code, headers, err = s.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 1})
        assert code == 503 and headers.get("Retry-After") and err["error"]["type"] == "server_busy"
        assert sum(len(ids_of(c.choices[0])) for c in first if c.choices) == 299
        got = [t for c in queued if c.choices for t in ids_of(c.choices[0])]
        assert len(got) == 4 and time.monotonic() - t0 > 1.5, "the queued stream did not outwait the timeout"

        first = s.client.completions.create(**long)
        next(iter(first))
        first.close()  # hang up: the slot frees at the engine's next step
        s.idle()
        assert s.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 1})[0] == 200
        stream = s.client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0, stream=True)
        it = iter(stream)
        next(it)
        s.proc.send_signal(signal.SIGTERM)
        rest = list(it)
        assert rest and rest[-1].choices[0].finish_reason == "length"
        assert s.proc.wait(timeout=60) == 0 and "stopped" in s.output()
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()
