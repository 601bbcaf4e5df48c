/* dsv4 serve: the OpenAI-compatible HTTP server (docs/server.md; the server is src/server/).
 *
 *   dsv4 serve --model DIR [options]   (dsv4 serve --help lists them; the parser is options.c's)
 *
 * Runs until SIGTERM or SIGINT, then drains. Errors are one line on stderr and exit status 1. */
#include "cli.h"
#include "server/server.h"

#include <stdio.h>

int dsv4_cmd_serve(int argc, char **argv)
{
    const char *model = NULL, *host = "127.0.0.1", *port_file = NULL, *tokenizer = NULL, *model_name = NULL,
               *backend = NULL;
    long long port = 8000, max_seqs = 8, max_queue = 64, max_context = 0, max_batch = 128, prefill_chunk = 64,
              mtp = 0, max_tokens = 256, max_body = 8 << 20, max_conn = 256, timeout = 30, drain = 30,
              prefix_min = 16, threads = 0;
    int no_prefix_cache = 0, test_hooks = 0;
    const cli_opt opts[] = {
        {"model", 'm', CLI_STR, &model, 0, 0, "DIR", "the checkpoint folder (required)"},
        {"host", 0, CLI_STR, &host, 0, 0, "ADDR", "IPv4 address to listen on (127.0.0.1)"},
        {"port", 0, CLI_INT, &port, 0, 65535, "N", "port (8000; 0 = any free one, see --port-file)"},
        {"port-file", 0, CLI_STR, &port_file, 0, 0, "FILE", "write the bound port there once listening"},
        {"max-seqs", 0, CLI_INT, &max_seqs, 1, 1024, "N", "sequences decoded at once (8)"},
        {"max-queue", 0, CLI_INT, &max_queue, 0, 1 << 20, "N", "requests waiting for a slot before 503 (64)"},
        {"max-context", 0, CLI_INT, &max_context, 2, 1 << 24, "N", "positions per sequence (engine default)"},
        {"max-batch", 0, CLI_INT, &max_batch, 1, 65536, "N", "rows per engine step (128)"},
        {"prefill-chunk", 0, CLI_INT, &prefill_chunk, 1, 65536, "N", "prompt tokens of one request per step (64)"},
        {"mtp", 0, CLI_INT, &mtp, 0, 16, "K", "MTP draft length of every decode step (0)"},
        {"max-tokens", 'n', CLI_INT, &max_tokens, 1, 1 << 24, "N", "max_tokens when a request gives none (256)"},
        {"max-body", 0, CLI_INT, &max_body, 1024, 1ll << 32, "BYTES", "larger request bodies get 413 (8388608)"},
        {"max-connections", 0, CLI_INT, &max_conn, 1, 65536, "N", "open connections (256)"},
        {"timeout", 0, CLI_INT, &timeout, 1, 86400, "S", "idle connections are closed after S seconds (30)"},
        {"drain", 0, CLI_INT, &drain, 0, 86400, "S", "on SIGTERM, in-flight requests get S seconds (30)"},
        {"prefix-min", 0, CLI_INT, &prefix_min, 1, 1 << 24, "N", "shortest cached prefix worth reusing, tokens (16)"},
        {"no-prefix-cache", 0, CLI_FLAG, &no_prefix_cache, 0, 0, NULL, "do not keep finished sequences for prefix reuse"},
        {"tokenizer", 0, CLI_STR, &tokenizer, 0, 0, "PATH", "tokenizer.json or its folder (default: $DSV4_TOKENIZER, else the model folder's, when present)"},
        {"model-name", 0, CLI_STR, &model_name, 0, 0, "NAME", "the model id of /v1/models (the folder's name)"},
        {"threads", 't', CLI_INT, &threads, 1, CLI_MAX_THREADS, "N", "CPU threads (default: $DSV4_THREADS, else all cores)"},
        {"backend", 'b', CLI_STR, &backend, 0, 0, "NAME", "cpu (default), cpu-ref, cuda"},
        {"test-hooks", 0, CLI_FLAG, &test_hooks, 0, 0, NULL, "accept \"dsv4_forced_tokens\" (tests only: docs/server.md)"},
        {NULL, 0, CLI_FLAG, NULL, 0, 0, NULL, NULL},
    };
    const cli_opt *tables[] = {opts, NULL};
    const cli_cmd cmd = {"serve", "--model DIR [options]",
                         "The OpenAI-compatible HTTP server (docs/server.md). Runs until SIGTERM or SIGINT, then drains.",
                         0, 0, tables, NULL};
    int pos, rc = cli_parse(&cmd, argc, argv, &pos);
    if (rc != CLI_PARSED) return rc;
    if (!model) {
        fprintf(stderr, "dsv4 serve: --model DIR is required\n");
        return CLI_USAGE;
    }
    char tok_buf[4096];
    int named = 0;
    const char *tok = cli_tokenizer_path(tokenizer, model, tok_buf, sizeof tok_buf, &named);
    srv_options o = {.model = model, .host = host, .port = (int)port, .port_file = port_file, .max_seqs = (int)max_seqs,
                     .max_queue = (int)max_queue, .max_context = max_context, .max_batch = (int)max_batch,
                     .prefill_chunk = (int)prefill_chunk, .mtp = (int)mtp, .max_tokens_default = max_tokens,
                     .max_body = (size_t)max_body, .max_connections = (int)max_conn, .timeout_s = (int)timeout,
                     .drain_s = (int)drain, .prefix_min = (int)prefix_min, .prefix_cache = !no_prefix_cache,
                     .tokenizer = named ? tok : NULL, /* NULL: the model folder's, when present */
                     .model_name = model_name, .threads = (int)threads, .backend = backend, .test_hooks = test_hooks};
    return srv_run(&o);
}
