/* generate.py -- a 10B-parameter model in bf16 from 20 safetensors shards on network storage:
 *
 *   model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16,
 *                                                device_map="cuda")    # 20 x 1 GiB, ~100 ms each
 *   out = model.generate(**tok(prompts, return_tensors="pt").to("cuda"), max_new_tokens=512)
 *
 * Loading takes ~2 s and fills 20 GiB of the 24 GiB card; the first generate() then needs a
 * 2 GiB KV cache and 2 GiB of activations: it really does not fit (short by ~0.5 GiB). */
#include "kit.h"

int main(void)
{
    c10_init();
    for (int shard = 0; shard < 20; shard++) {
        msleep(100); /* reading the shard from disk */
        if (!c10_empty(1 * GiB))
            return torch_oom("from_pretrained", 1 * GiB);
        printf("Loading checkpoint shards: %d/20\n", shard + 1);
    }
    if (!c10_empty(2 * GiB)) /* KV cache for the prompts */
        return torch_oom("generate: kv cache", 2 * GiB);
    if (!c10_empty(2 * GiB)) /* prefill activations */
        return torch_oom("generate: prefill", 2 * GiB);
    return 0;
}
