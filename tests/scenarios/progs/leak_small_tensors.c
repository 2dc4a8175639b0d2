/* chat_server.py -- a chatbot keeps each conversation's hidden state "for context" on the GPU;
 * nothing ever drops them (a dict keyed by session id that only grows):
 *
 *   sessions = {}
 *   for req in requests:                         # a busy server: ~2 ms per request
 *       with torch.inference_mode():
 *           h, out = model(req.tokens)           # 512 MiB of temporaries, back to the cache
 *       sessions[req.session] = h                # 768 KiB per request, kept forever
 *
 * A slow leak of small tensors: they are packed into the allocator's 2 MiB small-pool segments,
 * so the driver sees one new 2 MiB segment every few requests. */
#include "kit.h"

int main(void)
{
    c10_init();
    if (torch_alloc_n(44, 512 * MiB, "model")) /* the model: 22 GiB */
        return 1;
    for (int req = 0;; req++) {
        void *t = c10_empty(512 * MiB);
        if (!t)
            return torch_oom("forward", 512 * MiB);
        c10_free(t);
        if (!c10_empty(768 * 1024))
            return torch_oom("sessions[...] = h", 768 * 1024);
        usleep(2000);
    }
}
