/* dsv4 make-tiny --out DIR [--seed S]: the built-in tiny model in the official layout (FP8
 * weights with 128x128 scales, FP4 experts, hash and learned routing, SWA/CSA/HCA, MTP), loaded
 * back once to prove it. */
#include "dsv4.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int usage(void)
{
    fprintf(stderr, "usage: dsv4 make-tiny --out DIR [--seed S]\n");
    return 2;
}

int dsv4_cmd_make_tiny(int argc, char **argv)
{
    const char *out = NULL;
    unsigned long long seed = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) {
            out = argv[++i];
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
    if (!out) return usage();
    if (dsv4_make_tiny(out, seed) != DSV4_OK) {
        fprintf(stderr, "dsv4 make-tiny: %s\n", dsv4_last_error());
        return 1;
    }
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
    dsv4_model_close(m);
    return 0;
}
