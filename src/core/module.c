/* Loading backends built as modules (core/backend.h): find the shared object, dlopen it, check
 * that it was built with this library, and take its backend. Nothing of a module is linked in, so
 * libdsv4 and the programs linked with it run where the module's runtime (e.g. CUDA's) is absent. */
#define _GNU_SOURCE /* dladdr1 */
#include "core/backend.h"
#include "core/error.h"
#include "dsv4_build.h"

#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The folder of the object this code is in: libdsv4.so, or the program linked with libdsv4.a (the
 * main program has no name in the link map: /proc/self/exe gives it). "" when unknown. */
static void own_folder(char *out, size_t cap)
{
    Dl_info info;
    struct link_map *lm = NULL;
    char path[4096] = "";
    out[0] = '\0';
    if (dladdr1((void *)own_folder, &info, (void **)&lm, RTLD_DL_LINKMAP) && lm && lm->l_name && lm->l_name[0]) {
        snprintf(path, sizeof path, "%s", lm->l_name);
    } else {
        ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
        path[n > 0 ? n : 0] = '\0';
    }
    char *slash = strrchr(path, '/');
    if (!slash) return;
    *slash = '\0';
    snprintf(out, cap, "%s", path[0] ? path : "/");
}

static const dsv4_module_host host = {
    .version = DSV4_VERSION_STRING,
    .backend_size = sizeof(dsv4_backend),
    .fail = dsv4_fail,
    .warn = dsv4_warn,
};

const dsv4_backend *dsv4_module_load(const char *file, char *why, size_t cap)
{
    char dirs[4][4096];
    const char *env = getenv("DSV4_MODULE_DIR");
    snprintf(dirs[0], sizeof dirs[0], "%s", env ? env : "");
    own_folder(dirs[1], sizeof dirs[1]);
    /* a program linked with libdsv4.a installed in PREFIX/bin: the modules are in PREFIX/lib */
    if (!dirs[1][0] || snprintf(dirs[2], sizeof dirs[2], "%s/%s", dirs[1], DSV4_BIN_TO_LIBDIR) >= (int)sizeof dirs[2])
        dirs[2][0] = '\0';
    snprintf(dirs[3], sizeof dirs[3], "%s", DSV4_INSTALL_LIBDIR);
    char looked[2048] = "";
    size_t o = 0;
    for (int i = 0; i < 4; i++) {
        if (!dirs[i][0]) continue;
        char path[4352];
        if (snprintf(path, sizeof path, "%s/%s", dirs[i], file) >= (int)sizeof path) continue;
        if (o < sizeof looked) o += (size_t)snprintf(looked + o, sizeof looked - o, "%s%s", o ? ", " : "", dirs[i]);
        if (access(path, F_OK) != 0) continue;
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            snprintf(why, cap, "%s cannot be loaded: %s", path, dlerror());
            return NULL;
        }
        dsv4_module_entry_fn entry;
        *(void **)&entry = dlsym(h, DSV4_MODULE_ENTRY);
        if (!entry) {
            snprintf(why, cap, "%s has no %s: not a dsv4 module", path, DSV4_MODULE_ENTRY);
            dlclose(h);
            return NULL;
        }
        why[0] = '\0';
        const dsv4_backend *b = entry(&host, why, cap);
        if (b) why[0] = '\0';
        if (!b) {
            char reason[512];
            snprintf(reason, sizeof reason, "%s", why[0] ? why : "refused to load");
            snprintf(why, cap, "%s: %s", path, reason);
            dlclose(h);
        }
        /* a loaded module stays loaded: its backend is in the registry until the process ends */
        return b;
    }
    snprintf(why, cap, "%s was not found (looked in %s; $DSV4_MODULE_DIR names another folder)", file, looked);
    return NULL;
}
