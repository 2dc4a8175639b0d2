/* Another user's Jupyter kernel on a shared server: it loaded a model on GPU $HOLD_DEVICE
 * ($HOLD_GIB GiB), signals readiness through $SCEN_READY and idles until it is killed. */
#include "kit.h"

int main(void)
{
    int dev = getenv("HOLD_DEVICE") ? atoi(getenv("HOLD_DEVICE")) : 0;
    int gib = getenv("HOLD_GIB") ? atoi(getenv("HOLD_GIB")) : 12;
    c10_set_device(dev);
    c10_init();
    for (int i = 0; i < 2 * gib; i++)
        if (!c10_empty(512 * MiB))
            return 1;
    return hold_until_killed();
}
