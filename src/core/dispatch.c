/* Backend registry and execution contexts. The list of backends comes from the build
 * (generated dsv4_backend_list.inc); this file never names one. */
#include "core/backend.h"
#include "core/error.h"
#include "core/pool.h"

#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#define DSV4_BACKEND_ENTRY(id) extern const dsv4_backend dsv4_backend_##id;
#define DSV4_BACKEND_MODULE(id, file)
#include "dsv4_backend_list.inc"
#undef DSV4_BACKEND_ENTRY
#undef DSV4_BACKEND_MODULE

/* The built-in backends, then the modules (core/module.c) in the order the build lists them. A
 * module that did not load stays listed under its name with the reason (`missing`), so that
 * asking for it says why it is not there. Filled once, on first use. */
enum {
#define DSV4_BACKEND_ENTRY(id) 1 +
#define DSV4_BACKEND_MODULE(id, file) 1 +
    REGISTRY_SIZE =
#include "dsv4_backend_list.inc"
    0
#undef DSV4_BACKEND_ENTRY
#undef DSV4_BACKEND_MODULE
};
static const dsv4_backend *registry[REGISTRY_SIZE ? REGISTRY_SIZE : 1];
static dsv4_backend absent[REGISTRY_SIZE ? REGISTRY_SIZE : 1];
static char missing[REGISTRY_SIZE ? REGISTRY_SIZE : 1][768];
static pthread_once_t registry_once = PTHREAD_ONCE_INIT;

static void registry_init(void)
{
    int i = 0;
#define DSV4_BACKEND_ENTRY(id) registry[i++] = &dsv4_backend_##id;
#define DSV4_BACKEND_MODULE(id, file)                                                   \
    registry[i] = dsv4_module_load(file, missing[i], sizeof missing[i]);                \
    if (!registry[i]) {                                                                 \
        absent[i].name = #id;                                                           \
        registry[i] = &absent[i];                                                       \
    }                                                                                   \
    i++;
#include "dsv4_backend_list.inc"
#undef DSV4_BACKEND_ENTRY
#undef DSV4_BACKEND_MODULE
}

static void registry_ready(void) { pthread_once(&registry_once, registry_init); }

struct dsv4_ctx {
    const dsv4_backend *backend;
    dsv4_exec exec;
};

int dsv4_backend_count(void) { return REGISTRY_SIZE; }
const char *dsv4_backend_name(int i)
{
    registry_ready();
    return i >= 0 && i < REGISTRY_SIZE ? registry[i]->name : NULL;
}

static int backend_index(const char *name)
{
    registry_ready();
    for (int i = 0; i < REGISTRY_SIZE; i++)
        if (name && strcmp(registry[i]->name, name) == 0) return i;
    return -1;
}

const dsv4_backend *dsv4_backend_find(const char *name)
{
    int i = backend_index(name);
    return i >= 0 && !missing[i][0] ? registry[i] : NULL;
}

static dsv4_status backend_lookup(const char *name, const dsv4_backend **out)
{
    const int at = backend_index(name);
    if (at >= 0 && missing[at][0])
        return dsv4_fail(DSV4_ERR_UNSUPPORTED, "backend '%s': its module %s", name, missing[at]);
    const dsv4_backend *b = at >= 0 ? registry[at] : NULL;
    if (!b) {
        char known[256] = "";
        size_t o = 0;
        for (int i = 0; i < REGISTRY_SIZE && o < sizeof known; i++)
            o += (size_t)snprintf(known + o, sizeof known - o, "%s%s", i ? ", " : "", registry[i]->name);
        return dsv4_fail(DSV4_ERR_NOT_FOUND, "backend '%s' is not built in (have: %s)", name ? name : "(null)", known);
    }
    if (b->available) DSV4_TRY(b->available());
    *out = b;
    return DSV4_OK;
}

dsv4_status dsv4_backend_available(const char *name)
{
    const dsv4_backend *b = NULL;
    return backend_lookup(name, &b);
}

static dsv4_status ctx_init(dsv4_ctx *c, const dsv4_ctx_options *o)
{
    const char *name = o && o->backend ? o->backend : getenv("DSV4_BACKEND");
    if (!name || !*name) name = "cpu";
    const dsv4_backend *b = NULL;
    DSV4_TRY(backend_lookup(name, &b));
    int threads = o ? o->threads : 0;
    if (threads < 0 || threads > DSV4_MAX_THREADS)
        return dsv4_fail(DSV4_ERR_INVALID_ARG, "context: threads must be in [0, %d] (got %d)", DSV4_MAX_THREADS, threads);
    c->backend = b;
    c->exec.threads = threads > 0 ? threads : dsv4_default_threads();
    c->exec.pool = NULL;
    c->exec.device = o ? o->device : 0;
    c->exec.stream = NULL;
    c->exec.variant = 0;
    DSV4_TRY(dsv4_cpu_isa_resolve(o ? o->cpu_isa : NULL, &c->exec.isa));
    if (b->configure) {
        static const dsv4_ctx_options none = {0};
        DSV4_TRY(b->configure(o ? o : &none, &c->exec));
    }
    /* last: nothing after it fails, so a failed init leaves no threads behind */
    if (b->device == DSV4_DEVICE_CPU) DSV4_TRY(dsv4_pool_create(c->exec.threads, &c->exec.pool));
    return DSV4_OK;
}

dsv4_status dsv4_ctx_create(const dsv4_ctx_options *options, dsv4_ctx **out)
{
    DSV4_CHECK_ARG(out, "ctx_create: null output pointer");
    dsv4_ctx tmp;
    DSV4_TRY(ctx_init(&tmp, options));
    dsv4_ctx *c = malloc(sizeof *c);
    if (!c) {
        dsv4_pool_destroy(tmp.exec.pool);
        return dsv4_fail(DSV4_ERR_NO_MEMORY, "ctx_create: out of memory");
    }
    *c = tmp;
    *out = c;
    return DSV4_OK;
}

void dsv4_ctx_destroy(dsv4_ctx *ctx)
{
    if (!ctx) return;
    dsv4_pool_destroy(ctx->exec.pool);
    free(ctx);
}

static dsv4_ctx default_ctx;
static dsv4_status default_status;
static pthread_once_t default_once = PTHREAD_ONCE_INIT;
static char default_error[512];

static void default_init(void)
{
    default_status = ctx_init(&default_ctx, NULL);
    if (default_status != DSV4_OK) snprintf(default_error, sizeof default_error, "%s", dsv4_last_error());
}

dsv4_status dsv4_ctx_resolve(const dsv4_ctx *ctx, const dsv4_backend **backend, dsv4_exec *exec)
{
    if (!ctx) {
        pthread_once(&default_once, default_init);
        if (default_status != DSV4_OK)
            return dsv4_fail(default_status, "default context: %s", default_error);
        ctx = &default_ctx;
    }
    *backend = ctx->backend;
    *exec = ctx->exec;
    return DSV4_OK;
}

dsv4_status dsv4_op_resolve(const dsv4_ctx *ctx, const char *op, dsv4_op_family family, const dsv4_backend **backend,
                            dsv4_exec *exec)
{
    if (dsv4_ctx_resolve(ctx, backend, exec) != DSV4_OK)
        return dsv4_fail(default_status, "%s: default context: %s", op, default_error);
    const dsv4_backend *b = *backend;
    const void *table = NULL;
    switch (family) {
    case DSV4_FAMILY_NONE: return DSV4_OK;
    case DSV4_FAMILY_FORMATS: table = b->formats; break;
    case DSV4_FAMILY_ATTENTION: table = b->attention; break;
    case DSV4_FAMILY_LINEAR: table = b->linear; break;
    case DSV4_FAMILY_LAYER: table = b->layer; break;
    case DSV4_FAMILY_INDEXER: table = b->indexer; break;
    case DSV4_FAMILY_TENSOR: table = b->tensor; break;
    }
    if (!table) return dsv4_fail(DSV4_ERR_UNSUPPORTED, "%s: backend '%s' does not implement it", op, b->name);
    return DSV4_OK;
}

dsv4_status dsv4_ctx_set_stream(dsv4_ctx *ctx, void *stream)
{
    DSV4_CHECK_ARG(ctx, "ctx_set_stream: null context");
    ctx->exec.stream = stream;
    return DSV4_OK;
}

const char *dsv4_ctx_backend_name(const dsv4_ctx *ctx)
{
    const dsv4_backend *b = NULL;
    dsv4_exec ex = {0};
    return dsv4_ctx_resolve(ctx, &b, &ex) == DSV4_OK ? b->name : NULL;
}

int dsv4_ctx_threads(const dsv4_ctx *ctx)
{
    const dsv4_backend *b = NULL;
    dsv4_exec ex = {0};
    return dsv4_ctx_resolve(ctx, &b, &ex) == DSV4_OK ? ex.threads : 0;
}

void dsv4_ctx_pool_counts(const dsv4_ctx *ctx, int64_t out[DSV4_POOL_COUNTS])
{
    const dsv4_backend *b = NULL;
    dsv4_exec ex = {0};
    dsv4_pool_counts(dsv4_ctx_resolve(ctx, &b, &ex) == DSV4_OK ? ex.pool : NULL, out);
}

const char *dsv4_ctx_cpu_isa(const dsv4_ctx *ctx)
{
    const dsv4_backend *b = NULL;
    dsv4_exec ex = {0};
    return dsv4_ctx_resolve(ctx, &b, &ex) == DSV4_OK ? dsv4_cpu_isa_name(ex.isa) : NULL;
}
