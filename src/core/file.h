/* Reading a whole file into memory: config.json and the shard index (src/model) and
 * tokenizer.json (src/tokenizer) all come through here. */
#ifndef DSV4_CORE_FILE_H
#define DSV4_CORE_FILE_H

#include "dsv4/core.h"

#include <stddef.h>
#include <stdint.h>

/* Open `path` for reading only if it is a regular file (a FIFO, device or directory fails at once
 * with DSV4_ERR_IO instead of blocking): *fd (close() it) and its size at the open. */
dsv4_status dsv4_open_regular(const char *path, int *fd, uint64_t *size);

/* Read all of `path` (at most `max` bytes) into a new NUL-terminated buffer: *buf (free() it)
 * holds *len bytes before the NUL. Fails with DSV4_ERR_NOT_FOUND (no such file), DSV4_ERR_IO
 * (not a regular file, cannot open or read), DSV4_ERR_FORMAT (more than `max` bytes) or DSV4_ERR_NO_MEMORY, the
 * message naming the path; *buf and *len are written only on success. */
dsv4_status dsv4_read_file(const char *path, size_t max, char **buf, size_t *len);

#endif
