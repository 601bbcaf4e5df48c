"""Checkpoints: config.json (three namings), safetensors (single or sharded), the model-weights
description, make-tiny (include/dsv4/model.h). Tensors come back as numpy copies of the mapped
bytes; BF16 as uint16, FP8/E8M0/packed FP4 as uint8."""
import ctypes

import numpy as np

from ._lib import c_struct
from ._lib import DSV4Error, check, lib

MAX_LAYERS = 256
MAX_EOS = 8
ATTN_KINDS = ("SWA", "CSA", "HCA")
WEIGHT_FORMATS = ("auto", "bf16", "fp8", "fp4")
SCORE_FUNCS = ("sqrtsoftplus", "softmax", "sigmoid")
ISSUE_KINDS = ("missing", "unexpected", "dtype", "shape")
_DSV4_NUMPY = {0: np.float32, 1: np.uint16, 2: np.uint8, 3: np.uint8, 4: np.uint8, 5: np.int32, 6: np.int64, 7: np.uint8}


@c_struct("dsv4_rope_config")
class RopeConfig(ctypes.Structure):
    _fields_ = [("theta", ctypes.c_double), ("yarn", ctypes.c_int), ("factor", ctypes.c_double),
                ("original_max_position", ctypes.c_int64), ("beta_fast", ctypes.c_double),
                ("beta_slow", ctypes.c_double), ("attention_factor", ctypes.c_double)]


_I64_FIELDS = ["dim", "n_layers", "n_mtp_layers", "vocab_size", "n_heads", "n_kv_heads", "head_dim", "rope_head_dim",
               "nope_head_dim", "q_lora_rank", "o_groups", "o_lora_rank", "window_size", "index_n_heads",
               "index_head_dim", "index_topk", "n_routed_experts", "n_shared_experts", "n_activated_experts",
               "moe_inter_dim", "n_hash_layers"]


@c_struct("dsv4_model_config")
class ModelConfig(ctypes.Structure):
    _fields_ = ([(f, ctypes.c_int64) for f in _I64_FIELDS] +
                [("score_func", ctypes.c_int), ("norm_topk_prob", ctypes.c_int), ("route_scale", ctypes.c_double),
                 ("swiglu_limit", ctypes.c_double), ("hc_mult", ctypes.c_int64), ("hc_sinkhorn_iters", ctypes.c_int64),
                 ("hc_eps", ctypes.c_double), ("norm_eps", ctypes.c_double), ("rope_main", RopeConfig),
                 ("rope_compress", RopeConfig), ("max_position_embeddings", ctypes.c_int64),
                 ("bos_token_id", ctypes.c_int64), ("n_eos", ctypes.c_int), ("eos_token_ids", ctypes.c_int64 * MAX_EOS),
                 ("tie_word_embeddings", ctypes.c_int), ("weight_format", ctypes.c_int), ("expert_format", ctypes.c_int),
                 ("compress_ratio", ctypes.c_int32 * MAX_LAYERS), ("attn_kind", ctypes.c_uint8 * MAX_LAYERS),
                 ("hash_routed", ctypes.c_uint8 * MAX_LAYERS), ("naming", ctypes.c_char * 16)])


@c_struct("dsv4_tensor_entry")
class TensorEntry(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("canonical", ctypes.c_char_p), ("file", ctypes.c_char_p),
                ("st_dtype", ctypes.c_char_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int),
                ("shape", ctypes.c_int64 * 5), ("nbytes", ctypes.c_uint64), ("file_offset", ctypes.c_uint64),
                ("data", ctypes.c_void_p)]


@c_struct("dsv4_model_issue_info")
class IssueInfo(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("name", ctypes.c_char_p), ("message", ctypes.c_char_p)]


@c_struct("dsv4_model_open_options")
class OpenOptions(ctypes.Structure):
    _fields_ = [("allow_issues", ctypes.c_int), ("load", ctypes.c_int)]


_P = ctypes.c_void_p
lib.dsv4_config_parse.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.POINTER(ModelConfig)]
lib.dsv4_config_load.argtypes = [ctypes.c_char_p, ctypes.POINTER(ModelConfig)]
lib.dsv4_config_to_json.argtypes = [ctypes.POINTER(ModelConfig), ctypes.c_char_p, ctypes.c_size_t,
                                    ctypes.POINTER(ctypes.c_size_t)]
lib.dsv4_config_tiny.argtypes = [ctypes.POINTER(ModelConfig)]
lib.dsv4_config_default.argtypes = [ctypes.POINTER(ModelConfig)]
lib.dsv4_model_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(OpenOptions), ctypes.POINTER(_P)]
lib.dsv4_model_close.argtypes = [_P]
lib.dsv4_model_get_checkpoint.argtypes = [_P]
lib.dsv4_model_get_checkpoint.restype = _P
lib.dsv4_model_get_config.argtypes = [_P]
lib.dsv4_model_get_config.restype = ctypes.POINTER(ModelConfig)
lib.dsv4_model_issue_count.argtypes = [_P]
lib.dsv4_model_issue.argtypes = [_P, ctypes.c_int, ctypes.POINTER(IssueInfo)]
lib.dsv4_checkpoint_count.argtypes = [_P]
lib.dsv4_checkpoint_count.restype = ctypes.c_int64
lib.dsv4_checkpoint_file_count.argtypes = [_P]
lib.dsv4_checkpoint_layout.argtypes = [_P]
lib.dsv4_checkpoint_entry.argtypes = [_P, ctypes.c_int64, ctypes.POINTER(TensorEntry)]
lib.dsv4_checkpoint_find.argtypes = [_P, ctypes.c_char_p, ctypes.POINTER(TensorEntry)]
lib.dsv4_make_tiny.argtypes = [ctypes.c_char_p, ctypes.c_uint64]


def _rope(r):
    return {"theta": r.theta, "yarn": bool(r.yarn), "factor": r.factor,
            "original_max_position": r.original_max_position, "beta_fast": r.beta_fast,
            "beta_slow": r.beta_slow, "attention_factor": r.attention_factor}


def _config_dict(c):
    d = {f: getattr(c, f) for f in _I64_FIELDS}
    nb = c.n_layers + c.n_mtp_layers
    d.update(score_func=SCORE_FUNCS[c.score_func], norm_topk_prob=bool(c.norm_topk_prob), route_scale=c.route_scale,
             swiglu_limit=c.swiglu_limit, hc_mult=c.hc_mult, hc_sinkhorn_iters=c.hc_sinkhorn_iters, hc_eps=c.hc_eps,
             norm_eps=c.norm_eps, rope_main=_rope(c.rope_main), rope_compress=_rope(c.rope_compress),
             max_position_embeddings=c.max_position_embeddings, bos_token_id=c.bos_token_id,
             eos_token_ids=list(c.eos_token_ids[:c.n_eos]), tie_word_embeddings=bool(c.tie_word_embeddings),
             weight_format=WEIGHT_FORMATS[c.weight_format], expert_format=WEIGHT_FORMATS[c.expert_format],
             compress_ratio=list(c.compress_ratio[:nb]), attn_kind=[ATTN_KINDS[k] for k in c.attn_kind[:nb]],
             hash_routed=[bool(h) for h in c.hash_routed[:nb]], naming=c.naming.decode())
    return d


def config_parse(text, source="config.json"):
    """config.json text (str or bytes) in any naming -> dict of every field."""
    data = text.encode() if isinstance(text, str) else bytes(text)
    c = ModelConfig()
    check(lib.dsv4_config_parse(data, len(data), source.encode(), ctypes.byref(c)))
    return _config_dict(c)


def config_load(path):
    """The config.json at `path` (a file or a checkpoint folder) parsed by the library, as a dict."""
    c = ModelConfig()
    check(lib.dsv4_config_load(str(path).encode(), ctypes.byref(c)))
    return _config_dict(c)


def tiny_config_json():
    """config.json text of the built-in tiny model (official naming)."""
    c = ModelConfig()
    lib.dsv4_config_tiny(ctypes.byref(c))
    buf = ctypes.create_string_buffer(16384)
    n = ctypes.c_size_t()
    check(lib.dsv4_config_to_json(ctypes.byref(c), buf, len(buf), ctypes.byref(n)))
    return buf.raw[:n.value].decode()


def make_tiny(path, seed=0):
    """`dsv4 make-tiny`: write the built-in tiny checkpoint (4 layers and an MTP block, official
    layout, 2 shards) with random weights from `seed` into the folder `path`."""
    check(lib.dsv4_make_tiny(str(path).encode(), seed))


def _entry_dict(e):
    return {"name": e.name.decode(), "canonical": e.canonical.decode(), "file": e.file.decode(),
            "st_dtype": e.st_dtype.decode(), "dtype": e.dtype, "shape": tuple(e.shape[:e.ndim]),
            "nbytes": e.nbytes, "file_offset": e.file_offset}


class Model:
    """An opened checkpoint directory. allow_issues=True opens it even when tensors are
    missing, unexpected or mistyped, and lists them in .issues (as `dsv4 inspect` does)."""

    def __init__(self, path, allow_issues=False):
        self._h = None
        handle = _P()
        check(lib.dsv4_model_open(str(path).encode(), ctypes.byref(OpenOptions(int(allow_issues))), ctypes.byref(handle)))
        self._h = handle
        self._ck = lib.dsv4_model_get_checkpoint(handle)
        self.config = _config_dict(lib.dsv4_model_get_config(handle).contents)
        self.layout = ("official", "transformers")[lib.dsv4_checkpoint_layout(self._ck)]
        self.n_files = lib.dsv4_checkpoint_file_count(self._ck)
        self.issues = []
        info = IssueInfo()
        i = 0
        while lib.dsv4_model_issue(handle, i, ctypes.byref(info)) == 0:
            self.issues.append((ISSUE_KINDS[info.kind], info.name.decode(), info.message.decode()))
            i += 1

    def close(self):
        """Unmap the checkpoint (also on collection or leaving a `with`)."""
        if self._h:
            lib.dsv4_model_close(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()

    def tensors(self):
        """Every tensor of the checkpoint, file by file, each file in offset order."""
        e = TensorEntry()
        out = []
        for i in range(lib.dsv4_checkpoint_count(self._ck)):
            check(lib.dsv4_checkpoint_entry(self._ck, i, ctypes.byref(e)))
            out.append(_entry_dict(e))
        return out

    def entry(self, name):
        """The entry of tensor `name` (its file name or canonical name) as a dict: name, canonical
        name, file, safetensors dtype, dtype and shape; DSV4Error when absent."""
        e = TensorEntry()
        check(lib.dsv4_checkpoint_find(self._ck, name.encode(), ctypes.byref(e)))
        return _entry_dict(e)

    def raw(self, name):
        """The stored bytes of a tensor (file name or official name), copied out of the mapping."""
        e = TensorEntry()
        check(lib.dsv4_checkpoint_find(self._ck, name.encode(), ctypes.byref(e)))
        return ctypes.string_at(e.data, e.nbytes) if e.nbytes else b""

    def array(self, name):
        """The tensor as a numpy array of its raw element type (BF16 as uint16, I8 as uint8)."""
        e = TensorEntry()
        check(lib.dsv4_checkpoint_find(self._ck, name.encode(), ctypes.byref(e)))
        if e.dtype < 0:
            raise DSV4Error(3, f"{name}: dtype {e.st_dtype.decode()} has no numpy mapping here")
        shape = tuple(e.shape[:e.ndim])
        if e.st_dtype == b"F4":
            shape = shape[:-1] + (shape[-1] // 2,)
        buf = ctypes.string_at(e.data, e.nbytes) if e.nbytes else b""
        return np.frombuffer(buf, _DSV4_NUMPY[e.dtype]).reshape(shape).copy()
