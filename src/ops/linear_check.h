/* Checks of the linear family's op layer (src/ops/linear.c) that other op files reuse (moe.c). */
#ifndef DSV4_OPS_LINEAR_CHECK_H
#define DSV4_OPS_LINEAR_CHECK_H

#include "dsv4/linear.h"

/* A weight of `rows` rows of length k in `fmt` (k a multiple of 32): w of the format's dtype and
 * stored shape with unit inner stride, and its scale (named wname and sname in messages): present
 * with the format's block shape for the quantized formats, absent for BF16 / F32. */
dsv4_status dsv4_linear_check_weight(const char *op, const char *wname, const char *sname, dsv4_linear_format fmt,
                                     const dsv4_tensor *w, const dsv4_tensor *scale, int64_t rows, int64_t k);

#endif
