/* Fatal paths: an unrecovered failure's stderr summary is printed, and a dump being
 * committed leaves no hidden file, even when the process dies by a signal, abort() or
 * _exit, where no destructor runs.
 *
 * The handlers are installed only once there is something to print or a dump is being
 * written, so a program that never fails keeps its signal dispositions untouched.  Each
 * chains to what was installed before: a program handler still runs, an ignored signal
 * stays ignored, and a default one still kills with the same signal (exit status, core).
 * A program that installs its own handler later simply replaces ours.  Everything done in
 * a handler is async-signal-safe (write, unlinkat, sigaction, sigpending, raise).  A signal a
 * program handler deals with (a runtime that faults on purpose) is no end: only one that will
 * end the process marks it dying (ends_after_handler). */
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

/* After a program handler returned: will this signal still end the process?  Only when it is
 * left to its default action (the handler reset it, or it was one-shot) and it comes again:
 * re-raised (pending now), or a hardware fault, whose instruction runs again on return.  A
 * handler that fixed the fault and returned (a JVM's null check, a Julia safepoint, a wasm
 * bounds check), or one that left by siglongjmp (never returning here), leaves no mark: the
 * process is not dying, nothing is printed, later dumps go where they always go. */
static bool ends_after_handler(int sig, const siginfo_t *si)
{
    struct sigaction now;
    if (sigaction(sig, NULL, &now) != 0 || (now.sa_flags & SA_SIGINFO) || now.sa_handler != SIG_DFL)
        return false;
    sigset_t pend;
    if (sigpending(&pend) == 0 && sigismember(&pend, sig))
        return true;
    return si && si->si_code > 0 && is_fault(sig) && sig != SIGABRT;
}

static void on_fatal(int sig, siginfo_t *si, void *uc)
{
    int saved = errno;
    const struct sigaction *p = &prev[sig];
    bool dfl = !(p->sa_flags & SA_SIGINFO) && p->sa_handler == SIG_DFL;
    /* the default action is the end; a program handler may carry on (handled faults, a TERM
     * handler that cleans up): then the end is decided once it returns, or by its exit(),
     * _exit() or abort(), which print themselves */
    if (dfl) {
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
    } else if (p->sa_handler == SIG_DFL) {
        sigaction(sig, p, NULL);
        /* a sent signal (kill, raise, abort) is sent again and kills once we return; a
         * hardware fault re-executes the instruction and faults again, now by default */
        if (!si || si->si_code <= 0 || !is_fault(sig))
            raise(sig);
    } else if (p->sa_handler != SIG_IGN) {
        p->sa_handler(sig);
    }
    if (!dfl && ends_after_handler(sig, si)) {
        og_dump_fatal();
        og_live_exit();
    }
    errno = saved;
}

static void arm(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fatal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof fatal_sigs / sizeof *fatal_sigs; i++) {
        int sig = fatal_sigs[i];
        if (sigaction(sig, &sa, &prev[sig]) != 0)
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
