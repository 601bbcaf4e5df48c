/* Communicators: the collectives a sharded engine needs between its shards (docs/engine.md §9).
 *
 * A communicator is one rank's handle on a group of `size` ranks; every rank of the group calls
 * every collective, in the same order, with the same sizes (a collective waits for all of them).
 * Results are the same bits on every rank and never depend on thread timing: sums are taken in
 * rank order, (((b_0 + b_1) + b_2) + ...), element by element in fp32. Buffers are host memory.
 *
 * Implementations: the loopback group below (N ranks that are threads of one process, each with
 * its own engine and context). An NCCL group (one rank per GPU) is not built here: it would sit
 * behind the same functions (dsv4_comm_ops in src/runtime/comm.c). A failure of one rank
 * (dsv4_comm_abort) makes every collective of the group fail from then on, instead of waiting
 * for a rank that will not come. */
#ifndef DSV4_COMM_H
#define DSV4_COMM_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsv4_comm dsv4_comm;

/* n >= 1 handles of one in-process group: comms[r] is rank r's (one thread each). */
DSV4_API dsv4_status dsv4_comm_loopback_create(int n, dsv4_comm **comms);
/* Each handle is destroyed on its own; the group's shared state goes with the last one. */
DSV4_API void dsv4_comm_destroy(dsv4_comm *c);

DSV4_API int dsv4_comm_rank(const dsv4_comm *c);
DSV4_API int dsv4_comm_size(const dsv4_comm *c);

/* buf F32 [n] on every rank: afterwards every rank's buf[i] = Σ_r buf_r[i] in rank order. */
DSV4_API dsv4_status dsv4_comm_all_reduce_f32(dsv4_comm *c, float *buf, int64_t n);
/* buf [size * bytes] on every rank, rank r's part at r * bytes (written by rank r before the
 * call): afterwards every rank's buf holds every part. */
DSV4_API dsv4_status dsv4_comm_all_gather(dsv4_comm *c, void *buf, size_t bytes);
DSV4_API dsv4_status dsv4_comm_barrier(dsv4_comm *c);
/* Mark the group failed: collectives waiting now and later return DSV4_ERR_BACKEND. */
DSV4_API void dsv4_comm_abort(dsv4_comm *c);

#ifdef __cplusplus
}
#endif
#endif
