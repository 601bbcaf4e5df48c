/* libdsv4 — DeepSeek-V4 inference in C.
 *
 * The public API. Every function returns a dsv4_status; on failure dsv4_last_error() holds a
 * readable, thread-local message and no output has been written. Sizes are explicit, tensors are
 * non-owning views (dsv4/tensor.h), engines and contexts are opaque handles.
 *
 * Families of operations each have a header under dsv4/; this one includes them all. */
#ifndef DSV4_H
#define DSV4_H

#include "dsv4/attention.h"
#include "dsv4/comm.h"
#include "dsv4/core.h"
#include "dsv4/device.h"
#include "dsv4/engine.h"
#include "dsv4/formats.h"
#include "dsv4/indexer.h"
#include "dsv4/layer.h"
#include "dsv4/linear.h"
#include "dsv4/model.h"
#include "dsv4/tensor.h"
#include "dsv4/tensor_ops.h"
#include "dsv4/tokenizer.h"

#endif
