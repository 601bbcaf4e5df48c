#include "bench.h"

int dsv4_bench_formats(int argc, char **argv);
int dsv4_bench_model(int argc, char **argv);
int dsv4_bench_attention(int argc, char **argv);
int dsv4_bench_indexer(int argc, char **argv);
int dsv4_bench_attention_cuda(int argc, char **argv);
int dsv4_bench_linear(int argc, char **argv);
int dsv4_bench_layer(int argc, char **argv);
int dsv4_bench_run(int argc, char **argv);
int dsv4_bench_bandwidth(int argc, char **argv);

const dsv4_bench_entry dsv4_benches[] = {
    {"bandwidth", "the read-bandwidth probe behind every roofline (all threads, 1 thread) vs the former probe and an FP8 M=1 linear", dsv4_bench_bandwidth},
    {"formats", "GB/s of the vectorized quantize/dequantize routines vs read bandwidth", dsv4_bench_formats},
    {"attention", "sparse MLA decode at V4-Flash decode shapes: GFLOP/s, GB/s vs FMA peak, read bandwidth, the two-pass design", dsv4_bench_attention},
    {"linear", "linear layers, every format at every V4-Flash shape, M 1..32: best-call and sustained weight GB/s vs read bandwidth and OpenBLAS", dsv4_bench_linear},
    {"attention-cuda", "sparse MLA decode on the GPU: TFLOP/s, GB/s vs device copy, vs the two-pass design", dsv4_bench_attention_cuda},
    {"indexer", "lightning-indexer scoring + top-k at 16k/64k/256k entries: GB/s vs read bandwidth and an sgemm+sort peer", dsv4_bench_indexer},
    {"layer", "mHC, router and MoE (6 FP4 experts + FP8 shared) per token at V4-Flash sizes: GB/s vs read bandwidth; then the indexer bench", dsv4_bench_layer},
    {"model", "checkpoint loading: V4-Flash-shaped header parse + bind, in-place mmap vs a copying loader, mapped-weight GB/s", dsv4_bench_model},
    {"run", "the engine: prefill and decode tok/s (with / without MTP) on the tiny model and V4-Flash layer shapes vs the bytes-per-token roofline", dsv4_bench_run},
    {0, 0, 0},
};
