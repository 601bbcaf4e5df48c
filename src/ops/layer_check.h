/* View checks shared by op files (layer.c, moe.c, tensor_ops.c). */
#ifndef DSV4_OPS_LAYER_CHECK_H
#define DSV4_OPS_LAYER_CHECK_H

#include "core/error.h"
#include "core/ops_layer.h"
#include "core/tensor_check.h"

/* An argument: dsv4_check_tensor + unit inner stride (unless empty) + in the backend's memory. */
dsv4_status dsv4_layer_arg(const char *op, const char *name, const dsv4_tensor *t, unsigned dtypes, int ndim,
                           const int64_t *shape, const dsv4_backend *b);
/* An output: as an argument, and no zero (broadcast) stride in a dim longer than 1. */
dsv4_status dsv4_layer_out(const char *op, const char *name, const dsv4_tensor *t, unsigned dtypes, int ndim,
                           const int64_t *shape, const dsv4_backend *b);
/* Same data, dtype, shape and strides. */
int dsv4_same_view(const dsv4_tensor *a, const dsv4_tensor *b);

/* A named tensor of an overlap check; `alias` names the input an output may be (same view). */
typedef struct dsv4_layer_io {
    const dsv4_tensor *t; /* NULL: absent (inputs only) */
    const char *name;
    const char *alias;
} dsv4_layer_io;

/* Outputs overlap neither each other nor any input, except an output that is the very view of
 * the input its alias names. */
dsv4_status dsv4_layer_no_overlap(const char *op, const dsv4_layer_io *outs, int nout, const dsv4_layer_io *ins,
                                  int nin);

#endif
