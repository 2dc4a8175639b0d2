/* The classic leak: a training loop keeps every step's loss tensor (with its graph) in a
 * list, so memory grows a little each iteration until it runs out. */
#include <unistd.h>

#include "common.h"
#include "minitorch/minitorch.h"

int main(void)
{
    cudaSetDevice(0);
    for (int i = 0; i < 4; i++)
        if (!mt_alloc(2 * GiB))
            fail_exit("weights");
    for (int step = 0;; step++) {
        void *act = mt_alloc(3 * GiB); /* activations of this step */
        if (!act) {
            fprintf(stderr, "step %d: ", step);
            fail_exit("forward pass");
        }
        void *graph = mt_alloc(150 * MiB); /* losses.append(loss): the graph stays alive */
        if (!graph) {
            fprintf(stderr, "step %d: ", step);
            fail_exit("loss");
        }
        mt_free(act);
        usleep(15000); /* a training step takes time */
    }
}
