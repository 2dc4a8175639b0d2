/* train.py -- started again after an earlier attempt "crashed"; the earlier kernel still runs:
 *
 *   model = Model().cuda()             # 6 GiB
 *   loss = model(batch).loss           # 4 GiB of activations: out of memory
 */
#include "kit.h"

int main(void)
{
    c10_init();
    if (torch_alloc_n(12, 512 * MiB, "model.cuda()"))
        return 1;
    if (torch_alloc_n(8, 512 * MiB, "forward"))
        return 1;
    return 0;
}
