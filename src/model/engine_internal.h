/* Internals of the decode engine (include/dsv4/engine.h), shared by engine.c (load, memory plan,
 * sequences, export), forward.c (the model's forward pass), sampler.c and engine_generate.c.
 * The engine reaches the kernels through the public op API only. */
#ifndef DSV4_MODEL_ENGINE_INTERNAL_H
#define DSV4_MODEL_ENGINE_INTERNAL_H

#include "dsv4/attention.h"
#include "dsv4/engine.h"
#include "dsv4/indexer.h"
#include "dsv4/layer.h"
#include "dsv4/linear.h"
#include "model/weights_device.h"

#define ENG_MAX_RATIOS 8 /* distinct compression ratios (one page pool each) */
#define ENG_RING_BLOCK 64

/* One block (transformer layer or MTP block) made ready for the ops, with its cache memory. */
typedef struct eng_layer {
    const dsv4_layer_weights *w;
    int is_mtp, ratio, hash;
    dsv4_attn_kind kind;
    const dsv4_tensor *rope;            /* the RoPE table of this block's kind */
    dsv4_hc_site hc_attn, hc_ffn, hc_head; /* hc_head: MTP blocks */
    dsv4_tensor sink;                   /* F32 [H] */
    dsv4_tensor ape, index_ape;         /* F32 [ratio, coff*d] */
    dsv4_tensor gate_bias;              /* F32 [E] (learned routing) */
    dsv4_tensor wo_a;                   /* BF16 or F32 [G*o_lora, H*512/G] */
    dsv4_ffn_weights *experts;          /* n_routed_experts */
    dsv4_ffn_weights shared;
    int has_shared;
    /* caches of all sequences */
    dsv4_kv_cache ring;                 /* SWA ring pages */
    dsv4_kv_cache comp;                 /* compressed entries (CSA, HCA) */
    int pool;                           /* index of the ratio's page pool */
    uint8_t *index_cache;               /* CSA: [max_seqs][index_entries][index_entry_bytes] */
    float *state;                       /* [max_seqs][state_floats]: main kv, score; indexer kv, score */
    int64_t state_floats;               /* per sequence */
    float *snapshot;                    /* compressed layers: [max_seqs][state_floats], the states before a
                                           verification */
    float *saved_proj;                  /* [max_batch] rows of proj_ld: the compressor inputs of a call's rows, */
    int64_t proj_ld;                    /* main kv | main gate [| indexer kv | indexer gate] */
} eng_layer;

/* The compressors of a CSA layer (main and indexer) pool overlapping windows of 2·ratio tokens,
 * an HCA layer's one window of ratio tokens, whatever the ratio (include/dsv4/indexer.h). */
static inline int eng_overlap(const eng_layer *L) { return L->kind == DSV4_ATTN_CSA; }
/* Floats of a compressed layer's main compressor state (kv and score); the indexer's follows. */
static inline int64_t eng_main_state_floats(const eng_layer *L)
{
    const int64_t coff = eng_overlap(L) ? 2 : 1;
    return 2 * (coff * L->ratio) * (coff * DSV4_KV_DIM);
}

typedef struct eng_seq {
    int live;
    int failed;      /* a call failed after it had changed the caches: unusable until reset or freed */
    int64_t len;     /* tokens the main model has processed */
    int64_t mtp_len; /* MTP rows computed with the main model's streams (rows 0..mtp_len-1) */
    dsv4_kv_seq *ring;
    dsv4_kv_seq *comp[ENG_MAX_RATIOS];
    uint16_t *pending; /* [2][hc, D]: half `pend` holds the streams of position len-1 while its MTP row
                          waits for the next token (the other half takes the next call's) */
    int pend;
    int32_t *hist;     /* [max_context] the tokens of positions 0..len-1 */
    /* The MTP head: when mtp_len == len, the MTP row of position len-1 was run with next token
     * head_tok (by a speculative step); its logits and output streams wait for the next draft. */
    int32_t head_tok;
    float *head_logits;     /* host [vocab] */
    uint16_t *head_streams; /* [hc, D] */
    int32_t *btab[ENG_MAX_RATIOS]; /* the pools' block tables in the context's memory (dsv4_paged_slots) */
    int64_t btab_n[ENG_MAX_RATIOS];
} eng_seq;

/* One sequence's rows in a forward call: rows row .. row+T-1 at positions start .. start+T-1. */
typedef struct eng_seg {
    int sq;
    int save;      /* snapshot the compressor states first (a verification that may be rolled back) */
    int64_t start, T, row;
    int src;       /* the caller's entry or request */
    int64_t off;   /* tokens of that entry before this segment */
} eng_seg;

enum {
    ENG_REPLAY = 1 /* recompute rows whose compressed entries are in the caches already: the
                      compressors update their states, their entries are dropped */
};

/* Index tables of one forward call, built by the host (forward.c, before the call's first op) in
 * host memory; the ops read their twins in the context's memory (eng_scratch.dt): the very same
 * memory on a CPU backend, one upload of the whole block per call on a device. */
typedef struct eng_tables {
    int64_t *positions;            /* [T] */
    int32_t *tokens;               /* [T] */
    int64_t *rslots;               /* [T] ring slots of the call's positions (every block's ring) */
    int32_t *sidx, *slen;          /* [T, window], [T] SWA scope (every block's) */
    int64_t *pslots[ENG_MAX_RATIOS]; /* [T] pools: cache slots of the entries the call emits */
    int32_t *hidx[ENG_MAX_RATIOS]; /* HCA pools: a row [hrow] of entry slots per segment */
    int32_t *hlen[ENG_MAX_RATIOS]; /* [T] visible entries per query */
} eng_tables;

/* Scratch of one forward call of up to max_batch tokens (engine.c plans the sizes). Buffers the
 * host reads or writes between ops (the tables t, row lists, logits, sampling) are host memory;
 * the others are the context's. */
typedef struct eng_scratch {
    uint16_t *X, *Xm;           /* [T, hc, D] streams; MTP input streams */
    uint16_t *xin, *x, *a;      /* [T, D] */
    float *post, *comb;         /* [T, hc], [T, hc, hc] */
    uint16_t *qr, *q, *kv, *o, *z; /* [T, q_lora], [T, H, 512], [T, 512], [T, H, 512], [T, G*o_lora] */
    float *ckv, *cgate;         /* [T, 2*512] compressor inputs */
    uint16_t *cout;             /* [T, 512] compressed entries of one call */
    eng_tables t, dt;           /* host tables and their twins in the context's memory */
    uint8_t *tab, *dtab;        /* the block that holds each */
    uint64_t tab_bytes;
    int64_t pslot_n[ENG_MAX_RATIOS]; /* entries of pslots */
    int tab_inflight;           /* a shaped step's upload of the tables may not have run yet */
    int64_t head_rows;          /* rows 0.. of s.X whose logits the last (shaped) step left in dlogits */
    eng_seg *plan;              /* host [max_segs]: the shaped step's segments (positions erased) */
    int64_t *cslots;            /* host [T]: a call's row lists after the forward (logits rows) */
    int32_t *mtok;              /* host [T] next tokens of the MTP rows */
    int32_t *vtok;              /* host [T] a step's tokens and drafts by row */
    int64_t *qrow, *xrow;       /* [max_segs] a step's first draft-logits row and last MTP output row */
    eng_seg *segs, *msegs;      /* [max_segs] of a call; of its MTP rows */
    uint8_t *mark;              /* [max_seqs] duplicate check */
    uint16_t *qi, *wp;          /* [T, nI*dI], [T, nI] */
    uint8_t *qpk, *qsc;         /* [T, nI, dI/2], [T, nI, dI/32] */
    float *wts, *ikv, *igate;   /* [T, nI], [T, 2*dI] x2 */
    int32_t *cidx, *clen;       /* [T, topk] CSA scope (one layer's) */
    int32_t *ids;               /* [T, topk] */
    float *rw;                  /* [T, topk] */
    float *logits;              /* host [logits_rows, vocab] target-model logits */
    float *qlogits;             /* host [step_rows, vocab] draft logits */
    float *dlogits;             /* [dlogits_rows, vocab] on a device: the head's output before its download */
    int64_t dlogits_rows;
    int64_t *lrow;              /* [max_segs] first logits row of each request of a step */
    uint8_t *samp, *hsamp;      /* on a device: a plain step's sampling rows (engine.c), host twin */
    int64_t samp_rows;          /* rows of samp (max_segs on a device, else 0) */
    int logits_on_host;         /* the last step's logits rows are in s.logits (else on the device only) */
    int keep_logits;            /* the generation asks for every step's logits (prompt_ or step_logits) */
    float *probs, *probs2;      /* host [vocab] sampling; probs is the sample op's workspace, */
    int32_t *order;             /* [vocab] right after it (dsv4_sample_workspace_size of a row) */
    void *ws;                   /* one workspace for every op */
    size_t ws_bytes;
    float *moe_sum;             /* sharded: [T, D] F32, this shard's MoE sums, then every shard's (§9) */
    float *head_parts;          /* sharded: [n_ranks, head_part_rows, v_slice] F32, the head's slices */
    int64_t head_part_rows;
} eng_scratch;

/* The shaped decode step's modes (forward.c; DSV4_CUDA_GRAPH) and its recorded graphs: one per
 * shape (segment count and sequences), ENG_GRAPHS of them kept, for up to ENG_GRAPH_SEGS segments. */
enum { ENG_STEP_PLAIN = 0, ENG_STEP_SHAPED = 1, ENG_STEP_GRAPH = 2 };
#define ENG_GRAPHS 8
#define ENG_GRAPH_SEGS 256
typedef struct eng_graph {
    struct dsv4_device_graph *graph;
    int n, sq[ENG_GRAPH_SEGS];
} eng_graph;

struct dsv4_engine {
    dsv4_ctx *ctx;
    dsv4_model *model;
    const dsv4_model_config *cfg;
    const dsv4_model_weights *w;  /* the checkpoint's, in host memory (mapped) */
    const dsv4_model_weights *dw; /* what the ops read: w on a CPU backend, its copy on a device */
    eng_dev_weights devw;        /* that copy */
    int on_device;               /* the context's memory is not host memory */
    dsv4_device_kind device;     /* its kind: the views of the context's memory carry it */
    dsv4_ctx *hctx;              /* host context: load-time conversions and sampling (ctx on a CPU backend) */
    dsv4_engine_options opt;
    int64_t D, H, hc, V, W, R;   /* dims; window; ring capacity */
    int64_t cwidth;              /* columns of the compressed scope */
    int64_t index_entry_bytes, index_entries;
    int max_segs;                /* segments in one call: min(max_seqs, max_batch) */
    int64_t hrow[ENG_MAX_RATIOS]; /* HCA pools: entries of one scope row (max_context/ratio + 1) */
    int64_t restart_lcm, restart_overlap; /* truncation restart points: lcm of the ratios, overlap window */
    int n_blocks;                /* n_layers + (MTP planned ? 1 : 0) */
    eng_layer *layers;
    dsv4_hc_site hc_head;
    dsv4_tensor rope_main, rope_compress;
    const uint16_t *embed;       /* BF16 [V, D]: the checkpoint's table, or its conversion at load */
    dsv4_kv_pages *ring_pool, *pools[ENG_MAX_RATIOS];
    int pool_ratio[ENG_MAX_RATIOS], n_pools;
    int pool_hca[ENG_MAX_RATIOS];  /* the pool's layers are HCA (one scope row shared by them) */
    eng_seq *seqs;
    eng_scratch s;
    int step_mode;               /* ENG_STEP_*: how decode rows run */
    eng_graph graphs[ENG_GRAPHS];
    int graph_next;              /* the place the next recorded graph takes */
    int host_pinned;             /* mem[A_HOST] is the device's pinned staging memory */
    /* sharding (docs/engine.md §9): comm NULL when this engine holds the whole model */
    dsv4_comm *comm;
    int rank, n_ranks;
    int e_lo, e_n;               /* the routed experts this shard runs: e_lo .. e_lo + e_n - 1 */
    int64_t v_lo, v_n, v_slice;  /* its head rows v_lo .. v_lo + v_n - 1; every slice is v_slice wide */
    void *mem[5];                /* converted, kv, state, scratch (the context's memory); host bookkeeping */
    uint64_t mem_bytes[5];
    uint64_t weights_mapped;
};

/* ---- forward.c ----
 * The callers have checked the tokens (ids in [0, vocab)), the rows (at most max_batch, at most
 * max_segs segments, each sequence once) and the capacity; the workspace is planned for every
 * call size and scope width. A failure returned by these functions can still leave the
 * sequences' caches partly advanced: the public entry points then mark them failed. */
/* The main model over the segments' rows (tokens [T] in row order): advances every len, records
 * the tokens. Leaves the final streams in s.X. `flags`: ENG_REPLAY. The compressor inputs of
 * every row are kept in the layers' saved_proj (for eng_rollback). */
dsv4_status eng_main_forward(dsv4_engine *e, const eng_seg *segs, int n_seg, const int32_t *tokens, int flags);
/* Logits of the streams X [n, hc, D] through hc_head, norm and the head (L = NULL: the main
 * model's; else MTP block L's). */
dsv4_status eng_logits(dsv4_engine *e, const eng_layer *L, const uint16_t *X, int64_t n, float *logits);
/* The logits of rows (each < s.head_rows) that the last shaped step left in s.dlogits, into logits
 * (NULL: moved to rows 0..n-1 of s.dlogits, for the sampling on the device). */
dsv4_status eng_step_logits(dsv4_engine *e, const int64_t *rows, int64_t n, float *logits);
/* MTP rows: segment i holds rows at positions start.. of sequence sq; input streams [T, hc, D] in
 * s.Xm (gathered by the caller), next tokens [T]; output streams in s.X. Writes the MTP ring. */
dsv4_status eng_mtp_rows(dsv4_engine *e, const eng_seg *segs, int n_seg, const int32_t *tokens);
/* Roll the compressor states of `sq` back to the snapshot taken by eng_main_forward (segment with
 * save) and replay its first `keep` tokens, whose inputs are saved_proj rows row.. . */
dsv4_status eng_rollback(dsv4_engine *e, int sq, int64_t start, int64_t keep, int64_t row);
/* `rows` rows of streams (hc * D BF16 each) from src into s.Xm rows `row`.. (an op of the backend). */
dsv4_status eng_gather_streams(dsv4_engine *e, int64_t row, const uint16_t *src, int64_t rows);

/* ---- engine_batch.c ---- */
/* Checks of one entry of a call: the sequence usable and not named before in the call (marks in
 * s.mark, cleared by eng_clear_marks over the entries' `seq` fields), tokens in the vocabulary,
 * len + n + extra <= max_context. */
dsv4_status eng_check_rows(dsv4_engine *e, const char *op, int i, int seq, const int32_t *tokens, int64_t n, int64_t extra);
void eng_clear_marks(dsv4_engine *e, const int *seqs, int n, size_t stride);
/* Where the MTP rows of a call appending `next` first start (mtp_len, or len-1 when the waiting
 * head row was run for another token). */
int64_t eng_mtp_first(const dsv4_engine *e, int seq, int32_t next);
/* MTP rows first .. first+n-1 of the sequence of main segment `main` (just run: its streams in
 * s.X; position start-1 in the pending streams), next tokens `next`: their input streams
 * gathered into s.Xm rows *m.., tokens into s.mtok, a segment appended to s.msegs[*k] (`off`
 * there is the entry's first position). */
dsv4_status eng_mtp_add(dsv4_engine *e, int *k, int64_t *m, const eng_seg *main, int64_t first, int64_t n,
                        const int32_t *next);
/* After eng_main_forward (tokens in s.tokens, streams in s.X), for main segment g: the MTP rows of
 * every position whose next token is now known (eng_mtp_add); advances mtp_len and the pending
 * streams. The caller runs the rows (eng_mtp_rows over s.msegs). */
dsv4_status eng_mtp_catch_up(dsv4_engine *e, const eng_seg *g, int *k, int64_t *m);
/* Logits of streams rows[0..n-1] of X [*, hc, D] into out [n, vocab] (one pass of the head). */
dsv4_status eng_logits_rows(dsv4_engine *e, const eng_layer *L, const uint16_t *X, const int64_t *rows, int64_t n,
                            float *out);
/* Mark every sequence of a call failed after `st` (returned, message prefixed once). */
dsv4_status eng_seqs_failed(dsv4_engine *e, const int *seqs, int n, size_t stride, dsv4_status st, const char *op);

/* ---- engine.c ---- */
/* The sequence exists (eng_check_seq), and is usable (not failed) for eng_check_usable. */
dsv4_status eng_check_seq(const dsv4_engine *e, int seq, const char *op);
dsv4_status eng_check_usable(const dsv4_engine *e, int seq, const char *op);
/* Mark the sequence failed after a call changed its caches and then failed with `st` (returned,
 * its message prefixed with what happened). */
dsv4_status eng_seq_failed(dsv4_engine *e, int seq, dsv4_status st, const char *op);
float *eng_state(const dsv4_engine *e, const eng_layer *L, int sq); /* the layer's state of sequence sq */
/* `bytes` bytes from src to dst in the context's memory, by the backend (dsv4_copy_rows). */
dsv4_status eng_copy(const dsv4_engine *e, void *dst, const void *src, int64_t bytes);
/* Views of host memory (eng_t*) and of the context's memory (eng_v*: the context's device kind). */
dsv4_tensor eng_t1(const void *p, dsv4_dtype dt, int64_t a);
dsv4_tensor eng_t2(const void *p, dsv4_dtype dt, int64_t a, int64_t b);
dsv4_tensor eng_t3(const void *p, dsv4_dtype dt, int64_t a, int64_t b, int64_t c);
dsv4_tensor eng_v1(const dsv4_engine *e, const void *p, dsv4_dtype dt, int64_t a);
dsv4_tensor eng_v2(const dsv4_engine *e, const void *p, dsv4_dtype dt, int64_t a, int64_t b);
dsv4_tensor eng_v3(const dsv4_engine *e, const void *p, dsv4_dtype dt, int64_t a, int64_t b, int64_t c);
dsv4_linear_format eng_fmt(const dsv4_linear_weight *w); /* op format of a model linear */
dsv4_linear_format eng_tfmt(const dsv4_tensor *w);       /* BF16 or F32 plain weight */
/* Prefix the current error message with `what` (keeps the status). */
dsv4_status eng_wrap(dsv4_status st, const char *what, int index);

/* ---- sampler.c ---- */
/* The sampler's rule for non-finite logits (include/dsv4/engine.h): DSV4_OK when the row can be
 * sampled, else DSV4_ERR_RANGE with a message naming `what` (the row's sequence and position). */
dsv4_status eng_check_logits(const dsv4_engine *e, const float *logits, const char *what);

#endif
