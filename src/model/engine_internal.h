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
    float *snapshot;                    /* compressed layers: state of one sequence before a verification */
    float *saved_proj;                  /* the compressor inputs of the verified tokens, rows of proj_ld: */
    int64_t proj_ld;                    /* main kv | main gate [| indexer kv | indexer gate] */
} eng_layer;

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
} eng_seq;

/* Scratch of one forward call of up to max_batch tokens (engine.c plans the sizes). */
typedef struct eng_scratch {
    uint16_t *X, *Xm;           /* [T, hc, D] streams; MTP input streams */
    uint16_t *xin, *x, *a;      /* [T, D] */
    float *post, *comb;         /* [T, hc], [T, hc, hc] */
    uint16_t *qr, *q, *kv, *o, *z; /* [T, q_lora], [T, H, 512], [T, 512], [T, H, 512], [T, G*o_lora] */
    float *ckv, *cgate;         /* [T, 2*512] compressor inputs */
    uint16_t *cout;             /* [T, 512] compressed entries of one call */
    int64_t *cslots, *positions; /* [T] */
    int32_t *tokens;            /* [T] */
    uint16_t *qi, *wp;          /* [T, nI*dI], [T, nI] */
    uint8_t *qpk, *qsc;         /* [T, nI, dI/2], [T, nI, dI/32] */
    float *wts, *ikv, *igate;   /* [T, nI], [T, 2*dI] x2 */
    int64_t *rslots;            /* [T] ring slots of the call's positions (every block's ring) */
    int32_t *sidx, *slen;       /* [T, window] SWA scope (every block's) */
    int32_t *cidx, *clen;       /* [T, topk] CSA scope (one layer's) */
    int32_t *hidx[ENG_MAX_RATIOS]; /* HCA pools: one row [max_context/ratio] of entry slots */
    int32_t *hlen[ENG_MAX_RATIOS]; /* [T] visible entries per query */
    int32_t *ids;               /* [T, topk] */
    float *rw;                  /* [T, topk] */
    float *logits;              /* [logits_rows, vocab] target-model logits */
    float *qlogits;             /* [max_mtp, vocab] draft logits */
    float *probs, *probs2;      /* [vocab] sampling */
    int32_t *order;             /* [vocab] */
    void *ws;                   /* one workspace for every op */
    size_t ws_bytes;
} eng_scratch;

struct dsv4_engine {
    dsv4_ctx *ctx;
    dsv4_model *model;
    const dsv4_model_config *cfg;
    const dsv4_model_weights *w;
    dsv4_engine_options opt;
    int64_t D, H, hc, V, W, R;   /* dims; window; ring capacity */
    int64_t cwidth;              /* columns of the compressed scope */
    int64_t index_entry_bytes, index_entries;
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
    void *mem[4];                /* converted, kv, state, scratch */
    uint64_t mem_bytes[4];
    uint64_t weights_mapped;
};

/* ---- forward.c ----
 * The caller has checked the tokens (ids in [0, vocab)), T in [1, max_batch] and the capacity
 * (positions < max_context); the workspace is planned for every T and scope width. A failure
 * returned by these functions can still leave the sequence's caches partly advanced: the public
 * entry points then mark the sequence failed (eng_seq_failed). */
/* Main model over T <= max_batch tokens of sequence `sq` at positions len..len+T-1 (advances len).
 * Leaves the final streams in s.X. With save_proj the CSA compressor inputs are kept for a
 * rollback (T <= 1 + max_mtp). */
dsv4_status eng_main_forward(dsv4_engine *e, int sq, const int32_t *tokens, int64_t T, int save_proj);
/* Logits of rows first..first+n-1 of the streams X [*, hc, D] through hc_head, norm and the head
 * (L = NULL: the main model's; else MTP block L's). */
dsv4_status eng_logits(dsv4_engine *e, const eng_layer *L, const uint16_t *X, int64_t n, float *logits);
/* MTP rows at positions pos..pos+T-1: input streams [T, hc, D] = row 0 at `head`, rows 1..T-1
 * at `rest` (contiguous; may be s.X itself, read before it is written), next tokens `tokens`
 * [T]; output streams in s.X (s.Xm is scratch). Writes the MTP block's ring. */
dsv4_status eng_mtp_rows(dsv4_engine *e, int sq, int64_t pos, const int32_t *tokens, int64_t T, const uint16_t *head,
                         const uint16_t *rest);
/* Roll the CSA compressor states of `sq` back to the snapshot taken by eng_main_forward(save_proj)
 * and replay its first `keep` tokens. */
dsv4_status eng_rollback(dsv4_engine *e, int sq, int64_t start, int64_t keep);

/* ---- engine.c ---- */
/* The sequence exists (eng_check_seq), and is usable (not failed) for eng_check_usable. */
dsv4_status eng_check_seq(const dsv4_engine *e, int seq, const char *op);
dsv4_status eng_check_usable(const dsv4_engine *e, int seq, const char *op);
/* Mark the sequence failed after a call changed its caches and then failed with `st` (returned,
 * its message prefixed with what happened). */
dsv4_status eng_seq_failed(dsv4_engine *e, int seq, dsv4_status st, const char *op);
float *eng_state(const dsv4_engine *e, const eng_layer *L, int sq); /* the layer's state of sequence sq */
dsv4_tensor eng_t1(const void *p, dsv4_dtype dt, int64_t a);
dsv4_tensor eng_t2(const void *p, dsv4_dtype dt, int64_t a, int64_t b);
dsv4_tensor eng_t3(const void *p, dsv4_dtype dt, int64_t a, int64_t b, int64_t c);
dsv4_linear_format eng_fmt(const dsv4_linear_weight *w); /* op format of a model linear */
dsv4_linear_format eng_tfmt(const dsv4_tensor *w);       /* BF16 or F32 plain weight */
/* Prefix the current error message with `what` (keeps the status). */
dsv4_status eng_wrap(dsv4_status st, const char *what, int index);

/* ---- sampler.c ---- */
/* Probabilities after temperature and top-p (zero outside the nucleus) into out [vocab]. */
void eng_probs(dsv4_engine *e, const float *logits, const dsv4_sampling *s, float *out);
/* argmax_i p_i / E_i, E_i ~ Exp(1) from rng. */
int32_t eng_gumbel_pick(const float *p, int64_t n, uint64_t rng[4]);
double eng_rng_uniform(uint64_t rng[4]);
int32_t eng_argmax(const float *x, int64_t n);

#endif
