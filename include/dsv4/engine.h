/* The decode engine (docs/engine.md): a loaded DeepSeek-V4 checkpoint, its sequences with their caches,
 * prefill, decode, logits of several positions, sampling and MTP speculative decoding
 * (docs/model.md §3, §8, §12; docs/contracts.md §8).
 *
 * Memory is planned once, when the engine is created, from `max_context` (positions per sequence)
 * and `max_seqs` (sequences alive at once): every KV cache page (SWA rings, compressed caches in
 * the 584-byte FP8 format, MXFP4 indexer caches), the compressor states and the scratch of one
 * forward call of up to `max_batch` tokens. A decode step, a prefill chunk, an MTP draft and a
 * verification allocate nothing. Weights are used in place from the memory-mapped checkpoint; the
 * few parameters the ops take in another type (mHC params, sinks, `ape`, router bias as F32; the
 * grouped `wo_a` of FP8 checkpoints as BF16, as DeepSeek's converter does) are converted at load.
 *
 * Semantics per token are those of the reference (docs/model.md §12): a batched call of n tokens
 * (prefill, a chunk of it, or the verification of drafts) leaves the caches and states that n
 * single-token calls leave, bit for bit, and gives the same logits (every op's result for a token
 * is independent of the other tokens in the call; the sparse attention cuts each query's entries
 * into splits of a fixed size); a call over many sequences (dsv4_engine_forward_batch,
 * dsv4_engine_step) leaves each of them as it would be alone (docs/engine.md §8). The engine runs
 * every op on its context's backend and never names one.
 *
 * One engine is used by one thread at a time (the ops inside use the context's threads). */
#ifndef DSV4_ENGINE_H
#define DSV4_ENGINE_H

#include "comm.h"
#include "core.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsv4_engine dsv4_engine;

typedef struct dsv4_engine_options {
    int64_t max_context; /* positions per sequence; 0: min(4096, max_position_embeddings) */
    int max_seqs;        /* sequences at once; 0: 1 */
    int max_batch;       /* tokens per forward pass (longer prompts run in chunks); 0: 128 */
    int max_mtp;         /* longest MTP draft (k) to plan for; 0: no MTP (or the model has none) */
    int logits_rows;     /* rows of the engine's logits buffer used by dsv4_engine_generate
                            (>= 1 + max_mtp); 0: 1 + max_mtp. More rows let `prompt_logits`
                            deliver the prompt in chunks of that many. */
    dsv4_load_mode load; /* how the checkpoint is loaded (dsv4_model_open_options.load): DSV4_LOAD_COPY
                            for a process that must not die of SIGBUS if a shard is truncated */
    /* Where the load reports its progress on a device backend (the weights' copy to the device):
     * a line about every GB and a last one with the time and the GB/s reached; NULL: silent. */
    void (*progress)(void *user, const char *line);
    void *progress_user;
} dsv4_engine_options;

/* Open the checkpoint in `model_dir` (dsv4_model_open) and plan every buffer. ctx NULL = default. */
DSV4_API dsv4_status dsv4_engine_create(dsv4_ctx *ctx, const char *model_dir, const dsv4_engine_options *options,
                                        dsv4_engine **out);
/* One shard of a sharded engine (docs/engine.md §9); comm NULL or a group of size 1: the whole model,
 * as dsv4_engine_create. Else this engine is shard dsv4_comm_rank(comm) of dsv4_comm_size(comm)
 * engines over the same checkpoint and options, each driven by its own thread (or process) with the
 * same calls in the same order: a shard runs its contiguous range of routed experts (rank r:
 * [r·E/N, (r+1)·E/N)), the last one the shared expert too, and its slice of the vocabulary rows of
 * the head; attention, routing and everything else run replicated. The MoE sums are all-reduced in
 * fp32 and the logits all-gathered, so every shard returns the same logits and tokens. A CPU backend
 * only (the collectives read host memory); 1 <= N <= min(n_routed_experts, vocab). The engine does
 * not own comm: it must outlive the engine. */
DSV4_API dsv4_status dsv4_engine_create_sharded(dsv4_ctx *ctx, const char *model_dir, const dsv4_engine_options *options,
                                                dsv4_comm *comm, dsv4_engine **out);
DSV4_API void dsv4_engine_destroy(dsv4_engine *e);
DSV4_API const dsv4_model_config *dsv4_engine_config(const dsv4_engine *e);
/* The options in effect (defaults resolved, max_mtp 0 when the checkpoint has no MTP block). */
DSV4_API dsv4_engine_options dsv4_engine_get_options(const dsv4_engine *e);

typedef struct dsv4_engine_memory {
    uint64_t weights_mapped;    /* bytes of the checkpoint's tensors (memory-mapped, used in place) */
    uint64_t weights_converted; /* parameters converted at load */
    uint64_t kv_cache;          /* SWA rings, compressed and indexer caches of all sequences */
    uint64_t state;             /* compressor states, MTP streams, rollback snapshots */
    uint64_t scratch;           /* activations, workspaces, index lists, logits */
    uint64_t planned;           /* all the engine allocated (converted + kv_cache + state + scratch) */
    uint64_t kv_used;           /* cache bytes holding entries of the live sequences now */
    uint64_t weights_device;    /* on a device backend: the weights copied to its memory at load (else 0) */
} dsv4_engine_memory;

DSV4_API dsv4_status dsv4_engine_memory_info(const dsv4_engine *e, dsv4_engine_memory *out);

/* ---- sequences ------------------------------------------------------------------------------
 * A sequence is a slot 0..max_seqs-1 with its own caches, starting empty (length 0).
 *
 * Failures. Every argument, token id, the capacity and the planned memory are checked before a
 * call changes anything: such a failure leaves the sequence as it was. A failure after the caches
 * started to change (an op failing in the middle of the layers, which these checks are meant to
 * rule out) marks the sequence failed: forward, generate and export then refuse it with
 * DSV4_ERR_INVALID_ARG until it is reset or freed. */
DSV4_API dsv4_status dsv4_engine_seq_create(dsv4_engine *e, int *seq);
DSV4_API dsv4_status dsv4_engine_seq_free(dsv4_engine *e, int seq);
/* Empty the sequence (length 0, not failed), keeping its slot. */
DSV4_API dsv4_status dsv4_engine_seq_reset(dsv4_engine *e, int seq);
/* Tokens the main model has processed (the next token goes to this position); -1 if no such sequence. */
DSV4_API int64_t dsv4_engine_seq_length(const dsv4_engine *e, int seq);

/* ---- forward --------------------------------------------------------------------------------
 * Append n >= 1 tokens (ids in [0, vocab)) to the sequence at positions len .. len+n-1 and run
 * the main model over them (in chunks of max_batch): n > 1 is a prefill, n == 1 a decode step.
 *   logits      F32 [n_logits, vocab]: the logits of the last n_logits (0..n) positions.
 * With MTP planned (max_mtp > 0) the MTP block also runs, in the same batched way, on every row
 * whose next token is now known: row t combines the main model's pre-hc_head streams at t with
 * token t+1 (docs/model.md §8) at attention position t, i.e. rows max(0, len-1) .. len+n-2
 * (minus any row a draft already made).
 *   mtp_logits  F32 [n_mtp_logits, vocab]: the MTP logits of the last n_mtp_logits of those rows
 *               (row t predicts token t+2); NULL with 0 when not wanted.
 * Fails with DSV4_ERR_CAPACITY (nothing changed) when len + n > max_context. */
DSV4_API dsv4_status dsv4_engine_forward(dsv4_engine *e, int seq, const int32_t *tokens, int64_t n, float *logits,
                                         int64_t n_logits, float *mtp_logits, int64_t n_mtp_logits);

/* ---- sampling -------------------------------------------------------------------------------
 * temperature 0: greedy (argmax, lowest id on ties). temperature > 0: p = softmax(logits / T),
 * restricted to the smallest set of most likely tokens whose mass reaches top_p (top_p >= 1: all),
 * then the reference's Gumbel-max form argmax_i p_i / E_i with E_i ~ Exp(1) drawn from the
 * seeded generator (xoshiro256**, seeded through splitmix64). A zero-initialized dsv4_sampling is
 * greedy decoding.
 * Non-finite logits, the same rule on every path: -Inf masks the token out (probability 0, never
 * the argmax); a NaN or +Inf logit anywhere in the row, or a row with no finite logit, fails with
 * DSV4_ERR_RANGE naming the logit (a model does not produce them unless its weights or inputs are
 * broken, and any token picked from such a row would be garbage). Generation and steps check every
 * row they sample (main and MTP logits) this way and name the sequence and position. */
typedef struct dsv4_sampling {
    float temperature; /* >= 0 */
    float top_p;       /* (0, 1]; values >= 1 keep every token; 0: 1 */
    uint64_t seed;
} dsv4_sampling;

/* ---- many sequences in one pass ------------------------------------------------------------
 * One call appends tokens to several sequences and runs the model once over all their rows: the
 * weights are read once per chunk of up to max_batch rows, whatever the number of sequences.
 * Each entry is one sequence (at most once per call) with n_tokens >= 1 new tokens: a decode
 * token, a prefill chunk or a whole prompt. Entries are packed into chunks in order; an entry may
 * span chunks.
 *   logits      F32 [sum of n_logits, vocab]: for each entry in order, the logits of its last
 *               n_logits (0..n_tokens) positions.
 *   mtp_logits  F32 [sum of n_mtp_logits, vocab]: for each entry in order, the MTP logits of the
 *               last n_mtp_logits of the MTP rows it runs (see dsv4_engine_forward).
 * Every sequence ends with the logits, caches and states it gets when it runs alone (bit for
 * bit, for any mix of sequences, lengths, order and thread count). Every entry is checked before
 * anything runs; a failure after that marks every sequence of the call failed. */
typedef struct dsv4_batch_entry {
    int seq;
    const int32_t *tokens;
    int64_t n_tokens;
    int64_t n_logits;
    int64_t n_mtp_logits;
} dsv4_batch_entry;

DSV4_API dsv4_status dsv4_engine_forward_batch(dsv4_engine *e, const dsv4_batch_entry *entries, int n_entries,
                                               float *logits, float *mtp_logits);

/* ---- decode steps of many sequences -----------------------------------------------------------
 * One step of generation for several sequences at once, each with its own sampling: append the
 * request's tokens (the token sampled last, or a prompt chunk), then sample. With mtp = k >= 1
 * (n_tokens must be 1, k <= max_mtp) the step drafts k tokens with the MTP block, verifies them
 * in the same forward as every other request of the step and returns the accepted drafts plus one
 * token of the target model (1..k+1 tokens), exactly as dsv4_engine_generate does. Greedy output
 * is identical to plain greedy decoding; the rows of all requests together (n_tokens + mtp each)
 * must fit max_batch. A request with sample = 0 only appends its tokens (a prompt chunk).
 * The tokens returned are not in the caches yet: the next step feeds the last one. */
typedef struct dsv4_step_request {
    int seq;
    const int32_t *tokens;
    int64_t n_tokens;
    int mtp;                /* drafts to verify (0: plain step) */
    int sample;             /* 0: append only, out untouched */
    dsv4_sampling sampling;
    uint64_t *rng;          /* [4] generator state (dsv4_rng_seed), advanced by the step */
    int32_t *out;           /* [1 + mtp] tokens produced */
    int n_out;              /* set by the step */
    int drafted, accepted;  /* set by the step */
} dsv4_step_request;

DSV4_API dsv4_status dsv4_engine_step(dsv4_engine *e, dsv4_step_request *requests, int n_requests);

/* ---- sequence operations ------------------------------------------------------------------
 * copy      dst (an existing sequence, overwritten) becomes an exact copy of src: its caches,
 *           compressor states, MTP state and tokens; both then continue independently (a shared
 *           prompt prefix computed once).
 * truncate  keep the first `length` tokens (0 <= length <= current length), exactly: caches,
 *           states and logits afterwards are those of a sequence that only ever saw them. The
 *           compressor states cannot be rewound, so the engine recomputes the tokens from a restart
 *           point: the last multiple of every compression ratio at or before the new end, less the
 *           overlapping window (CSA), whose SWA window is still in the ring (at most lcm(ratios) +
 *           4 tokens when the cut is shorter than the ring's spare entries; else from position 0,
 *           never more than the prefill of `length` tokens). *recomputed (may be NULL) receives
 *           the number of tokens run again. A failure during the recomputation fails the sequence. */
DSV4_API dsv4_status dsv4_engine_seq_copy(dsv4_engine *e, int src, int dst);
DSV4_API dsv4_status dsv4_engine_seq_truncate(dsv4_engine *e, int seq, int64_t length, int64_t *recomputed);
/* The tokens the sequence holds: ids of positions 0..len-1 into out (cap of them at most). */
DSV4_API dsv4_status dsv4_engine_seq_tokens(const dsv4_engine *e, int seq, int32_t *out, int64_t cap, int64_t *len);

/* ---- state ----------------------------------------------------------------------------------
 * The sequence's cache and state contents in a fixed order, as bytes: for every block (MTP last)
 * the live SWA ring entries (positions max(0, len-window) .. len-1, 584 B each), the compressed
 * entries 0 .. len/ratio-1 (584 B), the indexer entries (packed FP4 + UE8M0), and the compressor
 * states (F32). Two sequences that processed the same tokens export the same bytes, however the
 * tokens were batched. out NULL asks for the size only. */
DSV4_API dsv4_status dsv4_engine_seq_export(const dsv4_engine *e, int seq, void *out, size_t cap, size_t *len);

/* One token from one row of logits with the engine's scratch; `rng` is a 4-word generator state
 * (dsv4_rng_seed). */
DSV4_API void dsv4_rng_seed(uint64_t seed, uint64_t rng[4]);
DSV4_API dsv4_status dsv4_engine_sample(dsv4_engine *e, const float *logits, const dsv4_sampling *s, uint64_t rng[4],
                                        int32_t *token);

/* ---- generation -----------------------------------------------------------------------------
 * Prefill the prompt, then decode until max_tokens tokens were produced (or an EOS id of the
 * config when stop_at_eos). With mtp = k >= 1 (k <= max_mtp) every step drafts k tokens with the
 * MTP block (the first from the main model's streams, the next ones from the MTP block's own
 * output streams), verifies them in one (k+1)-token forward and keeps the accepted prefix plus one
 * token of the target model: greedy acceptance is exact (the output equals greedy decoding
 * without MTP), at temperature > 0 drafts are accepted with probability min(1, p/q) and a
 * rejection samples from max(0, p - q) (speculative rejection sampling). */
typedef struct dsv4_gen_step {
    int64_t step;           /* 0: the prefill; then one per decode / speculative step */
    const int32_t *tokens;  /* tokens produced by this step */
    int64_t n_tokens;
    int drafted, accepted;  /* MTP drafts proposed / accepted in this step */
    double seconds;         /* wall time of the step */
    const float *logits;    /* target-model logits F32 [n_logits, vocab] of positions */
    int64_t n_logits;       /* first_position .. first_position + n_logits - 1 that this step */
    int64_t first_position; /* ran (prefill: only with prompt_logits, else the last one) */
} dsv4_gen_step;

/* Return non-zero to stop the generation after this step. */
typedef int (*dsv4_gen_callback)(void *user, const dsv4_gen_step *step);

/* A zero-initialized dsv4_generate_options asks for every default: greedy, no MTP, as many tokens
 * as the sequence has room for (max_context), not stopping at EOS. */
typedef struct dsv4_generate_options {
    int64_t max_tokens;      /* >= 1; 0: until the sequence holds max_context positions */
    int mtp;                 /* draft length k; 0: plain decoding */
    dsv4_sampling sampling;
    int stop_at_eos;
    int prompt_logits;       /* deliver the logits of every prompt position (in chunks), and of every step */
    dsv4_gen_callback callback;
    void *user;
    int step_logits;         /* deliver the logits of every decode step (without it or prompt_logits, a step
                              * on a device backend samples there and delivers none: logits NULL, n_logits 0) */
} dsv4_generate_options;

typedef struct dsv4_generate_stats {
    int64_t prompt_tokens, generated_tokens, steps;
    int64_t drafted, accepted;        /* acceptance rate = accepted / drafted */
    double prefill_seconds, decode_seconds;
} dsv4_generate_stats;

/* Runs on sequence `seq`: the prompt is appended to what it holds (a new turn of a conversation
 * continues it; the last token a previous generation returned is not in the caches, so a new
 * turn starts with it). out_tokens receives up to `cap` generated ids
 * (*n_out of them). stats may be NULL. Every prompt id is checked before anything runs. A stop
 * request from the callback during the prefill (prompt_logits chunks) ends the generation there:
 * the sequence holds the prompt tokens fed so far and no token is generated. */
DSV4_API dsv4_status dsv4_engine_generate(dsv4_engine *e, int seq, const int32_t *prompt, int64_t n_prompt,
                                          const dsv4_generate_options *options, int32_t *out_tokens, int64_t cap,
                                          int64_t *n_out, dsv4_generate_stats *stats);

#ifdef __cplusplus
}
#endif
#endif
