"""The decode engine (include/dsv4/engine.h): load a checkpoint with planned memory, sequences,
prefill / decode with logits of several positions, the MTP block's logits, state export, sampling
and generation with MTP speculative decoding. Token ids are int32; logits come back as float32
numpy arrays [rows, vocab]."""
import ctypes

import numpy as np

from ._lib import c_struct
from ._lib import DSV4Error, check, ctx, lib
from .model import ModelConfig, _config_dict

_P = ctypes.c_void_p


@c_struct("dsv4_engine_options")
class EngineOptions(ctypes.Structure):
    _fields_ = [("max_context", ctypes.c_int64), ("max_seqs", ctypes.c_int), ("max_batch", ctypes.c_int),
                ("max_mtp", ctypes.c_int), ("logits_rows", ctypes.c_int), ("load", ctypes.c_int),
                ("progress", _P), ("progress_user", _P)]


@c_struct("dsv4_engine_memory")
class EngineMemory(ctypes.Structure):
    _fields_ = [(f, ctypes.c_uint64) for f in ("weights_mapped", "weights_converted", "kv_cache", "state", "scratch",
                                               "planned", "kv_used", "weights_device")]


@c_struct("dsv4_sampling")
class Sampling(ctypes.Structure):
    _fields_ = [("temperature", ctypes.c_float), ("top_p", ctypes.c_float), ("seed", ctypes.c_uint64)]


@c_struct("dsv4_batch_entry")
class BatchEntry(ctypes.Structure):
    _fields_ = [("seq", ctypes.c_int), ("tokens", _P), ("n_tokens", ctypes.c_int64), ("n_logits", ctypes.c_int64),
                ("n_mtp_logits", ctypes.c_int64)]


@c_struct("dsv4_step_request")
class StepRequest(ctypes.Structure):
    _fields_ = [("seq", ctypes.c_int), ("tokens", _P), ("n_tokens", ctypes.c_int64), ("mtp", ctypes.c_int),
                ("sample", ctypes.c_int), ("sampling", Sampling), ("rng", _P), ("out", _P), ("n_out", ctypes.c_int),
                ("drafted", ctypes.c_int), ("accepted", ctypes.c_int)]


@c_struct("dsv4_gen_step")
class GenStep(ctypes.Structure):
    _fields_ = [("step", ctypes.c_int64), ("tokens", ctypes.POINTER(ctypes.c_int32)), ("n_tokens", ctypes.c_int64),
                ("drafted", ctypes.c_int), ("accepted", ctypes.c_int), ("seconds", ctypes.c_double),
                ("logits", ctypes.POINTER(ctypes.c_float)), ("n_logits", ctypes.c_int64),
                ("first_position", ctypes.c_int64)]


GEN_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, _P, ctypes.POINTER(GenStep))


@c_struct("dsv4_generate_options")
class GenOptions(ctypes.Structure):
    _fields_ = [("max_tokens", ctypes.c_int64), ("mtp", ctypes.c_int), ("sampling", Sampling),
                ("stop_at_eos", ctypes.c_int), ("prompt_logits", ctypes.c_int), ("callback", GEN_CALLBACK),
                ("user", _P), ("step_logits", ctypes.c_int)]


@c_struct("dsv4_generate_stats")
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
lib.dsv4_engine_forward_batch.argtypes = [_P, ctypes.POINTER(BatchEntry), ctypes.c_int, _P, _P]
lib.dsv4_engine_step.argtypes = [_P, ctypes.POINTER(StepRequest), ctypes.c_int]
lib.dsv4_engine_seq_copy.argtypes = [_P, ctypes.c_int, ctypes.c_int]
lib.dsv4_engine_seq_truncate.argtypes = [_P, ctypes.c_int, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)]
lib.dsv4_engine_seq_tokens.argtypes = [_P, ctypes.c_int, _P, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)]
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
        """Destroy the engine and free all it planned (also on collection or leaving a `with`)."""
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
        """A new empty sequence; returns its id (DSV4Error when max_seqs are alive)."""
        s = ctypes.c_int()
        check(lib.dsv4_engine_seq_create(self._h, ctypes.byref(s)))
        return s.value

    def seq_free(self, seq):
        """Release the sequence's slot and caches."""
        check(lib.dsv4_engine_seq_free(self._h, int(seq)))

    def seq_reset(self, seq):
        """Empty the sequence (also one marked failed by a call that failed midway), keeping its slot."""
        check(lib.dsv4_engine_seq_reset(self._h, int(seq)))

    def seq_length(self, seq):
        """Tokens the sequence holds (positions in its caches)."""
        return lib.dsv4_engine_seq_length(self._h, int(seq))

    def seq_copy(self, src, dst):
        """dst (an existing sequence) becomes an exact copy of src."""
        check(lib.dsv4_engine_seq_copy(self._h, int(src), int(dst)))

    def seq_truncate(self, seq, length):
        """Keep the first `length` tokens, exactly; returns how many tokens were recomputed."""
        n = ctypes.c_int64()
        check(lib.dsv4_engine_seq_truncate(self._h, int(seq), int(length), ctypes.byref(n)))
        return n.value

    def seq_tokens(self, seq):
        """The token ids the sequence holds (int32)."""
        n = ctypes.c_int64()
        check(lib.dsv4_engine_seq_tokens(self._h, int(seq), None, 0, ctypes.byref(n)))
        out = np.zeros(n.value, np.int32)
        check(lib.dsv4_engine_seq_tokens(self._h, int(seq), out.ctypes.data if n.value else None, n.value,
                                         ctypes.byref(n)))
        return out

    def memory(self):
        """The engine's memory in bytes, as a dict of dsv4_engine_memory's fields (planned, kv_used, ...)."""
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

    def forward_batch(self, entries):
        """Several sequences in one pass. entries: list of (seq, tokens[, n_logits[, n_mtp_logits]]) (n_logits
        None or missing = every position). Returns a list of (logits, mtp_logits) per entry, as forward does."""
        ids, arr = [], (BatchEntry * len(entries))()
        nl_total = nm_total = 0
        for i, ent in enumerate(entries):
            seq, toks = ent[0], _ids(ent[1])
            nl = len(toks) if len(ent) < 3 or ent[2] is None else int(ent[2])
            nm = int(ent[3]) if len(ent) > 3 else 0
            ids.append(toks)
            arr[i] = BatchEntry(int(seq), toks.ctypes.data if len(toks) else None, len(toks), nl, nm)
            nl_total += max(nl, 0)
            nm_total += max(nm, 0)
        lg = np.full((nl_total, self.vocab), np.nan, np.float32)
        ml = np.full((nm_total, self.vocab), np.nan, np.float32)
        check(lib.dsv4_engine_forward_batch(self._h, arr, len(entries), lg.ctypes.data if lg.size else None,
                                            ml.ctypes.data if ml.size else None))
        out, a, b = [], 0, 0
        for ent in arr:
            out.append((lg[a:a + ent.n_logits], ml[b:b + ent.n_mtp_logits]))
            a += ent.n_logits
            b += ent.n_mtp_logits
        return out

    def step(self, requests):
        """One decode step of several sequences. requests: list of dicts with seq, tokens, and optionally
        mtp (drafts), sample (default True), temperature, top_p, rng (uint64[4], advanced in place; default
        rng_seed(seed)). Returns a list of (tokens int32, drafted, accepted)."""
        arr = (StepRequest * len(requests))()
        keep = []
        for i, r in enumerate(requests):
            toks = _ids(r["tokens"])
            k = int(r.get("mtp", 0))
            rng = r.get("rng")
            if rng is None:
                rng = rng_seed(r.get("seed", 0))
            out = np.zeros(1 + max(k, 0), np.int32)
            keep.append((toks, rng, out))
            arr[i] = StepRequest(int(r["seq"]), toks.ctypes.data if len(toks) else None, len(toks), k,
                                 int(bool(r.get("sample", True))),
                                 Sampling(float(r.get("temperature", 0.0)), float(r.get("top_p", 1.0)), 0),
                                 rng.ctypes.data, out.ctypes.data, 0, 0, 0)
        check(lib.dsv4_engine_step(self._h, arr, len(requests)))
        return [(keep[i][2][:a.n_out].copy(), a.drafted, a.accepted) for i, a in enumerate(arr)]

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
        """Generate on a fresh sequence (or `seq`, whose tokens the prompt continues). Returns (tokens int32, stats dict,
        steps list); each step is a dict with its tokens, drafted/accepted counts and seconds, plus the
        target logits of the positions it ran when keep_logits. on_step(step dict) returning True stops
        the generation after that step (during the prefill: after that chunk, with no token generated).
        max_tokens 0 generates until the sequence holds max_context positions."""
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
                       int(bool(stop_at_eos)), int(bool(prompt_logits)), cb, None, int(bool(keep_logits)))
        own = seq is None
        if own:
            seq = self.seq_create()
        try:
            room = self.options["max_context"] - self.seq_length(seq) - len(ids) + 1  # what max_tokens 0 gets
            out = np.zeros(max(int(max_tokens) if int(max_tokens) else room, 0), np.int32)
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
