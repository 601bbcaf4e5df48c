/* dsv4 serve: the OpenAI-compatible HTTP server (docs/server.md; the server is src/server/).
 *
 *   dsv4 serve --model DIR [--host ADDR] [--port N] [--max-seqs N] [--max-queue N] [--max-context N]
 *              [--max-batch N] [--prefill-chunk N] [--mtp K] [--max-tokens N] [--max-body BYTES]
 *              [--max-connections N] [--timeout S] [--drain S] [--prefix-min N] [--no-prefix-cache]
 *              [--tokenizer FILE] [--model-name NAME] [--port-file FILE] [--threads N] [--backend NAME]
 *              [--test-hooks]
 *
 * Runs until SIGTERM or SIGINT, then drains. Errors are one line on stderr and exit status 1. */
#include "server/server.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int usage(FILE *f)
{
    fprintf(f, "usage: dsv4 serve --model DIR [options]\n"
               "  --host ADDR          IPv4 address to listen on (127.0.0.1)\n"
               "  --port N             port (8000; 0 = any free one, see --port-file)\n"
               "  --port-file FILE     write the bound port there once listening\n"
               "  --max-seqs N         sequences decoded at once (8)\n"
               "  --max-queue N        requests waiting for a slot before 503 (64)\n"
               "  --max-context N      positions per sequence (engine default)\n"
               "  --max-batch N        rows per engine step (128)\n"
               "  --prefill-chunk N    prompt tokens of one request per step (64)\n"
               "  --mtp K              MTP draft length of every decode step (0)\n"
               "  --max-tokens N       max_tokens when a request gives none (256)\n"
               "  --max-body BYTES     larger request bodies get 413 (8388608)\n"
               "  --max-connections N  open connections (256)\n"
               "  --timeout S          idle connections are closed after S seconds (30)\n"
               "  --drain S            on SIGTERM, in-flight requests get S seconds (30)\n"
               "  --prefix-min N       shortest cached prefix worth reusing, tokens (16)\n"
               "  --no-prefix-cache    do not keep finished sequences for prefix reuse\n"
               "  --tokenizer FILE     tokenizer.json (default: the model folder's, when present)\n"
               "  --model-name NAME    the model id of /v1/models (the folder's name)\n"
               "  --threads N, --backend NAME\n"
               "  --test-hooks         accept \"dsv4_forced_tokens\" (tests only: docs/server.md)\n");
    return f == stdout ? 0 : 2;
}

static int num(const char *opt, const char *s, long long lo, long long hi, long long *v)
{
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (errno || end == s || *end || x < lo || x > hi) {
        fprintf(stderr, "dsv4 serve: --%s %s is not an integer in [%lld, %lld]\n", opt, s, lo, hi);
        return 0;
    }
    *v = x;
    return 1;
}

int dsv4_cmd_serve(int argc, char **argv)
{
    srv_options o = {.host = "127.0.0.1", .port = 8000, .max_seqs = 8, .max_queue = 64, .max_batch = 128,
                     .prefill_chunk = 64, .max_tokens_default = 256, .max_body = 8u << 20, .max_connections = 256,
                     .timeout_s = 30, .drain_s = 30, .prefix_min = 16, .prefix_cache = 1};
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},       {"host", required_argument, 0, 'H'},
        {"port", required_argument, 0, 'p'},        {"port-file", required_argument, 0, 'P'},
        {"max-seqs", required_argument, 0, 's'},    {"max-queue", required_argument, 0, 'q'},
        {"max-context", required_argument, 0, 'c'}, {"max-batch", required_argument, 0, 'b'},
        {"prefill-chunk", required_argument, 0, 'C'}, {"mtp", required_argument, 0, 'k'},
        {"max-tokens", required_argument, 0, 'n'},  {"max-body", required_argument, 0, 'B'},
        {"max-connections", required_argument, 0, 'x'}, {"timeout", required_argument, 0, 't'},
        {"drain", required_argument, 0, 'd'},       {"prefix-min", required_argument, 0, 'r'},
        {"no-prefix-cache", no_argument, 0, 'N'},   {"tokenizer", required_argument, 0, 'T'},
        {"model-name", required_argument, 0, 'M'},  {"threads", required_argument, 0, 'j'},
        {"backend", required_argument, 0, 'e'},     {"test-hooks", no_argument, 0, 'X'},
        {"help", no_argument, 0, 'h'},              {0, 0, 0, 0}};
    optind = 1;
    opterr = 0;
    for (;;) {
        int i = -1, ch = getopt_long(argc + 1, argv - 1, "h", opts, &i); /* argv[-1] is the command name */
        if (ch == -1) break;
        long long v = 0;
        const char *name = i >= 0 ? opts[i].name : "";
        int ok = 1;
        switch (ch) {
        case 'm': o.model = optarg; break;
        case 'H': o.host = optarg; break;
        case 'P': o.port_file = optarg; break;
        case 'T': o.tokenizer = optarg; break;
        case 'M': o.model_name = optarg; break;
        case 'e': o.backend = optarg; break;
        case 'N': o.prefix_cache = 0; break;
        case 'X': o.test_hooks = 1; break;
        case 'h': return usage(stdout);
        case 'p': ok = num(name, optarg, 0, 65535, &v) && ((o.port = (int)v), 1); break;
        case 's': ok = num(name, optarg, 1, 1024, &v) && ((o.max_seqs = (int)v), 1); break;
        case 'q': ok = num(name, optarg, 0, 1 << 20, &v) && ((o.max_queue = (int)v), 1); break;
        case 'c': ok = num(name, optarg, 2, 1 << 24, &v) && ((o.max_context = v), 1); break;
        case 'b': ok = num(name, optarg, 1, 65536, &v) && ((o.max_batch = (int)v), 1); break;
        case 'C': ok = num(name, optarg, 1, 65536, &v) && ((o.prefill_chunk = (int)v), 1); break;
        case 'k': ok = num(name, optarg, 0, 16, &v) && ((o.mtp = (int)v), 1); break;
        case 'n': ok = num(name, optarg, 1, 1 << 24, &v) && ((o.max_tokens_default = v), 1); break;
        case 'B': ok = num(name, optarg, 1024, 1ll << 32, &v) && ((o.max_body = (size_t)v), 1); break;
        case 'x': ok = num(name, optarg, 1, 65536, &v) && ((o.max_connections = (int)v), 1); break;
        case 't': ok = num(name, optarg, 1, 86400, &v) && ((o.timeout_s = (int)v), 1); break;
        case 'd': ok = num(name, optarg, 0, 86400, &v) && ((o.drain_s = (int)v), 1); break;
        case 'r': ok = num(name, optarg, 1, 1 << 24, &v) && ((o.prefix_min = (int)v), 1); break;
        case 'j': ok = num(name, optarg, 1, 4096, &v) && ((o.threads = (int)v), 1); break;
        default:
            fprintf(stderr, "dsv4 serve: unknown or incomplete option '%s'\n", argv[optind - 2]);
            return usage(stderr);
        }
        if (!ok) return 1;
    }
    if (optind <= argc) {
        fprintf(stderr, "dsv4 serve: unexpected argument '%s'\n", argv[optind - 1]);
        return usage(stderr);
    }
    if (!o.model) {
        fprintf(stderr, "dsv4 serve: --model DIR is required\n");
        return usage(stderr);
    }
    return srv_run(&o);
}
