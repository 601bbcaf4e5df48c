/* The one list of DeepSeek-V4 weights (docs/model.md §9): every tensor a config implies, with
 * its official name, shape, storage class and where its view goes in dsv4_model_weights. The
 * loader (weights.c) binds checkpoint tensors to it and the writer (writer.c) writes it. */
#ifndef DSV4_MODEL_WEIGHTS_H
#define DSV4_MODEL_WEIGHTS_H

#include "dsv4/model.h"

typedef enum ws_kind {
    WS_FLOAT,  /* BF16 or F32: norms, mHC params, sinks, ape, biases, BF16 projections */
    WS_INDEX,  /* I64 or I32: gate.tid2eid */
    WS_LINEAR  /* name.weight (+ name.scale): see dsv4_weight_format */
} ws_kind;

/* How the writer draws random values (std relative to the fan-in where it says so). */
typedef enum ws_init {
    WI_NORM,     /* 1 + 0.1 N */
    WI_EMBED,    /* N(0, 1) */
    WI_HEAD,     /* 2 / sqrt(in) N: logits of standard deviation ~2 */
    WI_LINEAR,   /* N / sqrt(in) */
    WI_OUT,      /* 0.05 N / sqrt(in): output projections, each branch a small update */
    WI_SMALL,    /* 0.1 N: mHC base, ape, router bias */
    WI_HC_FN,    /* 0.2 N / sqrt(in): mixes near their base */
    WI_HC_SCALE, /* 0.75 + 0.1 N */
    WI_SINK,     /* N(0, 1) */
    WI_TID2EID   /* distinct expert ids per token */
} ws_init;

typedef struct ws_slot {
    char name[128];         /* official name; for WS_LINEAR without ".weight" / ".scale" */
    ws_kind kind;
    ws_init init;
    int ndim;
    int64_t shape[2];       /* WS_LINEAR: [out, in] */
    dsv4_weight_format fmt; /* WS_LINEAR */
    int block;              /* -1 for the global tensors */
    dsv4_tensor *t;         /* destination view (WS_FLOAT, WS_INDEX) */
    dsv4_linear_weight *lin;       /* destination (WS_LINEAR) */
} ws_slot;

typedef dsv4_status (*ws_visit)(void *user, const ws_slot *s);

/* Visit every weight of `c` with n_mtp MTP blocks and routed experts in expert_fmt (not AUTO).
 * w->layers must hold n_layers + n_mtp blocks, each with `experts` set; the visit may fill the
 * destinations. Stops at the first non-OK status of fn. */
dsv4_status ws_enumerate(const dsv4_model_config *c, dsv4_model_weights *w, int n_mtp, dsv4_weight_format expert_fmt,
                         ws_visit fn, void *user);

/* Allocate w->layers (and their experts) for n_layers + n_mtp blocks, with the per-block facts
 * (index, kind, ratio, routing) filled in and every view empty. */
dsv4_status ws_alloc(const dsv4_model_config *c, int n_mtp, dsv4_model_weights *w);
void ws_free(dsv4_model_weights *w);

/* Shape of the stored tensors of a linear slot: part 0 the weight, 1 the scale (ndim 0 if none),
 * as safetensors dtype (st_dtype) and shape. */
int ws_linear_part(const ws_slot *s, int part, int64_t shape[2]);

#endif
