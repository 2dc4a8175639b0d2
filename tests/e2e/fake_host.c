/* Preloaded after liboomguard.so by run_dumps.sh: gethostname() answers $FAKE_HOSTNAME, any bytes
 * a container could have been given (control characters, '/', terminal escapes). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

int gethostname(char *name, size_t len);
int gethostname(char *name, size_t len)
{
    const char *h = getenv("FAKE_HOSTNAME");
    size_t n = strlen(h ? h : "fake");
    if (n + 1 > len) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(name, h ? h : "fake", n + 1);
    return 0;
}
