/* Fatal paths: an unrecovered failure's stderr summary is printed, and a dump being
 * committed leaves no hidden file, even when the process dies by a signal, abort() or
 * _exit, where no destructor runs.
 *
 * The handlers are installed only once there is something to print or a dump is being
 * written, so a program that never fails keeps its signal dispositions untouched.  Each
 * chains to what was installed before: a program handler still runs, an ignored signal
 * stays ignored, and a default one still kills with the same signal (exit status, core).
 * A program that installs its own handler later simply replaces ours.  Everything done in
 * a handler is async-signal-safe (write, unlinkat, sigaction, raise).  A signal a program
 * handler deals with (a runtime that faults on purpose, even one that then resets the signal to
 * its default action) is no end: only a signal whose action is the end marks the process dying
 * (after_handler). */
#include "og.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static const int fatal_sigs[] = { SIGABRT, SIGSEGV, SIGBUS,  SIGFPE,  SIGILL, SIGTERM,
                                  SIGINT,  SIGHUP,  SIGQUIT, SIGPIPE, SIGXCPU };
static struct sigaction prev[NSIG];
static pthread_once_t arm_once = PTHREAD_ONCE_INIT;

static bool is_fault(int sig)
{
    return sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL || sig == SIGABRT;
}

static void on_fatal(int sig, siginfo_t *si, void *uc);
static int install(int sig, struct sigaction *old)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fatal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    return sigaction(sig, &sa, old);
}

/* Does `a` end the process when the signal comes?  The default action does; so does an ignored
 * hardware fault: its instruction runs again and the kernel, which cannot skip it, kills with the
 * default action. */
static bool ends(const struct sigaction *a, bool hw_fault)
{
    if (a->sa_flags & SA_SIGINFO)
        return false;
    return a->sa_handler == SIG_DFL || (hw_fault && a->sa_handler == SIG_IGN);
}

/* After a program handler returned, leaving the signal to its default action (it reset it, or it
 * was one-shot) or ignored: whether the process ends is not known here.  A handler that fixed the
 * fault (a JVM's null check, a Julia safepoint, a wasm bounds check) lets the instruction run
 * again, fine now; one that did not, or that re-raised, is followed by the same signal at once.
 * So nothing is marked now: this handler goes back in front of what the program chose, and
 * prints only if the signal comes again and its action is the end.  A handler that left by
 * siglongjmp never returns here; one that installed a handler of its own is left alone. */
static void after_handler(int sig, bool hw_fault)
{
    struct sigaction now;
    if (sigaction(sig, NULL, &now) != 0 || !ends(&now, hw_fault))
        return;
    prev[sig] = now;
    install(sig, NULL);
}

static void on_fatal(int sig, siginfo_t *si, void *uc)
{
    int saved = errno;
    const struct sigaction *p = &prev[sig];
    /* a hardware fault re-executes its instruction on return; a sent signal does not */
    bool hw_fault = si && si->si_code > 0 && is_fault(sig) && sig != SIGABRT;
    bool end = ends(p, hw_fault);
    /* the default action is the end; a program handler may carry on (handled faults, a TERM
     * handler that cleans up): then the end is decided once it returns, or by its exit(),
     * _exit() or abort(), which print themselves */
    if (end) {
        og_dump_fatal();
        og_live_exit();
    }
    if (p->sa_flags & SA_RESETHAND) {
        /* a one-shot handler (it re-raises to die): reset as if it had been called directly */
        struct sigaction reset;
        memset(&reset, 0, sizeof reset);
        reset.sa_handler = SIG_DFL;
        sigaction(sig, &reset, NULL);
    }
    if (p->sa_flags & SA_SIGINFO) {
        if (p->sa_sigaction)
            p->sa_sigaction(sig, si, uc);
    } else if (end) {
        sigaction(sig, p, NULL);
        /* a sent signal (kill, raise, abort) is sent again and kills once we return; a
         * hardware fault re-executes the instruction and faults again, now by its own action */
        if (!hw_fault)
            raise(sig);
    } else if (p->sa_handler != SIG_IGN && p->sa_handler != SIG_DFL) {
        p->sa_handler(sig);
    }
    if (!end)
        after_handler(sig, hw_fault);
    errno = saved;
}

static void arm(void)
{
    for (size_t i = 0; i < sizeof fatal_sigs / sizeof *fatal_sigs; i++) {
        int sig = fatal_sigs[i];
        if (install(sig, &prev[sig]) != 0)
            continue;
        /* ignored (nohup's SIGHUP): stays ignored */
        if (!(prev[sig].sa_flags & SA_SIGINFO) && prev[sig].sa_handler == SIG_IGN)
            sigaction(sig, &prev[sig], NULL);
    }
}

void og_fatal_arm(void) { pthread_once(&arm_once, arm); }

/* A fork child inherits the handlers and prev[]: nothing to redo. */

/* _exit and _Exit end the process without destructors: the summary is printed here. */
static _Noreturn void exit_now(int status)
{
    og_dump_fatal();
    og_live_exit();
    for (;;)
        syscall(SYS_exit_group, status);
}

OG_EXPORT void _exit(int status) { exit_now(status); }
OG_EXPORT void _Exit(int status) { exit_now(status); }
