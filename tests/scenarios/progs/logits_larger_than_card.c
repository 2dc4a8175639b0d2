/* score_document.py -- perplexity of a whole 32k-token document in one call:
 *
 *   model = AutoModelForCausalLM.from_pretrained("...-1b", torch_dtype=torch.bfloat16).cuda()  # 6 GiB
 *   with torch.inference_mode():
 *       logits = model(ids).logits.float()      # 32768 tokens x 262144 vocab x 4 bytes = 32 GiB
 *
 * One tensor larger than the whole 24 GiB card: nothing this process frees can make it fit. */
#include "kit.h"

int main(void)
{
    c10_init();
    if (torch_alloc_n(12, 512 * MiB, "from_pretrained"))
        return 1;
    if (!c10_empty(2 * GiB)) /* hidden states of the document */
        return torch_oom("forward", 2 * GiB);
    size_t logits = 32768ull * 262144ull * 4;
    if (!c10_empty(logits))
        return torch_oom("logits.float()", logits);
    return 0;
}
