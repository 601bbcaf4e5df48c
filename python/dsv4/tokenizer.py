"""Tokenizer (include/dsv4/tokenizer.h): Hugging Face byte-level BPE `tokenizer.json` and the
DeepSeek-V4 prompt format. Ids travel as int32 numpy arrays; text as str (UTF-8) or bytes."""
import ctypes
import json

import numpy as np

from ._lib import c_struct
from ._lib import DSV4Error, check, lib, new_output

ROLES = {"system": 0, "user": 1, "assistant": 2, "tool": 3}
SPECIAL_AS_TEXT = 1
SKIP_SPECIAL = 1

_P = ctypes.c_void_p
_SZ = ctypes.c_size_t
_SZP = ctypes.POINTER(ctypes.c_size_t)


@c_struct("dsv4_tool_call")
class ToolCall(ctypes.Structure):
    _fields_ = [("id", ctypes.c_char_p), ("id_len", _SZ), ("name", ctypes.c_char_p), ("name_len", _SZ),
                ("arguments", ctypes.c_char_p), ("arguments_len", _SZ)]


@c_struct("dsv4_chat_message")
class ChatMessage(ctypes.Structure):
    _fields_ = [("role", ctypes.c_int), ("content", ctypes.c_char_p), ("content_len", _SZ),
                ("reasoning", ctypes.c_char_p), ("reasoning_len", _SZ),
                ("tools", ctypes.c_char_p), ("tools_len", _SZ),
                ("tool_calls", ctypes.POINTER(ToolCall)), ("n_tool_calls", _SZ),
                ("tool_call_id", ctypes.c_char_p), ("tool_call_id_len", _SZ)]


@c_struct("dsv4_prompt_options")
class PromptOptions(ctypes.Structure):
    _fields_ = [("mode", ctypes.c_int), ("keep_reasoning", ctypes.c_int)]


@c_struct("dsv4_decode_stream")
class _Stream(ctypes.Structure):
    _fields_ = [("pending", ctypes.c_uint8 * 4), ("n_pending", ctypes.c_uint32), ("flags", ctypes.c_uint)]


lib.dsv4_tokenizer_load.argtypes = [ctypes.c_char_p, ctypes.POINTER(_P)]
lib.dsv4_tokenizer_load_json.argtypes = [ctypes.c_char_p, _SZ, ctypes.POINTER(_P)]
lib.dsv4_tokenizer_free.argtypes = [_P]
lib.dsv4_tokenizer_vocab_size.argtypes = [_P]
lib.dsv4_tokenizer_vocab_size.restype = ctypes.c_int32
lib.dsv4_tokenizer_max_token_bytes.argtypes = [_P]
lib.dsv4_tokenizer_max_token_bytes.restype = _SZ
lib.dsv4_tokenizer_max_ids.argtypes = [_P, _SZ]
lib.dsv4_tokenizer_max_ids.restype = _SZ
lib.dsv4_tokenizer_token_id.argtypes = [_P, ctypes.c_char_p, _SZ, ctypes.POINTER(ctypes.c_int32)]
lib.dsv4_tokenizer_token_text.argtypes = [_P, ctypes.c_int32, ctypes.POINTER(ctypes.c_char_p), _SZP]
lib.dsv4_tokenizer_is_special.argtypes = [_P, ctypes.c_int32]
lib.dsv4_tokenizer_encode.argtypes = [_P, ctypes.c_char_p, _SZ, ctypes.c_uint, _P, _SZ, _SZP]
lib.dsv4_tokenizer_decode.argtypes = [_P, _P, _SZ, ctypes.c_uint, _P, _SZ, _SZP]
lib.dsv4_decode_stream_init.argtypes = [ctypes.POINTER(_Stream), ctypes.c_uint]
lib.dsv4_decode_stream_init.restype = None
lib.dsv4_decode_stream_step.argtypes = [_P, ctypes.POINTER(_Stream), ctypes.c_int32, _P, _SZ, _SZP]
lib.dsv4_decode_stream_flush.argtypes = [ctypes.POINTER(_Stream), _P, _SZ, _SZP]
lib.dsv4_prompt_render.argtypes = [ctypes.POINTER(ChatMessage), _SZ, ctypes.POINTER(PromptOptions), _P, _SZ, _SZP]
lib.dsv4_prompt_encode.argtypes = [_P, ctypes.POINTER(ChatMessage), _SZ, ctypes.POINTER(PromptOptions), _P, _SZ, _SZP]
lib.dsv4_completion_parse.argtypes = [ctypes.c_char_p, _SZ, ctypes.c_int, _P, _SZ, _SZP]


def _as_bytes(text, name="text"):
    if isinstance(text, str):
        return text.encode("utf-8", "surrogateescape")
    if isinstance(text, (bytes, bytearray, memoryview)):
        return bytes(text)
    raise DSV4Error(1, f"{name}: expected str or bytes, got {type(text).__name__}")


def _ids_array(ids):
    a = np.asarray(ids)
    if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
        raise DSV4Error(3, f"ids: expected a 1-d array of integers, got {a.dtype} with shape {a.shape}")
    if a.size and (a.min() < -2**31 or a.max() >= 2**31):
        raise DSV4Error(5, "ids: values outside int32")
    return np.ascontiguousarray(a, dtype=np.int32)


def _json_text(value, name):
    """A JSON value given as text (str/bytes, passed on) or as Python objects (json.dumps)."""
    if isinstance(value, (str, bytes, bytearray, memoryview)):
        return _as_bytes(value, name)
    return json.dumps(value, ensure_ascii=False).encode("utf-8")


def _messages(messages):
    """list of OpenAI-style messages -> (ctypes array, keep-alive list): {"role": "system" | "user" |
    "assistant" | "tool", "content", "reasoning_content"? (assistant), "tools"? (system: the tools
    list, objects or JSON text), "tool_calls"? (assistant: [{"id", "function": {"name",
    "arguments"}}], arguments an object or JSON text), "tool_call_id"? (tool)}."""
    arr = (ChatMessage * max(len(messages), 1))()
    keep = []
    for i, m in enumerate(messages):
        role = m.get("role")
        if role not in ROLES:
            raise DSV4Error(1, f"message {i}: role {role!r} is not one of {sorted(ROLES)}")
        content = _as_bytes(m.get("content") or "", "content")
        reasoning = _as_bytes(m.get("reasoning_content") or "", "reasoning_content")
        tools = _json_text(m["tools"], "tools") if m.get("tools") else b""
        call_id = _as_bytes(m.get("tool_call_id") or "", "tool_call_id")
        calls = m.get("tool_calls") or []
        carr = (ToolCall * max(len(calls), 1))()
        for c, tc in enumerate(calls):
            fn = tc.get("function", tc)
            args = fn.get("arguments")
            args = b"" if args is None else _json_text(args, "arguments")
            cid, name = _as_bytes(tc.get("id") or "", "id"), _as_bytes(fn.get("name") or "", "name")
            keep += [args, cid, name]
            carr[c] = ToolCall(cid, len(cid), name, len(name), args, len(args))
        keep += [content, reasoning, tools, call_id, carr]
        arr[i] = ChatMessage(ROLES[role], content, len(content), reasoning, len(reasoning), tools, len(tools),
                             carr if calls else None, len(calls), call_id, len(call_id))
    return arr, keep


class DecodeStream:
    """Streaming decode: step(id) returns the bytes that are ready (never half a UTF-8
    character); flush() returns what is left at the end."""

    def __init__(self, tokenizer, skip_special=False):
        self._tok = tokenizer
        self._st = _Stream()
        lib.dsv4_decode_stream_init(ctypes.byref(self._st), SKIP_SPECIAL if skip_special else 0)
        self._buf = ctypes.create_string_buffer(lib.dsv4_tokenizer_max_token_bytes(tokenizer._h) + 4)

    def step(self, token_id):
        """The bytes ready after one more id (never the middle of a UTF-8 character)."""
        n = _SZ()
        check(lib.dsv4_decode_stream_step(self._tok._h, ctypes.byref(self._st), int(token_id), self._buf,
                                          len(self._buf), ctypes.byref(n)))
        return self._buf.raw[:n.value]

    def flush(self):
        """The bytes still waiting at the end (an unfinished character), emptying the stream."""
        n = _SZ()
        check(lib.dsv4_decode_stream_flush(ctypes.byref(self._st), self._buf, len(self._buf), ctypes.byref(n)))
        return self._buf.raw[:n.value]


class Tokenizer:
    """A loaded tokenizer.json: Tokenizer(path) or Tokenizer(json=text_or_bytes)."""

    def __init__(self, path=None, json=None):
        if (path is None) == (json is None):
            raise DSV4Error(1, "Tokenizer: give either a path or json")
        h = _P()
        if path is not None:
            check(lib.dsv4_tokenizer_load(str(path).encode(), ctypes.byref(h)))
        else:
            data = _as_bytes(json, "json")
            check(lib.dsv4_tokenizer_load_json(data, len(data), ctypes.byref(h)))
        self._h = h

    def __del__(self):
        h = getattr(self, "_h", None)
        if h:
            lib.dsv4_tokenizer_free(h)
            self._h = None

    @property
    def vocab_size(self):
        """Number of ids: valid ids are 0 .. vocab_size - 1."""
        return lib.dsv4_tokenizer_vocab_size(self._h)

    def token_to_id(self, token):
        """Id of a token written as in tokenizer.json, or None."""
        b = _as_bytes(token, "token")
        out = ctypes.c_int32()
        st = lib.dsv4_tokenizer_token_id(self._h, b, len(b), ctypes.byref(out))
        if st == 12:  # DSV4_ERR_NOT_FOUND
            return None
        check(st)
        return out.value

    def id_to_token(self, token_id):
        """The token's text as written in tokenizer.json."""
        s, n = ctypes.c_char_p(), _SZ()
        check(lib.dsv4_tokenizer_token_text(self._h, int(token_id), ctypes.byref(s), ctypes.byref(n)))
        return ctypes.string_at(s, n.value).decode("utf-8")

    def is_special(self, token_id):
        """Whether the id is an added token marked special (BOS, EOS, role markers)."""
        r = lib.dsv4_tokenizer_is_special(self._h, int(token_id))
        if r < 0:
            raise DSV4Error(5, f"id {token_id} is not in the vocabulary")
        return bool(r)

    def encode(self, text, special=True):
        """Ids of text (str or any bytes). special=False reads special tokens as plain text."""
        b = _as_bytes(text)
        out = new_output(lib.dsv4_tokenizer_max_ids(self._h, len(b)), np.int32)
        n = _SZ()
        check(lib.dsv4_tokenizer_encode(self._h, b, len(b), 0 if special else SPECIAL_AS_TEXT,
                                        out.ctypes.data if out.size else None, out.size, ctypes.byref(n)))
        return out[:n.value].copy()

    def decode_bytes(self, ids, skip_special=False):
        """The bytes of the ids concatenated (exactly those that were encoded), special tokens left
        out with skip_special."""
        a = _ids_array(ids)
        n = _SZ()
        flags = SKIP_SPECIAL if skip_special else 0
        ptr = a.ctypes.data if a.size else None
        check(lib.dsv4_tokenizer_decode(self._h, ptr, a.size, flags, None, 0, ctypes.byref(n)))
        buf = ctypes.create_string_buffer(max(n.value, 1))
        check(lib.dsv4_tokenizer_decode(self._h, ptr, a.size, flags, buf, len(buf), ctypes.byref(n)))
        return buf.raw[:n.value]

    def decode(self, ids, skip_special=False):
        """Text of ids; bytes that are not UTF-8 become U+FFFD (as tokenizers' decode does)."""
        return self.decode_bytes(ids, skip_special).decode("utf-8", "replace")

    def decode_stream(self, skip_special=False):
        """A DecodeStream over this tokenizer, for decoding one generated id at a time."""
        return DecodeStream(self, skip_special)

    def render_chat(self, messages, thinking=False, keep_reasoning=False):
        """The DeepSeek-V4 prompt of the messages as text (the module's render_chat)."""
        return render_chat(messages, thinking, keep_reasoning)

    def encode_chat(self, messages, thinking=False, keep_reasoning=False):
        """Ids of the DeepSeek-V4 prompt (BOS first) for a list of {"role", "content",
        "reasoning_content"} messages, ending with the opening of the assistant's turn."""
        arr, keep = _messages(messages)
        opt = PromptOptions(1 if thinking else 0, 1 if keep_reasoning else 0)
        n = _SZ()
        check(lib.dsv4_prompt_encode(self._h, arr, len(messages), ctypes.byref(opt), None, 0, ctypes.byref(n)))
        out = new_output(max(n.value, 1), np.int32)
        check(lib.dsv4_prompt_encode(self._h, arr, len(messages), ctypes.byref(opt), out.ctypes.data, out.size,
                                     ctypes.byref(n)))
        del keep
        return out[:n.value].copy()


def render_chat(messages, thinking=False, keep_reasoning=False):
    """The DeepSeek-V4 prompt text (str) for a list of messages (see Tokenizer.encode_chat)."""
    arr, keep = _messages(messages)
    opt = PromptOptions(1 if thinking else 0, 1 if keep_reasoning else 0)
    n = _SZ()
    check(lib.dsv4_prompt_render(arr, len(messages), ctypes.byref(opt), None, 0, ctypes.byref(n)))
    buf = ctypes.create_string_buffer(max(n.value, 1))
    check(lib.dsv4_prompt_render(arr, len(messages), ctypes.byref(opt), buf, len(buf), ctypes.byref(n)))
    del keep
    return buf.raw[:n.value].decode("utf-8", "surrogateescape")


def parse_completion(text, thinking=False):
    """The assistant message of a completion (decoded with special tokens, ending with the
    end-of-sentence token) as a dict {"role", "content", "reasoning_content", "tool_calls"}."""
    raw = _as_bytes(text, "text")
    n = _SZ()
    check(lib.dsv4_completion_parse(raw, len(raw), 1 if thinking else 0, None, 0, ctypes.byref(n)))
    buf = ctypes.create_string_buffer(max(n.value, 1))
    check(lib.dsv4_completion_parse(raw, len(raw), 1 if thinking else 0, buf, len(buf), ctypes.byref(n)))
    return json.loads(buf.raw[:n.value].decode("utf-8", "surrogateescape"))
