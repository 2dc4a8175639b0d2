/* tools/symbolize.h — frames of a dump turned into names and source lines, at report time.
 *
 * The shim records for each frame the library's path, its GNU build-id and the offset of
 * the address in it; nothing more is done while the program runs.  `oomguard report`
 * opens those files here (elfutils libdwfl): function names from the symbol tables or
 * DWARF, demangled; file:line and inlining from DWARF, also from separate debug files
 * (/usr/lib/debug/.build-id).  A file that is missing, or whose build-id is not the one
 * recorded (rebuilt since), is not used: the frame stays library+offset. */
#ifndef OG_SYMBOLIZE_H
#define OG_SYMBOLIZE_H

#include "dump.h"

enum og_sym_source {
    OG_SYM_NONE,   /* library+offset only */
    OG_SYM_DUMP,   /* names the dump itself carries (dynamic symbol, or symbolized before) */
    OG_SYM_SYMTAB, /* the library's symbol table (.symtab or .dynsym) */
    OG_SYM_DWARF,  /* debug information: name, file:line */
};

enum og_frame_kind {
    OG_FK_OTHER,     /* the program's, the framework's, a library's */
    OG_FK_RUNTIME,   /* CUDA driver/runtime, NVML, oomguard */
    OG_FK_ALLOCATOR, /* the framework's allocator (PyTorch's caching allocator, ...) */
    OG_FK_INTERP,    /* interpreter glue: CPython's eval loop, ffi_call, pybind11 dispatch */
};

struct og_sym {
    const char *function; /* demangled; NULL when unknown */
    const char *file;     /* source file as DWARF names it; NULL when unknown */
    int64_t line;         /* 0 when unknown */
    int inlined;          /* 1: inlined into `inlined_into` at this address */
    const char *inlined_into;
    const char *module; /* library base name, or NULL */
    char where[160];    /* "libfoo.so+0x1a2b" */
    int source;         /* enum og_sym_source */
    int kind;           /* enum og_frame_kind */
};

/* Fills *out for one frame; strings live until og_symbolize_reset(). */
void og_symbolize(const struct og_frame *f, struct og_sym *out);

/* A stack as reports show it: symbols, and the index of the "caller" (the first frame
 * outside the CUDA libraries and the framework's allocator; -1 if none).  syms has n
 * entries. */
int og_stack_symbolize(const struct og_frame *f, int n, struct og_sym *syms);

/* Length of the run of frames that reports fold into one line, starting at i: interpreter
 * glue, or the CUDA libraries (0 when syms[i] is neither). */
int og_fold_run(const struct og_sym *syms, int n, int i);
/* "interpreter frames" / "frames in the CUDA libraries" for a run starting at syms[i]. */
const char *og_fold_label(const struct og_sym *sym);

/* 1 when the stack is Python code only: interpreter frames (libpython, libffi, ctypes,
 * pybind11) and, around them, only the CUDA libraries, the framework's allocator and the
 * process's start (__libc_start_main, _start): reports show it as one line pointing at the
 * Python lines, not as native frames nobody wrote. */
int og_stack_python_only(const struct og_sym *syms, int n);
#define OG_PYTHON_CODE_LINE "Python code \u2014 see the Python lines"

/* `report --format json`: adds function, file, line, inlined to the frames of the document
 * (event.stack, top_sites[].frames) that this machine can symbolize.  Returns how many. */
int og_symbolize_json(cJSON *doc);

void og_symbolize_reset(void);

#endif
