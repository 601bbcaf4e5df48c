#include "bench.h"

int dsv4_bench_formats(int argc, char **argv);

const dsv4_bench_entry dsv4_benches[] = {
    {"formats", "GB/s of the vectorized quantize/dequantize routines vs read bandwidth", dsv4_bench_formats},
    {0, 0, 0},
};
