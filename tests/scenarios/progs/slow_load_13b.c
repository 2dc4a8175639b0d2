/* serve.py -- a 13B model in bf16 read from a network file system, one 1 GiB tensor group at a
 * time (about 80 ms each), onto a 24 GiB card:
 *
 *   model = AutoModelForCausalLM.from_pretrained("/nfs/models/13b", torch_dtype=torch.bfloat16,
 *                                                device_map="cuda")
 *
 * 26 GB of weights: the load itself runs out of memory after ~2 s, on one more 1 GiB piece.
 * A slow load is still a load: nothing is leaking. */
#include "kit.h"

int main(void)
{
    c10_init();
    for (int piece = 0; piece < 26; piece++) {
        msleep(80);
        if (!c10_empty(1 * GiB))
            return torch_oom("from_pretrained", 1 * GiB);
        printf("loaded %d/26\n", piece + 1);
    }
    return 0;
}
