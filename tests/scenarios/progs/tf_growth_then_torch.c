/* compare.py, with TF_FORCE_GPU_ALLOW_GROWTH=true already set (the usual advice was followed):
 * TensorFlow still ends up holding 10 GiB of live tensors (a loaded SavedModel and its outputs),
 * and PyTorch, loading its port of the model next to it, runs out:
 *
 *   tf_model = tf.saved_model.load(path); ref = tf_model(x)   # grows to 10 GiB, all in use
 *   port = Port().cuda(); out = port(x)                         # 6 GiB + 8 GiB: out of memory
 *
 * allow_growth is already on: suggesting it again is useless; TF's memory limit
 * (tf.config.set_logical_device_configuration(..., memory_limit=...)) or running the two
 * phases in separate processes is what helps. */
#include "kit.h"

int main(void)
{
    if (tf_gpu_init(0) != 0)
        return 1;
    for (int i = 0; i < 20; i++)
        if (!tf_alloc(512 * MiB))
            return 1;
    c10_init();
    if (torch_alloc_n(12, 512 * MiB, "port.cuda()"))
        return 1;
    if (torch_alloc_n(16, 512 * MiB, "port(x)"))
        return 1;
    return 0;
}
