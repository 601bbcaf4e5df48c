/* The tensor family of both cpu backends (include/dsv4/tensor_ops.h). cpu-ref: plain element
 * loops on one thread, the definitions; cpu: whole-row copies and the best ISA's add, rows spread
 * over the threads (each row is computed whole by one thread, so results never depend on the
 * thread count). Both read the index tensors first and fail before writing on an entry out of
 * range. Sampling is core/sample.h's rule, row by row (cpu: rows spread over the threads). */
#include "backends/cpu/cpu_layer.h"
#include "core/error.h"
#include "core/ops_tensor.h"
#include "core/pool.h"
#include "core/sample.h"

#include <string.h>

enum { PAR_MIN_BYTES = 1 << 16 }; /* bytes moved per call below which the cpu backend stays on one thread */

/* Every idx[i*s], i < n, in [0, bound). */
static dsv4_status check_index(const char *op, const char *name, const int32_t *idx, int64_t s, int64_t n,
                               int64_t bound)
{
    for (int64_t i = 0; i < n; i++) {
        int32_t r = idx[i * s];
        if (r < 0 || r >= bound)
            return dsv4_fail(DSV4_ERR_RANGE, "%s: %s[%lld] = %d is outside [0, %lld)", op, name, (long long)i, r,
                             (long long)bound);
    }
    return DSV4_OK;
}

static dsv4_status embed_check(const dsv4_embed_args *a)
{
    return check_index("embed_rows", "ids", a->ids, a->ids_s, a->T, a->V);
}

static dsv4_status copy_check(const dsv4_copy_rows_args *a)
{
    return a->idx ? check_index("copy_rows", "idx", a->idx, a->idx_s, a->n, a->R) : DSV4_OK;
}

/* ---- cpu-ref ------------------------------------------------------------------------------ */
static dsv4_status ref_embed(const dsv4_exec *ex, const dsv4_embed_args *a)
{
    (void)ex;
    DSV4_TRY(embed_check(a));
    for (int64_t t = 0; t < a->T; t++) {
        const uint16_t *row = a->table + a->ids[t * a->ids_s] * a->ldt;
        for (int64_t j = 0; j < a->copies; j++)
            for (int64_t d = 0; d < a->D; d++) a->out[t * a->so_t + j * a->so_j + d] = row[d];
    }
    return DSV4_OK;
}

static dsv4_status ref_add(const dsv4_exec *ex, const dsv4_add_args *a)
{
    (void)ex;
    const dsv4_cpu_layer_kernels *kn = &dsv4_cpu_layer_kernels_scalar;
    for (int64_t t = 0; t < a->T; t++)
        for (int64_t j = 0; j < a->n; j++)
            kn->add_row(a->a + t * a->sa_t + j * a->sa_j, a->b + t * a->sb_t, a->D, a->y + t * a->sy_t + j * a->sy_j);
    return DSV4_OK;
}

static dsv4_status ref_copy(const dsv4_exec *ex, const dsv4_copy_rows_args *a)
{
    (void)ex;
    DSV4_TRY(copy_check(a));
    for (int64_t i = 0; i < a->n; i++) {
        const unsigned char *s = (const unsigned char *)a->src + (a->idx ? a->idx[i * a->idx_s] : i) * a->lds;
        unsigned char *d = (unsigned char *)a->dst + i * a->ldd;
        for (int64_t k = 0; k < a->row_bytes; k++) d[k] = s[k];
    }
    return DSV4_OK;
}

/* Rows [lo, hi) of a sampling, each whole on one thread in its own piece of the workspace. */
static void sample_rows(void *v, int64_t lo, int64_t hi)
{
    const dsv4_sample_args *a = v;
    for (int64_t r = lo; r < hi; r++) {
        float *probs = (float *)((char *)a->ws + r * a->ws_row);
        a->tokens[r * a->tok_s] = dsv4_sample_row(a->logits + r * a->ldl, a->V, &a->params[r], a->rng + 4 * r, probs,
                                                  (int32_t *)(probs + a->V));
    }
}

static dsv4_status ref_sample(const dsv4_exec *ex, const dsv4_sample_args *a)
{
    (void)ex;
    sample_rows((void *)a, 0, a->B);
    return DSV4_OK;
}

/* Both cpu backends: one pass, each element read before it is written (in place allowed). */
static dsv4_status paged_slots(const dsv4_exec *ex, const dsv4_paged_slots_args *a)
{
    (void)ex;
    for (int64_t i = 0; i < a->n; i++)
        a->slots[i * a->ss] = dsv4_paged_slot(a->table, a->n_blocks, a->block_size, a->entries[i * a->es]);
    return DSV4_OK;
}

const struct dsv4_tensor_ops dsv4_cpu_ref_tensor_ops = {ref_embed, ref_add, ref_copy, ref_sample, paged_slots};

/* ---- cpu ---------------------------------------------------------------------------------- */
static void embed_rows(void *v, int64_t lo, int64_t hi)
{
    const dsv4_embed_args *a = v;
    const size_t bytes = (size_t)a->D * sizeof *a->out;
    for (int64_t r = lo; r < hi; r++) {
        const int64_t t = r / a->copies, j = r % a->copies;
        memcpy(a->out + t * a->so_t + j * a->so_j, a->table + a->ids[t * a->ids_s] * a->ldt, bytes);
    }
}

static dsv4_status cpu_embed(const dsv4_exec *ex, const dsv4_embed_args *a)
{
    DSV4_TRY(embed_check(a));
    const int64_t rows = a->T * a->copies;
    const size_t bytes = (size_t)a->D * sizeof *a->out;
    dsv4_par_for(ex, rows, (size_t)rows * bytes > PAR_MIN_BYTES ? DSV4_PAR_AUTO : rows, embed_rows, (void *)a);
    return DSV4_OK;
}

typedef struct {
    const dsv4_cpu_layer_kernels *kn;
    const dsv4_add_args *a;
} add_job;

static void add_rows(void *v, int64_t lo, int64_t hi)
{
    const add_job *job = v;
    const dsv4_add_args *a = job->a;
    for (int64_t r = lo; r < hi; r++) {
        const int64_t t = r / a->n, j = r % a->n;
        job->kn->add_row(a->a + t * a->sa_t + j * a->sa_j, a->b + t * a->sb_t, a->D, a->y + t * a->sy_t + j * a->sy_j);
    }
}

static dsv4_status cpu_add(const dsv4_exec *ex, const dsv4_add_args *a)
{
    add_job job = {dsv4_cpu_layer_kernels_best(ex), a};
    const int64_t rows = a->T * a->n;
    dsv4_par_for(ex, rows, rows * a->D * 6 > PAR_MIN_BYTES ? DSV4_PAR_AUTO : rows, add_rows, &job);
    return DSV4_OK;
}

static void copy_rows(void *v, int64_t lo, int64_t hi)
{
    const dsv4_copy_rows_args *a = v;
    for (int64_t i = lo; i < hi; i++)
        memcpy((char *)a->dst + i * a->ldd, (const char *)a->src + (a->idx ? a->idx[i * a->idx_s] : i) * a->lds,
               (size_t)a->row_bytes);
}

static dsv4_status cpu_copy(const dsv4_exec *ex, const dsv4_copy_rows_args *a)
{
    DSV4_TRY(copy_check(a));
    dsv4_par_for(ex, a->n, a->n * a->row_bytes > PAR_MIN_BYTES ? DSV4_PAR_AUTO : a->n, copy_rows, (void *)a);
    return DSV4_OK;
}

static dsv4_status cpu_sample(const dsv4_exec *ex, const dsv4_sample_args *a)
{
    dsv4_par_for(ex, a->B, 1, sample_rows, (void *)a);
    return DSV4_OK;
}

const struct dsv4_tensor_ops dsv4_cpu_tensor_ops = {cpu_embed, cpu_add, cpu_copy, cpu_sample, paged_slots};
