"""Shell: the native action launcher, compiled on first use, with the sh + nsenter fallback.

One small C program does what the fallback chain ``sh`` (join cgroups) -> ``nsenter`` (enter
namespaces) -> ``env -i`` (set the environment) does with three execs, which roughly halves
the cost of entering a sandbox. It is built with the host's C compiler into a per-user
cache (``$XDG_CACHE_HOME/arl_tangram``, keyed by the source hash) the first time a manager
starts; without a compiler the manager uses the fallback, with the same semantics.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading

log = logging.getLogger(__name__)

SOURCE = r"""/* arl-tangram action launcher: join cgroups, enter a sandbox, run a program.
 *
 * usage: launcher N CGFILE... INIT_PID UID GID CWD TIMEOUT_MS M KEY=VALUE... -- ARGV...
 * Writes its own pid into the N cgroup.procs files (so the program starts inside the
 * sandbox's limits), enters every namespace of INIT_PID (user last), drops to UID/GID,
 * forks (the pid namespace applies to children), and the child execs ARGV in CWD with
 * exactly the M environment entries. The parent waits and mirrors the child's status.
 * Exit 125 with "arl-tangram-launch:" on stderr when something before exec fails.
 * With $ARL_TANGRAM_NOTICE_FD naming an open fd (the started notice; the launcher's own
 * environment, not the program's), the parent writes one byte on it once the child
 * is forked, then closes it; the child never inherits it. The cgroup joins before the fork
 * can queue on the kernel's global cgroup lock for seconds under load: that wait is the
 * platform's, not the program's, so the program's clock starts at the fork.
 * Armed (``armed.py``): with $ARL_TANGRAM_ARMED set and a notice fd (a socket), argv ends
 * after GID; once joined, in the namespaces and dropped to UID/GID, the launcher reads the
 * rest of its arguments from the notice fd (a 4-byte native-endian length, then that many
 * bytes of NUL-terminated strings: CWD TIMEOUT_MS M KEY=VALUE... -- ARGV...) and goes on as
 * above. EOF instead (disarmed) exits 0. Its joins are then done before the run is due,
 * off the run's path, and while it waits it is a process of the sandbox's user.
 * With TIMEOUT_MS > 0 the child leads its own process group and, TIMEOUT_MS after the
 * fork, the parent SIGKILLs that group, reaps the child, writes
 * "arl-tangram-launch: timeout" on stderr and exits 124: the deadline is kept by the kernel
 * even when the manager's own threads run late (it then kills the rest through the cgroup).
 * SIGTERM is the manager's stop: before the fork it ends the launcher (nothing runs yet);
 * after it the parent SIGKILLs the child (and its group), reaps it and mirrors its status.
 * The child must die while the parent lives: orphaned, it is reparented to the host's init
 * (the parent is outside the sandbox's pid namespace), whose late reaping left its zombie
 * holding a place in the sandbox's pids budget, and the next run could not fork.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* chown dac_override fowner fsetid kill setgid setuid setpcap net_bind_service net_raw
 * sys_chroot mknod audit_write setfcap */
#define KEEP_CAPS ((1ULL << 0) | (1ULL << 1) | (1ULL << 3) | (1ULL << 4) | (1ULL << 5) | (1ULL << 6) | (1ULL << 7) | \
                   (1ULL << 8) | (1ULL << 10) | (1ULL << 13) | (1ULL << 18) | (1ULL << 27) | (1ULL << 29) | (1ULL << 31))

static void die(const char *what, const char *arg) {
    fprintf(stderr, "arl-tangram-launch: %s %s: %s\n", what, arg ? arg : "", strerror(errno));
    _exit(125);
}

static int to_int(const char *s) { return (int)strtol(s, NULL, 10); }

/* 1 when the child exited (its status in *status), 0 at the deadline (none when end is
 * NULL), -1 at the manager's stop (SIGTERM); `waited` (SIGCHLD, SIGTERM) is blocked */
static int wait_until(pid_t child, const struct timespec *end, const sigset_t *waited, int *status) {
    for (;;) {
        pid_t r = waitpid(child, status, WNOHANG);
        if (r == child) return 1;
        if (r < 0 && errno != EINTR) die("waitpid", NULL);
        int sig;
        if (end == NULL) {
            sig = sigwaitinfo(waited, NULL);
        } else {
            struct timespec now;
            clock_gettime(CLOCK_MONOTONIC, &now);
            long long left_ns = (long long)(end->tv_sec - now.tv_sec) * 1000000000LL + (end->tv_nsec - now.tv_nsec);
            if (left_ns <= 0) return 0;
            struct timespec left = {(time_t)(left_ns / 1000000000LL), (long)(left_ns % 1000000000LL)};
            sig = sigtimedwait(waited, NULL, &left);
        }
        if (sig == SIGTERM) return -1; /* else a SIGCHLD, the time left, or EINTR: look again */
    }
}

/* read exactly n bytes; 0 at EOF before any, -1 on error or a short message */
static int read_full(int fd, void *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)buf + got, n - got);
        if (r == 0) return got == 0 ? 0 : -1;
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        got += (size_t)r;
    }
    return 1;
}

/* an armed launcher's remaining arguments (see the header); exits 0 when disarmed (EOF) */
static char **read_args(int fd, int *argc) {
    unsigned int n;
    int r = read_full(fd, &n, sizeof n);
    if (r == 0) _exit(0);
    if (r < 0 || n == 0 || n > (64u << 20)) { errno = EPROTO; die("armed arguments", NULL); }
    char *data = malloc((size_t)n + 1);
    if (data == NULL || read_full(fd, data, n) != 1) { errno = EPROTO; die("armed arguments", NULL); }
    data[n] = '\0';
    int count = 0;
    for (unsigned int k = 0; k < n; k++) count += data[k] == '\0';
    char **out = calloc((size_t)count + 1, sizeof *out);
    if (out == NULL) die("calloc", NULL);
    char *p = data;
    for (int k = 0; k < count; k++) {
        out[k] = p;
        p += strlen(p) + 1;
    }
    *argc = count;
    return out;
}

int main(int argc, char **argv) {
    struct timespec end;
    const char *notice_env = getenv("ARL_TANGRAM_NOTICE_FD");
    int notice = notice_env != NULL ? to_int(notice_env) : -1; /* the started notice, if given */
    if (notice >= 0 && fcntl(notice, F_SETFD, FD_CLOEXEC) != 0) notice = -1;
    /* user last: bwrap nests the init's user namespace below the one owning the others,
     * so they are entered while still privileged in the host namespace */
    static const char *ns_names[] = {"ipc", "uts", "net", "pid", "mnt", "user"};
    enum { NUM_NS = 6 };
    int i = 1, ns_fd[NUM_NS];
    char buf[64];
    int armed = getenv("ARL_TANGRAM_ARMED") != NULL && notice >= 0;
    if (argc < (armed ? 5 : 8)) { errno = EINVAL; die("usage", NULL); }
    int n_join = to_int(argv[i++]);
    int len = snprintf(buf, sizeof buf, "%d", (int)getpid());
    for (int k = 0; k < n_join && i < argc; k++, i++) {
        int fd = open(argv[i], O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, buf, len) != len) die("cannot join cgroup", argv[i]);
        close(fd);
    }
    if (i + 3 > argc) { errno = EINVAL; die("usage", NULL); }
    const char *init_pid = argv[i++];
    uid_t uid = (uid_t)to_int(argv[i++]);
    gid_t gid = (gid_t)to_int(argv[i++]);
    for (int k = 0; k < NUM_NS; k++) {
        char path[96];
        snprintf(path, sizeof path, "/proc/%s/ns/%s", init_pid, ns_names[k]);
        ns_fd[k] = open(path, O_RDONLY | O_CLOEXEC);
        if (ns_fd[k] < 0) die("cannot open", path);
    }
    if (setgroups(0, NULL) != 0) die("setgroups", NULL);
    for (int k = 0; k < NUM_NS; k++) {
        if (setns(ns_fd[k], 0) != 0) die("setns", ns_names[k]);
        close(ns_fd[k]);
    }
    /* root inside an image keeps only a container runtime's default capabilities (what
     * apt, pip and chown need), never CAP_SYS_ADMIN & co, even in its own namespace */
    for (int cap = 0; cap <= 63; cap++) {
        if (KEEP_CAPS & (1ULL << cap)) continue;
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL) die("capbset drop", NULL);
    }
    if (setgid(gid) != 0) die("setgid", NULL);
    if (setuid(uid) != 0) die("setuid", NULL);
    if (armed) { /* the sandbox's user from here on: it waits as one of its processes would */
        argv = read_args(notice, &argc);
        i = 0;
    }
    if (i + 3 > argc) { errno = EINVAL; die("usage", NULL); }
    const char *cwd = argv[i++];
    long long timeout_ms = strtoll(argv[i++], NULL, 10);
    int n_env = to_int(argv[i++]);
    char **envp = &argv[i];
    i += n_env;
    if (i >= argc || strcmp(argv[i], "--") != 0 || i + 1 >= argc) { errno = EINVAL; die("usage", NULL); }
    argv[i] = NULL; /* terminates envp */
    char **prog = &argv[i + 1];
    sigset_t waited, old_mask;
    sigemptyset(&waited);
    sigaddset(&waited, SIGCHLD);
    sigaddset(&waited, SIGTERM);
    sigprocmask(SIG_BLOCK, &waited, &old_mask); /* before fork: none is lost */
    clock_gettime(CLOCK_MONOTONIC, &end); /* the deadline counts from the fork, after the joins */
    end.tv_sec += (time_t)(timeout_ms / 1000);
    end.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (end.tv_nsec >= 1000000000L) { end.tv_sec++; end.tv_nsec -= 1000000000L; }
    pid_t child = fork();
    if (child < 0) die("fork", NULL);
    if (child > 0 && notice >= 0) {
        signal(SIGPIPE, SIG_IGN); /* a reader that went away changes nothing */
        ssize_t ignored = write(notice, "s", 1);
        (void)ignored;
        close(notice);
    }
    if (child == 0) {
        sigprocmask(SIG_SETMASK, &old_mask, NULL);
        if (timeout_ms > 0) setpgid(0, 0);
        if (chdir(cwd) != 0) {
            fprintf(stderr, "cannot change directory to %s: %s\n", cwd, strerror(errno));
            _exit(126);
        }
        environ = envp;
        execvpe(prog[0], prog, envp);
        fprintf(stderr, "%s: %s\n", prog[0], strerror(errno));
        _exit(errno == ENOENT ? 127 : 126);
    }
    int status, waited_for = wait_until(child, timeout_ms > 0 ? &end : NULL, &waited, &status);
    if (waited_for <= 0) { /* the deadline or the stop: the child dies here, reaped by us */
        if (timeout_ms > 0) kill(-child, SIGKILL); /* its group (ESRCH if it had not made it yet) */
        kill(child, SIGKILL);
        while (waitpid(child, &status, 0) < 0) {
            if (errno != EINTR) die("waitpid", NULL);
        }
        if (waited_for == 0) {
            fprintf(stderr, "\narl-tangram-launch: timeout\n");
            _exit(124);
        }
    }
    if (WIFSIGNALED(status)) {
        sigset_t one;
        sigemptyset(&one);
        sigaddset(&one, WTERMSIG(status));
        signal(WTERMSIG(status), SIG_DFL);
        sigprocmask(SIG_UNBLOCK, &one, NULL); /* a SIGTERM is blocked since the fork */
        kill(getpid(), WTERMSIG(status));
        _exit(128 + WTERMSIG(status));
    }
    return WEXITSTATUS(status);
}
"""

_lock = threading.Lock()
_built: dict[str, str | None] = {}


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "arl_tangram")


def launcher_path() -> str | None:
    """Path of the compiled launcher (built now if needed), or None when it cannot be built."""
    return native_binary("launcher", SOURCE)


def native_binary(name: str, source: str, flags: tuple[str, ...] = ()) -> str | None:
    """Path of ``source`` compiled as ``name`` into the cache (keyed by source and flags,
    built once per process and reused across processes), or None when it cannot be built."""
    digest = hashlib.sha256("\0".join((source, *flags)).encode()).hexdigest()[:16]
    key = f"{name}-{digest}"
    with _lock:
        if key in _built:
            return _built[key]
        target = os.path.join(cache_dir(), key)
        if not os.access(target, os.X_OK):
            target = _build(target, source, flags) or ""
        _built[key] = target or None
        return _built[key]


def _build(target: str, source: str = SOURCE, flags: tuple[str, ...] = ()) -> str | None:
    """Compile ``source`` to ``target`` (atomically); None without a compiler or on failure."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        log.info("no C compiler: sandboxes are entered through sh + nsenter (slower), image roots are refused")
        return None
    os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=os.path.dirname(target)) as tmp:
        src, out = os.path.join(tmp, "launcher.c"), os.path.join(tmp, "launcher")
        with open(src, "w", encoding="utf-8") as f:
            f.write(source)
        proc = subprocess.run([cc, "-O2", *flags, "-o", out, src], capture_output=True, timeout=120)
        if proc.returncode != 0:
            log.warning("building %s failed: %s", os.path.basename(target), proc.stderr.decode(errors="replace"))
            return None
        with contextlib.suppress(FileExistsError):
            os.replace(out, target)
    return target
