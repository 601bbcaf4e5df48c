"""The decode engine (include/dsv4/engine.h): load a checkpoint with planned memory, sequences,
prefill / decode with logits of several positions, the MTP block's logits, state export, sampling
and generation with MTP speculative decoding. Token ids are int32; logits come back as float32
numpy arrays [rows, vocab]."""
import ctypes

import numpy as np

from ._lib import DSV4Error, check, ctx, lib
from .model import ModelConfig, _config_dict

_P = ctypes.c_void_p


class EngineOptions(ctypes.Structure):
    _fields_ = [("max_context", ctypes.c_int64), ("max_seqs", ctypes.c_int), ("max_batch", ctypes.c_int),
                ("max_mtp", ctypes.c_int), ("logits_rows", ctypes.c_int)]


class EngineMemory(ctypes.Structure):
    _fields_ = [(f, ctypes.c_uint64) for f in ("weights_mapped", "weights_converted", "kv_cache", "state", "scratch",
                                               "planned", "kv_used")]


class Sampling(ctypes.Structure):
    _fields_ = [("temperature", ctypes.c_float), ("top_p", ctypes.c_float), ("seed", ctypes.c_uint64)]


class GenStep(ctypes.Structure):
    _fields_ = [("step", ctypes.c_int64), ("tokens", ctypes.POINTER(ctypes.c_int32)), ("n_tokens", ctypes.c_int64),
                ("drafted", ctypes.c_int), ("accepted", ctypes.c_int), ("seconds", ctypes.c_double),
                ("logits", ctypes.POINTER(ctypes.c_float)), ("n_logits", ctypes.c_int64),
                ("first_position", ctypes.c_int64)]


GEN_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, _P, ctypes.POINTER(GenStep))


class GenOptions(ctypes.Structure):
    _fields_ = [("max_tokens", ctypes.c_int64), ("mtp", ctypes.c_int), ("sampling", Sampling),
                ("stop_at_eos", ctypes.c_int), ("prompt_logits", ctypes.c_int), ("callback", GEN_CALLBACK),
                ("user", _P)]


class GenStats(ctypes.Structure):
    _fields_ = [("prompt_tokens", ctypes.c_int64), ("generated_tokens", ctypes.c_int64), ("steps", ctypes.c_int64),
                ("drafted", ctypes.c_int64), ("accepted", ctypes.c_int64), ("prefill_seconds", ctypes.c_double),
                ("decode_seconds", ctypes.c_double)]


lib.dsv4_engine_create.argtypes = [_P, ctypes.c_char_p, ctypes.POINTER(EngineOptions), ctypes.POINTER(_P)]
lib.dsv4_engine_destroy.argtypes = [_P]
lib.dsv4_engine_config.argtypes = [_P]
lib.dsv4_engine_config.restype = ctypes.POINTER(ModelConfig)
lib.dsv4_engine_get_options.argtypes = [_P]
lib.dsv4_engine_get_options.restype = EngineOptions
lib.dsv4_engine_memory_info.argtypes = [_P, ctypes.POINTER(EngineMemory)]
lib.dsv4_engine_seq_create.argtypes = [_P, ctypes.POINTER(ctypes.c_int)]
lib.dsv4_engine_seq_free.argtypes = [_P, ctypes.c_int]
lib.dsv4_engine_seq_reset.argtypes = [_P, ctypes.c_int]
lib.dsv4_engine_seq_length.argtypes = [_P, ctypes.c_int]
lib.dsv4_engine_seq_length.restype = ctypes.c_int64
lib.dsv4_engine_forward.argtypes = [_P, ctypes.c_int, _P, ctypes.c_int64, _P, ctypes.c_int64, _P, ctypes.c_int64]
lib.dsv4_engine_seq_export.argtypes = [_P, ctypes.c_int, _P, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]
lib.dsv4_engine_sample.argtypes = [_P, _P, ctypes.POINTER(Sampling), _P, ctypes.POINTER(ctypes.c_int32)]
lib.dsv4_rng_seed.argtypes = [ctypes.c_uint64, _P]
lib.dsv4_engine_generate.argtypes = [_P, ctypes.c_int, _P, ctypes.c_int64, ctypes.POINTER(GenOptions), _P,
                                     ctypes.c_int64, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(GenStats)]


def _ids(tokens):
    a = np.ascontiguousarray(tokens)
    if a.ndim != 1 or a.dtype.kind not in "iu":
        raise DSV4Error(3, f"token ids: expected a 1-D integer array, got {a.dtype} of shape {a.shape}")
    return np.ascontiguousarray(a, np.int32)


class Engine:
    """Engine(model_dir, max_context=0, max_seqs=1, max_batch=0, max_mtp=0, logits_rows=0,
    backend=None, threads=None); 0 means the library default."""

    def __init__(self, model_dir, max_context=0, max_seqs=1, max_batch=0, max_mtp=0, logits_rows=0, backend=None,
                 threads=None):
        self._h = None
        opts = EngineOptions(int(max_context), int(max_seqs), int(max_batch), int(max_mtp), int(logits_rows))
        h = _P()
        check(lib.dsv4_engine_create(ctx(backend, threads), str(model_dir).encode(), ctypes.byref(opts), ctypes.byref(h)))
        self._h = h
        self.config = _config_dict(lib.dsv4_engine_config(h).contents)
        o = lib.dsv4_engine_get_options(h)
        self.options = {f: getattr(o, f) for f, _ in EngineOptions._fields_}
        self.vocab = self.config["vocab_size"]

    def close(self):
        h, self._h = self._h, None
        if h:
            lib.dsv4_engine_destroy(h)

    __del__ = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- sequences ----
    def seq_create(self):
        s = ctypes.c_int()
        check(lib.dsv4_engine_seq_create(self._h, ctypes.byref(s)))
        return s.value

    def seq_free(self, seq):
        check(lib.dsv4_engine_seq_free(self._h, int(seq)))

    def seq_reset(self, seq):
        """Empty the sequence (also one marked failed by a call that failed midway), keeping its slot."""
        check(lib.dsv4_engine_seq_reset(self._h, int(seq)))

    def seq_length(self, seq):
        return lib.dsv4_engine_seq_length(self._h, int(seq))

    def memory(self):
        m = EngineMemory()
        check(lib.dsv4_engine_memory_info(self._h, ctypes.byref(m)))
        return {f: getattr(m, f) for f, _ in EngineMemory._fields_}

    def export(self, seq):
        """The sequence's caches and states as bytes (uint8 array), in the engine's fixed order."""
        n = ctypes.c_size_t()
        check(lib.dsv4_engine_seq_export(self._h, int(seq), None, 0, ctypes.byref(n)))
        out = np.zeros(n.value, np.uint8)
        check(lib.dsv4_engine_seq_export(self._h, int(seq), out.ctypes.data, n.value, ctypes.byref(n)))
        return out

    # ---- forward ----
    def forward(self, seq, tokens, n_logits=None, n_mtp_logits=0):
        """Append tokens to the sequence; returns (logits [n_logits, vocab], mtp_logits [n_mtp_logits, vocab]).
        n_logits None = every position of the call. With MTP planned, the MTP block runs on the rows whose
        next token is now known (from an empty sequence: n - 1 rows; then n per call)."""
        ids = _ids(tokens)
        n = len(ids)
        n_logits = n if n_logits is None else int(n_logits)
        lg = np.full((max(n_logits, 0), self.vocab), np.nan, np.float32)
        ml = np.full((max(int(n_mtp_logits), 0), self.vocab), np.nan, np.float32)
        check(lib.dsv4_engine_forward(self._h, int(seq), ids.ctypes.data if n else None, n,
                                      lg.ctypes.data if lg.size else None, n_logits,
                                      ml.ctypes.data if ml.size else None, int(n_mtp_logits)))
        return lg, ml

    # ---- sampling and generation ----
    def sample(self, logits, temperature=0.0, top_p=1.0, seed=0, rng=None):
        """One token from a row of logits; `rng` (uint64[4], from rng_seed) is advanced in place."""
        row = np.ascontiguousarray(logits, np.float32)
        if row.shape != (self.vocab,):
            raise DSV4Error(2, f"logits: expected shape ({self.vocab},), got {row.shape}")
        if rng is None:
            rng = rng_seed(seed)
        t = ctypes.c_int32()
        s = Sampling(float(temperature), float(top_p), int(seed))
        check(lib.dsv4_engine_sample(self._h, row.ctypes.data, ctypes.byref(s), rng.ctypes.data, ctypes.byref(t)))
        return t.value

    def generate(self, prompt, max_tokens, mtp=0, temperature=0.0, top_p=1.0, seed=0, stop_at_eos=False,
                 prompt_logits=False, keep_logits=False, seq=None, on_step=None):
        """Generate on a fresh sequence (or `seq`, which must be empty). Returns (tokens int32, stats dict,
        steps list); each step is a dict with its tokens, drafted/accepted counts and seconds, plus the
        target logits of the positions it ran when keep_logits. on_step(step dict) returning True stops
        the generation after that step (during the prefill: after that chunk, with no token generated)."""
        ids = _ids(prompt)
        steps = []

        def step_cb(_user, sp):
            s = sp.contents
            d = {"step": s.step, "tokens": [s.tokens[i] for i in range(s.n_tokens)], "drafted": s.drafted,
                 "accepted": s.accepted, "seconds": s.seconds, "first_position": s.first_position}
            if keep_logits and s.n_logits:
                d["logits"] = np.ctypeslib.as_array(s.logits, shape=(s.n_logits, self.vocab)).copy()
            steps.append(d)
            return int(bool(on_step(d))) if on_step else 0

        cb = GEN_CALLBACK(step_cb)
        o = GenOptions(int(max_tokens), int(mtp), Sampling(float(temperature), float(top_p), int(seed)),
                       int(bool(stop_at_eos)), int(bool(prompt_logits)), cb, None)
        own = seq is None
        if own:
            seq = self.seq_create()
        try:
            out = np.zeros(max(int(max_tokens), 0), np.int32)
            n = ctypes.c_int64()
            st = GenStats()
            check(lib.dsv4_engine_generate(self._h, int(seq), ids.ctypes.data, len(ids), ctypes.byref(o),
                                           out.ctypes.data if out.size else None, len(out), ctypes.byref(n),
                                           ctypes.byref(st)))
        finally:
            if own:
                self.seq_free(seq)
        stats = {f: getattr(st, f) for f, _ in GenStats._fields_}
        stats["acceptance"] = st.accepted / st.drafted if st.drafted else None
        return out[:n.value].copy(), stats, steps


def rng_seed(seed):
    """A fresh 4-word generator state for Engine.sample."""
    r = np.zeros(4, np.uint64)
    lib.dsv4_rng_seed(int(seed), r.ctypes.data)
    return r
