/* Scalar reference kernels of the indexer family (backend "cpu-ref"; also the cpu backend's
 * fallback): plain loops in the order the vector kernels reproduce. */
#include "backends/cpu/indexer_cpu.h"

void dsv4_ix_ref_pool(int nrows, const float *const *a, const float *const *g, const float *const *ape, int d, float *v)
{
    for (int e = 0; e < d; e++) {
        float m = -INFINITY;
        for (int j = 0; j < nrows; j++) {
            float s = ape[j] ? g[j][e] + ape[j][e] : g[j][e];
            m = s > m ? s : m;
        }
        float den = 0.0f, num = 0.0f;
        for (int j = 0; j < nrows; j++) {
            float s = ape[j] ? g[j][e] + ape[j][e] : g[j][e];
            float w = dsv4_ix_expf(s - m);
            den = den + w;
            num = num + w * a[j][e];
        }
        v[e] = num / den;
    }
}

void dsv4_ix_ref_fwht(float *x, int d)
{
    for (int h = 1; h < d; h <<= 1)
        for (int i = 0; i < d; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
}

/* The documented order of include/dsv4/indexer.h (dsv4_indexer_scores). */
float dsv4_ix_ref_score(const dsv4_ix_operands *o, int64_t t, int64_t c)
{
    const int groups = o->dim / 32;
    const uint8_t *kc = o->k + c * o->ld_k, *ks = o->k_scales + c * o->ld_ks;
    const float *w = o->weights + t * o->ld_w;
    float lanes[16] = {0};
    for (int64_t h = 0; h < o->heads; h++) {
        const uint8_t *qc = o->q + t * o->ld_q_t + h * o->ld_q_h;
        const uint8_t *qs = o->q_scales + t * o->ld_qs_t + h * o->ld_qs_h;
        float dot = 0.0f;
        for (int g = 0; g < groups; g++) {
            int32_t sum = 0;
            for (int b = 16 * g; b < 16 * g + 16; b++)
                sum += dsv4_ix_fp4x2[qc[b] & 15] * dsv4_ix_fp4x2[kc[b] & 15] +
                       dsv4_ix_fp4x2[qc[b] >> 4] * dsv4_ix_fp4x2[kc[b] >> 4];
            dot = fmaf((float)sum, dsv4_ix_half_scale(qs[g]) * dsv4_ix_half_scale(ks[g]), dot);
        }
        float r = dot > 0.0f ? dot : 0.0f;
        lanes[h & 15] = fmaf(r, w[h], lanes[h & 15]);
    }
    return dsv4_ix_lane_tree(lanes);
}

static void score_run(const dsv4_ix_operands *o, int64_t t, const dsv4_ix_qprep *qp, int64_t c0, int64_t n, float *out)
{
    (void)qp;
    for (int64_t i = 0; i < n; i++) out[i] = dsv4_ix_ref_score(o, t, c0 + i);
}

const dsv4_ix_kernels dsv4_ix_kernels_scalar = {dsv4_ix_ref_pool, dsv4_ix_ref_fwht, score_run, 0};
