/* Code shared by both cpu backends' indexer families: RoPE, the Hadamard + FP4 tail, the
 * query path driver, and the query preparation of the vector scoring kernels. */
#include "backends/cpu/indexer_cpu.h"
#include "core/pool.h"

#include <string.h>

void dsv4_ix_rope64(float *x, const float *cs)
{
    for (int i = 0; i < 32; i++) {
        float a = x[2 * i], b = x[2 * i + 1], c = cs[i], s = cs[32 + i];
        x[2 * i] = dsv4_bf16_round(a * c - b * s);
        x[2 * i + 1] = dsv4_bf16_round(a * s + b * c);
    }
}

void dsv4_ix_hadamard_fp4(const dsv4_ix_kernels *kn, float *x, int d, uint8_t *codes, uint8_t *scales, uint16_t *values)
{
    kn->fwht(x, d);
    const float sc = (float)(1.0 / sqrt((double)d));
    for (int e = 0; e < d; e++) x[e] = dsv4_bf16_round(x[e] * sc);
    const dsv4_qrule_params *p = &dsv4_qrules[DSV4_QRULE_FP4_32];
    for (int g = 0; g < d / 32; g++) {
        uint8_t c[32];
        uint8_t byte = dsv4_quantize_group(p, x + 32 * g, 32, c);
        if (values) {
            float s = dsv4_e8m0_to_f32(byte);
            for (int j = 0; j < 32; j++) values[32 * g + j] = dsv4_bf16_from_f32(dsv4_e2m1_to_f32(c[j]) * s);
        } else {
            for (int j = 0; j < 16; j++) codes[16 * g + j] = (uint8_t)(c[2 * j] | (c[2 * j + 1] << 4));
            scales[g] = byte;
        }
    }
}

static int64_t position(const void *p, int i64, int64_t ld, int64_t t)
{
    return i64 ? ((const int64_t *)p)[t * ld] : ((const int32_t *)p)[t * ld];
}

static void ixq_rows(void *v, int64_t lo, int64_t hi)
{
    const dsv4_ix_kernels *kn = ((const dsv4_ix_job *)v)->kn;
    const dsv4_ixq_call *c = ((const dsv4_ix_job *)v)->call;
    const int d = c->dim;
    for (int64_t r = lo; r < hi; r++) {
        int64_t t = r / c->heads, h = r % c->heads;
        float x[DSV4_IX_MAX_DIM];
        const uint16_t *q = c->q + t * c->ld_q_t + h * c->ld_q_h;
        for (int e = 0; e < d; e++) x[e] = dsv4_bf16_to_f32(q[e]);
        dsv4_ix_rope64(x + d - 64, c->rope + position(c->positions, c->pos_i64, c->ld_pos, t) * c->ld_rope);
        if (c->packed)
            dsv4_ix_hadamard_fp4(kn, x, d, (uint8_t *)c->out + t * c->ld_out_t + h * c->ld_out_h,
                                 c->out_scales + t * c->ld_os_t + h * c->ld_os_h, NULL);
        else
            dsv4_ix_hadamard_fp4(kn, x, d, NULL, NULL, (uint16_t *)c->out + t * c->ld_out_t + h * c->ld_out_h);
    }
}

dsv4_status dsv4_ixq_run(const dsv4_ix_kernels *kn, const dsv4_exec *ex, const dsv4_ixq_call *c)
{
    const int64_t rows = c->tokens * c->heads;
    dsv4_ix_job job = {kn, c};
    dsv4_par_for(ex, rows, rows * c->dim > 65536 ? DSV4_PAR_AUTO : rows, ixq_rows, &job);
    return DSV4_OK;
}

void dsv4_ix_qprep_build(dsv4_ix_qprep *qp, const dsv4_ix_operands *o, int64_t t)
{
    const int H = (int)o->heads, hpad = (H + 15) & ~15, d = o->dim, groups = d / 32, q8 = d / 8;
    qp->heads = H;
    qp->hpad = hpad;
    qp->dim = d;
    memset(qp->qi, 0, (size_t)d * hpad);
    const float *w = o->weights + t * o->ld_w;
    for (int h = 0; h < hpad; h++) {
        qp->w[h] = h < H ? w[h] : 0.0f;
        for (int g = 0; g < groups; g++) {
            qp->qs[g * hpad + h] = h < H ? dsv4_ix_half_scale(o->q_scales[t * o->ld_qs_t + h * o->ld_qs_h + g]) : 1.0f;
            qp->corr[g * hpad + h] = 0;
        }
        if (h >= H) continue;
        const uint8_t *qc = o->q + t * o->ld_q_t + h * o->ld_q_h;
        for (int b = 0; b < d / 2; b++) {
            int8_t lo = dsv4_ix_fp4x2[qc[b] & 15], hi = dsv4_ix_fp4x2[qc[b] >> 4];
            qp->qi[((b / 4) * hpad + h) * 4 + b % 4] = lo;
            qp->qi[((q8 + b / 4) * hpad + h) * 4 + b % 4] = hi;
            qp->corr[(b / 16) * hpad + h] -= 12 * (lo + hi);
        }
    }
}
