/* convert.py -- a TensorFlow SavedModel is run once to produce reference outputs, then the
 * PyTorch port is checked against them in the same process:
 *
 *   import tensorflow as tf
 *   ref = tf.saved_model.load(path)(x)       # the first GPU op: TF maps nearly all free memory
 *   import torch
 *   port = Port().cuda()                      # 2 GiB: out of memory in PyTorch
 */
#include "kit.h"

int main(void)
{
    if (tf_gpu_init(0) != 0) {
        fprintf(stderr, "tensorflow: failed to create the GPU device\n");
        return 1;
    }
    c10_init();
    if (torch_alloc_n(4, 512 * MiB, "port.cuda()"))
        return 1;
    return 0;
}
