/* Report-time symbolization (see symbolize.h).  One libdwfl session per library file, opened
 * on first use; one cached answer per (library, build-id, offset).  The demangler is the C++
 * runtime's (__cxa_demangle, the ABI's C entry point: no C++ code here). */
#include "symbolize.h"

#include <elfutils/libdw.h>
#include <elfutils/libdwelf.h>
#include <elfutils/libdwfl.h>
#include <dwarf.h>
#include <fcntl.h>
#include <gelf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uthash.h>

char *__cxa_demangle(const char *mangled, char *buf, size_t *len, int *status);

struct og_module {
    char *key;  /* path "\n" build-id */
    Dwfl *dwfl; /* NULL: no usable file on this machine */
    Dwfl_Module *m;
    GElf_Addr link_base; /* first PT_LOAD's page: where the recorded offsets start */
    UT_hash_handle hh;
};

struct og_cached {
    char *key; /* module key "\n" offset */
    struct og_sym sym;
    UT_hash_handle hh;
};

static struct og_module *modules;
static struct og_cached *cached;
static char *debuginfo_path;  /* libdwfl's search path: next to the file, .debug/, debug roots */
static char debug_root[4096]; /* OOMGUARD_DEBUG_DIR (a /usr/lib/debug-like tree), or "" */

static const Dwfl_Callbacks callbacks = {
    .find_elf = dwfl_build_id_find_elf,
    .find_debuginfo = dwfl_standard_find_debuginfo,
    .section_address = dwfl_offline_section_address,
    .debuginfo_path = &debuginfo_path,
};

static char *demangle(const char *name)
{
    if (!name)
        return NULL;
    char *plain = strndup(name, strcspn(name, "@")); /* "memcpy@@GLIBC_2.14": the version is noise */
    if (plain && plain[0] == '_' && plain[1] == 'Z') {
        int status = -1;
        char *d = __cxa_demangle(plain, NULL, NULL, &status);
        if (d && status == 0) {
            free(plain);
            return d;
        }
        free(d);
    }
    return plain;
}

/* The file's GNU build-id (hex) and the page of its first PT_LOAD; 0 when not an ELF file. */
static int elf_facts(const char *file, char hex[41], GElf_Addr *link_base)
{
    struct stat st;
    if (stat(file, &st) != 0 || !S_ISREG(st.st_mode))
        return 0;
    int fd = open(file, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    int ok = 0;
    Elf *elf = elf_begin(fd, ELF_C_READ_MMAP, NULL);
    size_t nph;
    if (elf && elf_kind(elf) == ELF_K_ELF && elf_getphdrnum(elf, &nph) == 0) {
        hex[0] = 0;
        const void *id;
        ssize_t len = dwelf_elf_gnu_build_id(elf, &id);
        for (ssize_t i = 0; i < len && i < 20; i++)
            snprintf(hex + 2 * i, 3, "%02x", ((const unsigned char *)id)[i]);
        for (size_t i = 0; i < nph; i++) {
            GElf_Phdr ph;
            if (gelf_getphdr(elf, (int)i, &ph) && ph.p_type == PT_LOAD) {
                /* the loader maps the first segment from its page: offsets count from there */
                *link_base = ph.p_vaddr & ~(GElf_Addr)4095;
                ok = 1;
                break;
            }
        }
    }
    if (elf)
        elf_end(elf);
    close(fd);
    return ok;
}

static struct og_module *module_open(const char *path, const char *build_id)
{
    size_t klen = strlen(path) + 1 + (build_id ? strlen(build_id) : 0) + 1;
    char *key = malloc(klen);
    if (!key)
        return NULL;
    snprintf(key, klen, "%s\n%s", path, build_id ? build_id : "");
    struct og_module *mod;
    HASH_FIND_STR(modules, key, mod);
    if (mod) {
        free(key);
        return mod;
    }
    mod = calloc(1, sizeof *mod);
    if (!mod) {
        free(key);
        return NULL;
    }
    mod->key = key;
    HASH_ADD_KEYPTR(hh, modules, mod->key, strlen(mod->key), mod);
    if (elf_version(EV_CURRENT) == EV_NONE)
        return mod;
    if (!debuginfo_path) {
        const char *root = getenv("OOMGUARD_DEBUG_DIR");
        if (root && root[0] == '/' && strlen(root) < sizeof debug_root && !strchr(root, ':'))
            snprintf(debug_root, sizeof debug_root, "%s", root);
        static char dpath[4200];
        snprintf(dpath, sizeof dpath, ":.debug%s%s:/usr/lib/debug", debug_root[0] ? ":" : "", debug_root);
        debuginfo_path = dpath;
    }

    /* The recorded file if it is still the same build; else its separate debug file. */
    char cand[3][4200];
    int ncand = 0;
    if (path[0] == '/')
        snprintf(cand[ncand++], sizeof cand[0], "%s", path);
    size_t idlen = build_id ? strlen(build_id) : 0;
    if (idlen > 2 && idlen <= 40 && strspn(build_id, "0123456789abcdef") == idlen) {
        if (debug_root[0])
            snprintf(cand[ncand++], sizeof cand[0], "%s/.build-id/%.2s/%s.debug", debug_root, build_id, build_id + 2);
        snprintf(cand[ncand++], sizeof cand[0], "/usr/lib/debug/.build-id/%.2s/%s.debug", build_id, build_id + 2);
    }
    for (int c = 0; c < ncand && !mod->dwfl; c++) {
        char hex[41] = "";
        GElf_Addr base = 0;
        if (!elf_facts(cand[c], hex, &base))
            continue;
        if (idlen && strcmp(hex, build_id) != 0)
            continue; /* rebuilt since the dump: its addresses mean something else */
        Dwfl *dwfl = dwfl_begin(&callbacks);
        if (!dwfl)
            break;
        dwfl_report_begin(dwfl);
        const char *slash = strrchr(path, '/');
        Dwfl_Module *m = dwfl_report_elf(dwfl, slash ? slash + 1 : path, cand[c], -1, 0, false);
        dwfl_report_end(dwfl, NULL, NULL);
        if (!m) {
            dwfl_end(dwfl);
            continue;
        }
        mod->dwfl = dwfl;
        mod->m = m;
        mod->link_base = base;
    }
    return mod;
}

static const char *die_name(Dwarf_Die *die, char **owned)
{
    Dwarf_Attribute attr;
    const char *s = NULL;
    /* the linkage name demangles to the qualified name with its parameters */
    if (dwarf_attr_integrate(die, DW_AT_linkage_name, &attr) ||
        dwarf_attr_integrate(die, DW_AT_MIPS_linkage_name, &attr))
        s = dwarf_formstring(&attr);
    if (!s && dwarf_attr_integrate(die, DW_AT_name, &attr))
        s = dwarf_formstring(&attr);
    *owned = demangle(s);
    return *owned;
}

static void lookup(struct og_module *mod, uint64_t offset, struct og_sym *out)
{
    GElf_Addr bias = 0;
    if (!dwfl_module_getelf(mod->m, &bias))
        return;
    /* a return address: the call is the byte before it */
    GElf_Addr addr = bias + mod->link_base + offset - (offset ? 1 : 0);
    GElf_Off off;
    GElf_Sym sym;
    const char *name = dwfl_module_addrinfo(mod->m, addr, &off, &sym, NULL, NULL, NULL);
    if (name) {
        out->function = demangle(name);
        out->source = OG_SYM_SYMTAB;
    }
    Dwarf_Addr cubias = 0;
    Dwarf_Die *cu = dwfl_module_addrdie(mod->m, addr, &cubias);
    if (cu) {
        Dwarf_Die *scopes = NULL;
        int ns = dwarf_getscopes(cu, addr - cubias, &scopes);
        int inner = -1;
        for (int i = 0; i < ns && inner < 0; i++) {
            int tag = dwarf_tag(&scopes[i]);
            if (tag == DW_TAG_subprogram || tag == DW_TAG_inlined_subroutine)
                inner = i;
        }
        if (inner >= 0 && dwarf_tag(&scopes[inner]) == DW_TAG_inlined_subroutine) {
            char *fn;
            if (die_name(&scopes[inner], &fn)) {
                free((char *)out->function);
                out->function = fn;
                out->inlined = 1;
            }
            /* the function it was inlined into: the nearest function around the inlined
             * instance in the concrete tree (getscopes lists the abstract one next) */
            Dwarf_Die *up = NULL;
            int nup = dwarf_getscopes_die(&scopes[inner], &up);
            for (int i = 1; i < nup; i++) {
                int tag = dwarf_tag(&up[i]);
                if (tag == DW_TAG_subprogram || tag == DW_TAG_inlined_subroutine) {
                    char *outer;
                    if (die_name(&up[i], &outer))
                        out->inlined_into = outer;
                    break;
                }
            }
            free(up);
        } else if (inner >= 0 && !out->function) {
            char *fn;
            if (die_name(&scopes[inner], &fn))
                out->function = fn;
        }
        free(scopes);
    }
    Dwfl_Line *ln = dwfl_module_getsrc(mod->m, addr);
    int line = 0;
    const char *file = ln ? dwfl_lineinfo(ln, NULL, &line, NULL, NULL, NULL) : NULL;
    if (file && line > 0) {
        out->file = strdup(file);
        out->line = line;
        out->source = OG_SYM_DWARF;
    }
}

static int prefix(const char *s, const char *p) { return s && strncmp(s, p, strlen(p)) == 0; }

static int classify(const struct og_sym *s)
{
    static const char *const runtime[] = { "libcuda.so", "libcudart", "libnvidia-ml", "liboomguard" };
    for (size_t i = 0; i < sizeof runtime / sizeof *runtime; i++)
        if (prefix(s->module, runtime[i]))
            return OG_FK_RUNTIME;
    const char *fn = s->function ? s->function : "";
    if (prefix(s->module, "libc10_cuda") || prefix(s->module, "libc10.") || strstr(fn, "CachingAllocator") ||
        strstr(fn, "BFCAllocator") || strstr(fn, "StreamExecutorMemoryAllocator") || strstr(fn, "MemoryPool::malloc"))
        return OG_FK_ALLOCATOR;
    static const char *const interp_mod[] = { "libpython", "python", "libffi", "_ctypes" };
    for (size_t i = 0; i < sizeof interp_mod / sizeof *interp_mod; i++)
        if (prefix(s->module, interp_mod[i]))
            return OG_FK_INTERP;
    static const char *const interp_fn[] = {
        "_PyEval_",   "PyEval_",           "_PyObject_", "PyObject_Call", "PyObject_Vectorcall", "_PyFunction_",
        "cfunction_", "method_vectorcall", "slot_tp_",   "ffi_call",      "pybind11::"
    };
    for (size_t i = 0; i < sizeof interp_fn / sizeof *interp_fn; i++)
        if (prefix(fn, interp_fn[i]))
            return OG_FK_INTERP;
    if (strstr(fn, "pybind11::cpp_function") || strstr(fn, "pybind11::detail::"))
        return OG_FK_INTERP;
    return OG_FK_OTHER;
}

/* The dump's own (dynamic, mangled) symbol name, demangled once. */
static struct og_cached *dump_names;
static const char *dump_symbol(const char *name)
{
    if (name[0] != '_' || name[1] != 'Z')
        return name;
    struct og_cached *c;
    HASH_FIND_STR(dump_names, name, c);
    if (!c && (c = calloc(1, sizeof *c))) {
        c->key = strdup(name);
        c->sym.function = demangle(name);
        if (!c->key || !c->sym.function) {
            free(c->key);
            free((char *)c->sym.function);
            free(c);
            return name;
        }
        HASH_ADD_KEYPTR(hh, dump_names, c->key, strlen(c->key), c);
    }
    return c ? c->sym.function : name;
}

static int env_off(void)
{
    const char *e = getenv("OOMGUARD_SYMBOLIZE");
    return e && strcmp(e, "0") == 0;
}

void og_symbolize(const struct og_frame *f, struct og_sym *out)
{
    memset(out, 0, sizeof *out);
    const char *lib = f->library && *f->library ? f->library : NULL;
    if (!lib && f->path) {
        const char *slash = strrchr(f->path, '/');
        lib = slash ? slash + 1 : f->path;
    }
    uint64_t offset = 0;
    int have_off = f->offset && sscanf(f->offset, "%lx", &offset) == 1;
    if (lib && have_off)
        snprintf(out->where, sizeof out->where, "%.120s+0x%llx", lib, (unsigned long long)offset);
    else
        snprintf(out->where, sizeof out->where, "%.120s", f->ip ? f->ip : lib ? lib : "?");

    /* symbolized already (the dump says so), or this machine has the file */
    struct og_cached *c = NULL;
    char *key = NULL;
    if (!f->function && f->path && have_off && !env_off()) {
        size_t klen = strlen(f->path) + (f->build_id ? strlen(f->build_id) : 0) + 24;
        key = malloc(klen);
        if (key) {
            snprintf(key, klen, "%s\n%s\n%llx", f->path, f->build_id ? f->build_id : "", (unsigned long long)offset);
            HASH_FIND_STR(cached, key, c);
        }
        if (!c && key && (c = calloc(1, sizeof *c))) {
            c->key = key;
            key = NULL;
            struct og_module *mod = module_open(f->path, f->build_id);
            if (mod && mod->dwfl)
                lookup(mod, offset, &c->sym);
            HASH_ADD_KEYPTR(hh, cached, c->key, strlen(c->key), c);
        }
        free(key);
    }
    if (c && c->sym.source != OG_SYM_NONE) {
        out->function = c->sym.function;
        out->file = c->sym.file;
        out->line = c->sym.line;
        out->inlined = c->sym.inlined;
        out->inlined_into = c->sym.inlined_into;
        out->source = c->sym.source;
    } else if (f->function || (f->symbol && *f->symbol)) {
        /* a name the writing process resolved may still be mangled (it had no demangler) */
        out->function = dump_symbol(f->function ? f->function : f->symbol);
        out->file = f->file;
        out->line = f->line > 0 ? f->line : 0;
        out->inlined = f->inlined == 1;
        out->inlined_into = f->inlined_into;
        out->source = OG_SYM_DUMP;
    }
    out->module = lib;
    out->kind = classify(out);
}

int og_stack_symbolize(const struct og_frame *f, int n, struct og_sym *syms)
{
    int caller = -1;
    for (int i = 0; i < n; i++) {
        og_symbolize(&f[i], &syms[i]);
        if (caller < 0 && syms[i].kind == OG_FK_OTHER)
            caller = i;
    }
    return caller;
}

int og_fold_run(const struct og_sym *syms, int n, int i)
{
    if (i >= n || (syms[i].kind != OG_FK_INTERP && syms[i].kind != OG_FK_RUNTIME))
        return 0;
    int j = i;
    while (j < n && syms[j].kind == syms[i].kind)
        j++;
    return j - i;
}

int og_stack_python_only(const struct og_sym *syms, int n)
{
    static const char *const start[] = {
        "__libc_start_call_main", "__libc_start_main", "_start", "start_thread", "clone", "__clone", "__GI___clone"
    };
    int interp = 0;
    for (int i = 0; i < n; i++) {
        if (syms[i].kind == OG_FK_INTERP) {
            interp = 1;
            continue;
        }
        if (syms[i].kind == OG_FK_RUNTIME || syms[i].kind == OG_FK_ALLOCATOR)
            continue;
        int glue = 0;
        for (size_t k = 0; k < sizeof start / sizeof *start && !glue; k++)
            glue = syms[i].function && !strcmp(syms[i].function, start[k]);
        if (!glue)
            return 0;
    }
    return interp;
}

const char *og_fold_label(const struct og_sym *sym)
{
    return sym->kind == OG_FK_INTERP ? "interpreter frames" : "frames in the CUDA libraries";
}

void og_symbolize_reset(void)
{
    struct og_cached *c, *ct;
    HASH_ITER(hh, cached, c, ct)
    {
        HASH_DEL(cached, c);
        free((char *)c->sym.function);
        free((char *)c->sym.file);
        free((char *)c->sym.inlined_into);
        free(c->key);
        free(c);
    }
    HASH_ITER(hh, dump_names, c, ct)
    {
        HASH_DEL(dump_names, c);
        free((char *)c->sym.function);
        free(c->key);
        free(c);
    }
    struct og_module *m, *mt;
    HASH_ITER(hh, modules, m, mt)
    {
        HASH_DEL(modules, m);
        if (m->dwfl)
            dwfl_end(m->dwfl);
        free(m->key);
        free(m);
    }
}

/* One frame object of the document: symbolized keys added unless it has them already. */
static int json_frame(cJSON *fo)
{
    if (!cJSON_IsObject(fo) || cJSON_GetObjectItemCaseSensitive(fo, "function"))
        return 0;
    struct og_frame f;
    memset(&f, 0, sizeof f);
    f.line = -1;
    f.inlined = -1;
    f.ip = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(fo, "ip"));
    f.symbol = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(fo, "symbol"));
    f.library = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(fo, "library"));
    f.offset = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(fo, "offset"));
    f.path = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(fo, "path"));
    f.build_id = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(fo, "build_id"));
    struct og_sym y;
    og_symbolize(&f, &y);
    if (y.source != OG_SYM_SYMTAB && y.source != OG_SYM_DWARF)
        return 0;
    cJSON_AddStringToObject(fo, "function", y.function);
    if (y.file && y.line > 0) {
        cJSON_AddStringToObject(fo, "file", y.file);
        cJSON_AddNumberToObject(fo, "line", (double)y.line);
    }
    cJSON_AddBoolToObject(fo, "inlined", y.inlined == 1);
    if (y.inlined == 1 && y.inlined_into)
        cJSON_AddStringToObject(fo, "inlined_into", y.inlined_into);
    return 1;
}

int og_symbolize_json(cJSON *doc)
{
    if (env_off())
        return 0;
    int n = 0;
    cJSON *fo;
    cJSON *stack = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(doc, "event"), "stack");
    cJSON_ArrayForEach(fo, stack) n += json_frame(fo);
    cJSON *site;
    cJSON_ArrayForEach(site, cJSON_GetObjectItemCaseSensitive(doc, "top_sites"))
    {
        cJSON_ArrayForEach(fo, cJSON_GetObjectItemCaseSensitive(site, "frames")) n += json_frame(fo);
    }
    return n;
}
