/* Byte counts and framework names as people read them.  Shared by liboomguard.so and the
 * oomguard command (tools/tools.mk links this file's object too), so a dump and its report
 * spell both the same way.  Pure: no allocation, no state. */
#ifndef OG_HUMAN_H
#define OG_HUMAN_H

#include <stddef.h>

/* How many digits a count shows.  FIXED: two decimals from KiB up ("1.30 GiB", "512 B"), like
 * PyTorch's messages, for dumps and reports.  SHORT: what a sentence needs ("1.30 GiB",
 * "512 MiB", "12.5 MiB", "3.0 KiB", "17 B"). */
enum og_bytes_style { OG_BYTES_FIXED, OG_BYTES_SHORT };

/* Binary units up to EiB; a count that would round to 1024 of a unit is shown in the next one.
 * Negative or NaN counts show as 0 B: callers that know a count is missing say so themselves.
 * Returns buf. */
const char *og_bytes_fmt(char *buf, size_t n, double bytes, enum og_bytes_style style);

/* After a remedy folded under "also possible" because its own estimate cannot cover the shortfall
 * (remedies[].ranking.tier 3), in the text dump and in the report's text and HTML. */
#define OG_NOT_ENOUGH_ALONE " (not enough alone)"

enum og_framework { OG_FW_UNKNOWN, OG_FW_PYTORCH, OG_FW_JAX, OG_FW_TENSORFLOW, OG_FW_CUPY };

/* The name a dump writes (framework.name, OOMGUARD_FRAMEWORK): "pytorch", "jax", "tensorflow",
 * "cupy"; "unknown" for anything else. */
const char *og_framework_name(enum og_framework fw);
/* The reverse: OG_FW_UNKNOWN for NULL or a name that is none of the above. */
enum og_framework og_framework_from_name(const char *name);
/* The name people know: PyTorch, JAX, TensorFlow, CuPy; `unknown` for OG_FW_UNKNOWN. */
const char *og_framework_display(enum og_framework fw, const char *unknown);
/* enum og_framework of a loaded library from its base name and path (path NULL: the base name), by the one
 * table of the frameworks' native libraries (common/framework_libs.def); OG_FW_UNKNOWN when none */
int og_framework_of(const char *base, const char *path);

/* A Python file of a framework's own package (".../site-packages/torch/nn/modules/module.py",
 * ".../transformers/trainer.py": a directory named as a package of common/framework_code.def):
 * the failing Python line is the innermost frame outside them and the standard library, the program's. */
int og_python_file_in_framework(const char *file);
/* A file of the interpreter's standard library by its path (the OG_STANDARD_LIBRARY rows of
 * common/framework_code.def: "/usr/lib/python3.11/copy.py", "<frozen runpy>"; not a package installed
 * below it, ".../lib/python3.11/site-packages/..."). */
int og_python_file_in_standard_library(const char *file);
/* Not the program's own line: a framework's file or the standard library's.  The failing Python
 * line is the innermost frame of which this is false. */
int og_python_file_not_program(const char *file);

#endif
