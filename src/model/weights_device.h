/* A model's weights copied into the memory of a context's backend (docs/engine.md "Weights on a
 * device"): one allocation, every tensor of the weight list (model/weights.h) uploaded into it at a
 * 256-byte aligned offset, and a mirror dsv4_model_weights whose views point there, with the
 * shapes, dtypes, strides, formats and per-block facts of the checkpoint's. On a CPU backend the
 * allocation is host memory and the mirror a plain aligned copy. */
#ifndef DSV4_MODEL_WEIGHTS_DEVICE_H
#define DSV4_MODEL_WEIGHTS_DEVICE_H

#include "dsv4/device.h"
#include "dsv4/model.h"

#define ENG_DEV_ALIGN 256                      /* offset of every tensor in the allocation */
#define ENG_DEV_CHUNK ((uint64_t)64 << 20)     /* bytes per dsv4_device_upload */
#define ENG_DEV_REPORT ((uint64_t)1000000000)  /* a progress report every this many bytes (1 GB) */

typedef struct eng_dev_weights {
    dsv4_model_weights w; /* the mirror: views in `mem` (NULL where the source has none) */
    void *mem;            /* the one dsv4_device_alloc */
    uint64_t bytes;       /* its size: eng_dev_weights_size */
    double seconds, gbps; /* the upload's time and rate (GB = 1e9 bytes) */
} eng_dev_weights;

/* Where an upload stands: done of total tensor bytes (the allocation less its alignment padding)
 * after `seconds`, at `gbps` GB/s; final on the last report. */
typedef struct eng_dev_progress {
    uint64_t done, total;
    double seconds, gbps;
    int final;
} eng_dev_progress;

typedef void (*eng_dev_progress_fn)(void *user, const eng_dev_progress *p);

/* Zero-initialized (or NULL): no reports, ENG_DEV_CHUNK, ENG_DEV_REPORT. */
typedef struct eng_dev_upload_options {
    eng_dev_progress_fn progress; /* called every `every` bytes and once at the end */
    void *user;
    uint64_t chunk, every;        /* 0: the defaults above */
} eng_dev_upload_options;

/* Bytes the upload of blocks 0..n_blocks-1 and the global tensors takes (each tensor rounded up to
 * ENG_DEV_ALIGN; a tied head counted once), without allocating device memory. n_blocks is in
 * [n_layers, n_layers + the checkpoint's MTP blocks]. */
dsv4_status eng_dev_weights_size(const dsv4_model *m, int n_blocks, uint64_t *bytes);

/* One dsv4_device_alloc of eng_dev_weights_size bytes on ctx's backend, every tensor uploaded in
 * chunks, the mirror built (a tied head aliases the embedding). Weights larger than the device's
 * free memory are refused first (DSV4_ERR_NO_MEMORY, with the sizes). On failure *out is left
 * empty (nothing held). The upload is synchronous: the mirror is usable on return. */
dsv4_status eng_dev_weights_upload(dsv4_ctx *ctx, const dsv4_model *m, int n_blocks, const eng_dev_upload_options *opt,
                                   eng_dev_weights *out);

/* Frees the allocation and the mirror's block arrays; *d is emptied. NULL or empty: no-op. */
void eng_dev_weights_free(dsv4_ctx *ctx, eng_dev_weights *d);

/* One line on a report, e.g. "weights to device: 3.0 of 10.2 GB, 12.3 GB/s" or, final,
 * "weights to device: 10.2 GB in 0.8 s, 12.3 GB/s" (no newline); snprintf's result. */
int eng_dev_progress_line(const eng_dev_progress *p, char *buf, size_t cap);

#endif
