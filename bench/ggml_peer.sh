#!/usr/bin/env bash
# ggml's CPU backend as an in-run peer of `dsv4 bench linear` (BENCHMARKS.md, "linear layers vs ggml").
#
#   bench/ggml_peer.sh build [GGML_SRC]   build ggml (Release, native flags) from a snapshot outside the
#                                         repository, twice: its default mul_mat and with llamafile's sgemm
#   bench/ggml_peer.sh [run] [OPTIONS]    compile bench/ggml_peer.c against those builds and run it
#                                         (options go to the driver: --threads N, --only TEXT, --quick, ...)
#
# GGML_SRC: a git directory (bare or not) or a plain source tree of ggml-org/ggml; default
# $DSV4_GGML_SRC. The work happens in $DSV4_GGML_DIR (default /work/scratch/ggml, or
# $TMPDIR/dsv4-ggml when /work/scratch does not exist). Without a built peer `run` prints why and
# exits 0, so the benchmark suite can call it on any machine.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -d /work/scratch ]]; then dflt=/work/scratch/ggml; else dflt=${TMPDIR:-/tmp}/dsv4-ggml; fi
dir=${DSV4_GGML_DIR:-$dflt}
jobs=${JOBS:-2}
variants=(default llamafile)

build() {
    local src=${1:-${DSV4_GGML_SRC:-}}
    if [[ -z $src ]]; then
        echo "ggml_peer: build needs a ggml snapshot: bench/ggml_peer.sh build GGML_SRC (or DSV4_GGML_SRC)" >&2
        exit 2
    fi
    mkdir -p "$dir"
    local commit
    if git --git-dir="$src" rev-parse --verify -q HEAD >/dev/null 2>&1 ||
        git -C "$src" rev-parse --verify -q HEAD >/dev/null 2>&1; then
        local gd
        gd=$(git -C "$src" rev-parse --git-dir 2>/dev/null || echo "$src")
        [[ $gd = /* ]] || gd="$src/$gd"
        commit=$(git --git-dir="$gd" rev-parse HEAD)
        if [[ ! -f $dir/src/COMMIT || $(cat "$dir/src/COMMIT") != "$commit" ]]; then
            rm -rf "$dir/src" && mkdir -p "$dir/src"
            git --git-dir="$gd" archive "$commit" | tar -x -C "$dir/src"
            echo "$commit" >"$dir/src/COMMIT"
        fi
    else
        commit="unversioned tree $src"
        rm -rf "$dir/src" && mkdir -p "$dir/src" && cp -a "$src/." "$dir/src/"
        echo "$commit" >"$dir/src/COMMIT"
    fi
    echo "ggml_peer: ggml $(cat "$dir/src/COMMIT")"
    for v in "${variants[@]}"; do
        local lf=OFF
        [[ $v = llamafile ]] && lf=ON
        cmake -S "$dir/src" -B "$dir/build-$v" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
            -DBUILD_SHARED_LIBS=OFF -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF \
            -DGGML_OPENMP=ON -DGGML_CPU_REPACK=ON -DGGML_LLAMAFILE=$lf -DGGML_CCACHE=OFF >"$dir/build-$v.log" 2>&1
        cmake --build "$dir/build-$v" -j"$jobs" --target ggml ggml-cpu ggml-base >>"$dir/build-$v.log" 2>&1
        cp "$dir/src/COMMIT" "$dir/build-$v/COMMIT"
        echo "ggml_peer: built $dir/build-$v (GGML_LLAMAFILE=$lf)"
    done
}

# The driver against build-$1, into $dir/driver-$1 (the ISA units of the read probe with their flags).
compile() {
    local v=$1 b="$dir/build-$1" out="$dir/driver-$1"
    local cc=${CC:-cc} obj="$dir/obj-$1"
    mkdir -p "$obj"
    local common=(-O2 -std=c17 -D_POSIX_C_SOURCE=200809L -fopenmp -I"$here/bench" -I"$here/include" -I"$here/src" -I"$dir/src/include")
    "$cc" "${common[@]}" -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mavx2 \
        -c "$here/bench/bandwidth_avx512.c" -o "$obj/bandwidth_avx512.o"
    "$cc" "${common[@]}" -mavx2 -mfma -c "$here/bench/bandwidth_avx2.c" -o "$obj/bandwidth_avx2.o"
    "$cc" "${common[@]}" "$here/bench/ggml_peer/ggml_peer.c" "$here/bench/bench_util.c" \
        "$here/bench/linear_weights.c" "$here/bench/bench_bandwidth.c" "$obj"/bandwidth_avx*.o \
        "$b/src/libggml.a" "$b/src/libggml-cpu.a" "$b/src/libggml-base.a" \
        -L"$lib" -Wl,-rpath,"$lib" -ldsv4 -lstdc++ -lm -lpthread -o "$out"
}

run() {
    lib=${DSV4_BUILD:-$here/build}
    lib=$(cd "$lib" 2>/dev/null && pwd || echo "$lib")
    if [[ ! -f $lib/libdsv4.so ]]; then
        echo "ggml_peer: no $lib/libdsv4.so: build dsv4 first (make build, or DSV4_BUILD=DIR)" >&2
        exit 1
    fi
    local have=()
    for v in "${variants[@]}"; do
        [[ -f $dir/build-$v/src/libggml-cpu.a && -f $dir/build-$v/COMMIT ]] && have+=("$v")
    done
    if ((${#have[@]} == 0)); then
        echo "ggml_peer: skipped: ggml is not built in $dir (bench/ggml_peer.sh build GGML_SRC builds it)"
        exit 0
    fi
    for v in "${have[@]}"; do
        compile "$v"
        "$dir/driver-$v" --variant "$v" --commit "$(cat "$dir/build-$v/COMMIT")" "$@"
        echo
    done
}

case "${1:-run}" in
build) shift; build "$@" ;;
run) shift || true; run "$@" ;;
*) run "$@" ;;
esac
