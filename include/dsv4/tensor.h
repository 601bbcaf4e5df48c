/* Tensor views: a typed, strided window on memory the caller owns. Transpose, slice and reshape
 * make new views; nothing is copied unless a function says it copies. */
#ifndef DSV4_TENSOR_H
#define DSV4_TENSOR_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DSV4_MAX_DIMS 5

typedef enum dsv4_dtype {
    DSV4_F32 = 0,
    DSV4_BF16 = 1,
    DSV4_F8_E4M3 = 2, /* OCP E4M3FN */
    DSV4_E8M0 = 3,    /* UE8M0 scale byte, 2^(b-127) */
    DSV4_FP4X2 = 4,   /* one byte = two E2M1 values, low nibble = even element; shapes count bytes */
    DSV4_I32 = 5,
    DSV4_I64 = 6,
    DSV4_U8 = 7,
    DSV4_DTYPE_COUNT = 8
} dsv4_dtype;

typedef enum dsv4_device_kind { DSV4_DEVICE_CPU = 0, DSV4_DEVICE_CUDA = 1 } dsv4_device_kind;

typedef struct dsv4_tensor {
    void *data;
    dsv4_dtype dtype;
    int32_t ndim;
    int64_t shape[DSV4_MAX_DIMS];
    int64_t stride[DSV4_MAX_DIMS]; /* in elements, may be 0 (broadcast) but never negative */
    dsv4_device_kind device;
    int32_t device_index;
} dsv4_tensor;

DSV4_API size_t dsv4_dtype_size(dsv4_dtype dtype);
DSV4_API const char *dsv4_dtype_name(dsv4_dtype dtype);

/* A contiguous row-major view of `data`. */
DSV4_API dsv4_status dsv4_tensor_init(dsv4_tensor *t, void *data, dsv4_dtype dtype, int ndim,
                                      const int64_t *shape);
/* A view with explicit strides (elements). */
DSV4_API dsv4_status dsv4_tensor_init_strided(dsv4_tensor *t, void *data, dsv4_dtype dtype, int ndim,
                                              const int64_t *shape, const int64_t *stride);
DSV4_API int64_t dsv4_tensor_numel(const dsv4_tensor *t);
DSV4_API int dsv4_tensor_is_contiguous(const dsv4_tensor *t);
/* out = t with dims a and b swapped. */
DSV4_API dsv4_status dsv4_tensor_transpose(const dsv4_tensor *t, int a, int b, dsv4_tensor *out);
/* out = t[..., start:end, ...] along dim. */
DSV4_API dsv4_status dsv4_tensor_slice(const dsv4_tensor *t, int dim, int64_t start, int64_t end,
                                       dsv4_tensor *out);
/* out = t viewed with a new shape; fails (DSV4_ERR_STRIDE) when that needs a copy. */
DSV4_API dsv4_status dsv4_tensor_reshape(const dsv4_tensor *t, int ndim, const int64_t *shape,
                                         dsv4_tensor *out);

#ifdef __cplusplus
}
#endif
#endif
