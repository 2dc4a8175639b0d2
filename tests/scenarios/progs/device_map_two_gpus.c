/* generate.py -- a 30B model in bf16 split over two 24 GiB GPUs with accelerate's
 * device_map="auto" (layers 0-23 on GPU 0, layers 24-47 + lm_head on GPU 1), then a long prompt:
 *
 *   model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16, device_map="auto")
 *   out = model.generate(**inputs, max_new_tokens=256)   # KV cache and logits land on GPU 1
 *
 * GPU 1 carries the lm_head, the logits and the KV cache of its layers and runs out; GPU 0 has
 * room.  This is a pipeline split of one model for inference, not nn.DataParallel: the fix is a
 * balanced device_map (max_memory), quantization or offload, not DistributedDataParallel. */
#include "kit.h"

int main(void)
{
    c10_init();
    if (torch_alloc_n(28, 512 * MiB, "from_pretrained (cuda:0)")) /* layers 0-23: 14 GiB on GPU 0 */
        return 1;
    c10_set_device(1);
    if (torch_alloc_n(28, 512 * MiB, "from_pretrained (cuda:1)")) /* layers 24-47: 14 GiB on GPU 1 */
        return 1;
    if (!c10_empty(2 * GiB)) /* lm_head (tied embedding copy) */
        return torch_oom("lm_head", 2 * GiB);
    c10_set_device(0);
    if (torch_alloc_n(4, 512 * MiB, "kv cache (cuda:0)")) /* KV cache of layers 0-23 */
        return 1;
    c10_set_device(1);
    if (torch_alloc_n(4, 512 * MiB, "kv cache (cuda:1)")) /* KV cache of layers 24-47 */
        return 1;
    if (!c10_empty(6 * GiB)) /* logits of the prompt, fp32 */
        return torch_oom("logits", 6 * GiB);
    return 0;
}
