/* The two CPU backends: "cpu" (vectorized kernels chosen by CPU features, on the context's threads) and
 * "cpu-ref" (the scalar reference kernels every faster version is tested against).
 * Each op family adds its table here. */
#include "backends/cpu/cpu_attention.h"
#include "backends/cpu/cpu_formats.h"
#include "backends/cpu/indexer_cpu.h"
#include "backends/cpu/cpu_layer.h"
#include "backends/cpu/cpu_linear.h"
#include "core/ops_tensor.h"

extern const struct dsv4_tensor_ops dsv4_cpu_tensor_ops, dsv4_cpu_ref_tensor_ops; /* tensor_cpu.c */

const dsv4_backend dsv4_backend_cpu = {
    .name = "cpu",
    .device = DSV4_DEVICE_CPU,
    .formats = &dsv4_cpu_format_ops,
    .indexer = &dsv4_cpu_indexer_ops,
    .attention = &dsv4_cpu_attention_ops,
    .linear = &dsv4_cpu_linear_ops,
    .layer = &dsv4_cpu_layer_ops,
    .tensor = &dsv4_cpu_tensor_ops,
};

const dsv4_backend dsv4_backend_cpu_ref = {
    .name = "cpu-ref",
    .device = DSV4_DEVICE_CPU,
    .formats = &dsv4_cpu_ref_format_ops,
    .indexer = &dsv4_cpu_ref_indexer_ops,
    .attention = &dsv4_cpu_ref_attention_ops,
    .linear = &dsv4_cpu_ref_linear_ops,
    .layer = &dsv4_cpu_ref_layer_ops,
    .tensor = &dsv4_cpu_ref_tensor_ops,
};
