/* chat.py -- a 13B chat model in fp16 on a 24 GiB card:
 *
 *   model = AutoModelForCausalLM.from_pretrained("...-13b-chat", torch_dtype=torch.float16).cuda()
 *
 * 13B parameters x 2 bytes = 26 GB of weights (3 shards of ~8 GiB, loaded in 1 GiB pieces):
 * the weights alone are larger than the card.  Fails during the load. */
#include "kit.h"

int main(void)
{
    c10_init();
    if (torch_alloc_n(25, 1 * GiB, "from_pretrained"))
        return 1;
    return 0;
}
