/* Another user's Jupyter kernel on a shared server: it loaded a model on GPU $HOLD_DEVICE
 * ($HOLD_GIB GiB), signals readiness through $SCEN_READY and idles until it is killed. */
#include <fcntl.h>

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
    const char *r = getenv("SCEN_READY");
    if (r)
        close(open(r, O_CREAT | O_WRONLY, 0644));
    for (int i = 0; i < 600; i++)
        sleep(1);
    return 0;
}
