/* fork(): the child holds none of the parent's device memory and starts an empty ledger;
 * exec(): the preload is inherited and the new image is tracked from its first call. */
#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

#define MiB (1024ull * 1024)

static int child_work(const char *label)
{
    void *p[3];
    CHECK(cudaSetDevice(1) == cudaSuccess, "[%s] set device", label);
    check_device(1, label);
    for (int i = 0; i < 3; i++)
        CHECK(cudaMalloc(&p[i], (size_t)(i + 1) * MiB + 17) == cudaSuccess, "[%s] alloc", label);
    check_device(1, label);
    CHECK(cudaFree(p[1]) == cudaSuccess, "[%s] free", label);
    check_device(1, label);
    return check_failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    int have_shim = check_setup();
    if (have_shim < 0)
        return 1;
    if (argc > 1 && strcmp(argv[1], "--exec-child") == 0) {
        CHECK(have_shim == (getenv("LD_PRELOAD") != NULL), "exec child: preload not inherited");
        int rc = child_work("exec child");
        printf("exec child: %d checks, %d failed\n", check_count, check_failures);
        return rc;
    }
    void *a, *b;
    CHECK(cudaSetDevice(1) == cudaSuccess, "set device");
    CHECK(cudaMalloc(&a, 50 * MiB) == cudaSuccess, "parent alloc");
    CHECK(cudaMalloc(&b, 7 * MiB) == cudaSuccess, "parent alloc");
    check_device(1, "parent before fork");

    pid_t pid = fork();
    if (pid == 0)
        _exit(child_work("fork child"));
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "fork child failed (status %d)", st);
    check_device(1, "parent after fork");
    CHECK(cudaFree(a) == cudaSuccess, "parent free");
    check_device(1, "parent after free");

    pid = fork();
    if (pid == 0) {
        execl("/proc/self/exe", argv[0], "--exec-child", (char *)NULL);
        _exit(127);
    }
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exec child failed (status %d)", st);
    return check_finish(argv[0]);
}
