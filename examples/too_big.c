/* Case 1 of the article: the model plus its activations simply do not fit.
 * A 24 GiB card holds 14 GiB of weights and optimizer state; the forward pass then asks
 * for 12 GiB of activations at once.  Nothing is cached, nothing is fragmented. */
#include "common.h"
#include "minitorch/minitorch.h"

int main(void)
{
    cudaSetDevice(0);
    void *weights[7];
    for (int i = 0; i < 7; i++)
        if (!(weights[i] = mt_alloc(2 * GiB)))
            fail_exit("weights");
    printf("model loaded: 14 GiB\n");
    void *act = mt_alloc(12 * GiB);
    if (!act)
        fail_exit("forward pass: activations of 12 GiB");
    return 0;
}
