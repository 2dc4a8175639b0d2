/* Preloaded after liboomguard.so by run_dumps.sh: a file system without O_TMPFILE (some
 * network and FUSE file systems), so the dump writer's hidden-temporary-file path runs. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <sys/types.h>

typedef int (*openat_fn)(int, const char *, int, ...);

static int no_tmpfile(int dfd, const char *path, int flags, va_list ap, const char *name)
{
    mode_t mode = (flags & (O_CREAT | __O_TMPFILE)) ? (mode_t)va_arg(ap, int) : 0;
    if ((flags & __O_TMPFILE) == __O_TMPFILE) {
        errno = EOPNOTSUPP;
        return -1;
    }
    openat_fn real = (openat_fn)dlsym(RTLD_NEXT, name);
    return real ? real(dfd, path, flags, mode) : (errno = ENOSYS, -1);
}

int openat(int dfd, const char *path, int flags, ...);
int openat(int dfd, const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    int r = no_tmpfile(dfd, path, flags, ap, "openat");
    va_end(ap);
    return r;
}

int openat64(int dfd, const char *path, int flags, ...);
int openat64(int dfd, const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    int r = no_tmpfile(dfd, path, flags, ap, "openat64");
    va_end(ap);
    return r;
}
