/* A program that never links the driver loads a library that does, with RTLD_GLOBAL: the driver
 * enters the process's global scope with it and no door of the shim (dlsym on the driver's handle,
 * cuGetProcAddress) is passed.  Every block must still be counted on the device that holds it. */
#include <cuda.h>

#include "check.h"

int main(int argc, char **argv)
{
    void *h = dlopen("libglobal_client.so", RTLD_NOW | RTLD_GLOBAL);
    CHECK(h != NULL, "dlopen libglobal_client.so: %s", dlerror());
    if (!h)
        return 1;
    int (*alloc)(int, size_t, CUdeviceptr *) = (int (*)(int, size_t, CUdeviceptr *))dlsym(h, "og_client_alloc");
    int (*release)(CUdeviceptr) = (int (*)(CUdeviceptr))dlsym(h, "og_client_free");
    CHECK(alloc && release, "dlsym on the client");
    if (!(alloc && release))
        return check_finish(argv[0]);
    CUdeviceptr p[40];
    for (int i = 0; i < 40; i++) /* both devices, the current one changing under the shim */
        CHECK(alloc(i % 2, (size_t)(i + 1) * 1048573, &p[i]) == 0, "alloc %d", i);
    for (int i = 0; i < 40; i += 3)
        CHECK(release(p[i]) == 0, "free %d", i);
    /* only now the truth and the shim's numbers: looking them up passes a door */
    if (check_setup() < 0)
        return 1;
    check_device(0, "global client, device 0");
    check_device(1, "global client, device 1");
    return check_finish(argv[0]);
}
