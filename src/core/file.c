#include "core/file.h"

#include "core/error.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

dsv4_status dsv4_read_file(const char *path, size_t max, char **buf, size_t *len)
{
    DSV4_CHECK_ARG(path && buf && len && max < SIZE_MAX / 2, "read_file: bad argument");
    FILE *f = fopen(path, "rb");
    if (!f) return dsv4_fail(errno == ENOENT ? DSV4_ERR_NOT_FOUND : DSV4_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    /* Room for the whole file where its size is known (else 64 KiB, doubling), always at least
     * one byte more than it holds, so that a full buffer means more data or a file too large. */
    size_t cap = (size_t)1 << 16;
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size >= 0 && (uintmax_t)sb.st_size < max)
        cap = (size_t)sb.st_size + 1;
    if (cap > max + 1) cap = max + 1;
    char *b = NULL;
    size_t n = 0;
    dsv4_status st = DSV4_OK;
    for (;;) {
        char *nb = realloc(b, cap + 1); /* + the NUL */
        if (!nb) {
            st = dsv4_fail(DSV4_ERR_NO_MEMORY, "%s: out of memory", path);
            break;
        }
        b = nb;
        n += fread(b + n, 1, cap - n, f);
        if (ferror(f)) {
            st = dsv4_fail(DSV4_ERR_IO, "%s: read error", path);
            break;
        }
        if (n < cap) break; /* the end of the file */
        if (n > max) {
            st = dsv4_fail(DSV4_ERR_FORMAT, "%s: larger than the %zu bytes such a file may have", path, max);
            break;
        }
        cap = cap > max / 2 ? max + 1 : cap * 2;
    }
    fclose(f);
    if (st != DSV4_OK) {
        free(b);
        return st;
    }
    b[n] = '\0';
    *buf = b;
    *len = n;
    return DSV4_OK;
}
