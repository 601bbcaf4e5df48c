/* dsv4 bench startup: what the first use of the backend registry costs (it loads the backend
 * modules it finds, docs/backends.md §2), then each backend's availability check (for cuda: the
 * CUDA runtime's start, or finding that there is no device). Run it as a fresh process: the
 * registry is filled once. */
#include "bench.h"
#include "dsv4.h"

#include <stdio.h>

int dsv4_bench_startup(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    const double t0 = bench_now();
    const int n = dsv4_backend_count();
    const char *first = dsv4_backend_name(0); /* fills the registry */
    const double t1 = bench_now();
    printf("dsv4 bench startup — registry first use (loading the modules found): %.3f ms (%d backends, first %s)\n",
           (t1 - t0) * 1e3, n, first);
    for (int i = 0; i < n; i++) {
        const double a = bench_now();
        const dsv4_status s = dsv4_backend_available(dsv4_backend_name(i));
        const double b = bench_now();
        printf("  %-8s available: %-3s %8.3f ms%s%s\n", dsv4_backend_name(i), s == DSV4_OK ? "yes" : "no",
               (b - a) * 1e3, s == DSV4_OK ? "" : "  ", s == DSV4_OK ? "" : dsv4_last_error());
    }
    return 0;
}
