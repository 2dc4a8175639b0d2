/* A failure the framework recovers from: the cache holds freed segments, a big request
 * fails, the allocator releases its cache and the retry succeeds.  The dump says
 * "recovered" instead of looking like a crash. */
#include "common.h"
#include "minitorch/minitorch.h"

int main(void)
{
    cudaSetDevice(0);
    void *t[10];
    for (int i = 0; i < 10; i++)
        if (!(t[i] = mt_alloc(2 * GiB)))
            fail_exit("warm-up");
    for (int i = 0; i < 10; i++)
        mt_free(t[i]);              /* all cached, nothing returned to the driver */
    void *big = mt_alloc(12 * GiB); /* fails once, flush, retry succeeds */
    if (!big)
        fail_exit("big batch");
    printf("big batch allocated after the cache was flushed\n");
    return 0;
}
