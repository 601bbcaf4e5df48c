/* Validation of tensor views against an op's contract. Each check returns an error with a
 * message naming the op and the argument; none aborts. */
#ifndef DSV4_CORE_TENSOR_CHECK_H
#define DSV4_CORE_TENSOR_CHECK_H

#include "dsv4/tensor.h"

/* Any dim, use in `shape` arrays of dsv4_check_tensor. */
#define DSV4_ANY (-1)

/* t non-null with data, one of the allowed dtypes (dtype_mask = OR of 1u << dtype), ndim dims,
 * and each shape[i] equal to want[i] unless want[i] == DSV4_ANY. */
dsv4_status dsv4_check_tensor(const char *op, const char *arg, const dsv4_tensor *t, unsigned dtype_mask,
                              int ndim, const int64_t *want);
/* The last dim has unit stride (rows may be strided). */
dsv4_status dsv4_check_inner_contiguous(const char *op, const char *arg, const dsv4_tensor *t);
dsv4_status dsv4_check_contiguous(const char *op, const char *arg, const dsv4_tensor *t);
/* An output view: no two of its elements share memory (no zero/broadcast stride on a dim of size
 * > 1, and no dim's elements interleaved with another's), so writers never race on an element. */
dsv4_status dsv4_check_output(const char *op, const char *arg, const dsv4_tensor *t);
/* Data pointer aligned to `bytes`. */
dsv4_status dsv4_check_aligned(const char *op, const char *arg, const dsv4_tensor *t, size_t bytes);
/* Tensor lives on the CPU. */
dsv4_status dsv4_check_host(const char *op, const char *arg, const dsv4_tensor *t);
/* Byte span [lo, hi) a view touches (for overlap checks). */
void dsv4_tensor_span(const dsv4_tensor *t, const char **lo, const char **hi);
/* 1 if two views' byte spans overlap. */
int dsv4_tensors_overlap(const dsv4_tensor *a, const dsv4_tensor *b);

#define DSV4_DT(d) (1u << (d))

#endif
