/* dsv4 make-tiny --out DIR [--seed S]: the built-in tiny model (see its --help). */
#include "cli.h"

int dsv4_cmd_make_tiny(int argc, char **argv)
{
    const char *out = NULL;
    long long seed = 0;
    const cli_opt own[] = {{"out", 'o', CLI_STR, &out, 0, 0, "DIR", "the folder to write (created); required"},
                           {"seed", 's', CLI_INT, &seed, 0, 9007199254740991.0, "S", "the weights' random seed (default 0)"},
                           {0}};
    const cli_opt *tables[] = {own, NULL};
    const cli_cmd cmd = {"make-tiny", "--out DIR [--seed S]",
                         "Write the built-in tiny model in the official layout: FP8 weights with 128x128 scales, FP4\n"
                         "experts, hash and learned routing, SWA/CSA/HCA blocks, MTP; loaded back once to prove it.\n"
                         "Its weights are random.",
                         0, 0, tables, NULL};
    int pos, rc = cli_parse(&cmd, argc, argv, &pos);
    if (rc != CLI_PARSED) return rc;
    if (!out) {
        fprintf(stderr, "dsv4 make-tiny: --out DIR is required (dsv4 make-tiny --help)\n");
        return 2;
    }
    if (dsv4_make_tiny(out, (uint64_t)seed) != DSV4_OK) {
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
           out, (unsigned long long)seed, (long long)dsv4_checkpoint_count(ck), bytes, dsv4_checkpoint_file_count(ck), (long long)c->n_layers,
           (long long)c->n_mtp_layers, (long long)c->dim, (long long)c->n_routed_experts, (long long)c->vocab_size);
    dsv4_model_close(m);
    return 0;
}
