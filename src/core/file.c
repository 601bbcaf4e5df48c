#include "core/file.h"

#include "core/error.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

dsv4_status dsv4_open_regular(const char *path, int *fd_out, uint64_t *size)
{
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever; fstat
     * then refuses anything that is not a regular file before a byte is read. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return dsv4_fail(errno == ENOENT ? DSV4_ERR_NOT_FOUND : DSV4_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size < 0) {
        close(fd);
        return dsv4_fail(DSV4_ERR_IO, "%s: not a regular file", path);
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    *fd_out = fd;
    *size = (uint64_t)sb.st_size;
    return DSV4_OK;
}

dsv4_status dsv4_read_file(const char *path, size_t max, char **buf, size_t *len)
{
    DSV4_CHECK_ARG(path && buf && len && max < SIZE_MAX / 2, "read_file: bad argument");
    int fd;
    uint64_t size;
    DSV4_TRY(dsv4_open_regular(path, &fd, &size));
    if (size > max) {
        close(fd);
        return dsv4_fail(DSV4_ERR_FORMAT, "%s: larger than the %zu bytes such a file may have", path, max);
    }
    /* Room for one byte more than fstat saw, so that a file growing under us shows as a full
     * buffer: read on to the end (doubling) or to the limit. */
    size_t cap = (size_t)size + 1;
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
        while (n < cap) {
            ssize_t r = read(fd, b + n, cap - n);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) {
                st = dsv4_fail(DSV4_ERR_IO, "%s: read error: %s", path, strerror(errno));
                break;
            }
            if (r == 0) break;
            n += (size_t)r;
        }
        if (st != DSV4_OK || n < cap) break; /* an error, or the end of the file */
        if (n > max) {
            st = dsv4_fail(DSV4_ERR_FORMAT, "%s: larger than the %zu bytes such a file may have", path, max);
            break;
        }
        cap = cap > max / 2 ? max + 1 : cap * 2;
    }
    close(fd);
    if (st != DSV4_OK) {
        free(b);
        return st;
    }
    b[n] = '\0';
    *buf = b;
    *len = n;
    return DSV4_OK;
}
