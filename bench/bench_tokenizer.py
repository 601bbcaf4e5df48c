"""Tokenizer benchmark: encode MB/s of libdsv4 next to Hugging Face `tokenizers` on the same corpus
in the same run (and decode MB/s), with the DeepSeek-V4 tokenizer.json.

    DSV4_LIB=build/libdsv4.so PYTHONPATH=python:tests/python python3 bench/bench_tokenizer.py [--mib 32]

The corpus is what every machine of the project has: the Python standard library's sources (code
with English comments), the licence texts of /usr/share/common-licenses (English prose), the CJK
sample texts of Python's test suite (Chinese, Japanese, Korean), and the multilingual corpus of
tests/python/test_tokenizer.py; distinct files until --mib MiB. Each file is one encode call on
both sides; both run on one thread (tokenizers' encode_batch, which uses every core, is shown too).
The ids of the two are compared on the whole corpus in the same run."""
import argparse
import pathlib
import sys
import sysconfig
import time

import numpy as np

import dsv4
from tokenizer_data import hf_tokenizers, tokenizer_json


def corpus(mib):
    """{kind: [documents]}: English prose, CJK prose, the multilingual test corpus, and code
    (distinct files until the total reaches mib MiB)."""
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    from test_tokenizer import CORPUS
    kinds = {"prose (en)": sorted(pathlib.Path("/usr/share/common-licenses").glob("*")),
             "prose (zh/ja/ko)": sorted((stdlib / "test" / "cjkencodings").glob("*-utf8.txt")),
             "code (python)": sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts)}
    docs, total, limit = {}, 0, mib << 20
    for kind, files in kinds.items():
        docs[kind] = []
        for p in files:
            if total >= limit:
                break
            try:
                text = p.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            docs[kind].append(text)
            total += len(text.encode())
    docs["test corpus (mixed)"] = [t for t in CORPUS if t]
    return docs


def timed(fn, reps):
    best = 1e30
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=32)
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    path = tokenizer_json()
    tokenizers = hf_tokenizers()
    hf = tokenizers.Tokenizer.from_file(path)
    t0 = time.perf_counter()
    tok = dsv4.Tokenizer(path)
    t_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    tokenizers.Tokenizer.from_file(path)
    t_load_hf = time.perf_counter() - t0

    kinds = corpus(args.mib)
    docs = [d for ds in kinds.values() for d in ds]
    mb = sum(len(d.encode()) for d in docs) / 1e6
    print(f"dsv4 tokenizer bench: {len(docs)} documents, {mb:.1f} MB; tokenizers {tokenizers.__version__}; "
          f"one encode call per document, best of {args.reps}")
    print(f"load tokenizer.json: dsv4 {t_load * 1e3:.0f} ms, tokenizers {t_load_hf * 1e3:.0f} ms\n")
    print(f"{'corpus':22s} {'MB':>6s} {'ids':>9s} {'same ids':>8s} {'dsv4 MB/s':>10s} {'tokenizers MB/s':>16s} {'speed-up':>9s}")
    all_same, total = True, [0.0, 0.0, 0.0]
    for kind, ds in kinds.items():
        raw = [d.encode("utf-8") for d in ds]
        kmb = sum(len(r) for r in raw) / 1e6
        t_dsv4, ours = timed(lambda: [tok.encode(r) for r in raw], args.reps)
        t_hf, theirs = timed(lambda: [hf.encode(d).ids for d in ds], args.reps)
        same = all(a.tolist() == b for a, b in zip(ours, theirs))
        all_same &= same
        total = [total[0] + kmb, total[1] + t_dsv4, total[2] + t_hf]
        print(f"{kind:22s} {kmb:6.2f} {sum(len(a) for a in ours):9d} {str(same):>8s} {kmb / t_dsv4:10.1f} {kmb / t_hf:16.2f}"
              f" {t_hf / t_dsv4:8.1f}x")
    print(f"{'all':22s} {total[0]:6.2f} {'':9s} {str(all_same):>8s} {total[0] / total[1]:10.1f} {total[0] / total[2]:16.2f}"
          f" {total[2] / total[1]:8.1f}x")

    t_batch, _ = timed(lambda: hf.encode_batch(docs), 1)
    print(f"\ntokenizers encode_batch (all cores, one call): {mb / t_batch:.2f} MB/s")
    ids = [tok.encode(d) for d in docs]
    lists = [a.tolist() for a in ids]
    t_dec, _ = timed(lambda: [tok.decode_bytes(a) for a in ids], args.reps)
    t_dec_hf, _ = timed(lambda: [hf.decode(b) for b in lists], args.reps)
    print(f"decode: dsv4 {mb / t_dec:.1f} MB/s, tokenizers {mb / t_dec_hf:.1f} MB/s ({t_dec_hf / t_dec:.1f}x)")
    return 0 if all_same else 1


if __name__ == "__main__":
    sys.exit(main())
