/* The functions of the rtld test libraries (librtld_*.so), which e2e_rtld calls directly or
 * finds with dlsym. */
#ifndef OG_E2E_RTLD_H
#define OG_E2E_RTLD_H
int og_rtld_probe(void);        /* defined by both librtld_next_a.so and librtld_next_b.so */
int og_rtld_next_value(void);   /* librtld_next_a.so: the next og_rtld_probe's answer */
int og_rtld_dep_only(void);     /* librtld_dep.so, a dependency of librtld_local.so only */
int og_rtld_local_lookup(void); /* librtld_local.so: og_rtld_dep_only through RTLD_DEFAULT */
#endif
