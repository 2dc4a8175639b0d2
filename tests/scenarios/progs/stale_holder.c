/* The leftover of an earlier run: a Jupyter kernel (or a training run whose launcher died) that
 * still holds 60% of the card and does nothing.  Signals readiness with $SCEN_READY and sleeps
 * until it is killed. */
#include <fcntl.h>
#include <signal.h>

#include "kit.h"

int main(void)
{
    c10_init();
    for (int i = 0; i < 28; i++)          /* 14 GiB: with its context, 60% of 24 GiB */
        if (!c10_empty(512 * MiB))
            return 1;
    const char *r = getenv("SCEN_READY");
    if (r)
        close(open(r, O_CREAT | O_WRONLY, 0644));
    for (int i = 0; i < 600; i++)
        sleep(1);
    return 0;
}
