#include "core/error.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

static _Thread_local char last_error[1024];

dsv4_status dsv4_fail(dsv4_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

/* ---- warnings ------------------------------------------------------------------------------ */
static pthread_mutex_t warn_lock = PTHREAD_MUTEX_INITIALIZER;
static dsv4_warning_fn warn_fn = dsv4_warning_stderr;
static void *warn_user;
static uint64_t warned[256]; /* hashes of the messages the default handler printed (0 = free) */

void dsv4_set_warning_handler(dsv4_warning_fn fn, void *user)
{
    pthread_mutex_lock(&warn_lock);
    warn_fn = fn;
    warn_user = user;
    pthread_mutex_unlock(&warn_lock);
}

/* Called with warn_lock held (dsv4_warn), which also guards `warned`. Once the table is full,
 * messages are printed every time rather than remembered. */
void dsv4_warning_stderr(void *user, const char *message)
{
    (void)user;
    uint64_t h = 1469598103934665603ull;
    for (const char *c = message; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
    h |= 1;
    size_t n = sizeof warned / sizeof warned[0], i = (size_t)(h % n);
    for (size_t k = 0; k < n; k++, i = (i + 1) % n) {
        if (warned[i] == h) return;
        if (!warned[i]) {
            warned[i] = h;
            break;
        }
    }
    fprintf(stderr, "dsv4: warning: %s\n", message);
}

void dsv4_warn(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&warn_lock);
    if (warn_fn) warn_fn(warn_user, msg);
    pthread_mutex_unlock(&warn_lock);
}

const char *dsv4_last_error(void) { return last_error; }
void dsv4_clear_error(void) { last_error[0] = '\0'; }

const char *dsv4_status_name(dsv4_status s)
{
    switch (s) {
    case DSV4_OK: return "ok";
    case DSV4_ERR_INVALID_ARG: return "invalid argument";
    case DSV4_ERR_SHAPE: return "shape mismatch";
    case DSV4_ERR_DTYPE: return "wrong dtype";
    case DSV4_ERR_STRIDE: return "unsupported layout";
    case DSV4_ERR_RANGE: return "out of range";
    case DSV4_ERR_NO_MEMORY: return "out of memory";
    case DSV4_ERR_CAPACITY: return "capacity exhausted";
    case DSV4_ERR_IO: return "i/o error";
    case DSV4_ERR_FORMAT: return "malformed input";
    case DSV4_ERR_UNSUPPORTED: return "unsupported";
    case DSV4_ERR_BACKEND: return "backend failure";
    case DSV4_ERR_NOT_FOUND: return "not found";
    }
    return "unknown status";
}
