/* tests/cli/measure.c — runs a command and records its wall time and peak RSS
 * (the test machines may lack /usr/bin/time).
 * usage: og-measure RESULT_FILE CMD [ARGS...]
 * RESULT_FILE gets "wall_s=<s> cpu_s=<user+sys s> maxrss_kb=<KiB> status=<exit status>". */
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s RESULT_FILE CMD [ARGS...]\n", argv[0]);
        return 2;
    }
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    pid_t pid = fork();
    if (pid < 0)
        return 2;
    if (pid == 0) {
        execvp(argv[2], argv + 2);
        perror(argv[2]);
        _exit(127);
    }
    int status;
    struct rusage ru;
    if (wait4(pid, &status, 0, &ru) < 0)
        return 2;
    clock_gettime(CLOCK_MONOTONIC, &b);
    FILE *f = fopen(argv[1], "w");
    if (!f)
        return 2;
    double cpu = (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
    fprintf(f, "wall_s=%.3f cpu_s=%.3f maxrss_kb=%ld status=%d\n",
            (double)(b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9, cpu, ru.ru_maxrss,
            WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    return fclose(f) == 0 ? 0 : 2;
}
