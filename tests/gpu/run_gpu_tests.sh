#!/usr/bin/env bash
# GPU checks of the cuda backend (`make test-gpu`): build, the C tests against cpu-ref (test_cuda,
# the op-by-op conformance test_backend_ops, and test_engine: the engine on cuda), the Python tests on backend "cuda" (the
# attention suite with DSV4_TEST_BACKENDS=cuda and the device tests), compute-sanitizer memcheck +
# racecheck on small cases, the SASS instruction mix, Nsight Compute profiles of one decode
# launch, the attention benchmark next to a bf16 matmul and the linear benchmark (linear-cuda); with
# DSV4_PEER_FLASHMLA=dir also the same-run comparison with FlashMLA (step peer).
# Without an NVIDIA GPU it says so and exits 0. Each step's log goes to $BUILD/gpu-logs (all of
# them also to $OUT/gpu-tests.log when OUT is set); STEPS="build test_cuda ..." runs a subset,
# STEP_TIMEOUT (seconds, default 300) bounds each step. The build needs what `make build` needs
# (libpcre2-8 for the tokenizer: on an image without its headers, point PKG_CONFIG_PATH at a copy);
# the attention and engine tests read shared/testdata (DSV4_SHARED / DSV4_KERNEL_TESTDATA when not beside the repo).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-$ROOT/build-gpu}
LOGS=${LOGS:-$BUILD/gpu-logs}
ALL=${OUT:+$OUT/gpu-tests.log}
JOBS=${JOBS:-$(nproc)}
PEER=${DSV4_PEER_FLASHMLA:-}
STEPS=${STEPS:-"build test_cuda backend_ops engine matmul bench bench_linear pytest_device pytest_attention sass ncu memcheck racecheck memcheck_ops racecheck_ops memcheck_engine${PEER:+ peer}"}
mkdir -p "$LOGS"
if ! nvidia-smi -L > /dev/null 2>&1; then
    echo "test-gpu: SKIP: no NVIDIA GPU visible (nvidia-smi -L failed)"
    exit 0
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee ${ALL:+"$ALL"}
export DSV4_LIB=$BUILD/libdsv4.so PYTHONPATH=$ROOT/python:$ROOT/tests/python PYTHONUNBUFFERED=1
fail=0

step() { # name command...: run, keep the log, print its tail
    local name=$1
    shift
    case " $STEPS " in *" $name "*) ;; *) return 0 ;; esac
    echo "== $name"
    local t0=$SECONDS
    timeout "${STEP_TIMEOUT:-300}" "$@" > "$LOGS/$name.log" 2>&1
    local rc=$?
    echo "   rc=$rc, $((SECONDS - t0)) s"
    tail -n "${TAILN:-12}" "$LOGS/$name.log"
    if [ -n "$ALL" ]; then
        { echo "===== $name (rc=$rc, $((SECONDS - t0)) s)"; cat "$LOGS/$name.log"; } >> "$ALL"
    fi
    [ $rc -eq 0 ] || fail=1
}

step build bash -c "cmake -S '$ROOT' -B '$BUILD' -DCMAKE_BUILD_TYPE=Release > /dev/null &&
                    cmake --build '$BUILD' -j $JOBS --target dsv4 dsv4_cuda dsv4_cli test_cuda test_backend_ops test_engine"
step test_cuda "$BUILD/test_cuda"
# every op of every backend against cpu-ref (tests/c/test_backend_ops.c); cuda's NULL entries are reported skipped
step backend_ops "$BUILD/test_backend_ops"
# the engine on cuda against cpu-ref and as on the cpu (tests/c/test_engine.c), and hf-tiny-a's golden logits
step engine bash -c "'$BUILD/test_engine' && python3 -m pytest -q -rs '$ROOT/tests/python/test_engine.py' -k golden"
step matmul python3 -c "
import torch
a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16); b = torch.randn_like(a)
for _ in range(3): a @ b
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(10): a @ b
e.record(); torch.cuda.synchronize()
print('bf16 matmul 8192^3: %.0f TFLOP/s' % (10 * 2 * 8192**3 / (s.elapsed_time(e) * 1e-3) / 1e12))"
PEAK=$(grep -oE '[0-9]+ TFLOP/s' "$LOGS/matmul.log" 2> /dev/null | grep -oE '[0-9]+' || echo 0)
step bench "$BUILD/dsv4" bench attention-cuda --peak-tflops "${PEAK:-0}"
# the linear family at V4-Flash shapes, every format, next to the device copy rate (bench/bench_linear_cuda.c)
step bench_linear "$BUILD/dsv4" bench linear-cuda
step pytest_device python3 -m pytest -q -rs "$ROOT/tests/python/test_device.py"
step pytest_attention env DSV4_TEST_BACKENDS=cuda python3 -m pytest -q "$ROOT/tests/python/test_attention.py"
step memcheck env DSV4_CUDA_TEST_SMALL=1 compute-sanitizer --tool memcheck --error-exitcode 9 "$BUILD/test_cuda"
# racecheck: every handoff between roles of the warp-specialized kernels goes through mbarriers,
# each thread arriving for itself (named barriers between roles, and one lane arriving for its
# warp after __syncwarp, were reported as hazards)
step racecheck env DSV4_CUDA_TEST_SMALL=2 compute-sanitizer --tool racecheck --racecheck-report hazard \
    --error-exitcode 9 "$BUILD/test_cuda"
# the op-by-op conformance test under the sanitizers: the linear, tensor and layer kernels
step memcheck_ops compute-sanitizer --tool memcheck --error-exitcode 9 "$BUILD/test_backend_ops"
step racecheck_ops compute-sanitizer --tool racecheck --racecheck-report hazard --error-exitcode 9 "$BUILD/test_backend_ops"
# the engine under both sanitizers: 8 tokens of the tiny model with 2 drafts a step (every op of a
# forward, MTP draft, verification and rollback on the device)
step memcheck_engine bash -c "'$BUILD/dsv4' make-tiny --no-tokenizer --out '$BUILD/tiny-gpu' > /dev/null &&
    R='run --backend cuda --model $BUILD/tiny-gpu --prompt-ids 1,5,9,33,100,7,250,3 --max-tokens 8 --mtp 2 --seed 1' &&
    compute-sanitizer --tool memcheck --error-exitcode 9 '$BUILD/dsv4' \$R &&
    compute-sanitizer --tool racecheck --racecheck-report hazard --error-exitcode 9 '$BUILD/dsv4' \$R"
step sass bash -c "cuobjdump --dump-sass '$BUILD/libdsv4-cuda.so' | grep -oE '\b(HGMMA|HMMA|LDSM|LDGSTS|F2FP|F2F|HADD2)[.A-Z0-9_]*' | sort | uniq -c"
# the default kernel of the quick bench's first shape (h 64: decode_ws_kernel<true>, ws2)
NCU="ncu --clock-control none --kernel-name-base mangled --kernel-name regex:${NCU_KERNEL:-decode_ws_kernelILb1} --launch-skip 40 --launch-count 1"
step ncu bash -c "$NCU --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section Occupancy --section WarpStateStats '$BUILD/dsv4' bench attention-cuda --quick;
  $NCU --metrics 'regex:smsp__warp_issue_stalled_.*_per_warp_active.pct,regex:sm__pipe_tensor.*pct_of_peak_sustained_active' \
    '$BUILD/dsv4' bench attention-cuda --quick"
# with DSV4_PEER_FLASHMLA=dir (a folder holding FlashMLA's reduced SM90 sparse decode as a .tar.xz):
# build it (sources unpacked once into $BUILD/peer/src, so a second run reuses the build), then time
# it and dsv4 in one process on the same bytes with the repository's bench/flashmla_same_run.py,
# each shape of the decode and MODEL1 tables, both times and the ratio (docs/kernels.md §12.1; its
# DSV4_VARIANTS, FMLA_PROFILE pass through). Without the folder the step says so and passes.
step peer bash -c "if [ -z '$PEER' ]; then echo 'peer: SKIP: DSV4_PEER_FLASHMLA is not set'; exit 0; fi
    [ -d '$PEER' ] || { echo 'peer: DSV4_PEER_FLASHMLA is not a folder'; exit 2; }
    ls '$PEER'/flashmla-*.tar.xz > /dev/null || { echo 'peer: no flashmla-*.tar.xz in DSV4_PEER_FLASHMLA'; exit 2; }
    W='$BUILD/peer/src'
    [ -d \$W ] || { mkdir -p \$W && tar -xJf '$PEER'/flashmla-*.tar.xz -C \$W; } &&
    python3 '$ROOT/bench/flashmla_same_run.py' --build-only \$W &&
    OUT='${OUT:-$LOGS}' python3 '$ROOT/bench/flashmla_same_run.py' \$W '$ROOT' '$BUILD/libdsv4.so'"
# not in the default steps: the phase profile of the warp-specialized kernels (tests/gpu/ws_profile.cu)
step profile bash -c "nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -DDSV4_WS_PROFILE -I'$ROOT/src' \
    -I'$ROOT/include' '$ROOT/tests/gpu/ws_profile.cu' -o '$BUILD/ws_profile' && '$BUILD/ws_profile'"
echo "test-gpu: $([ $fail -eq 0 ] && echo all steps passed || echo SOME STEPS FAILED) (logs in $LOGS)"
exit $fail
