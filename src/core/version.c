/* dsv4_version(): the project version of CMakeLists.txt, through the generated dsv4_build.h. */
#include "dsv4/core.h"
#include "dsv4_build.h"

const char *dsv4_version(void) { return DSV4_VERSION_STRING; }
