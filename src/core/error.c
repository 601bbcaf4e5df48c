#include "core/error.h"

#include <stdarg.h>
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
