/* The one option parser of every dsv4 command: getopt_long over the command's option tables
 * (src/cli/cli.h), with the help written from the same tables. */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { VAL_VERSION = 1, VAL_FIRST = 1000 };

int cli_parse_int(const char *s, long long lo, long long hi, long long *v)
{
    const char *p = s + (*s == '-' && lo < 0);
    if (!*p) return 0;
    for (const char *q = p; *q; q++)
        if (*q < '0' || *q > '9') return 0;
    errno = 0;
    char *end;
    long long x = strtoll(s, &end, 10);
    if (errno || *end || x < lo || x > hi) return 0;
    *v = x;
    return 1;
}

static int parse_f64(const char *s, double lo, double hi, double *v)
{
    if (!*s || *s == ' ' || *s == '\t' || *s == '+' || *s == '\n') return 0;
    errno = 0;
    char *end;
    double x = strtod(s, &end);
    if (errno || *end || !isfinite(x) || x < lo || x > hi) return 0;
    *v = x;
    return 1;
}

static long long ll(double x) { return x >= 9.2e18 ? INT64_MAX : x <= -9.2e18 ? INT64_MIN : (long long)x; }

static const cli_opt *nth(const cli_cmd *cmd, int k)
{
    for (const cli_opt *const *t = cmd->tables; *t; t++)
        for (const cli_opt *o = *t; o->name; o++)
            if (!k--) return o;
    return NULL;
}

static const cli_opt *by_name(const cli_cmd *cmd, const char *name, size_t len, int *matches)
{
    const cli_opt *hit = NULL;
    *matches = 0;
    for (const cli_opt *const *t = cmd->tables; *t; t++)
        for (const cli_opt *o = *t; o->name; o++)
            if (!strncmp(o->name, name, len)) {
                if (strlen(o->name) == len) {
                    *matches = 1;
                    return o;
                }
                ++*matches;
                hit = o;
            }
    if (!strncmp("help", name, len) || !strncmp("version", name, len)) ++*matches;
    return *matches == 1 ? hit : NULL;
}

void cli_help(const cli_cmd *cmd, FILE *f)
{
    fprintf(f, "usage: dsv4 %s %s\n", cmd->name, cmd->synopsis);
    if (cmd->about) fprintf(f, "\n%s\n", cmd->about);
    fprintf(f, "\noptions:\n");
    for (int k = 0;; k++) {
        const cli_opt *o = nth(cmd, k);
        if (!o) break;
        char left[64];
        snprintf(left, sizeof left, "%c%c%c --%s%s%s", o->short_name ? '-' : ' ', o->short_name ? o->short_name : ' ',
                 o->short_name ? ',' : ' ', o->name, o->kind == CLI_FLAG ? "" : " ", o->kind == CLI_FLAG ? "" : o->arg);
        fprintf(f, "  %-26s %s\n", left, o->help);
    }
    fprintf(f, "  %-26s %s\n  %-26s %s\n", "-h, --help", "this help", "    --version", "the version of dsv4");
}

static int bad(const cli_cmd *cmd, const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "dsv4 %s: ", cmd->name);
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, " (dsv4 %s --help)\n", cmd->name);
    return CLI_USAGE;
}

/* One value into its destination, or the message naming what is wrong. */
static int store(const cli_cmd *cmd, const cli_opt *o, const char *v)
{
    char range[96];
    switch (o->kind) {
    case CLI_FLAG: *(int *)o->dst = 1; return 0;
    case CLI_STR: *(const char **)o->dst = v; return 0;
    case CLI_INT:
        if (cli_parse_int(v, ll(o->lo), ll(o->hi), (long long *)o->dst)) return 0;
        snprintf(range, sizeof range, "an integer in [%lld, %lld]", ll(o->lo), ll(o->hi));
        break;
    case CLI_F64:
        if (parse_f64(v, o->lo, o->hi, (double *)o->dst)) return 0;
        snprintf(range, sizeof range, "a number in [%g, %g]", o->lo, o->hi);
        break;
    }
    char what[128];
    snprintf(what, sizeof what, "--%s '%%s' is not %s", o->name, range);
    return bad(cmd, what, v, "");
}

int cli_parse(const cli_cmd *cmd, int argc, char **argv, int *first_pos)
{
    int n = 0;
    while (nth(cmd, n)) n++;
    struct option *lo = calloc((size_t)n + 3, sizeof *lo);
    char *shorts = malloc(3 + 2 * (size_t)n + 1);
    if (!lo || !shorts) {
        free(lo);
        free(shorts);
        fprintf(stderr, "dsv4 %s: out of memory\n", cmd->name);
        return 1;
    }
    size_t ns = 0;
    shorts[ns++] = ':'; /* ':' for a missing value, '?' for an unknown option; the messages are ours */
    shorts[ns++] = 'h';
    for (int k = 0; k < n; k++) {
        const cli_opt *o = nth(cmd, k);
        lo[k] = (struct option){o->name, o->kind == CLI_FLAG ? no_argument : required_argument, NULL, VAL_FIRST + k};
        if (o->short_name) {
            shorts[ns++] = o->short_name;
            if (o->kind != CLI_FLAG) shorts[ns++] = ':';
        }
    }
    shorts[ns] = '\0';
    lo[n] = (struct option){"help", no_argument, NULL, 'h'};
    lo[n + 1] = (struct option){"version", no_argument, NULL, VAL_VERSION};
    int rc = CLI_PARSED;
    if (cmd->seen) memset(cmd->seen, 0, (size_t)n * sizeof *cmd->seen);
    opterr = 0;
    optind = 0; /* GNU: start afresh (each command parses once, bench after its name) */
    for (int c; rc == CLI_PARSED && (c = getopt_long(argc, argv, shorts, lo, NULL)) != -1;) {
        const char *arg = argv[optind - 1];
        if (c == 'h') {
            cli_help(cmd, stdout);
            rc = CLI_EXIT_OK;
        } else if (c == VAL_VERSION) {
            printf("dsv4 %s\n", dsv4_version());
            rc = CLI_EXIT_OK;
        } else if (c == '?' || c == ':') {
            char opt[64];
            int matches = 0;
            if (!strncmp(arg, "--", 2) || !optopt || optopt > 127) snprintf(opt, sizeof opt, "%.*s", (int)strcspn(arg, "="), arg);
            else snprintf(opt, sizeof opt, "-%c", optopt);
            const cli_opt *o = strncmp(opt, "--", 2) ? NULL : by_name(cmd, opt + 2, strlen(opt + 2), &matches);
            if (c == ':') rc = bad(cmd, "option '%s' needs a value%s", opt, "");
            else if (o && o->kind == CLI_FLAG && strchr(arg, '=')) rc = bad(cmd, "option '%s' takes no value%s", opt, "");
            else if (matches > 1) rc = bad(cmd, "option '%s' is ambiguous%s", opt, "");
            else rc = bad(cmd, "unknown option '%s'%s", opt, "");
        } else {
            int k = c - VAL_FIRST;
            if (c < VAL_FIRST) /* a short option: getopt gives its letter */
                for (k = 0; nth(cmd, k)->short_name != c; k++) continue;
            const cli_opt *o = nth(cmd, k);
            int matches = 0;
            /* "--model --max-tokens 5": a value that is itself one of our options was forgotten */
            if (o->kind != CLI_FLAG && optarg == arg && !strncmp(optarg, "--", 2) && optarg[2] &&
                by_name(cmd, optarg + 2, strcspn(optarg + 2, "="), &matches) && matches == 1)
                rc = bad(cmd, "option '--%s' needs a value, not the option '%s'", o->name, optarg);
            else if (store(cmd, o, optarg)) rc = CLI_USAGE;
            else if (cmd->seen) cmd->seen[k] = 1;
        }
    }
    free(lo);
    free(shorts);
    if (rc != CLI_PARSED) return rc;
    int n_pos = argc - optind;
    if (n_pos < cmd->min_pos) return bad(cmd, "missing argument%s%s", "", "");
    if (cmd->max_pos >= 0 && n_pos > cmd->max_pos) return bad(cmd, "unexpected argument '%s'%s", argv[optind + cmd->max_pos], "");
    *first_pos = optind;
    return CLI_PARSED;
}

int cli_stderr_tty(void) { return isatty(STDERR_FILENO); }

char *cli_read_file(const char *cmd, const char *path, size_t *len)
{
    int in = !strcmp(path, "-");
    FILE *f = in ? stdin : fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "dsv4 %s: %s: %s\n", cmd, path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - 1 - n, f);
        if (n < cap - 1) break;
        char *b = realloc(buf, cap *= 2);
        if (!b) free(buf);
        buf = b;
    }
    int err = ferror(f);
    if (!in) fclose(f);
    if (!buf || err) {
        fprintf(stderr, "dsv4 %s: cannot read %s\n", cmd, in ? "standard input" : path);
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

void cli_check_env(void)
{
    const char *s = getenv("DSV4_THREADS");
    long long n;
    if (s && *s) {
        char shown[64]; /* the value, kept: it is removed below, so the count is the cores this process may use */
        snprintf(shown, sizeof shown, "%s", s);
        const int valid = cli_parse_int(s, 1, INT64_MAX, &n);
        if (valid && n <= CLI_MAX_THREADS) return;
        unsetenv("DSV4_THREADS");
        const int cores = dsv4_default_threads();
        if (!valid) {
            fprintf(stderr, "dsv4: warning: DSV4_THREADS='%s' is not a positive integer; ignored (using %d, the cores)\n",
                    shown, cores);
        } else {
            fprintf(stderr, "dsv4: warning: DSV4_THREADS=%s is more than %d threads; using %d (the cores)\n", shown,
                    CLI_MAX_THREADS, cores);
            char v[32];
            snprintf(v, sizeof v, "%d", cores);
            setenv("DSV4_THREADS", v, 1);
        }
    }
}
