/* dsv4 — the command-line tool: one entry per command below; each parses its own options with
 * cli_parse (src/cli/cli.h) and receives argv[0] = its name. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

int dsv4_cmd_bench(int argc, char **argv);     /* bench_cmd.c */
int dsv4_cmd_chat(int argc, char **argv);      /* chat.c */
int dsv4_cmd_inspect(int argc, char **argv);   /* inspect.c */
int dsv4_cmd_make_tiny(int argc, char **argv); /* make_tiny.c */
int dsv4_cmd_run(int argc, char **argv);       /* run.c */
int dsv4_cmd_serve(int argc, char **argv);     /* serve.c */
int dsv4_cmd_tokenize(int argc, char **argv);  /* tokenize.c */
static int cmd_info(int argc, char **argv);

static const struct command {
    const char *name, *help;
    int (*run)(int argc, char **argv);
} commands[] = {
    {"info", "backends, CPU features, threads", cmd_info},
    {"run", "generate from a checkpoint: text or token ids in, text out (run --help)", dsv4_cmd_run},
    {"chat", "an interactive conversation with a checkpoint", dsv4_cmd_chat},
    {"serve", "the OpenAI-compatible HTTP server (serve --help)", dsv4_cmd_serve},
    {"tokenize", "text -> token ids with a tokenizer.json, and back (--decode)", dsv4_cmd_tokenize},
    {"inspect", "a checkpoint: config, tensors by dtype, missing/unexpected", dsv4_cmd_inspect},
    {"make-tiny", "write the built-in tiny model (random weights, DeepSeek-V4's tokenizer)", dsv4_cmd_make_tiny},
    {"bench", "benchmarks (bench --help lists them)", dsv4_cmd_bench},
};
enum { N_COMMANDS = sizeof commands / sizeof commands[0] };

static int cmd_info(int argc, char **argv)
{
    const cli_opt none[] = {{0}}, *tables[] = {none, NULL};
    const cli_cmd cmd = {"info", "", "The version, CPU features and kernels, threads and backends.", 0, 0, tables, NULL};
    int pos, rc = cli_parse(&cmd, argc, argv, &pos);
    if (rc != CLI_PARSED) return rc;
    printf("dsv4 %s\n", dsv4_version());
    printf("cpu features: %s\n", dsv4_cpu_features());
    printf("cpu kernels:  %s (cap with DSV4_CPU_ISA=scalar|avx2|avx512)\n", dsv4_cpu_isa());
    printf("threads:      %d (DSV4_THREADS)\n", dsv4_default_threads());
    printf("backends:\n");
    for (int i = 0; i < dsv4_backend_count(); i++) {
        const char *name = dsv4_backend_name(i);
        dsv4_status s = dsv4_backend_available(name);
        printf("  %-8s %s%s\n", name, s == DSV4_OK ? "available" : "unavailable: ", s == DSV4_OK ? "" : dsv4_last_error());
    }
    const char *sel = dsv4_ctx_backend_name(NULL);
    printf("default backend: %s (DSV4_BACKEND)\n", sel ? sel : dsv4_last_error());
    return sel ? 0 : 1;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: dsv4 COMMAND [options]   (dsv4 COMMAND --help: its options)\n\ncommands:\n");
    for (int i = 0; i < N_COMMANDS; i++) fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\noptions: -h, --help (this help), --version\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("dsv4 %s\n", dsv4_version());
        return 0;
    }
    cli_check_env();
    for (int i = 0; i < N_COMMANDS; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "dsv4: unknown %s '%s' (dsv4 --help lists the commands)\n", argv[1][0] == '-' ? "option" : "command",
            argv[1]);
    return 2;
}
