#include "bench.h"

int dsv4_bench_formats(int argc, char **argv);
int dsv4_bench_model(int argc, char **argv);
int dsv4_bench_attention(int argc, char **argv);
int dsv4_bench_indexer(int argc, char **argv);
int dsv4_bench_attention_cuda(int argc, char **argv);
int dsv4_bench_linear(int argc, char **argv);
int dsv4_bench_linear_cuda(int argc, char **argv);
int dsv4_bench_layer(int argc, char **argv);
int dsv4_bench_run(int argc, char **argv);
int dsv4_bench_serve(int argc, char **argv);
int dsv4_bench_bandwidth(int argc, char **argv);
int dsv4_bench_memory(int argc, char **argv);
int dsv4_bench_startup(int argc, char **argv);

const dsv4_bench_entry dsv4_benches[] = {
    {"bandwidth", "the read-bandwidth probe behind every roofline (all threads, 1 thread) vs the former probe and an FP8 M=1 linear", "threads passes", dsv4_bench_bandwidth},
    {"formats", "GB/s of the vectorized quantize/dequantize routines vs read bandwidth", "threads quick", dsv4_bench_formats},
    {"attention", "sparse MLA decode at V4-Flash decode shapes: GFLOP/s, GB/s vs FMA peak, read bandwidth, the two-pass design", "threads quick", dsv4_bench_attention},
    {"linear", "linear layers, every format at every V4-Flash shape, M 1..32: best-call and sustained weight GB/s vs read bandwidth and OpenBLAS", "threads quick only m rounds", dsv4_bench_linear},
    {"linear-cuda", "linear layers on the GPU at V4-Flash shapes, every format, M 1..64: weight GB/s vs the device copy rate", "quick only", dsv4_bench_linear_cuda},
    {"attention-cuda", "sparse MLA decode on the GPU: TFLOP/s, GB/s vs device copy, vs the two-pass design", "quick peak-tflops compare", dsv4_bench_attention_cuda},
    {"indexer", "lightning-indexer scoring + top-k at 16k/64k/256k entries: GB/s vs read bandwidth and an sgemm+sort peer", "threads quick", dsv4_bench_indexer},
    {"layer", "mHC, router and MoE (6 FP4 experts + FP8 shared) per token at V4-Flash sizes: GB/s vs read bandwidth; then the indexer bench", "threads quick only no-indexer", dsv4_bench_layer},
    {"model", "checkpoint loading: V4-Flash-shaped header parse + bind, in-place mmap vs a copying loader, mapped-weight GB/s", "threads quick dir", dsv4_bench_model},
    {"run", "the engine: prefill and decode tok/s (with / without MTP) on the tiny model and V4-Flash layer shapes vs the bytes-per-token roofline, by weight class with the 43-layer model extrapolated", "threads quick model max-batch steps busy rounds backend layers peak-tflops no-tiny", dsv4_bench_run},
    {"serve", "dsv4 serve under load (loopback, concurrency 1..64): aggregate tok/s, TTFT, inter-token p50/p99 vs the batched engine alone", "threads quick model tokens reps keep", dsv4_bench_serve},
    {"memory", "what V4-Flash (--pro: V4-Pro) needs: mapped checkpoint, bytes read per decoded token, the engine's plan at 4k/64k/1M positions (minutes)", "dir model pro", dsv4_bench_memory},
    {"startup", "first use of the backend registry (loading the backend modules) and each backend's availability check", "", dsv4_bench_startup},
    {0, 0, 0, 0},
};

const cli_opt bench_options[] = {
    {"threads", 0, CLI_INT, NULL, 1, CLI_MAX_THREADS, "N", "threads (default: $DSV4_THREADS, else all cores)"},
    {"quick", 0, CLI_FLAG, NULL, 0, 0, NULL, "fewer sizes and repetitions"},
    {"passes", 0, CLI_INT, NULL, 1, 1000, "N", "passes over the buffer (default 4)"},
    {"only", 0, CLI_STR, NULL, 0, 0, "NAME", "only the cases whose name (or format) contains NAME"},
    {"no-indexer", 0, CLI_FLAG, NULL, 0, 0, NULL, "leave out the indexer benchmark that follows"},
    {"dir", 0, CLI_STR, NULL, 0, 0, "DIR", "folder for the temporary checkpoint (default /tmp)"},
    {"pro", 0, CLI_FLAG, NULL, 0, 0, NULL, "also V4-Pro's shapes (an 865 GB checkpoint of file holes)"},
    {"model", 0, CLI_STR, NULL, 0, 0, "DIR", "a checkpoint of your own instead of the built-in shapes"},
    {"max-batch", 0, CLI_INT, NULL, 1, 32, "N", "largest batch of sequences (default and at most 32)"},
    {"steps", 0, CLI_INT, NULL, 0, 1 << 20, "N", "decode steps timed (default: 24 on the tiny model, else 8)"},
    {"peak-tflops", 0, CLI_F64, NULL, 0, 1e6, "X", "the GPU's peak to compare with (default: none)"},
    {"compare", 0, CLI_STR, NULL, 0, 0, "LIST", "kernels to compare with (default ws1,v1)"},
    {"busy", 0, CLI_INT, NULL, 0, 64, "N", "CPU-bound competing processes during the model parts (default 0)"},
    {"tokens", 0, CLI_INT, NULL, 1, 1 << 20, "N", "tokens generated per request (default 32)"},
    {"reps", 0, CLI_INT, NULL, 1, 100, "N", "repetitions of each row (default 3)"},
    {"keep", 0, CLI_FLAG, NULL, 0, 0, NULL, "keep the temporary checkpoint"},
    {"m", 0, CLI_INT, NULL, 1, 4096, "M", "only this row count (default: 1, 2, 4, 8, 16, 32)"},
    {"backend", 0, CLI_STR, NULL, 0, 0, "NAME", "the engine's backend (run: default $DSV4_BACKEND, else cpu; cuda: the device's roofline)"},
    {"layers", 0, CLI_INT, NULL, 1, 43, "N", "blocks of the V4-Flash-shaped checkpoint (run: default 3, one of each kind; else V4-Flash's first N)"},
    {"no-tiny", 0, CLI_FLAG, NULL, 0, 0, NULL, "run: the V4-Flash-shaped checkpoint only (not the tiny model before it)"},
    {"rounds", 0, CLI_INT, NULL, 1, 100, "N", "alternating rounds (default 2; run: default threads against 1, 7 with --busy, else none)"},
    {NULL, 0, CLI_FLAG, NULL, 0, 0, NULL, NULL},
};
