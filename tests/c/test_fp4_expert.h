/* A random FP4 expert of the MoE tests (test_layer.c, test_shard.c): w1, w3 [MI, MD] and w2 [MD, MI]
 * as E2M1 codes (two a byte, uniformly random) with one E8M0 scale per 32 values in 121..124
 * (2^-6 .. 2^-3, so the products stay well inside BF16's range). */
#ifndef DSV4_TEST_FP4_EXPERT_H
#define DSV4_TEST_FP4_EXPERT_H

#include "test_util.h"

enum { TEST_FP4_MD = 256, TEST_FP4_MI = 128 };

typedef struct {
    uint8_t w1[TEST_FP4_MI * TEST_FP4_MD / 2], s1[TEST_FP4_MI * TEST_FP4_MD / 32];
    uint8_t w3[TEST_FP4_MI * TEST_FP4_MD / 2], s3[TEST_FP4_MI * TEST_FP4_MD / 32];
    uint8_t w2[TEST_FP4_MD * TEST_FP4_MI / 2], s2[TEST_FP4_MD * TEST_FP4_MI / 32];
    dsv4_tensor t[6];
    dsv4_ffn_weights f;
} fp4_expert;

static inline void make_fp4_expert(fp4_expert *e)
{
    enum { D = TEST_FP4_MD, I = TEST_FP4_MI };
    uint8_t *bufs[6] = {e->w1, e->s1, e->w3, e->s3, e->w2, e->s2};
    const int64_t rows[6] = {I, I, I, I, D, D}, cols[6] = {D / 2, D / 32, D / 2, D / 32, I / 2, I / 32};
    for (int m = 0; m < 6; m++) {
        for (int64_t i = 0; i < rows[m] * cols[m]; i++)
            bufs[m][i] = (uint8_t)(m % 2 ? 121 + test_rand_u64() % 4 : test_rand_u64() & 0xFF);
        dsv4_tensor_init(&e->t[m], bufs[m], m % 2 ? DSV4_E8M0 : DSV4_FP4X2, 2, (const int64_t[]){rows[m], cols[m]});
    }
    e->f = (dsv4_ffn_weights){DSV4_LINEAR_FP4, &e->t[0], &e->t[1], &e->t[2], &e->t[3], &e->t[4], &e->t[5]};
}

#endif
