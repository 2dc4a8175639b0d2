// A program whose failing cudaMalloc comes through a static function, an inlined function and
// a namespaced template, for tests/stacks/run_tests.sh: the report must name them
// (demangled), with file:line when built with -g.
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

static volatile int sink;

// static: only .symtab (or DWARF) names it
__attribute__((always_inline)) static inline void *inline_step(size_t n)
{
    void *p = nullptr;
    cudaError_t e = cudaMalloc(&p, n);   // SYMPROG_LINE_MALLOC
    return e == cudaSuccess ? p : nullptr;
}

__attribute__((noinline)) static void *static_helper(size_t n)
{
    void *p = inline_step(n);
    sink++;
    return p;
}

namespace og_test {
template <typename T> struct Pool {
    __attribute__((noinline)) static T *grab(size_t count)
    {
        T *p = static_cast<T *>(static_helper(count * sizeof(T)));   // SYMPROG_LINE_GRAB
        sink++;
        return p;
    }
};
}  // namespace og_test

int main(int argc, char **argv)
{
    size_t gib = (size_t)1 << 30;
    size_t n = argc > 1 ? strtoull(argv[1], nullptr, 10) : 64;   // GiB: more than the GPU has
    float *p = og_test::Pool<float>::grab(n * gib / sizeof(float));
    printf("%s\n", p ? "allocated" : "out of memory");
    return p ? 1 : 0;
}
