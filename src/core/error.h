/* Error reporting inside the library: set the thread-local message and return the status. */
#ifndef DSV4_CORE_ERROR_H
#define DSV4_CORE_ERROR_H

#include "dsv4/core.h"

#if defined(__GNUC__)
#define DSV4_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define DSV4_PRINTF(a, b)
#endif

dsv4_status dsv4_fail(dsv4_status status, const char *fmt, ...) DSV4_PRINTF(2, 3);
/* A warning through the process-wide handler (dsv4_set_warning_handler); never touches the
 * thread's error message. */
void dsv4_warn(const char *fmt, ...) DSV4_PRINTF(1, 2);

/* Return early on failure. */
#define DSV4_TRY(expr)                          \
    do {                                        \
        dsv4_status s_ = (expr);                \
        if (s_ != DSV4_OK) return s_;           \
    } while (0)

/* Argument checks that become errors, never aborts. */
#define DSV4_CHECK_ARG(cond, ...)                                     \
    do {                                                              \
        if (!(cond)) return dsv4_fail(DSV4_ERR_INVALID_ARG, __VA_ARGS__); \
    } while (0)

#endif
