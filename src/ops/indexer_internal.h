/* View checks shared by the op layers of the indexer family (src/ops/indexer.c, compressor.c). */
#ifndef DSV4_OPS_INDEXER_INTERNAL_H
#define DSV4_OPS_INDEXER_INTERNAL_H

#include "core/backend.h"

/* Each non-NULL view: unit inner stride and in the backend's memory. */
dsv4_status dsv4_ix_check_views(const char *op, const dsv4_backend *b, const dsv4_tensor *const *t,
                                const char *const *names, int n);
/* Non-NULL outputs overlap neither each other nor any non-NULL input. */
dsv4_status dsv4_ix_check_disjoint(const char *op, const dsv4_tensor *const *outs, const char *const *onames, int no,
                                   const dsv4_tensor *const *ins, const char *const *inames, int ni);

#endif
