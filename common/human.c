/* See human.h. */
#include "human.h"

#include <stdio.h>
#include <string.h>

const char *og_bytes_fmt(char *buf, size_t n, double bytes, enum og_bytes_style style)
{
    static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
    enum { TOP = sizeof unit / sizeof *unit - 1 };
    const double k = 1024.0;
    double v = bytes >= 0 ? bytes : 0; /* also NaN */
    int u = 0, digits = 0;
    while (v >= k && u < TOP) {
        v /= k;
        u++;
    }
    for (;;) {
        if (u == 0)
            digits = 0;
        else if (style == OG_BYTES_FIXED || u >= 3)
            digits = 2;
        else
            digits = u == 2 && v >= 100 ? 0 : 1;
        /* 1023.996 MiB would print as "1024.00 MiB": take the next unit first */
        double half = digits == 0 ? 0.5 : digits == 1 ? 0.05 : 0.005;
        if (u == TOP || v < k - half)
            break;
        v /= k;
        u++;
    }
    if (n)
        snprintf(buf, n, "%.*f %s", digits, v, unit[u]);
    return buf;
}

static const struct {
    const char *name, *display;
} frameworks[] = {
    [OG_FW_PYTORCH] = { "pytorch", "PyTorch" },
    [OG_FW_JAX] = { "jax", "JAX" },
    [OG_FW_TENSORFLOW] = { "tensorflow", "TensorFlow" },
    [OG_FW_CUPY] = { "cupy", "CuPy" },
};
#define OG_FW_END ((int)(sizeof frameworks / sizeof *frameworks))

const char *og_framework_name(enum og_framework fw)
{
    return (int)fw > OG_FW_UNKNOWN && (int)fw < OG_FW_END ? frameworks[fw].name : "unknown";
}

enum og_framework og_framework_from_name(const char *name)
{
    for (int fw = OG_FW_UNKNOWN + 1; name && fw < OG_FW_END; fw++)
        if (strcmp(name, frameworks[fw].name) == 0)
            return (enum og_framework)fw;
    return OG_FW_UNKNOWN;
}

const char *og_framework_display(enum og_framework fw, const char *unknown)
{
    return (int)fw > OG_FW_UNKNOWN && (int)fw < OG_FW_END ? frameworks[fw].display : unknown;
}

static const char *const framework_code[] = {
#define OG_FRAMEWORK_CODE(package) package,
#include "framework_code.def"
#undef OG_FRAMEWORK_CODE
};

int og_python_file_in_framework(const char *file)
{
    if (!file)
        return 0;
    for (const char *f = file; (f = strchr(f, '/')) != NULL; f++) /* each directory: "/pkg/" */
        for (size_t i = 0; i < sizeof framework_code / sizeof *framework_code; i++) {
            size_t n = strlen(framework_code[i]);
            if (strncmp(f + 1, framework_code[i], n) == 0 && f[1 + n] == '/')
                return 1;
        }
    return 0;
}
