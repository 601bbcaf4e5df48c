/* The cuda backend as a module (core/backend.h, loaded by core/module.c): its one exported
 * function, and the library functions the backend calls, served through the host table. */
#include "core/backend.h"
#include "core/error.h"
#include "dsv4_build.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

extern const dsv4_backend dsv4_backend_cuda;

static const dsv4_module_host *host_lib;

/* The backend's failures become the library's last error, its warnings go through the library's
 * warning handler; both messages are formatted here and handed over as one string. */
#define HOST_FORMAT(msg, fmt)                                                                               \
    char msg[1024];                                                                                         \
    va_list ap;                                                                                             \
    va_start(ap, fmt);                                                                                      \
    vsnprintf(msg, sizeof msg, fmt, ap);                                                                    \
    va_end(ap)

dsv4_status dsv4_fail(dsv4_status status, const char *fmt, ...)
{
    HOST_FORMAT(msg, fmt);
    return host_lib ? host_lib->fail(status, "%s", msg) : status;
}

void dsv4_warn(const char *fmt, ...)
{
    HOST_FORMAT(msg, fmt);
    if (host_lib) host_lib->warn("%s", msg);
}

/* DSV4_MODULE_ENTRY */
__attribute__((visibility("default"))) const dsv4_backend *dsv4_module_backend(const dsv4_module_host *host, char *why,
                                                                               size_t cap)
{
    if (!host || strcmp(host->version, DSV4_VERSION_STRING) != 0 || host->backend_size != sizeof(dsv4_backend)) {
        snprintf(why, cap, "built for dsv4 %s, the library is %s", DSV4_VERSION_STRING, host ? host->version : "?");
        return NULL;
    }
    host_lib = host;
    return &dsv4_backend_cuda;
}
