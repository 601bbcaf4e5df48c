/* The layout of the public structs as this library was compiled, for bindings that mirror them
 * (python/dsv4/_lib.py checks every ctypes.Structure against it when the module loads). Only type
 * declarations of the public headers are read here.
 *
 * Adding a struct is one line in ABI_STRUCTS below: the C type and its fields in declaration order
 * (nested structs are listed as fields, and as entries of their own where a binding mirrors them). */
#include "core/error.h"
#include "dsv4.h"

#include <stddef.h>
#include <string.h>

#define ABI_STRUCTS(X)                                                                                             \
    X(dsv4_tensor, data, dtype, ndim, shape, stride, device, device_index)                                          \
    X(dsv4_ctx_options, backend, threads, device, cpu_isa, cuda_decode)                                             \
    X(dsv4_kv_cache, pages, block_size)                                                                             \
    X(dsv4_sparse_scope, cache, indices, lengths)                                                                   \
    X(dsv4_rope_params, theta, factor, original_max_pos, beta_fast, beta_slow)                                      \
    X(dsv4_device_info, name, ordinal, multiprocessors, compute_major, compute_minor, total_memory, free_memory,    \
      l2_bytes, shared_per_block)                                                                                   \
    X(dsv4_compressor_desc, kind, ratio, dim, eps, fp8_sim, overlap, position)                                                \
    X(dsv4_indexer_args, q, q_scales, weights, k, k_scales, positions, ratio)                                       \
    X(dsv4_hc_site, fn, scale, base, sinkhorn_iters, eps, norm_eps)                                                 \
    X(dsv4_ffn_weights, fmt, w1, w1_scale, w3, w3_scale, w2, w2_scale)                                              \
    X(dsv4_rope_config, theta, yarn, factor, original_max_position, beta_fast, beta_slow, attention_factor)         \
    X(dsv4_model_config, dim, n_layers, n_mtp_layers, vocab_size, n_heads, n_kv_heads, head_dim, rope_head_dim,     \
      nope_head_dim, q_lora_rank, o_groups, o_lora_rank, window_size, index_n_heads, index_head_dim, index_topk,    \
      n_routed_experts, n_shared_experts, n_activated_experts, moe_inter_dim, n_hash_layers, score_func,            \
      norm_topk_prob, route_scale, swiglu_limit, hc_mult, hc_sinkhorn_iters, hc_eps, norm_eps, rope_main,          \
      rope_compress, max_position_embeddings, bos_token_id, n_eos, eos_token_ids, tie_word_embeddings,             \
      weight_format, expert_format, compress_ratio, attn_kind, hash_routed, naming)                                 \
    X(dsv4_tensor_entry, name, canonical, file, st_dtype, dtype, ndim, shape, nbytes, file_offset, data)            \
    X(dsv4_model_issue_info, kind, name, message)                                                                   \
    X(dsv4_model_open_options, allow_issues, load)                                                                      \
    X(dsv4_engine_options, max_context, max_seqs, max_batch, max_mtp, logits_rows, load, progress, progress_user) \
    X(dsv4_engine_memory, weights_mapped, weights_converted, kv_cache, state, scratch, planned, kv_used,           \
      weights_device)                                                                                             \
    X(dsv4_sampling, temperature, top_p, seed)                                                                      \
    X(dsv4_batch_entry, seq, tokens, n_tokens, n_logits, n_mtp_logits)                                              \
    X(dsv4_step_request, seq, tokens, n_tokens, mtp, sample, sampling, rng, out, n_out, drafted, accepted)          \
    X(dsv4_gen_step, step, tokens, n_tokens, drafted, accepted, seconds, logits, n_logits, first_position)          \
    X(dsv4_generate_options, max_tokens, mtp, sampling, stop_at_eos, prompt_logits, callback, user, step_logits)    \
    X(dsv4_generate_stats, prompt_tokens, generated_tokens, steps, drafted, accepted, prefill_seconds,              \
      decode_seconds)                                                                                               \
    X(dsv4_tool_call, id, id_len, name, name_len, arguments, arguments_len)                                         \
    X(dsv4_chat_message, role, content, content_len, reasoning, reasoning_len, tools, tools_len, tool_calls,       \
      n_tool_calls, tool_call_id, tool_call_id_len)                                                                 \
    X(dsv4_prompt_options, mode, keep_reasoning)                                                                    \
    X(dsv4_decode_stream, pending, n_pending, flags)

typedef struct abi_field {
    const char *name;
    size_t offset, size;
} abi_field;

typedef struct abi_struct {
    const char *name;
    size_t size;
    const abi_field *fields;
    int n_fields;
} abi_struct;

/* ABI_F<n>(T, f1, ..., fn): the abi_field initializers of n fields of T (up to 64). */
#define ABI_FIELD(T, f) {#f, offsetof(T, f), sizeof(((T *)0)->f)},
#define ABI_CAT(a, b) ABI_CAT_(a, b)
#define ABI_CAT_(a, b) a##b
#define ABI_NARGS(...) ABI_NARGS_(__VA_ARGS__, 64, 63, 62, 61, 60, 59, 58, 57, 56, 55, 54, 53, 52, 51, 50, 49, 48, 47, 46, 45, 44, 43, 42, 41, 40, 39, 38, 37, 36, 35, 34, 33, 32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1)
#define ABI_NARGS_(a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, a31, a32, a33, a34, a35, a36, a37, a38, a39, a40, a41, a42, a43, a44, a45, a46, a47, a48, a49, a50, a51, a52, a53, a54, a55, a56, a57, a58, a59, a60, a61, a62, a63, a64, n, ...) n
#define ABI_F1(T, f) ABI_FIELD(T, f)
#define ABI_F2(T, f, ...) ABI_FIELD(T, f) ABI_F1(T, __VA_ARGS__)
#define ABI_F3(T, f, ...) ABI_FIELD(T, f) ABI_F2(T, __VA_ARGS__)
#define ABI_F4(T, f, ...) ABI_FIELD(T, f) ABI_F3(T, __VA_ARGS__)
#define ABI_F5(T, f, ...) ABI_FIELD(T, f) ABI_F4(T, __VA_ARGS__)
#define ABI_F6(T, f, ...) ABI_FIELD(T, f) ABI_F5(T, __VA_ARGS__)
#define ABI_F7(T, f, ...) ABI_FIELD(T, f) ABI_F6(T, __VA_ARGS__)
#define ABI_F8(T, f, ...) ABI_FIELD(T, f) ABI_F7(T, __VA_ARGS__)
#define ABI_F9(T, f, ...) ABI_FIELD(T, f) ABI_F8(T, __VA_ARGS__)
#define ABI_F10(T, f, ...) ABI_FIELD(T, f) ABI_F9(T, __VA_ARGS__)
#define ABI_F11(T, f, ...) ABI_FIELD(T, f) ABI_F10(T, __VA_ARGS__)
#define ABI_F12(T, f, ...) ABI_FIELD(T, f) ABI_F11(T, __VA_ARGS__)
#define ABI_F13(T, f, ...) ABI_FIELD(T, f) ABI_F12(T, __VA_ARGS__)
#define ABI_F14(T, f, ...) ABI_FIELD(T, f) ABI_F13(T, __VA_ARGS__)
#define ABI_F15(T, f, ...) ABI_FIELD(T, f) ABI_F14(T, __VA_ARGS__)
#define ABI_F16(T, f, ...) ABI_FIELD(T, f) ABI_F15(T, __VA_ARGS__)
#define ABI_F17(T, f, ...) ABI_FIELD(T, f) ABI_F16(T, __VA_ARGS__)
#define ABI_F18(T, f, ...) ABI_FIELD(T, f) ABI_F17(T, __VA_ARGS__)
#define ABI_F19(T, f, ...) ABI_FIELD(T, f) ABI_F18(T, __VA_ARGS__)
#define ABI_F20(T, f, ...) ABI_FIELD(T, f) ABI_F19(T, __VA_ARGS__)
#define ABI_F21(T, f, ...) ABI_FIELD(T, f) ABI_F20(T, __VA_ARGS__)
#define ABI_F22(T, f, ...) ABI_FIELD(T, f) ABI_F21(T, __VA_ARGS__)
#define ABI_F23(T, f, ...) ABI_FIELD(T, f) ABI_F22(T, __VA_ARGS__)
#define ABI_F24(T, f, ...) ABI_FIELD(T, f) ABI_F23(T, __VA_ARGS__)
#define ABI_F25(T, f, ...) ABI_FIELD(T, f) ABI_F24(T, __VA_ARGS__)
#define ABI_F26(T, f, ...) ABI_FIELD(T, f) ABI_F25(T, __VA_ARGS__)
#define ABI_F27(T, f, ...) ABI_FIELD(T, f) ABI_F26(T, __VA_ARGS__)
#define ABI_F28(T, f, ...) ABI_FIELD(T, f) ABI_F27(T, __VA_ARGS__)
#define ABI_F29(T, f, ...) ABI_FIELD(T, f) ABI_F28(T, __VA_ARGS__)
#define ABI_F30(T, f, ...) ABI_FIELD(T, f) ABI_F29(T, __VA_ARGS__)
#define ABI_F31(T, f, ...) ABI_FIELD(T, f) ABI_F30(T, __VA_ARGS__)
#define ABI_F32(T, f, ...) ABI_FIELD(T, f) ABI_F31(T, __VA_ARGS__)
#define ABI_F33(T, f, ...) ABI_FIELD(T, f) ABI_F32(T, __VA_ARGS__)
#define ABI_F34(T, f, ...) ABI_FIELD(T, f) ABI_F33(T, __VA_ARGS__)
#define ABI_F35(T, f, ...) ABI_FIELD(T, f) ABI_F34(T, __VA_ARGS__)
#define ABI_F36(T, f, ...) ABI_FIELD(T, f) ABI_F35(T, __VA_ARGS__)
#define ABI_F37(T, f, ...) ABI_FIELD(T, f) ABI_F36(T, __VA_ARGS__)
#define ABI_F38(T, f, ...) ABI_FIELD(T, f) ABI_F37(T, __VA_ARGS__)
#define ABI_F39(T, f, ...) ABI_FIELD(T, f) ABI_F38(T, __VA_ARGS__)
#define ABI_F40(T, f, ...) ABI_FIELD(T, f) ABI_F39(T, __VA_ARGS__)
#define ABI_F41(T, f, ...) ABI_FIELD(T, f) ABI_F40(T, __VA_ARGS__)
#define ABI_F42(T, f, ...) ABI_FIELD(T, f) ABI_F41(T, __VA_ARGS__)
#define ABI_F43(T, f, ...) ABI_FIELD(T, f) ABI_F42(T, __VA_ARGS__)
#define ABI_F44(T, f, ...) ABI_FIELD(T, f) ABI_F43(T, __VA_ARGS__)
#define ABI_F45(T, f, ...) ABI_FIELD(T, f) ABI_F44(T, __VA_ARGS__)
#define ABI_F46(T, f, ...) ABI_FIELD(T, f) ABI_F45(T, __VA_ARGS__)
#define ABI_F47(T, f, ...) ABI_FIELD(T, f) ABI_F46(T, __VA_ARGS__)
#define ABI_F48(T, f, ...) ABI_FIELD(T, f) ABI_F47(T, __VA_ARGS__)
#define ABI_F49(T, f, ...) ABI_FIELD(T, f) ABI_F48(T, __VA_ARGS__)
#define ABI_F50(T, f, ...) ABI_FIELD(T, f) ABI_F49(T, __VA_ARGS__)
#define ABI_F51(T, f, ...) ABI_FIELD(T, f) ABI_F50(T, __VA_ARGS__)
#define ABI_F52(T, f, ...) ABI_FIELD(T, f) ABI_F51(T, __VA_ARGS__)
#define ABI_F53(T, f, ...) ABI_FIELD(T, f) ABI_F52(T, __VA_ARGS__)
#define ABI_F54(T, f, ...) ABI_FIELD(T, f) ABI_F53(T, __VA_ARGS__)
#define ABI_F55(T, f, ...) ABI_FIELD(T, f) ABI_F54(T, __VA_ARGS__)
#define ABI_F56(T, f, ...) ABI_FIELD(T, f) ABI_F55(T, __VA_ARGS__)
#define ABI_F57(T, f, ...) ABI_FIELD(T, f) ABI_F56(T, __VA_ARGS__)
#define ABI_F58(T, f, ...) ABI_FIELD(T, f) ABI_F57(T, __VA_ARGS__)
#define ABI_F59(T, f, ...) ABI_FIELD(T, f) ABI_F58(T, __VA_ARGS__)
#define ABI_F60(T, f, ...) ABI_FIELD(T, f) ABI_F59(T, __VA_ARGS__)
#define ABI_F61(T, f, ...) ABI_FIELD(T, f) ABI_F60(T, __VA_ARGS__)
#define ABI_F62(T, f, ...) ABI_FIELD(T, f) ABI_F61(T, __VA_ARGS__)
#define ABI_F63(T, f, ...) ABI_FIELD(T, f) ABI_F62(T, __VA_ARGS__)
#define ABI_F64(T, f, ...) ABI_FIELD(T, f) ABI_F63(T, __VA_ARGS__)

#define ABI_FIELD_TABLE(T, ...) \
    static const abi_field T##_abi[] = {ABI_CAT(ABI_F, ABI_NARGS(__VA_ARGS__))(T, __VA_ARGS__)};
ABI_STRUCTS(ABI_FIELD_TABLE)
#define ABI_ENTRY(T, ...) {#T, sizeof(T), T##_abi, (int)(sizeof T##_abi / sizeof T##_abi[0])},
static const abi_struct structs[] = {ABI_STRUCTS(ABI_ENTRY)};

static const abi_struct *find(const char *name)
{
    for (size_t i = 0; i < sizeof structs / sizeof structs[0]; i++)
        if (!strcmp(structs[i].name, name)) return &structs[i];
    return NULL;
}

dsv4_status dsv4_abi_struct(const char *name, size_t *size, int *n_fields)
{
    DSV4_CHECK_ARG(name && size && n_fields, "abi_struct: null argument");
    const abi_struct *s = find(name);
    if (!s) return dsv4_fail(DSV4_ERR_NOT_FOUND, "abi_struct: '%s' is not a struct of the public API", name);
    *size = s->size;
    *n_fields = s->n_fields;
    return DSV4_OK;
}

dsv4_status dsv4_abi_field(const char *name, int index, const char **field, size_t *offset, size_t *size)
{
    DSV4_CHECK_ARG(name && field && offset && size, "abi_field: null argument");
    const abi_struct *s = find(name);
    if (!s) return dsv4_fail(DSV4_ERR_NOT_FOUND, "abi_field: '%s' is not a struct of the public API", name);
    if (index < 0 || index >= s->n_fields)
        return dsv4_fail(DSV4_ERR_RANGE, "abi_field: %s has %d fields, no field %d", name, s->n_fields, index);
    *field = s->fields[index].name;
    *offset = s->fields[index].offset;
    *size = s->fields[index].size;
    return DSV4_OK;
}
