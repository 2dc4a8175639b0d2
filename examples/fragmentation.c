/* Case 2 of the article: memory "exists" but not in one piece.  Variable-size tensors are
 * allocated and every other one freed, leaving the cache full of holes; a request larger
 * than any hole cannot be served and the device has no room for a new segment.  The
 * framework's flush-and-retry frees nothing (every segment still holds a live tensor). */
#include "common.h"
#include "minitorch/minitorch.h"

int main(void)
{
    cudaSetDevice(0);
    size_t free_b = 0, total = 0;
    cudaMemGetInfo(&free_b, &total);
    int segments = (int)(free_b / (20 * MiB));
    void **t = calloc(2 * (size_t)segments, sizeof *t);
    int n = 0;
    /* fill the device with 20 MiB segments, each split into a 12 MiB and an 8 MiB tensor */
    for (; n < 2 * segments; n += 2) {
        if (!(t[n] = mt_alloc(12 * MiB)) || !(t[n + 1] = mt_alloc(8 * MiB)))
            fail_exit("fill");
    }
    printf("filled the device with %d tensors\n", n);
    for (int i = 0; i < n; i += 2) /* free the 12 MiB ones: holes everywhere */
        mt_free(t[i]);
    mt_stats_t s;
    mt_stats(&s);
    printf("reserved %.2f GiB, allocated %.2f GiB, largest hole %.2f MiB\n", s.reserved / (double)GiB,
           s.allocated / (double)GiB, s.largest_free_block / (double)MiB);
    if (!mt_alloc(40 * MiB))
        fail_exit("attention scores: 40 MiB");
    return 0;
}
