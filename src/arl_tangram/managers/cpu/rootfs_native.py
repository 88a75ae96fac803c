"""Shell: the native helper that builds an image sandbox's root, and the static init that
image sandboxes run (an image need not contain ``sleep``). Compiled once per source hash,
like the action launcher (``native_launcher``); without a C compiler image roots are
refused, never built some weaker way.

usage: helper N CGFILE... STAGE UPPER_BYTES SHIFT COUNT M LOWER... -- BWRAP_ARGV...
  1. joins the N cgroup.procs files (everything below, tmpfs pages included, is charged to
     the sandbox from the start);
  2. unshares a mount namespace (all mounts private), mounts a tmpfs of UPPER_BYTES at STAGE
     holding upper/, work/ and root/, and mounts the overlay of the M lower dirs (given
     LOWEST first; overlay wants the top first) on STAGE/root (redirect_dir=off: a renamed
     lower directory is copied up whole, so an upper is a self-contained layer a snapshot
     can freeze and stack anywhere), and binds itself at
     STAGE/init (bwrap's unprivileged uid could not reach the compiler cache). The lowers are reached
     through short symlinks in STAGE, so neither path length nor ':' or ',' in a path
     matter. The mounts live only in this namespace: they vanish with the sandbox's last
     process and never reach the host's mount table;
  3. creates a user namespace as host uid SHIFT (its owner), maps in-namespace 0..COUNT-1
     to host SHIFT.. (written by us, as root: bwrap 0.8 maps one id only), and
  4. drops to host uid/gid SHIFT and execs BWRAP_ARGV with "@USERNS@" replaced by the
     namespace's fd: bwrap joins it and so is never host root.
usage: helper init [FD] -- writes "R" to FD (a writer of bwrap's info pipe), closes inherited
fds and sleeps until killed (the sandbox's init).
Exit 125 with "arl-tangram-launch:" on stderr when a step fails.
"""

from __future__ import annotations

from arl_tangram.managers.cpu.native_launcher import native_binary

SOURCE = r"""/* arl-tangram image root helper; see rootfs_native.py for the contract. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static void die(const char *what, const char *arg) {
    fprintf(stderr, "arl-tangram-launch: %s %s: %s\n", what, arg ? arg : "", strerror(errno));
    _exit(125);
}

static void write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text)) die("cannot write", path);
    close(fd);
}

static int init_main(const char *ready_fd) {
    /* one byte on bwrap's info pipe says "mounted and running": no polling for readiness */
    if (ready_fd != NULL && write(atoi(ready_fd), "R", 1) != 1) {}
    for (int fd = 3; fd < 1024; fd++) close(fd);
    for (;;) pause();
}

static void mount_root(const char *stage, const char *upper_bytes, int m, char **lowers) {
    char opts[8192], path[4096];
    struct stat st;
    if (unshare(CLONE_NEWNS) != 0) die("unshare", "mount namespace");
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) die("make private", "/");
    snprintf(opts, sizeof opts, "size=%s,mode=0711", upper_bytes);
    if (mount("arl-tangram-upper", stage, "tmpfs", MS_NOSUID | MS_NODEV, opts) != 0) die("mount tmpfs", stage);
    if (chdir(stage) != 0) die("chdir", stage);
    if (mkdir("upper", 0755) || mkdir("work", 0700) || mkdir("root", 0755) || mkdir("l", 0700)) die("mkdir", stage);
    /* ourselves as the sandbox's init, reachable by bwrap's unprivileged uid (the cache is not) */
    int ifd = open("init", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0755);
    if (ifd < 0) die("create", "init");
    close(ifd);
    /* by path: the exe link names a mount of the namespace we just left */
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
    if (n <= 0) die("readlink", "/proc/self/exe");
    path[n] = 0;
    if (mount(path, "init", NULL, MS_BIND, NULL) != 0) die("bind", path);
    if (stat(lowers[m - 1], &st) != 0) die("stat", lowers[m - 1]);
    /* the root dir's owner and mode come from the top layer, as a container runtime shows them */
    if (chown("upper", st.st_uid, st.st_gid) || chmod("upper", st.st_mode & 07777)) die("chown", "upper");
    size_t used = (size_t)snprintf(opts, sizeof opts, "lowerdir=");
    for (int k = m - 1; k >= 0; k--) {
        snprintf(path, sizeof path, "l/%d", k);
        if (symlink(lowers[k], path) != 0) die("symlink", lowers[k]);
        used += (size_t)snprintf(opts + used, sizeof opts - used, "%s%d", k == m - 1 ? "" : ":", k);
        if (used >= sizeof opts) { errno = E2BIG; die("too many layers", NULL); }
    }
    snprintf(opts + used, sizeof opts - used, ",upperdir=../upper,workdir=../work,redirect_dir=off");
    if (chdir("l") != 0) die("chdir", "l");
    if (mount("overlay", "../root", "overlay", MS_NOSUID | MS_NODEV, opts) != 0) die("mount overlay", stage);
    if (chdir("/") != 0) die("chdir", "/");
}

static int make_userns(uid_t shift, const char *count) {
    int go[2], ready[2];
    char c = 0, path[64], map[96];
    if (pipe2(go, O_CLOEXEC) || pipe2(ready, O_CLOEXEC)) die("pipe", NULL);
    pid_t child = fork();
    if (child < 0) die("fork", NULL);
    if (child == 0) {
        close(go[1]); /* else our own copy would hold off the EOF we wait for */
        close(ready[0]);
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a helper that failed */
        if (getppid() == 1) _exit(1);
        if (setgroups(0, NULL) || setresgid(shift, shift, shift) || setresuid(shift, shift, shift)) _exit(1);
        if (unshare(CLONE_NEWUSER) != 0) _exit(1);
        if (write(ready[1], &c, 1) != 1) _exit(1);
        (void)!read(go[0], &c, 1); /* EOF: the parent has opened our namespace */
        _exit(0);
    }
    close(ready[1]);
    close(go[0]);
    if (read(ready[0], &c, 1) != 1) { errno = ECHILD; die("user namespace", "not created"); }
    snprintf(map, sizeof map, "0 %u %s\n", (unsigned)shift, count);
    snprintf(path, sizeof path, "/proc/%d/uid_map", (int)child);
    write_file(path, map);
    snprintf(path, sizeof path, "/proc/%d/gid_map", (int)child);
    write_file(path, map);
    snprintf(path, sizeof path, "/proc/%d/ns/user", (int)child);
    int fd = open(path, O_RDONLY); /* inherited by bwrap on purpose */
    if (fd < 0) die("cannot open", path);
    close(go[1]);
    close(ready[0]);
    while (waitpid(child, NULL, 0) < 0 && errno == EINTR) {}
    return fd;
}

int main(int argc, char **argv) {
    int i = 1;
    char buf[32], fdnum[16];
    if (argc >= 2 && strcmp(argv[1], "init") == 0) return init_main(argc >= 3 ? argv[2] : NULL);
    if (argc < 8) { errno = EINVAL; die("usage", NULL); }
    int n_join = atoi(argv[i++]);
    int len = snprintf(buf, sizeof buf, "%d", (int)getpid());
    for (int k = 0; k < n_join && i < argc; k++, i++) {
        int fd = open(argv[i], O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, buf, len) != len) die("cannot join cgroup", argv[i]);
        close(fd);
    }
    if (i + 5 > argc) { errno = EINVAL; die("usage", NULL); }
    const char *stage = argv[i++], *upper_bytes = argv[i++];
    uid_t shift = (uid_t)strtoul(argv[i++], NULL, 10);
    const char *count = argv[i++];
    int m = atoi(argv[i++]);
    if (m < 1 || i + m >= argc || strcmp(argv[i + m], "--") != 0) { errno = EINVAL; die("usage", NULL); }
    mount_root(stage, upper_bytes, m, &argv[i]);
    int userns = make_userns(shift, count);
    snprintf(fdnum, sizeof fdnum, "%d", userns);
    char **prog = &argv[i + m + 1];
    for (char **a = prog; *a; a++)
        if (strcmp(*a, "@USERNS@") == 0) *a = fdnum;
    if (setgroups(0, NULL) || setresgid(shift, shift, shift) || setresuid(shift, shift, shift)) die("drop to", "shift");
    execvp(prog[0], prog);
    die("exec", prog[0]);
    return 125;
}
"""


def helper_path() -> str | None:
    """The compiled helper (static, so that it also runs as the init inside any image), or
    None when no compiler can build it."""
    return native_binary("rootfs-helper", SOURCE, ("-static",))
