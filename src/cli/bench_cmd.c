/* dsv4 bench NAME [options]: the benchmarks of bench/, each with the options its registry entry
 * names, parsed by the one parser (src/cli/options.c) and handed on as checked "--name value" pairs. */
#include "bench.h"
#include "cli.h"

#include <string.h>

static void list(FILE *f)
{
    fprintf(f, "usage: dsv4 bench NAME [options]   (dsv4 bench NAME --help: its options)\n\nbenchmarks:\n");
    for (const dsv4_bench_entry *b = dsv4_benches; b->name; b++) fprintf(f, "  %-14s %s\n", b->name, b->help);
}

static int taken(const char *names, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = names; (p = strstr(p, name)); p += n)
        if ((p == names || p[-1] == ' ') && (p[n] == ' ' || !p[n])) return 1;
    return 0;
}

enum { MAX_OPTS = 16 };

static int run_bench(const dsv4_bench_entry *b, int argc, char **argv)
{
    cli_opt own[MAX_OPTS + 1];
    union { int flag; const char *str; long long i; double f; } val[MAX_OPTS];
    int n = 0;
    memset(val, 0, sizeof val);
    for (const cli_opt *o = bench_options; o->name && n < MAX_OPTS; o++)
        if (taken(b->opts, o->name)) {
            own[n] = *o;
            own[n].dst = &val[n];
            n++;
        }
    own[n] = (cli_opt){0};
    char name[64];
    snprintf(name, sizeof name, "bench %s", b->name);
    const cli_opt *tables[] = {own, NULL};
    int seen[MAX_OPTS];
    const cli_cmd cmd = {name, "[options]", b->help, 0, 0, tables, seen};
    int pos, rc = cli_parse(&cmd, argc, argv, &pos);
    if (rc != CLI_PARSED) return rc;
    char *out[2 * MAX_OPTS + 1], text[MAX_OPTS][2][40];
    int k = 0;
    out[k++] = argv[0];
    for (int i = 0; i < n; i++) {
        if (!seen[i]) continue;
        snprintf(text[i][0], sizeof text[i][0], "--%s", own[i].name);
        out[k++] = text[i][0];
        if (own[i].kind == CLI_INT) snprintf(text[i][1], sizeof text[i][1], "%lld", val[i].i);
        else if (own[i].kind == CLI_F64) snprintf(text[i][1], sizeof text[i][1], "%.17g", val[i].f);
        if (own[i].kind == CLI_STR) out[k++] = (char *)val[i].str;
        else if (own[i].kind != CLI_FLAG) out[k++] = text[i][1];
    }
    return b->run(k - 1, out + 1);
}

int dsv4_cmd_bench(int argc, char **argv)
{
    if (argc < 2) {
        list(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        list(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("dsv4 %s\n", dsv4_version());
        return 0;
    }
    for (const dsv4_bench_entry *b = dsv4_benches; b->name; b++)
        if (!strcmp(b->name, argv[1])) return run_bench(b, argc - 1, argv + 1);
    fprintf(stderr, "dsv4 bench: unknown benchmark '%s' (dsv4 bench --help lists them)\n", argv[1]);
    return 2;
}
