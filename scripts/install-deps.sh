#!/usr/bin/env bash
# Installs what dsv4's build, tests and benchmarks need, only when it is missing.
# Debian packages through apt-get, test oracles through pip (PyPI). Safe to run repeatedly.
set -euo pipefail

DEB_PACKAGES=(cmake make gcc g++ python3 python3-pip libopenblas-dev pkg-config libpcre2-dev clang libclang-rt-dev)
PY_PACKAGES=(numpy ml_dtypes pytest)

missing_deb=()
for p in "${DEB_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing_deb+=("$p")
done
# A toolchain already on PATH (e.g. a newer cmake) counts as present.
filtered=()
for p in "${missing_deb[@]}"; do
  case "$p" in
    cmake|make|gcc|g++|python3) command -v "$p" >/dev/null 2>&1 && continue ;;
    python3-pip) python3 -m pip --version >/dev/null 2>&1 && continue ;;
  esac
  filtered+=("$p")
done
if [ ${#filtered[@]} -gt 0 ]; then
  echo "install-deps: apt-get install ${filtered[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${filtered[@]}" >/dev/null
fi

missing_py=()
for p in "${PY_PACKAGES[@]}"; do
  python3 -c "import $p" >/dev/null 2>&1 || missing_py+=("$p")
done
if [ ${#missing_py[@]} -gt 0 ]; then
  echo "install-deps: pip install ${missing_py[*]}"
  python3 -m pip install -q --disable-pip-version-check "${missing_py[@]}" 2>&1 | grep -v "Running pip as the 'root'" || true
  for p in "${missing_py[@]}"; do python3 -c "import $p" || { echo "install-deps: $p did not install" >&2; exit 1; }; done
fi

# DeepSeek-V4's tokenizer.json into the cache, where `dsv4 make-tiny` and the tests find it
python3 "$(dirname "$0")/fetch_tokenizer.py" > /dev/null || { echo "install-deps: could not fetch DeepSeek-V4's tokenizer.json" >&2; exit 1; }
