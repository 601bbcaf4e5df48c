/* dsv4 — the command-line tool. */
#include "bench.h"
#include "dsv4.h"

#include <stdio.h>
#include <string.h>

int dsv4_cmd_inspect(int argc, char **argv);   /* inspect.c */
int dsv4_cmd_make_tiny(int argc, char **argv); /* make_tiny.c */
int dsv4_cmd_run(int argc, char **argv);       /* run.c */
int dsv4_cmd_tokenize(int argc, char **argv);  /* tokenize.c */

static int cmd_info(void)
{
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
    fprintf(f, "usage: dsv4 COMMAND [options]\n\n"
               "commands:\n"
               "  info                 backends, CPU features, threads\n"
               "  inspect DIR          a checkpoint: config, tensors by dtype, missing/unexpected\n"
               "                       (--values: tensors holding NaN / Inf or NaN scales)\n"
               "  make-tiny --out DIR  write the built-in tiny model with DeepSeek-V4's tokenizer (--seed S, --no-tokenizer)\n"
               "  run --model DIR ...  generate: --prompt-ids 1,2,3 --max-tokens N [--mtp K] (run -h)\n"
               "  tokenize TEXT|-      text -> token ids with a tokenizer.json (--ids, --chat, --think, --decode; -h)\n"
               "  bench NAME [opts]    benchmarks (--threads N, --quick):\n");
    for (const dsv4_bench_entry *b = dsv4_benches; b->name; b++) fprintf(f, "      %-14s %s\n", b->name, b->help);
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "info")) return cmd_info();
    if (!strcmp(argv[1], "inspect")) return dsv4_cmd_inspect(argc - 2, argv + 2);
    if (!strcmp(argv[1], "make-tiny")) return dsv4_cmd_make_tiny(argc - 2, argv + 2);
    if (!strcmp(argv[1], "run")) return dsv4_cmd_run(argc - 2, argv + 2);
    if (!strcmp(argv[1], "tokenize")) return dsv4_cmd_tokenize(argc - 2, argv + 2);
    if (!strcmp(argv[1], "bench")) {
        if (argc < 3) {
            usage(stderr);
            return 2;
        }
        for (const dsv4_bench_entry *b = dsv4_benches; b->name; b++)
            if (!strcmp(b->name, argv[2])) return b->run(argc - 3, argv + 3);
        fprintf(stderr, "dsv4: unknown benchmark '%s'\n", argv[2]);
        usage(stderr);
        return 2;
    }
    fprintf(stderr, "dsv4: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
