#include "core/error.h"
#include "core/tensor_check.h"

#include <stdio.h>
#include <string.h>

static const size_t dtype_sizes[DSV4_DTYPE_COUNT] = {4, 2, 1, 1, 1, 4, 8, 1};
static const char *const dtype_names[DSV4_DTYPE_COUNT] = {"f32", "bf16", "f8_e4m3", "e8m0",
                                                          "fp4x2", "i32", "i64", "u8"};

size_t dsv4_dtype_size(dsv4_dtype d) { return (unsigned)d < DSV4_DTYPE_COUNT ? dtype_sizes[d] : 0; }
const char *dsv4_dtype_name(dsv4_dtype d) { return (unsigned)d < DSV4_DTYPE_COUNT ? dtype_names[d] : "?"; }

dsv4_status dsv4_tensor_init_strided(dsv4_tensor *t, void *data, dsv4_dtype dtype, int ndim,
                                     const int64_t *shape, const int64_t *stride)
{
    DSV4_CHECK_ARG(t, "tensor_init: null tensor");
    DSV4_CHECK_ARG((unsigned)dtype < DSV4_DTYPE_COUNT, "tensor_init: unknown dtype %d", (int)dtype);
    DSV4_CHECK_ARG(ndim >= 0 && ndim <= DSV4_MAX_DIMS, "tensor_init: ndim %d not in [0, %d]", ndim, DSV4_MAX_DIMS);
    DSV4_CHECK_ARG(ndim == 0 || (shape && stride), "tensor_init: null shape or stride");
    dsv4_tensor v;
    memset(&v, 0, sizeof v);
    v.data = data;
    v.dtype = dtype;
    v.ndim = ndim;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return dsv4_fail(DSV4_ERR_SHAPE, "tensor_init: negative dim %d = %lld", i, (long long)shape[i]);
        if (stride[i] < 0) return dsv4_fail(DSV4_ERR_STRIDE, "tensor_init: negative stride %d = %lld", i, (long long)stride[i]);
        v.shape[i] = shape[i];
        v.stride[i] = stride[i];
    }
    *t = v;
    return DSV4_OK;
}

dsv4_status dsv4_tensor_init(dsv4_tensor *t, void *data, dsv4_dtype dtype, int ndim, const int64_t *shape)
{
    int64_t stride[DSV4_MAX_DIMS];
    DSV4_CHECK_ARG(ndim >= 0 && ndim <= DSV4_MAX_DIMS, "tensor_init: ndim %d not in [0, %d]", ndim, DSV4_MAX_DIMS);
    DSV4_CHECK_ARG(ndim == 0 || shape, "tensor_init: null shape");
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        stride[i] = s;
        s *= shape[i] > 0 ? shape[i] : 1;
    }
    return dsv4_tensor_init_strided(t, data, dtype, ndim, shape, stride);
}

int64_t dsv4_tensor_numel(const dsv4_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

int dsv4_tensor_is_contiguous(const dsv4_tensor *t)
{
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] == 0) return 1; /* an empty view touches nothing (numpy gives it stride 0) */
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != s) return 0;
        s *= t->shape[i];
    }
    return 1;
}

dsv4_status dsv4_tensor_transpose(const dsv4_tensor *t, int a, int b, dsv4_tensor *out)
{
    DSV4_CHECK_ARG(t && out, "tensor_transpose: null tensor");
    DSV4_CHECK_ARG(a >= 0 && a < t->ndim && b >= 0 && b < t->ndim, "tensor_transpose: dims %d, %d out of range for %d dims", a, b, t->ndim);
    dsv4_tensor v = *t;
    v.shape[a] = t->shape[b]; v.shape[b] = t->shape[a];
    v.stride[a] = t->stride[b]; v.stride[b] = t->stride[a];
    *out = v;
    return DSV4_OK;
}

dsv4_status dsv4_tensor_slice(const dsv4_tensor *t, int dim, int64_t start, int64_t end, dsv4_tensor *out)
{
    DSV4_CHECK_ARG(t && out, "tensor_slice: null tensor");
    DSV4_CHECK_ARG(dim >= 0 && dim < t->ndim, "tensor_slice: dim %d out of range for %d dims", dim, t->ndim);
    if (start < 0 || end < start || end > t->shape[dim])
        return dsv4_fail(DSV4_ERR_RANGE, "tensor_slice: [%lld, %lld) not inside dim %d of size %lld",
                         (long long)start, (long long)end, dim, (long long)t->shape[dim]);
    dsv4_tensor v = *t;
    if (v.data) v.data = (char *)v.data + (size_t)(start * t->stride[dim]) * dsv4_dtype_size(t->dtype);
    v.shape[dim] = end - start;
    *out = v;
    return DSV4_OK;
}

dsv4_status dsv4_tensor_reshape(const dsv4_tensor *t, int ndim, const int64_t *shape, dsv4_tensor *out)
{
    DSV4_CHECK_ARG(t && out && (shape || ndim == 0), "tensor_reshape: null argument");
    DSV4_CHECK_ARG(ndim >= 0 && ndim <= DSV4_MAX_DIMS, "tensor_reshape: ndim %d not in [0, %d]", ndim, DSV4_MAX_DIMS);
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return dsv4_fail(DSV4_ERR_SHAPE, "tensor_reshape: negative dim %d", i);
        n *= shape[i];
    }
    if (n != dsv4_tensor_numel(t))
        return dsv4_fail(DSV4_ERR_SHAPE, "tensor_reshape: %lld elements cannot become %lld", (long long)dsv4_tensor_numel(t), (long long)n);
    if (!dsv4_tensor_is_contiguous(t))
        return dsv4_fail(DSV4_ERR_STRIDE, "tensor_reshape: the view is not contiguous; reshaping it would need a copy");
    dsv4_tensor v;
    DSV4_TRY(dsv4_tensor_init(&v, t->data, t->dtype, ndim, shape));
    v.device = t->device;
    v.device_index = t->device_index;
    *out = v;
    return DSV4_OK;
}

/* ---- contract checks --------------------------------------------------------------------- */

static void shape_str(const dsv4_tensor *t, char *buf, size_t n)
{
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < t->ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

dsv4_status dsv4_check_tensor(const char *op, const char *arg, const dsv4_tensor *t, unsigned dtype_mask,
                              int ndim, const int64_t *want)
{
    if (!t) return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: %s is null", op, arg);
    if ((unsigned)t->dtype >= DSV4_DTYPE_COUNT || !(dtype_mask & DSV4_DT(t->dtype))) {
        char allowed[128] = "";
        size_t o = 0;
        for (int d = 0; d < DSV4_DTYPE_COUNT; d++)
            if (dtype_mask & DSV4_DT(d)) o += (size_t)snprintf(allowed + o, sizeof allowed - o, "%s%s", o ? "/" : "", dtype_names[d]);
        return dsv4_fail(DSV4_ERR_DTYPE, "%s: %s has dtype %s, expected %s", op, arg, dsv4_dtype_name(t->dtype), allowed);
    }
    if (t->ndim != ndim) return dsv4_fail(DSV4_ERR_SHAPE, "%s: %s has %d dims, expected %d", op, arg, t->ndim, ndim);
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (t->shape[i] < 0 || t->stride[i] < 0)
            return dsv4_fail(DSV4_ERR_SHAPE, "%s: %s has a negative dim or stride", op, arg);
        if (want && want[i] != DSV4_ANY && t->shape[i] != want[i]) {
            char got[96];
            shape_str(t, got, sizeof got);
            return dsv4_fail(DSV4_ERR_SHAPE, "%s: %s has shape %s, dim %d should be %lld", op, arg, got, i, (long long)want[i]);
        }
        numel *= t->shape[i];
    }
    if (numel > 0 && !t->data) return dsv4_fail(DSV4_ERR_INVALID_ARG, "%s: %s has a null data pointer", op, arg);
    return DSV4_OK;
}

dsv4_status dsv4_check_inner_contiguous(const char *op, const char *arg, const dsv4_tensor *t)
{
    if (t->ndim > 0 && t->shape[t->ndim - 1] > 1 && t->stride[t->ndim - 1] != 1)
        return dsv4_fail(DSV4_ERR_STRIDE, "%s: %s must have unit stride in its last dim (got %lld)", op, arg,
                         (long long)t->stride[t->ndim - 1]);
    return DSV4_OK;
}

dsv4_status dsv4_check_contiguous(const char *op, const char *arg, const dsv4_tensor *t)
{
    if (!dsv4_tensor_is_contiguous(t)) return dsv4_fail(DSV4_ERR_STRIDE, "%s: %s must be contiguous", op, arg);
    return DSV4_OK;
}

dsv4_status dsv4_check_output(const char *op, const char *arg, const dsv4_tensor *t)
{
    /* dims of size > 1 ordered by stride: each must step past the whole extent of the smaller ones */
    int order[DSV4_MAX_DIMS], n = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] == 0) return DSV4_OK;
        if (t->shape[i] > 1) order[n++] = i;
    }
    for (int a = 1; a < n; a++)
        for (int b = a; b > 0 && t->stride[order[b]] < t->stride[order[b - 1]]; b--) {
            int tmp = order[b];
            order[b] = order[b - 1];
            order[b - 1] = tmp;
        }
    int64_t extent = 1; /* elements spanned by the dims seen so far */
    for (int j = 0; j < n; j++) {
        int d = order[j];
        if (t->stride[d] < extent)
            return dsv4_fail(DSV4_ERR_STRIDE, "%s: output %s overlaps itself (dim %d has stride %lld)", op, arg, d,
                             (long long)t->stride[d]);
        extent = t->stride[d] * (t->shape[d] - 1) + extent;
    }
    return DSV4_OK;
}

dsv4_status dsv4_check_aligned(const char *op, const char *arg, const dsv4_tensor *t, size_t bytes)
{
    if (((uintptr_t)t->data) % bytes)
        return dsv4_fail(DSV4_ERR_STRIDE, "%s: %s data must be %zu-byte aligned", op, arg, bytes);
    return DSV4_OK;
}

dsv4_status dsv4_check_host(const char *op, const char *arg, const dsv4_tensor *t)
{
    if (t->device != DSV4_DEVICE_CPU) return dsv4_fail(DSV4_ERR_UNSUPPORTED, "%s: %s must be host memory", op, arg);
    return DSV4_OK;
}

void dsv4_tensor_span(const dsv4_tensor *t, const char **lo, const char **hi)
{
    int64_t last = 0;
    int empty = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] == 0) empty = 1;
        else last += (t->shape[i] - 1) * t->stride[i];
    }
    *lo = (const char *)t->data;
    *hi = empty ? *lo : *lo + (size_t)(last + 1) * dsv4_dtype_size(t->dtype);
}

int dsv4_tensors_overlap(const dsv4_tensor *a, const dsv4_tensor *b)
{
    const char *alo, *ahi, *blo, *bhi;
    dsv4_tensor_span(a, &alo, &ahi);
    dsv4_tensor_span(b, &blo, &bhi);
    return alo < bhi && blo < ahi;
}
