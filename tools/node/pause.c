/* The node's sandbox ("pause") container: holds a Pod's namespaces open and does nothing else.
 *
 * Invariants: it sleeps until SIGTERM or SIGINT, then exits 0; as PID 1 of a shared PID
 * namespace it reaps every child that dies, so no zombie outlives its parent. The signals are
 * blocked outside sigsuspend(), so one arriving between the check and the sleep is not lost.
 * Built with `gcc -static` by tools/node/build.sh: its image holds this one file.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

static volatile sig_atomic_t stop;

static void on_signal(int sig) {
    if (sig == SIGTERM || sig == SIGINT) stop = 1;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "-v") == 0) {
        puts("declop pause");
        return 0;
    }
    sigset_t blocked, waiting;
    sigemptyset(&blocked);
    sigaddset(&blocked, SIGTERM);
    sigaddset(&blocked, SIGINT);
    sigaddset(&blocked, SIGCHLD);
    if (sigprocmask(SIG_BLOCK, &blocked, &waiting) < 0) return 1;
    sigdelset(&waiting, SIGTERM);
    sigdelset(&waiting, SIGINT);
    sigdelset(&waiting, SIGCHLD);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_NOCLDSTOP;
    if (sigaction(SIGTERM, &sa, NULL) < 0 || sigaction(SIGINT, &sa, NULL) < 0 ||
        sigaction(SIGCHLD, &sa, NULL) < 0)
        return 1;

    while (!stop) {
        sigsuspend(&waiting); /* returns after any handled signal, with the mask restored */
        while (waitpid(-1, NULL, WNOHANG) > 0) {
        }
    }
    return 0;
}
