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

/* the rows of common/framework_code.def, one array per kind */
#define OG_FRAMEWORK_CODE(package) package,
#define OG_STANDARD_LIBRARY(pattern)
#define OG_INSTALLED_PACKAGES(dir)
static const char *const framework_code[] = {
#include "framework_code.def"
};
#undef OG_FRAMEWORK_CODE
#undef OG_STANDARD_LIBRARY
#define OG_FRAMEWORK_CODE(package)
#define OG_STANDARD_LIBRARY(pattern) pattern,
static const char *const standard_library[] = {
#include "framework_code.def"
};
#undef OG_STANDARD_LIBRARY
#undef OG_INSTALLED_PACKAGES
#define OG_STANDARD_LIBRARY(pattern)
#define OG_INSTALLED_PACKAGES(dir) dir,
static const char *const installed_packages[] = {
#include "framework_code.def"
};
#undef OG_FRAMEWORK_CODE
#undef OG_STANDARD_LIBRARY
#undef OG_INSTALLED_PACKAGES

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

/* The end of `pattern` matched at s ('#': one or more digits), or NULL. */
static const char *pattern_at(const char *s, const char *pattern)
{
    for (const char *p = pattern; *p; p++) {
        if (*p == '#') {
            if (*s < '0' || *s > '9')
                return NULL;
            while (*s >= '0' && *s <= '9')
                s++;
        } else if (*s++ != *p)
            return NULL;
    }
    return s;
}

/* A directory of `rest` (up to its last '/') is one of the installed-package directories. */
static int below_installed_packages(const char *rest)
{
    for (const char *d = rest; *d; d++) {
        if (d != rest && d[-1] != '/')
            continue;
        for (size_t i = 0; i < sizeof installed_packages / sizeof *installed_packages; i++) {
            size_t n = strlen(installed_packages[i]);
            if (strncmp(d, installed_packages[i], n) == 0 && d[n] == '/')
                return 1;
        }
    }
    return 0;
}

int og_python_file_in_standard_library(const char *file)
{
    if (!file)
        return 0;
    for (const char *f = file; f; f = strchr(f, '/')) {
        if (*f == '/')
            f++;
        for (size_t i = 0; i < sizeof standard_library / sizeof *standard_library; i++) {
            const char *rest = pattern_at(f, standard_library[i]);
            if (rest)
                return !below_installed_packages(rest);
        }
    }
    return 0;
}

int og_python_file_not_program(const char *file)
{
    return og_python_file_in_framework(file) || og_python_file_in_standard_library(file);
}

int og_framework_of(const char *base, const char *path)
{
    enum { OG_LIB_BASE, OG_LIB_PATH };
    static const struct {
        int match;
        const char *pattern;
        enum og_framework fw;
    } libs[] = {
#define OG_FRAMEWORK_LIB(match, pattern, framework) { OG_LIB_##match, pattern, OG_FW_##framework },
#include "framework_libs.def"
#undef OG_FRAMEWORK_LIB
    };
    if (!base)
        return OG_FW_UNKNOWN;
    if (!path)
        path = base;
    for (size_t i = 0; i < sizeof libs / sizeof *libs; i++)
        if (libs[i].match == OG_LIB_PATH ? strstr(path, libs[i].pattern) != NULL
                                         : strncmp(base, libs[i].pattern, strlen(libs[i].pattern)) == 0)
            return libs[i].fw;
    return OG_FW_UNKNOWN;
}
