/* The two CPU backends: "cpu" (vectorized kernels chosen by CPU features, OpenMP threads) and
 * "cpu-ref" (the scalar reference kernels every faster version is tested against).
 * Each op family adds its table here. */
#include "backends/cpu/cpu_formats.h"

const dsv4_backend dsv4_backend_cpu = {
    .name = "cpu",
    .device = DSV4_DEVICE_CPU,
    .formats = &dsv4_cpu_format_ops,
};

const dsv4_backend dsv4_backend_cpu_ref = {
    .name = "cpu-ref",
    .device = DSV4_DEVICE_CPU,
    .formats = &dsv4_cpu_ref_format_ops,
};
