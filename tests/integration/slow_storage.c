/* A stand-in for slow shared storage (Lustre, a busy NFS server), which this machine's
 * disk is not. Preloaded into a job (LD_PRELOAD) by the cluster tests that need it:
 *
 *   NVRX_SLOW_DELETE_S=N  each removal of a directory that task 0's retention renamed
 *                         aside (checkpoints/.removing_iter_NNNNNNN) waits N seconds;
 *   NVRX_SLOW_SAVE_S=N    each file created in a checkpoint being written (under a
 *                         .partial_iter_NNNNNNN directory) waits N seconds first;
 *   NVRX_SLOW_SAVE_RANK=R with NVRX_SLOW_SAVE_S, only the process whose RANK is R waits
 *                         (one rank's save is slow, the others wait for it).
 *
 * Every other call goes straight through. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void hold(const char *knob) {
    const char *seconds = getenv(knob);
    if (seconds)
        sleep((unsigned)atoi(seconds));
}

static void hold_if_retired(const char *path) {
    const char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    if (strncmp(name, ".removing_", 10) == 0)
        hold("NVRX_SLOW_DELETE_S");
}

static int this_rank_saves_slowly(void) {
    const char *slow = getenv("NVRX_SLOW_SAVE_RANK");
    const char *rank = getenv("RANK");
    return !slow || (rank && strcmp(slow, rank) == 0);
}

static void hold_if_saving(const char *path, int flags) {
    if ((flags & O_CREAT) && strstr(path, "/.partial_iter_") && this_rank_saves_slowly())
        hold("NVRX_SLOW_SAVE_S");
}

int rmdir(const char *path) {
    static int (*real)(const char *);
    if (!real)
        real = (int (*)(const char *))dlsym(RTLD_NEXT, "rmdir");
    hold_if_retired(path);
    return real(path);
}

int unlinkat(int dirfd, const char *path, int flags) {
    static int (*real)(int, const char *, int);
    if (!real)
        real = (int (*)(int, const char *, int))dlsym(RTLD_NEXT, "unlinkat");
    if (flags & AT_REMOVEDIR)
        hold_if_retired(path);
    return real(dirfd, path, flags);
}

/* open()'s mode argument is there only when the flags create a file. */
#define MODE_OF(flags, mode)                                                           \
    if ((flags) & (O_CREAT | O_TMPFILE)) {                                             \
        va_list args;                                                                  \
        va_start(args, flags);                                                         \
        mode = va_arg(args, mode_t);                                                   \
        va_end(args);                                                                  \
    }

#define OPEN(name)                                                                     \
    int name(const char *path, int flags, ...) {                                       \
        static int (*real)(const char *, int, ...);                                    \
        mode_t mode = 0;                                                               \
        MODE_OF(flags, mode)                                                           \
        if (!real)                                                                     \
            real = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, #name);           \
        hold_if_saving(path, flags);                                                   \
        return real(path, flags, mode);                                                \
    }
OPEN(open)
OPEN(open64)

#define OPENAT(name)                                                                   \
    int name(int dirfd, const char *path, int flags, ...) {                            \
        static int (*real)(int, const char *, int, ...);                               \
        mode_t mode = 0;                                                               \
        MODE_OF(flags, mode)                                                           \
        if (!real)                                                                     \
            real = (int (*)(int, const char *, int, ...))dlsym(RTLD_NEXT, #name);      \
        hold_if_saving(path, flags);                                                   \
        return real(dirfd, path, flags, mode);                                         \
    }
OPENAT(openat)
OPENAT(openat64)
