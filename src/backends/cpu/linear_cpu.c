/* The linear family of both cpu backends: one driver, run with the scalar kernels (cpu-ref) or
 * with the best ISA's (cpu). The driver stages each activation row (quantized by the ISA's own
 * staging kernel, or here with the format kernels of the same ISA; both bit-identical to
 * formats/codec.h) and describes the staging in the work space (a staged call checks that
 * description instead of staging), cuts the output into tiles, hands the tiles of N to the
 * threads (a tile is computed whole by one thread, in a fixed K order), and adds the bias and
 * rounds. */
#include "backends/cpu/cpu_formats.h"
#include "backends/cpu/cpu_linear.h"
#include "core/error.h"
#include "core/pool.h"
#include "formats/codec.h"

#include <string.h>

static int quantized(dsv4_linear_format fmt) { return fmt <= DSV4_LINEAR_FP4; }

/* The widest staging: the AVX2 one (linear_avx2.c row_scales): F32 values up to a multiple of 128,
 * a float per 32 for the group scales and a byte per value for the codes, to 64 bytes (k + k / 32
 * bytes for codes, 2 k for BF16 values fit too). */
int64_t dsv4_lin_row_bytes(int64_t k)
{
    const int64_t kp = (k + 127) / 128 * 128;
    return (kp * 4 + (k + 31) / 32 * 4 + kp + 63) / 64 * 64;
}

/* The description of a staging, at the first 64-byte boundary of the work space; the rows
 * follow at HEAD_BYTES from it. */
#define HEAD_BYTES 64
#define STAGING_MAGIC 0x6567617473347664ull /* "dv4stage" */
typedef struct staging_head {
    uint64_t magic;
    const dsv4_cpu_linear_kernels *lk; /* the kernel set whose layout the rows are in */
    int64_t rows, k;
    int32_t fmt; /* the format the rows are arranged for */
} staging_head;
_Static_assert(sizeof(staging_head) <= HEAD_BYTES, "staging head");

static size_t workspace_size(dsv4_linear_format fmt, int64_t rows, int64_t k)
{
    return quantized(fmt) ? (size_t)(rows * dsv4_lin_row_bytes(k)) + 64 + HEAD_BYTES : 0;
}

static staging_head *head_of(void *workspace) { return (staging_head *)(((uintptr_t)workspace + 63) & ~(uintptr_t)63); }
static uint8_t *rows_of(void *workspace) { return (uint8_t *)head_of(workspace) + HEAD_BYTES; }
static int mx32(dsv4_linear_format fmt) { return fmt == DSV4_LINEAR_MXFP8; }

static const void *x_row(const dsv4_linear_args *a, int64_t m, int64_t g)
{
    return (const char *)a->x + (size_t)(m * a->xs_m + g * a->xs_g) * (a->x_bf16 ? 2 : 4);
}

/* Quantize one row of x (act128 or mx32) into its staged form at dst, group by group. */
static void stage_row(const dsv4_cpu_linear_kernels *lk, const dsv4_cpu_format_kernels *fk,
                      const dsv4_linear_args *a, const void *x, uint8_t *dst)
{
    const dsv4_qrule rule = a->fmt == DSV4_LINEAR_MXFP8 ? DSV4_QRULE_MX32 : DSV4_QRULE_ACT128;
    const dsv4_qrule_params *p = &dsv4_qrules[rule];
    float buf[128];
    uint8_t codes[128];
    for (int64_t k0 = 0, j = 0; k0 < a->k; k0 += p->group, j++) {
        const int len = (int)(a->k - k0 < p->group ? a->k - k0 : p->group);
        if (a->x_bf16)
            fk->decode_span(DSV4_FMT_BF16, (const uint16_t *)x + k0, len, buf);
        else
            memcpy(buf, (const float *)x + k0, (size_t)len * sizeof(float));
        uint8_t byte;
        if (len == p->group)
            fk->quantize_row(rule, buf, len, codes, &byte);
        else /* the short last act128 group of a K with an edge block */
            byte = dsv4_quantize_group(p, buf, len, codes);
        if (lk->stage_bytes) {
            lk->stage_group(codes, len, dsv4_e8m0_to_f32(byte), dst + k0 * lk->stage_bytes);
        } else {
            memcpy(dst + k0, codes, (size_t)len);
            dst[a->k + j] = byte;
        }
    }
    if (lk->stage_bytes) {
        const int64_t kp = (a->k + 127) / 128 * 128;
        memset(dst + a->k * lk->stage_bytes, 0, (size_t)((kp - a->k) * lk->stage_bytes));
    }
}

static size_t weight_elem_size(dsv4_linear_format fmt)
{
    return fmt == DSV4_LINEAR_F32 ? 4 : fmt == DSV4_LINEAR_BF16 ? 2 : 1;
}

static void store_tile(const dsv4_linear_args *a, int64_t g, int64_t m0, int mv, int64_t n0, int nv,
                       float out[DSV4_LIN_MT][DSV4_LIN_NT])
{
    for (int i = 0; i < mv; i++) {
        const int64_t base = (m0 + i) * a->ys_m + g * a->ys_g + n0;
        for (int j = 0; j < nv; j++) {
            float v = out[i][j];
            if (a->bias) {
                const int64_t bi = (n0 + j) * a->bias_s;
                v += a->bias_bf16 ? dsv4_bf16_to_f32(((const uint16_t *)a->bias)[bi]) : ((const float *)a->bias)[bi];
            }
            if (a->y_bf16)
                ((uint16_t *)a->y)[base + j] = dsv4_bf16_from_f32(v);
            else
                ((float *)a->y)[base + j] = v;
        }
    }
}

/* Quantize the groups*m rows of x into the work space and describe the staging. */
/* One linear call on the pool: its kernels and arguments (and for a rearrangement the staged format). */
typedef struct {
    const dsv4_cpu_linear_kernels *lk;
    const dsv4_cpu_format_kernels *fk;
    const dsv4_linear_args *a;
    dsv4_linear_format from;
    int64_t ntiles, mt, nt;
} lin_job;

static void stage_range(void *v, int64_t lo, int64_t hi)
{
    const lin_job *j = v;
    const dsv4_linear_args *a = j->a;
    const int64_t rb = dsv4_lin_row_bytes(a->k);
    uint8_t *ws = rows_of(a->workspace);
    for (int64_t r = lo; r < hi; r++) {
        const void *x = x_row(a, r / a->groups, r % a->groups);
        if (j->lk->stage_row)
            j->lk->stage_row(a->fmt, x, a->x_bf16, a->k, (uint16_t *)(ws + r * rb));
        else
            stage_row(j->lk, j->fk, a, x, ws + r * rb);
    }
}

static void stage_rows(const dsv4_cpu_linear_kernels *lk, const dsv4_cpu_format_kernels *fk, const dsv4_exec *ex,
                       const dsv4_linear_args *a)
{
    const int64_t rows = a->m * a->groups;
    lin_job j = {.lk = lk, .fk = fk, .a = a};
    dsv4_par_for(ex, rows, rows * a->k > DSV4_CPU_CHUNK ? DSV4_PAR_AUTO : rows, stage_range, &j);
    *head_of(a->workspace) = (staging_head){STAGING_MAGIC, lk, rows, a->k, (int32_t)a->fmt};
}

static void rearrange_range(void *v, int64_t lo, int64_t hi)
{
    const lin_job *j = v;
    const int64_t rb = dsv4_lin_row_bytes(j->a->k);
    uint8_t *ws = rows_of(j->a->workspace);
    for (int64_t r = lo; r < hi; r++) j->lk->rearrange_row(j->from, j->a->fmt, (uint16_t *)(ws + r * rb), j->a->k);
}

static const char *kernels_name(const dsv4_cpu_linear_kernels *lk)
{
    return lk == &dsv4_cpu_linear_kernels_avx512 ? "avx512" : lk == &dsv4_cpu_linear_kernels_avx2 ? "avx2" : "scalar";
}

/* A staged call: check that the work space holds a staging of these rows for this family and
 * these kernels (nothing written if not), then arrange it for a->fmt where the layout differs. */
static dsv4_status use_staging(const dsv4_cpu_linear_kernels *lk, const dsv4_exec *ex, const dsv4_linear_args *a)
{
    const char *op = "linear_staged";
    staging_head *h = head_of(a->workspace);
    if (h->magic != STAGING_MAGIC || !quantized((dsv4_linear_format)h->fmt))
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: the work space holds no staging (dsv4_linear_stage)", op);
    if (h->lk != lk)
        return dsv4_fail(DSV4_ERR_INVALID_ARG,
                         "%s: the staging was made by the %s kernels, this call runs the %s ones (stage and "
                         "consume with the same backend and cpu ISA)",
                         op, kernels_name(h->lk), kernels_name(lk));
    const dsv4_linear_format sf = (dsv4_linear_format)h->fmt;
    if (mx32(sf) != mx32(a->fmt))
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: activations staged for %s (%s) cannot feed %s weights (%s)", op,
                         dsv4_linear_fmt_str(sf), mx32(sf) ? "mx32" : "act128", dsv4_linear_fmt_str(a->fmt),
                         mx32(a->fmt) ? "mx32" : "act128");
    if (h->rows != a->m || h->k != a->k)
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: the staging holds %lld rows of K = %lld; x is [%lld, %lld]", op,
                         (long long)h->rows, (long long)h->k, (long long)a->m, (long long)a->k);
    if (sf != a->fmt && lk->rearrange_row) {
        lin_job j = {.lk = lk, .a = a, .from = sf};
        dsv4_par_for(ex, a->m, a->m * a->k > DSV4_CPU_CHUNK ? DSV4_PAR_AUTO : a->m, rearrange_range, &j);
        h->fmt = (int32_t)a->fmt;
    }
    return DSV4_OK;
}

/* Tiles [lo, hi) of the N x groups output tiles, each computed whole in a fixed K order. */
static void tile_range(void *v, int64_t lo, int64_t hi)
{
    const lin_job *j = v;
    const dsv4_linear_args *a = j->a;
    const int q = quantized(a->fmt), mt = (int)j->mt, nt = (int)j->nt;
    const int64_t rb = dsv4_lin_row_bytes(a->k);
    const uint8_t *ws = q ? rows_of(a->workspace) : NULL;
    const size_t wes = weight_elem_size(a->fmt);
    for (int64_t t = lo; t < hi; t++) {
        const int64_t g = t / j->ntiles, n0 = (t % j->ntiles) * nt;
        const int nv = (int)(a->n - n0 < nt ? a->n - n0 : nt);
        dsv4_lin_tile tl = {.fmt = a->fmt, .k = a->k, .mt = mt, .nt = nt, .x_bf16 = a->x_bf16, .ss1 = a->ss1,
                            .w_next = (int64_t)((size_t)(nt * a->ws_r) * wes)};
        for (int k = 0; k < nt; k++) {
            const int64_t r = g * a->n + n0 + (k < nv ? k : nv - 1); /* row of the whole weight */
            tl.w[k] = (const char *)a->w + (size_t)(r * a->ws_r) * wes;
            tl.s[k] = q ? a->scale + (a->fmt == DSV4_LINEAR_FP8_B128 ? r / 128 : r) * a->ss0 : NULL;
        }
        for (int64_t m0 = 0; m0 < a->m; m0 += mt) {
            const int mv = (int)(a->m - m0 < mt ? a->m - m0 : mt);
            for (int i = 0; i < mt; i++) {
                const int64_t m = m0 + (i < mv ? i : mv - 1);
                tl.act[i] = q ? (const void *)(ws + (m * a->groups + g) * rb) : x_row(a, m, g);
            }
            float out[DSV4_LIN_MT][DSV4_LIN_NT];
            j->lk->tile(&tl, out);
            store_tile(a, g, m0, mv, n0, nv, out);
        }
    }
}

static dsv4_status run_with(const dsv4_cpu_linear_kernels *lk, const dsv4_cpu_format_kernels *fk,
                            const dsv4_exec *ex, const dsv4_linear_args *a)
{
    const int q = quantized(a->fmt);
    if (q && a->staged)
        DSV4_TRY(use_staging(lk, ex, a));
    else if (q)
        stage_rows(lk, fk, ex, a);
    int mt, nt;
    lk->shape(a->fmt, a->m, &mt, &nt);
    const int64_t ntiles = (a->n + nt - 1) / nt, total = ntiles * a->groups;
    const int64_t work = a->m * a->n * a->groups * a->k;
    /* Tiles are handed out in chunks of consecutive tiles as threads come free (on a shared machine
     * a thread may stall): where a tile is computed never changes its result. */
    const int64_t chunk = total / (8 * (int64_t)ex->threads) > 1 ? total / (8 * (int64_t)ex->threads) : 1;
    lin_job j = {.lk = lk, .fk = fk, .a = a, .ntiles = ntiles, .mt = mt, .nt = nt};
    dsv4_par_for(ex, total, work > 4 * DSV4_CPU_CHUNK ? chunk : total, tile_range, &j);
    return DSV4_OK;
}

static const dsv4_cpu_linear_kernels *fast_kernels(const dsv4_exec *ex, const dsv4_cpu_format_kernels **fk)
{
    if (dsv4_cpu_isa_bf16(ex->isa)) {
        *fk = &dsv4_cpu_format_kernels_avx512;
        return &dsv4_cpu_linear_kernels_avx512;
    }
    if (ex->isa >= DSV4_ISA_AVX2) {
        *fk = &dsv4_cpu_format_kernels_avx2;
        return &dsv4_cpu_linear_kernels_avx2;
    }
    *fk = &dsv4_cpu_format_kernels_scalar;
    return &dsv4_cpu_linear_kernels_scalar;
}

static dsv4_status ref_linear(const dsv4_exec *ex, const dsv4_linear_args *a)
{
    return run_with(&dsv4_cpu_linear_kernels_scalar, &dsv4_cpu_format_kernels_scalar, ex, a);
}

static dsv4_status fast_linear(const dsv4_exec *ex, const dsv4_linear_args *a)
{
    const dsv4_cpu_format_kernels *fk;
    const dsv4_cpu_linear_kernels *lk = fast_kernels(ex, &fk);
    return run_with(lk, fk, ex, a);
}

static dsv4_status ref_stage(const dsv4_exec *ex, const dsv4_linear_args *a)
{
    stage_rows(&dsv4_cpu_linear_kernels_scalar, &dsv4_cpu_format_kernels_scalar, ex, a);
    return DSV4_OK;
}

static dsv4_status fast_stage(const dsv4_exec *ex, const dsv4_linear_args *a)
{
    const dsv4_cpu_format_kernels *fk;
    const dsv4_cpu_linear_kernels *lk = fast_kernels(ex, &fk);
    stage_rows(lk, fk, ex, a);
    return DSV4_OK;
}

const struct dsv4_linear_ops dsv4_cpu_ref_linear_ops = {workspace_size, ref_linear, ref_stage};
const struct dsv4_linear_ops dsv4_cpu_linear_ops = {workspace_size, fast_linear, fast_stage};
