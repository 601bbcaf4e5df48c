/* Sampling for the engine (include/dsv4/engine.h): one row of host logits through the host context's sample op
 * (dsv4_sample_rows, whose rule core/sample.h owns) in the engine's scratch; nothing is
 * allocated. */
#include "model/engine_internal.h"

#include "core/error.h"
#include "core/sample.h"
#include "dsv4/tensor_ops.h"

#include <math.h>

dsv4_status eng_check_logits(const dsv4_engine *e, const float *logits, const char *what)
{
    return dsv4_sample_result(dsv4_sample_check_row(logits, e->V), what);
}

dsv4_status dsv4_engine_sample(dsv4_engine *e, const float *logits, const dsv4_sampling *s, uint64_t rng[4], int32_t *token)
{
    DSV4_CHECK_ARG(e && logits && s && rng && token, "engine_sample: null argument");
    DSV4_CHECK_ARG(s->temperature >= 0.0f && isfinite(s->temperature), "engine_sample: temperature %g must be finite and >= 0",
                   (double)s->temperature);
    DSV4_CHECK_ARG(s->top_p >= 0.0f, "engine_sample: top_p %g must be >= 0 (0: 1)", (double)s->top_p);
    const dsv4_tensor lg = eng_t2(logits, DSV4_F32, 1, e->V);
    int32_t t = 0;
    dsv4_tensor tok = eng_t1(&t, DSV4_I32, 1);
    DSV4_TRY(dsv4_sample_rows(e->hctx, &lg, s, rng, &tok, e->s.probs, (size_t)DSV4_SAMPLE_ROW_BYTES(e->V)));
    DSV4_TRY(dsv4_sample_result(t, "engine_sample"));
    *token = t;
    return DSV4_OK;
}
