/* The portable decode unit built for AVX2 + FMA (this file is compiled with those flags and
 * runs only after the run-time check). */
#include "backends/cpu/cpu_attention_unit.h"

void dsv4_attn_unit_avx2(const dsv4_attn_unit *u, float *part) { dsv4_attn_unit_portable(u, part); }
