/* The portable decode unit (see dsv4_attn_unit in cpu_attention.h), written with 16-lane
 * partial sums so a compiler can vectorize it for whatever ISA the including file is built for
 * (only attention_cpu.c includes it now, for the baseline; AVX2 and AVX-512 have their own units in
 * attention_avx2.c and attention_avx512.c). Entries are dequantized to fp32 once and
 * shared by the unit's heads; everything is fp32. */
#ifndef DSV4_CPU_ATTENTION_UNIT_H
#define DSV4_CPU_ATTENTION_UNIT_H

#include "backends/cpu/cpu_attention.h"

#include <math.h>

static inline void dsv4_attn_unit_portable(const dsv4_attn_unit *u, float *part)
{
    const dsv4_attn_args *a = u->a;
    const int64_t nh = u->nh;
    float q[DSV4_ATTN_TILE][DSV4_KV_DIM], k[DSV4_KV_DIM];
    for (int64_t j = 0; j < nh; j++) {
        const uint16_t *qr = a->q + u->t * a->q_st + (u->h0 + j) * a->q_sh;
        float *o = part + j * DSV4_ATTN_PART;
        for (int d = 0; d < DSV4_KV_DIM; d++) {
            q[j][d] = dsv4_bf16_to_f32(qr[d]);
            o[d] = 0.0f;
        }
        o[512] = -INFINITY;
        o[513] = 0.0f;
    }
    int64_t p = u->p0, count = 0, idx;
    int s;
    while ((idx = dsv4_attn_next_slot(u, &p, &s)) >= 0) {
        dsv4_ref_kv_read(&u->scopes[s].cache, u->bf16_rows, idx, k);
        count++;
        for (int64_t j = 0; j < nh; j++) {
            float acc[16] = {0};
            for (int d = 0; d < DSV4_KV_DIM; d += 16)
                for (int i = 0; i < 16; i++) acc[i] += q[j][d + i] * k[d + i];
            for (int w = 8; w >= 1; w /= 2)
                for (int i = 0; i < w; i++) acc[i] += acc[i + w];
            float *o = part + j * DSV4_ATTN_PART, m = o[512];
            float x = a->scale * acc[0], mn = x > m ? x : m;
            float alpha = mn == m ? 1.0f : expf(m - mn), pr = x == -INFINITY ? 0.0f : expf(x - mn);
            const float pb = dsv4_bf16_round(pr); /* P is BF16 for P.V, the sum fp32 (docs/kernels.md §3.2) */
            for (int d = 0; d < DSV4_KV_DIM; d++) o[d] = o[d] * alpha + pb * k[d];
            o[513] = o[513] * alpha + pr;
            o[512] = mn;
        }
    }
    for (int64_t j = 0; j < nh; j++) part[j * DSV4_ATTN_PART + 514] = (float)count;
}

#endif
