/*
 * The machine's init in C: the same job and the same wire protocol as init.py, without the ~40 ms a
 * Python start-up with its imports costs inside every sandbox. Compiled from this file at first use by
 * swarmyard.machines.native with the system C compiler; the Python init stays as the fallback.
 *
 * Inside bwrap it binds its control socket (and the relay when the machine has a control plane), applies Landlock
 * so that writes land only beneath the machine's disk and /tmp, reports ready on a pipe, and then serves each
 * connection on its own thread. A timed-out or abandoned exec has its whole process tree stopped and killed.
 *
 * Frames (see wire.py): 1 kind byte + u32 big-endian length + payload. A request is one 'q' frame holding fields,
 * each 1 tag byte + u32 big-endian length + bytes; uploads follow as 'd' frames ended by an empty one.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <mntent.h>
#include <sched.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/loop.h>
#include <linux/seccomp.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_FRAME (1u << 20)
#define CHUNK 65536

/* ---------------------------------------------------------------- frames ---------------------------------- */

static int write_all(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == ENOTSOCK) n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int read_exact(int fd, void *buf, size_t len) {
    char *p = buf;
    while (len) {
        ssize_t n = read(fd, p, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int send_frame(int fd, char kind, const void *payload, uint32_t len) {
    unsigned char head[5];
    head[0] = (unsigned char)kind;
    uint32_t be = htonl(len);
    memcpy(head + 1, &be, 4);
    if (len <= 4096) {
        char buf[5 + 4096];
        memcpy(buf, head, 5);
        if (len) memcpy(buf + 5, payload, len);
        return write_all(fd, buf, 5 + len);
    }
    if (write_all(fd, head, 5) < 0) return -1;
    return write_all(fd, payload, len);
}

/* Receive one frame into a malloc'd buffer; returns 0 on success, -1 on close, error or an oversized frame. */
static int recv_frame(int fd, char *kind, char **payload, uint32_t *len) {
    unsigned char head[5];
    if (read_exact(fd, head, 5) < 0) return -1;
    uint32_t be;
    memcpy(&be, head + 1, 4);
    *kind = (char)head[0];
    *len = ntohl(be);
    if (*len > MAX_FRAME) return -1;
    *payload = malloc(*len + 1);
    if (!*payload) return -1;
    if (*len && read_exact(fd, *payload, *len) < 0) {
        free(*payload);
        return -1;
    }
    (*payload)[*len] = 0;
    return 0;
}

static void send_error(int fd, const char *what, int err) {
    char msg[4096];
    char esc[8192];
    snprintf(msg, sizeof msg, "%s: %s", what, strerror(err));
    size_t j = 0;
    for (const unsigned char *p = (const unsigned char *)msg; *p && j < sizeof esc - 8; p++) {
        if (*p == '"' || *p == '\\') {
            esc[j++] = '\\';
            esc[j++] = (char)*p;
        } else if (*p < 0x20) {
            j += (size_t)snprintf(esc + j, 8, "\\u%04x", *p);
        } else {
            esc[j++] = (char)*p;  // bytes >= 0x80 stay as UTF-8; json.loads accepts them
        }
    }
    esc[j] = 0;
    char body[8400];
    int n = snprintf(body, sizeof body, "{\"message\": \"%s\", \"errno\": %d}", esc, err);
    send_frame(fd, '!', body, (uint32_t)n);
}

/* ---------------------------------------------------------------- requests -------------------------------- */

struct request {
    const char *op;
    char **argv;
    int argc;
    char **env;
    int envc;
    const char *cwd;
    const char *path;
    double timeout_s; /* < 0: none */
    const char *stdin_data;
    uint32_t stdin_len;
    int has_stdin;
    int mode;
};

/* Each field is copied out NUL-terminated; free_request releases them. */
static int parse_request(char *buf, uint32_t len, struct request *req) {
    memset(req, 0, sizeof *req);
    req->timeout_s = -1;
    req->mode = 0644;
    req->argv = calloc(len / 5 + 2, sizeof(char *));
    req->env = calloc(len / 5 + 2, sizeof(char *));
    if (!req->argv || !req->env) return -1;
    uint32_t off = 0;
    while (off < len) {
        if (len - off < 5) return -1;
        char tag = buf[off];
        uint32_t be;
        memcpy(&be, buf + off + 1, 4);
        uint32_t n = ntohl(be);
        off += 5;
        if (n > len - off) return -1;
        char *value = malloc(n + 1);
        if (!value) return -1;
        memcpy(value, buf + off, n);
        value[n] = 0;
        off += n;
        switch (tag) {
        case 'o': req->op = value; break;
        case 'a': req->argv[req->argc++] = value; break;
        case 'v': req->env[req->envc++] = value; break;
        case 'c': req->cwd = value; break;
        case 'p': req->path = value; break;
        case 't': req->timeout_s = strtod(value, NULL); free(value); break;
        case 'm': req->mode = (int)strtol(value, NULL, 10); free(value); break;
        case 'i': req->stdin_data = value; req->stdin_len = n; req->has_stdin = 1; break;
        default: free(value); break;
        }
    }
    return req->op ? 0 : -1;
}

/* ---------------------------------------------------------------- process trees --------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct procinfo {
    int pid, ppid, marked;
};

/* Every process in the sandbox with its parent, and whether its environment carries the exec's marker. */
static int scan_procs(struct procinfo **out, const char *marker) {
    DIR *dir = opendir("/proc");
    if (!dir) return 0;
    int cap = 64, n = 0;
    struct procinfo *list = malloc(sizeof *list * (size_t)cap);
    struct dirent *ent;
    int self = getpid();
    while (list && (ent = readdir(dir))) {
        int pid = atoi(ent->d_name);
        if (pid <= 0 || pid == self) continue;
        char path[64], buf[512];
        snprintf(path, sizeof path, "/proc/%d/stat", pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        ssize_t r = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (r <= 0) continue;
        buf[r] = 0;
        char *close_paren = strrchr(buf, ')');
        int ppid = 0;
        char state;
        if (!close_paren || sscanf(close_paren + 2, "%c %d", &state, &ppid) != 2) continue;
        int marked = 0;
        snprintf(path, sizeof path, "/proc/%d/environ", pid);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            static __thread char env[1 << 16];
            ssize_t got = read(fd, env, sizeof env - 1);
            close(fd);
            size_t mlen = strlen(marker);
            for (ssize_t i = 0; got > 0 && i + (ssize_t)mlen <= got; i++) {
                if ((i == 0 || env[i - 1] == 0) && memcmp(env + i, marker, mlen) == 0 &&
                    (i + (ssize_t)mlen == got || env[i + mlen] == 0)) {
                    marked = 1;
                    break;
                }
            }
        }
        if (n == cap) {
            cap *= 2;
            struct procinfo *bigger = realloc(list, sizeof *list * (size_t)cap);
            if (!bigger) break;
            list = bigger;
        }
        list[n++] = (struct procinfo){pid, ppid, marked};
    }
    closedir(dir);
    *out = list;
    return list ? n : 0;
}

static int contains(const int *set, int n, int pid) {
    for (int i = 0; i < n; i++)
        if (set[i] == pid) return 1;
    return 0;
}

/* Stop the leader, every descendant and every process carrying the marker (they may have setsid'd and
 * double-forked away), repeating until no new one appears, then kill them all. */
static void kill_tree(int leader, const char *marker) {
    int cap = 256, nvictims = 0;
    int *victims = malloc(sizeof(int) * (size_t)cap);
    if (!victims) return;
    for (int round = 0; round < 8; round++) {
        struct procinfo *procs = NULL;
        int n = scan_procs(&procs, marker);
        int *found = malloc(sizeof(int) * (size_t)(n + 1));
        int nfound = 0;
        if (!found) {
            free(procs);
            break;
        }
        found[nfound++] = leader;
        for (int i = 0; i < n; i++)
            if (procs[i].marked && !contains(found, nfound, procs[i].pid)) found[nfound++] = procs[i].pid;
        for (int grew = 1; grew;) {
            grew = 0;
            for (int i = 0; i < n; i++)
                if (contains(found, nfound, procs[i].ppid) && !contains(found, nfound, procs[i].pid)) {
                    found[nfound++] = procs[i].pid;
                    grew = 1;
                }
        }
        free(procs);
        int added = 0;
        for (int i = 0; i < nfound; i++) {
            if (contains(victims, nvictims, found[i])) continue;
            kill(found[i], SIGSTOP);
            if (nvictims == cap) {
                int *bigger = realloc(victims, sizeof(int) * (size_t)(cap *= 2));
                if (!bigger) break;
                victims = bigger;
            }
            victims[nvictims++] = found[i];
            added = 1;
        }
        free(found);
        if (!added) break;
    }
    killpg(leader, SIGKILL);
    for (int i = 0; i < nvictims; i++) kill(victims[i], SIGKILL);
    free(victims);
}

/* ---------------------------------------------------------------- exec ------------------------------------ */

static const char *env_get(char **env, int envc, const char *name) {
    size_t n = strlen(name);
    for (int i = envc - 1; i >= 0; i--)
        if (strncmp(env[i], name, n) == 0 && env[i][n] == '=') return env[i] + n + 1;
    return NULL;
}

static void send_exit(int conn, int status, int timed_out) {
    int code = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
    char body[96];
    int n = snprintf(body, sizeof body, "{\"exit_code\": %d, \"timed_out\": %s}", code, timed_out ? "true" : "false");
    send_frame(conn, 'x', body, (uint32_t)n);
}

static void run_exec(int conn, struct request *req) {
    if (req->argc == 0) {
        send_error(conn, "exec", EINVAL);
        return;
    }
    double started = now_s();
    unsigned char rnd[8];
    char marker[64];
    if (getrandom(rnd, sizeof rnd, 0) != sizeof rnd) memset(rnd, 0, sizeof rnd);
    int m = snprintf(marker, sizeof marker, "SWARMYARD_EXEC=");
    for (int i = 0; i < 8; i++) m += snprintf(marker + m, sizeof marker - (size_t)m, "%02x", rnd[i]);
    /* The environment as asked for, without any SWARMYARD_EXEC of the caller's, plus the marker. */
    char **envp = calloc((size_t)req->envc + 2, sizeof(char *));
    int envn = 0;
    for (int i = 0; i < req->envc; i++)
        if (strncmp(req->env[i], "SWARMYARD_EXEC=", 15) != 0) envp[envn++] = req->env[i];
    envp[envn++] = marker;
    envp[envn] = NULL;
    char **argv = calloc((size_t)req->argc + 1, sizeof(char *));
    memcpy(argv, req->argv, sizeof(char *) * (size_t)req->argc);
    /* Candidates for argv[0], looked up in the exec's own PATH as Python's subprocess does. */
    const char *name = argv[0];
    char **candidates;
    int ncand = 0;
    if (strchr(name, '/')) {
        candidates = calloc(2, sizeof(char *));
        candidates[ncand++] = strdup(name);
    } else {
        const char *path = env_get(req->env, req->envc, "PATH");
        if (!path) path = "/bin:/usr/bin";
        candidates = calloc(strlen(path) + 2, sizeof(char *));
        const char *p = path;
        while (1) {
            const char *end = strchr(p, ':');
            size_t dlen = end ? (size_t)(end - p) : strlen(p);
            char *full = malloc(dlen + strlen(name) + 2);
            if (dlen == 0)
                sprintf(full, "%s", name);
            else
                sprintf(full, "%.*s/%s", (int)dlen, p, name);
            candidates[ncand++] = full;
            if (!end) break;
            p = end + 1;
        }
    }
    int out[2], err[2], in[2] = {-1, -1}, errpipe[2];
    if (pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC) || pipe2(errpipe, O_CLOEXEC) ||
        (req->has_stdin && pipe2(in, O_CLOEXEC))) {
        send_error(conn, name, errno);
        return;
    }
    int devnull = req->has_stdin ? -1 : open("/dev/null", O_RDONLY | O_CLOEXEC);
    pid_t pid = fork();
    if (pid == 0) {
        /* Only async-signal-safe calls from here: this process is a copy of a threaded one. */
        signal(SIGPIPE, SIG_DFL);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        setsid();
        dup2(req->has_stdin ? in[0] : devnull, 0);
        dup2(out[1], 1);
        dup2(err[1], 2);
        syscall(SYS_close_range, 3, ~0U, 4 /* CLOSE_RANGE_CLOEXEC */);
        int e = 0;
        if (req->cwd && chdir(req->cwd) != 0) {
            e = errno;
        } else {
            /* As Python's subprocess: the first error that is not "no such file" wins, else the last one. */
            int saved = 0;
            for (int i = 0; i < ncand; i++) {
                execve(candidates[i], argv, envp);
                e = errno;
                if (e != ENOENT && e != ENOTDIR && saved == 0) saved = e;
            }
            if (saved) e = saved;
        }
        int ev = e ? e : ENOENT;
        ssize_t ignored = write(errpipe[1], &ev, sizeof ev);
        (void)ignored;
        _exit(127);
    }
    int fork_errno = errno;
    close(out[1]);
    close(err[1]);
    close(errpipe[1]);
    if (in[0] >= 0) close(in[0]);
    if (devnull >= 0) close(devnull);
    for (int i = 0; i < ncand; i++) free(candidates[i]);
    free(candidates);
    free(argv);
    free(envp);
    if (pid < 0) {
        close(out[0]);
        close(err[0]);
        close(errpipe[0]);
        if (in[1] >= 0) close(in[1]);
        send_error(conn, name, fork_errno);
        return;
    }
    int child_errno = 0;
    ssize_t got = read(errpipe[0], &child_errno, sizeof child_errno);
    close(errpipe[0]);
    if (got == sizeof child_errno) {
        waitpid(pid, NULL, 0);
        close(out[0]);
        close(err[0]);
        if (in[1] >= 0) close(in[1]);
        send_error(conn, name, child_errno);
        return;
    }
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    double deadline = req->timeout_s < 0 ? -1 : started + req->timeout_s;
    uint32_t fed = 0;
    if (in[1] >= 0) fcntl(in[1], F_SETFL, O_NONBLOCK);
    if (in[1] >= 0 && req->stdin_len == 0) {
        close(in[1]);
        in[1] = -1;
    }
    int fds[2] = {out[0], err[0]};
    const char kinds[2] = {'o', 'e'};
    int streams = 2, timed_out = 0, hung_up = 0, exited = 0, status = 0;
    static __thread char buf[CHUNK];
    while (streams || !exited) {
        int timeout_ms = -1;
        if (deadline >= 0) {
            double left = deadline - now_s();
            if (left <= 0) {
                timed_out = 1;
                break;
            }
            timeout_ms = (int)(left * 1000) + 1;
        }
        struct pollfd p[5];
        int np = 0, idx_stream[2] = {-1, -1}, idx_conn, idx_in = -1, idx_pid = -1;
        for (int i = 0; i < 2; i++)
            if (fds[i] >= 0) {
                idx_stream[i] = np;
                p[np++] = (struct pollfd){fds[i], POLLIN, 0};
            }
        idx_conn = np;
        p[np++] = (struct pollfd){conn, POLLIN, 0};
        if (in[1] >= 0) {
            idx_in = np;
            p[np++] = (struct pollfd){in[1], POLLOUT, 0};
        }
        if (!streams && pidfd >= 0) {
            idx_pid = np;
            p[np++] = (struct pollfd){pidfd, POLLIN, 0};
        }
        if (!streams && pidfd < 0) {
            /* No pidfd (old kernel): a blocking wait; the streams are closed so the exit is near. */
            waitpid(pid, &status, 0);
            exited = 1;
            break;
        }
        int r = poll(p, (nfds_t)np, timeout_ms);
        if (r < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (p[idx_conn].revents) { /* the host hung up (cancelled): nothing may outlive the exec */
            hung_up = 1;
            break;
        }
        for (int i = 0; i < 2; i++) {
            if (idx_stream[i] < 0 || !p[idx_stream[i]].revents) continue;
            ssize_t n = read(fds[i], buf, sizeof buf);
            if (n > 0) {
                if (send_frame(conn, kinds[i], buf, (uint32_t)n) < 0) hung_up = 1;
            } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
                close(fds[i]);
                fds[i] = -1;
                streams--;
            }
        }
        if (hung_up) break;
        if (idx_in >= 0 && p[idx_in].revents) {
            ssize_t n = write(in[1], req->stdin_data + fed, req->stdin_len - fed);
            if (n > 0) fed += (uint32_t)n;
            if ((n < 0 && errno != EAGAIN && errno != EINTR) || fed >= req->stdin_len) {
                close(in[1]);
                in[1] = -1;
            }
        }
        if (idx_pid >= 0 && p[idx_pid].revents) {
            waitpid(pid, &status, 0);
            exited = 1;
        }
    }
    if (timed_out || hung_up) {
        kill_tree(pid, marker);
        waitpid(pid, &status, 0);
        exited = 1;
    } else if (!exited) {
        waitpid(pid, &status, 0);
    }
    for (int i = 0; i < 2; i++)
        if (fds[i] >= 0) close(fds[i]);
    if (in[1] >= 0) close(in[1]);
    if (pidfd >= 0) close(pidfd);
    if (!hung_up) send_exit(conn, status, timed_out);
}

/* ---------------------------------------------------------------- files ----------------------------------- */

static int mkdir_parents(const char *path) {
    char *copy = strdup(path);
    if (!copy) return -1;
    char *slash = strrchr(copy, '/');
    if (!slash || slash == copy) {
        free(copy);
        return 0;
    }
    *slash = 0;
    for (char *p = copy + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(copy, 0777) != 0 && errno != EEXIST) {
            free(copy);
            return -1;
        }
        *p = '/';
    }
    int rc = (mkdir(copy, 0777) != 0 && errno != EEXIST) ? -1 : 0;
    free(copy);
    return rc;
}

static void drain_upload(int conn) {
    char kind;
    char *payload;
    uint32_t len;
    while (recv_frame(conn, &kind, &payload, &len) == 0) {
        free(payload);
        if (len == 0) break;
    }
}

static void put_file(int conn, struct request *req) {
    if (!req->path) {
        send_error(conn, "put", EINVAL);
        return;
    }
    int fd = -1;
    /* replaced, not rewritten in place: a file sent read-only (a governed slot's module, 0400) takes its next copy,
       and a symlink left where the file goes is replaced, not written through; open() reports what failed */
    if (mkdir_parents(req->path) == 0) {
        unlink(req->path);
        fd = open(req->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, req->mode);
    }
    if (fd < 0) {
        int e = errno;
        drain_upload(conn);
        send_error(conn, req->path, e);
        return;
    }
    uint64_t size = 0;
    char kind;
    char *payload;
    uint32_t len;
    int failed = 0;
    while (recv_frame(conn, &kind, &payload, &len) == 0) {
        if (len == 0) {
            free(payload);
            break;
        }
        if (!failed && write_all(fd, payload, len) < 0) failed = errno;
        size += len;
        free(payload);
    }
    close(fd);
    if (failed) {
        send_error(conn, req->path, failed);
        return;
    }
    char body[64];
    int n = snprintf(body, sizeof body, "{\"size\": %llu}", (unsigned long long)size);
    send_frame(conn, 'x', body, (uint32_t)n);
}

static void get_file(int conn, struct request *req) {
    // O_NONBLOCK: opening a FIFO must not wait for a writer; only a regular file is sent (a symlink to
    // /dev/zero or a FIFO would never end)
    int fd = req->path ? open(req->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK) : -1;
    struct stat st;
    char what[4096];
    snprintf(what, sizeof what, "%s", req->path ? req->path : "get");
    if (fd >= 0) {
        int err = 0;
        if (fstat(fd, &st) != 0) err = errno;
        else if (S_ISDIR(st.st_mode)) err = EISDIR;
        else if (!S_ISREG(st.st_mode)) {
            err = EINVAL;
            snprintf(what, sizeof what, "%s (not a regular file)", req->path);
        }
        if (err) {
            close(fd);
            fd = -1;
            errno = err;
        }
    }
    if (fd >= 0) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    if (fd < 0) {
        send_error(conn, what, errno);
        return;
    }
    char *buf = malloc(MAX_FRAME);
    uint64_t size = 0;
    ssize_t n = 0;
    int sent = 0;
    while (buf && (n = read(fd, buf, MAX_FRAME)) > 0) {
        if (send_frame(conn, 'd', buf, (uint32_t)n) < 0) {
            sent = -1;
            break;
        }
        size += (uint64_t)n;
    }
    int failed = !buf ? ENOMEM : n < 0 ? errno : 0;
    free(buf);
    close(fd);
    if (sent < 0) return; /* the host hung up */
    if (failed) { /* a file that fails to read (/proc/self/mem: EIO) is an error, not a short file */
        send_error(conn, what, failed);
        return;
    }
    char body[64];
    int len = snprintf(body, sizeof body, "{\"size\": %llu}", (unsigned long long)size);
    send_frame(conn, 'x', body, (uint32_t)len);
}

static void free_request(struct request *req) {
    free((void *)req->op);
    for (int i = 0; i < req->argc; i++) free(req->argv[i]);
    for (int i = 0; i < req->envc; i++) free(req->env[i]);
    free(req->argv);
    free(req->env);
    free((void *)req->cwd);
    free((void *)req->path);
    free((void *)req->stdin_data);
}

/* Serve only peers outside this pid namespace (the host): set (--host-only) for an init with a pid namespace. */
static int host_only = 0;

static void *serve_one(void *arg) {
    int conn = (int)(intptr_t)arg;
    char kind;
    char *payload;
    uint32_t len;
    struct request req;
    memset(&req, 0, sizeof req);
    /* Only the host may ask: a process of this machine would have its peer pid in the machine's pid namespace,
     * and through the init it could run what its own exec lock (or the machine's allowlist, by ld.so) refused. */
    struct ucred peer;
    socklen_t peer_len = sizeof peer;
    if (host_only && (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &peer, &peer_len) != 0 || peer.pid != 0)) {
        close(conn);
        return NULL;
    }
    if (recv_frame(conn, &kind, &payload, &len) == 0) {
        if (kind == 'q' && parse_request(payload, len, &req) == 0) {
            if (strcmp(req.op, "exec") == 0) run_exec(conn, &req);
            else if (strcmp(req.op, "put") == 0) put_file(conn, &req);
            else if (strcmp(req.op, "get") == 0) get_file(conn, &req);
            else if (strcmp(req.op, "ping") == 0) {
                char body[48];
                int n = snprintf(body, sizeof body, "{\"pid\": %d}", getpid());
                send_frame(conn, 'x', body, (uint32_t)n);
            } else {
                send_error(conn, req.op, EINVAL);
            }
        }
        free_request(&req);
        free(payload);
    }
    close(conn);
    return NULL;
}

/* ---------------------------------------------------------------- relay ----------------------------------- */

static const char *relay_target;

static void *relay_pump(void *arg) {
    int client = (int)(intptr_t)arg;
    int up = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s", relay_target);
    if (up < 0 || connect(up, (struct sockaddr *)&addr, sizeof addr) != 0) {
        fprintf(stderr, "relay: cannot reach %s: %s\n", relay_target, strerror(errno));
        close(client);
        if (up >= 0) close(up);
        return NULL;
    }
    /* Copy both ways; at EOF on one side half-close the other so HTTP framing keeps working. */
    int open_in[2] = {1, 1};
    int fds[2] = {client, up};
    char *buf = malloc(CHUNK);
    while (buf && (open_in[0] || open_in[1])) {
        /* A side already at EOF is left out (fd -1): poll reports POLLHUP even with no events asked for,
         * which would wake this loop at once, forever, while the other side waits (a long model answer). */
        struct pollfd p[2] = {{open_in[0] ? client : -1, POLLIN, 0}, {open_in[1] ? up : -1, POLLIN, 0}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        int failed = 0;
        for (int i = 0; i < 2; i++) {
            if (!open_in[i] || !p[i].revents) continue;
            ssize_t n = read(fds[i], buf, CHUNK);
            if (n > 0) {
                if (write_all(fds[1 - i], buf, (size_t)n) < 0) failed = 1;
            } else {
                open_in[i] = 0;
                shutdown(fds[1 - i], SHUT_WR);
            }
        }
        if (failed) break;
    }
    free(buf);
    close(client);
    close(up);
    return NULL;
}

static void *relay_serve(void *arg) {
    int listener = (int)(intptr_t)arg;
    while (1) {
        int client = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
        if (client < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE) continue;
            return NULL;
        }
        pthread_t t;
        if (pthread_create(&t, NULL, relay_pump, (void *)(intptr_t)client) != 0) close(client);
        else pthread_detach(t);
    }
}

/* ---------------------------------------------------------------- landlock -------------------------------- */

#define LL_EXECUTE (1ULL << 0)
#define LL_WRITE_FILE (1ULL << 1)
#define LL_TRUNCATE (1ULL << 14)
#define LL_IOCTL_DEV (1ULL << 15)

static unsigned long long ll_write_access(int abi) {
    /* WRITE_FILE, REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR, MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK,
     * MAKE_SYM; then REFER (ABI 2), TRUNCATE (ABI 3), IOCTL_DEV (ABI 5): the same set as landlock.py. */
    unsigned long long access = (1ULL << 1) | (1ULL << 4) | (1ULL << 5) | (1ULL << 6) | (1ULL << 7) | (1ULL << 8) |
                                (1ULL << 9) | (1ULL << 10) | (1ULL << 11) | (1ULL << 12);
    if (abi >= 2) access |= 1ULL << 13;
    if (abi >= 3) access |= LL_TRUNCATE;
    if (abi >= 5) access |= LL_IOCTL_DEV;
    return access;
}

static int ll_add(int ruleset, const char *path, unsigned long long access, char *why, size_t whylen) {
    int fd = open(path, O_PATH | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, whylen, "landlock_add_rule %s: %s", path, strerror(errno));
        return -1;
    }
    struct __attribute__((packed)) {
        unsigned long long allowed_access;
        int parent_fd;
    } attr = {access, fd};
    long rc = syscall(445 /* landlock_add_rule */, ruleset, 1 /* PATH_BENEATH */, &attr, 0);
    int e = errno;
    close(fd);
    if (rc != 0) {
        snprintf(why, whylen, "landlock_add_rule %s: %s", path, strerror(e));
        return -1;
    }
    return 0;
}

/* Returns the ABI used, 0 with `why` set when Landlock could not be applied. With exec_only files, the execute
 * right is handled too: only those files can be executed from then on (a governed machine's interpreter). */
static int landlock_restrict(char **writable, int nwritable, char **devices, int ndevices, char **exec_only,
                             int nexec, char *why, size_t whylen) {
    long abi = syscall(444 /* landlock_create_ruleset */, NULL, 0, 1 /* VERSION */);
    if (abi < 1) {
        snprintf(why, whylen, "Landlock is not available on this kernel");
        return 0;
    }
    unsigned long long handled = ll_write_access((int)abi) | (nexec ? LL_EXECUTE : 0);
    unsigned long long attr[3] = {handled, 0, abi >= 6 ? 3ULL /* scope abstract unix sockets, signals */ : 0};
    int ruleset = (int)syscall(444, attr, abi >= 6 ? 24 : 16, 0);
    if (ruleset < 0) {
        snprintf(why, whylen, "landlock_create_ruleset: %s", strerror(errno));
        return 0;
    }
    int ok = 1;
    for (int i = 0; ok && i < nwritable; i++)
        ok = ll_add(ruleset, writable[i], handled & ~LL_EXECUTE, why, whylen) == 0;
    for (int i = 0; ok && i < ndevices; i++)
        ok = ll_add(ruleset, devices[i], handled & (LL_WRITE_FILE | LL_TRUNCATE | LL_IOCTL_DEV), why, whylen) == 0;
    for (int i = 0; ok && i < nexec; i++) ok = ll_add(ruleset, exec_only[i], LL_EXECUTE, why, whylen) == 0;
    if (ok && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
        snprintf(why, whylen, "prctl(NO_NEW_PRIVS): %s", strerror(errno));
        ok = 0;
    }
    if (ok && syscall(446 /* landlock_restrict_self */, ruleset, 0) != 0) {
        snprintf(why, whylen, "landlock_restrict_self: %s", strerror(errno));
        ok = 0;
    }
    close(ruleset);
    return ok ? (int)abi : 0;
}

/* ---------------------------------------------------------------- main ------------------------------------ */

#include <sys/resource.h>

/* Write "0" (the writing process itself) into a cgroup.procs file. */
static int join_cgroup(const char *file) {
    int fd = open(file, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, "0", 1) != 1) {
        fprintf(stderr, "launch: cannot join %s: %s\n", file, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    close(fd);
    return 0;
}

static int set_rlimit_as(const char *value) {
    rlim_t limit = (rlim_t)strtoull(value, NULL, 10);
    struct rlimit rl = {limit, limit};
    if (setrlimit(RLIMIT_AS, &rl) != 0) {
        fprintf(stderr, "launch: setrlimit: %s\n", strerror(errno));
        return -1;
    }
    return 0;
}

/* A mount namespace of the launcher's own, private both ways: the machine's disk is mounted there only, so
 * the host's mount table does not grow with every machine (bwrap re-reads the whole table for each of its
 * binds) and the disk goes away with the sandbox's last process. */
static int private_mounts(void) {
    if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) {
        fprintf(stderr, "launch: cannot make a private mount namespace: %s\n", strerror(errno));
        return -1;
    }
    return 0;
}

/* In a parked launcher's private namespace, drop what no sandbox binds: /sys with its cgroup mounts (bwrap puts
 * a tmpfs there) and other machines' overlay disks. bwrap parses the whole mount table once per bind, so a
 * table of a few lines instead of dozens is cheaper at every boot; each detach waits for an expedited RCU
 * grace period, which a parked launcher pays before it is needed. */
static void prune_mounts(void) {
    umount2("/sys", MNT_DETACH);
    FILE *table = setmntent("/proc/self/mounts", "r");
    if (!table) return;
    char *gone[256];
    int ngone = 0;
    struct mntent *m;
    while ((m = getmntent(table)) && ngone < 256)
        if (strcmp(m->mnt_type, "overlay") == 0 && strcmp(m->mnt_dir, "/") != 0) gone[ngone++] = strdup(m->mnt_dir);
    endmntent(table);
    for (int i = 0; i < ngone; i++) {
        umount2(gone[i], MNT_DETACH);
        free(gone[i]);
    }
}

/* Attach IMAGE (an ext4 file system image the size of the machine's disk quota) to a free loop device and mount it at
 * DIR: the overlay's upper and work folders live there, so a full disk is ENOSPC inside the machine and the host
 * loses at most the image's size. The device detaches itself when the file system is unmounted (with the
 * launcher's mount namespace, when the sandbox's last process exits).
 *
 * Taking a free device and binding the image to it are done one machine at a time, under a lock on
 * /dev/loop-control: with hundreds booting at once, another launcher opening the same free device made the mount
 * EBUSY, and each retry's device was the next one's free device again. A bound device is no longer free, so no
 * other launcher is handed it, and the mount runs outside the lock, beside the other machines' mounts. Both slow
 * parts stay out of it: the mount (ext4 reads and writes its superblock and starts a kernel thread per file system)
 * and the write-back of the image's pages (its copy was just written, and binding it writes them back first). Held
 * over them, the lock made every machine's boot wait for each earlier one's disk I/O: 80 launchers queued behind
 * one holder in ext4_fill_super or in write-back, about 0.1 s each on a host with its disk busy. */
static int attach_free(int ctl, int file, char *device, size_t size) {
    for (int tries = 0; tries < 64; tries++) {
        int number = ioctl(ctl, LOOP_CTL_GET_FREE);
        if (number < 0) return -1;
        snprintf(device, size, "/dev/loop%d", number);
        int loop = open(device, O_RDWR | O_CLOEXEC);
        if (loop < 0 && errno == ENOENT) {
            /* A /dev that is not devtmpfs (a container's) gets no node for a device made on demand. */
            if (mknod(device, S_IFBLK | 0600, makedev(7, (unsigned)number)) == 0 || errno == EEXIST)
                loop = open(device, O_RDWR | O_CLOEXEC);
        }
        if (loop < 0) return -1;
        struct loop_config config;
        memset(&config, 0, sizeof config);
        config.fd = (uint32_t)file;
        config.info.lo_flags = LO_FLAGS_AUTOCLEAR;
        if (ioctl(loop, LOOP_CONFIGURE, &config) == 0) return loop;
        int busy = errno == EBUSY; /* another launcher took the same free device first */
        close(loop);
        if (!busy) return -1;
    }
    errno = EBUSY;
    return -1;
}

static int mount_space(const char *image, const char *dir) {
    int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
    int file = open(image, O_RDWR | O_CLOEXEC);
    int done = -1;
    int err = 0;
    if (ctl < 0 || file < 0) {
        fprintf(stderr, "launch: cannot open the disk image %s: %s\n", image, strerror(errno));
        goto out;
    }
    fsync(file); /* outside the lock; a failure shows again when the device is bound */
    for (int tries = 0; tries < 64 && done != 0; tries++) {
        if (flock(ctl, LOCK_EX) != 0) {
            fprintf(stderr, "launch: cannot lock /dev/loop-control: %s\n", strerror(errno));
            goto out;
        }
        char device[32];
        int loop = attach_free(ctl, file, device, sizeof device);
        err = errno;
        flock(ctl, LOCK_UN);
        if (loop < 0) break;
        /* noinit_itable: the image's inode tables stay holes (the kernel would zero them in the background). */
        done = mount(device, dir, "ext4", MS_NOSUID | MS_NODEV, "noinit_itable");
        err = errno;
        close(loop); /* unmounted, the device clears itself at this last close (LO_FLAGS_AUTOCLEAR) */
        /* EBUSY: the device was still held as another machine's went (hundreds of machines booting and ending at
         * once); take another free one. */
        if (done != 0 && err != EBUSY) break;
    }
    if (done != 0) fprintf(stderr, "launch: cannot mount the disk image %s: %s\n", image, strerror(err));
out:
    if (ctl >= 0) close(ctl);
    if (file >= 0) close(file);
    return done;
}

/* Mount the machine's overlay disk at TARGET (over any disk mounted there before, at park time). */
static int mount_disk(const char *target, const char *options) {
    if (umount2(target, MNT_DETACH) != 0 && errno != EINVAL && errno != ENOENT) {
        fprintf(stderr, "launch: cannot unmount %s: %s\n", target, strerror(errno));
        return -1;
    }
    if (mount("overlay", target, "overlay", 0, options) != 0) {
        fprintf(stderr, "launch: cannot mount the overlay disk at %s: %s\n", target, strerror(errno));
        return -1;
    }
    return 0;
}

/* `init --launch [--join FILE]... [--rlimit-as BYTES] -- ARGV...`: on the host, before bwrap, so the whole
 * sandbox starts inside its cgroups with no window. Spawned without a Python preexec hook, which would force a
 * full fork of the host process (~3 ms) instead of vfork. */
static int launch(int argc, char **argv) {
    int i = 2;
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (i + 1 < argc && strcmp(argv[i], "--join") == 0) {
            if (join_cgroup(argv[++i]) != 0) return 126;
        } else if (i + 1 < argc && strcmp(argv[i], "--rlimit-as") == 0) {
            if (set_rlimit_as(argv[++i]) != 0) return 126;
        } else if (strcmp(argv[i], "--private-mounts") == 0) {
            if (private_mounts() != 0) return 126;
        } else if (i + 2 < argc && strcmp(argv[i], "--space") == 0) {
            if (mount_space(argv[i + 1], argv[i + 2]) != 0) return 126;
            i += 2;
        } else if (i + 2 < argc && strcmp(argv[i], "--disk") == 0) {
            if (mount_disk(argv[i + 1], argv[i + 2]) != 0) return 126;
            i += 2;
        } else {
            fprintf(stderr, "launch: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (i + 1 >= argc) return 2;
    execv(argv[i + 1], argv + i + 1);
    fprintf(stderr, "launch: %s: %s\n", argv[i + 1], strerror(errno));
    return 127;
}

#define PARK_MAX_FDS 8
#define PARK_MAX_ITEMS 1024

/* `init --park FD --parent PID [--join FILE]... [--private-mounts [--space IMAGE DIR] [--disk TARGET OPTIONS]]`: a launcher started
 * ahead of demand (see launchers.py). It joins its cgroups first (a cgroup move waits for an RCU grace period,
 * ~12 ms, unless another move happened moments before), takes a mount namespace of its own and mounts the disk
 * it was told to, then waits on the SOCK_SEQPACKET socket FD for one order: NUL-terminated items `fd=N` (one
 * per passed descriptor, in SCM_RIGHTS order: the descriptor becomes number N), `rlimit-as=BYTES`,
 * `disk=TARGET` and `disk-options=OPTIONS` (mount this disk instead), `env=K=V` and `arg=A`, after which it
 * execs the args with that environment. End of file means: nothing to launch, exit. */
static int park(int argc, char **argv) {
    if (argc < 3) return 2;
    int sock = atoi(argv[2]);
    pid_t parent = 0;
    /* Die with the owner while parked; the sandbox it execs sets its own (bwrap --die-with-parent). */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    for (int i = 3; i < argc; i++) {
        if (i + 1 < argc && strcmp(argv[i], "--parent") == 0) parent = (pid_t)atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--join") == 0) {
            if (join_cgroup(argv[++i]) != 0) return 126;
        } else if (strcmp(argv[i], "--private-mounts") == 0) {
            if (private_mounts() != 0) return 126;
            prune_mounts();
        } else if (i + 2 < argc && strcmp(argv[i], "--space") == 0) {
            if (mount_space(argv[i + 1], argv[i + 2]) != 0) return 126;
            i += 2;
        } else if (i + 2 < argc && strcmp(argv[i], "--disk") == 0) {
            if (mount_disk(argv[i + 1], argv[i + 2]) != 0) return 126;
            i += 2;
        } else return 2;
    }
    if (parent && getppid() != parent) return 1; /* the owner died before PDEATHSIG was armed */
    static char buf[1 << 16];
    union {
        struct cmsghdr align;
        char space[CMSG_SPACE(sizeof(int) * PARK_MAX_FDS)];
    } control;
    struct iovec iov = {buf, sizeof buf - 1};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.space,
                         .msg_controllen = sizeof control.space};
    ssize_t n;
    do n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    if (n <= 0) return 0;
    close(sock);
    int got[PARK_MAX_FDS], ngot = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        int count = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        for (int k = 0; k < count && ngot < PARK_MAX_FDS; k++) memcpy(&got[ngot++], CMSG_DATA(c) + k * sizeof(int), sizeof(int));
    }
    if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
        fprintf(stderr, "park: order truncated\n");
        return 2;
    }
    buf[n] = 0;
    static char *args[PARK_MAX_ITEMS + 1], *envp[PARK_MAX_ITEMS + 1];
    int targets[PARK_MAX_FDS], ntargets = 0, nargs = 0, nenv = 0, top = 2;
    const char *disk = NULL, *disk_options = NULL;
    for (char *p = buf; p < buf + n; p += strlen(p) + 1) {
        if (strncmp(p, "disk=", 5) == 0) disk = p + 5;
        else if (strncmp(p, "disk-options=", 13) == 0) disk_options = p + 13;
        else if (strncmp(p, "fd=", 3) == 0 && ntargets < PARK_MAX_FDS) {
            targets[ntargets] = atoi(p + 3);
            if (targets[ntargets] > top) top = targets[ntargets];
            ntargets++;
        } else if (strncmp(p, "rlimit-as=", 10) == 0) {
            if (set_rlimit_as(p + 10) != 0) return 126;
        } else if (strncmp(p, "env=", 4) == 0 && nenv < PARK_MAX_ITEMS) envp[nenv++] = p + 4;
        else if (strncmp(p, "arg=", 4) == 0 && nargs < PARK_MAX_ITEMS) args[nargs++] = p + 4;
    }
    args[nargs] = NULL;
    envp[nenv] = NULL;
    if (nargs == 0 || ntargets != ngot) {
        fprintf(stderr, "park: bad order (%d args, %d fds for %d numbers)\n", nargs, ngot, ntargets);
        return 2;
    }
    /* Move every received descriptor above all targets first, so no dup2 below lands on one still needed. */
    for (int k = 0; k < ngot; k++)
        if (got[k] > top) top = got[k];
    for (int k = 0; k < ngot; k++) {
        int high = fcntl(got[k], F_DUPFD_CLOEXEC, top + 1);
        if (high < 0) return 126;
        close(got[k]);
        got[k] = high;
    }
    for (int k = 0; k < ngot; k++) {
        if (dup2(got[k], targets[k]) < 0) return 126; /* dup2 leaves the target without close-on-exec */
        close(got[k]);
    }
    /* After the descriptors: a failure is written to the machine's log (fd 2 by now). */
    if (disk && disk_options && mount_disk(disk, disk_options) != 0) return 126;
    execve(args[0], args, envp);
    fprintf(stderr, "launch: %s: %s\n", args[0], strerror(errno));
    return 127;
}

/* Leave the root of the machine's user namespace (which bwrap needed to set the sandbox up) for UID, gid the same,
 * no supplementary groups; after this the process has no capability left. */
static int drop_to(uid_t uid) {
    if (setgroups(0, NULL) != 0 || setresgid(uid, uid, uid) != 0 || setresuid(uid, uid, uid) != 0) {
        perror("init: cannot drop to the machine's uid");
        return -1;
    }
    return 0;
}

#ifndef SYS_mount_setattr
#define SYS_mount_setattr 442
#endif
#ifndef MOUNT_ATTR_NOEXEC
#define MOUNT_ATTR_NOEXEC 0x00000008
#endif
#ifndef AT_RECURSIVE
#define AT_RECURSIVE 0x8000
#endif

/* Undo mountinfo's octal escapes (a space is \040) in place. */
static void unescape_mount_point(char *s) {
    char *w = s;
    for (char *r = s; *r;) {
        if (r[0] == '\\' && r[1] >= '0' && r[1] <= '3' && r[2] >= '0' && r[2] <= '7' && r[3] >= '0' && r[3] <= '7') {
            *w++ = (char)(((r[1] - '0') << 6) | ((r[2] - '0') << 3) | (r[3] - '0'));
            r += 4;
        } else {
            *w++ = *r++;
        }
    }
    *w = 0;
}

#define KEEP_EXEC_MAX 256
/* The read-only mounts strictly beneath PATH that are not noexec: the machine's view of the interpreter and its
 * packages sits there when they are installed beneath a writable folder (a virtual environment under /tmp, say).
 * Nothing can write them, so they keep their exec; what PATH's recursive marking gives them is taken back. */
static int read_only_beneath(const char *path, char keep[][4096], int max) {
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (f == NULL) return 0;
    char line[8192];
    size_t len = strlen(path);
    int n = 0;
    while (n < max && fgets(line, sizeof line, f) != NULL) {
        char *save = NULL, *field[6];
        int got = 0;
        for (char *t = strtok_r(line, " ", &save); t != NULL && got < 6; t = strtok_r(NULL, " ", &save)) field[got++] = t;
        if (got < 6) continue;
        unescape_mount_point(field[4]);
        if (strncmp(field[4], path, len) != 0 || field[4][len] != '/') continue;
        int ro = 0, noexec = 0;
        char *osave = NULL;
        for (char *o = strtok_r(field[5], ",", &osave); o != NULL; o = strtok_r(NULL, ",", &osave)) {
            if (strcmp(o, "ro") == 0) ro = 1;
            if (strcmp(o, "noexec") == 0) noexec = 1;
        }
        if (ro && !noexec) snprintf(keep[n++], 4096, "%s", field[4]);
    }
    fclose(f);
    return n;
}

/* Mark PATH's mount noexec (with every writable mount beneath it, except for "/", whose tree holds /usr): no file
 * on it can be executed or mapped executable, even by ld.so. Needs CAP_SYS_ADMIN in the machine's user namespace,
 * so it runs before the uid drop and before the seccomp filter (which denies mount_setattr). */
static int mount_noexec(const char *path, char *why, size_t whylen) {
    static char keep[KEEP_EXEC_MAX][4096];
    struct { uint64_t attr_set, attr_clr, propagation, userns_fd; } attr = {MOUNT_ATTR_NOEXEC, 0, 0, 0};
    int recursive = strcmp(path, "/") != 0;
    int kept = recursive ? read_only_beneath(path, keep, KEEP_EXEC_MAX) : 0;
    if (syscall(SYS_mount_setattr, AT_FDCWD, path, recursive ? AT_RECURSIVE : 0, &attr, sizeof attr) != 0) {
        snprintf(why, whylen, "mount_setattr(noexec) %s: %s", path, strerror(errno));
        return -1;
    }
    struct { uint64_t attr_set, attr_clr, propagation, userns_fd; } back = {0, MOUNT_ATTR_NOEXEC, 0, 0};
    for (int i = 0; i < kept; i++) {
        if (syscall(SYS_mount_setattr, AT_FDCWD, keep[i], 0, &back, sizeof back) != 0) {
            snprintf(why, whylen, "mount_setattr(exec) %s: %s", keep[i], strerror(errno));
            return -1;
        }
    }
    return 0;
}

/* Give up every capability (a sandbox bwrap started as a non-root uid holds the ones it was given as ambient; a
 * nested user namespace starts with all of them), and the bounding set where CAP_SETPCAP allows. */
static int drop_capabilities(char *why, size_t whylen) {
    struct __user_cap_header_struct head = {_LINUX_CAPABILITY_VERSION_3, 0};
    for (int cap = 0; cap < 64 && prctl(PR_CAPBSET_READ, cap, 0, 0, 0) >= 0; cap++) prctl(PR_CAPBSET_DROP, cap, 0, 0, 0);
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof data);
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 || syscall(SYS_capset, &head, data) != 0) {
        snprintf(why, whylen, "cannot drop capabilities: %s", strerror(errno));
        return -1;
    }
    return 0;
}

/* Load the seccomp filter (struct sock_filter bytes, as bwrap's --seccomp reads them) from FD, then close it. */
static int load_seccomp(int fd, char *why, size_t whylen) {
    static struct sock_filter insns[4096];
    size_t got = 0;
    ssize_t n;
    while ((n = read(fd, (char *)insns + got, sizeof insns - got)) > 0) got += (size_t)n;
    close(fd);
    if (n < 0 || got == 0 || got % sizeof insns[0] != 0) {
        snprintf(why, whylen, "cannot read the seccomp filter");
        return -1;
    }
    struct sock_fprog prog = {(unsigned short)(got / sizeof insns[0]), insns};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) != 0) {
        snprintf(why, whylen, "cannot load the seccomp filter: %s", strerror(errno));
        return -1;
    }
    return 0;
}

static int write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    int ok = write_all(fd, text, strlen(text));
    close(fd);
    return ok;
}

/* Become UID (and its gid) in a user namespace of our own nested in the machine's, as bwrap does when it is not
 * root and the sandbox's uid is not 0: bwrap's own nested namespace would not own the machine's mounts, so it is
 * made here, after they were marked noexec. */
static int nest_user(uid_t uid, char *why, size_t whylen) {
    uid_t outer = getuid();
    gid_t outer_gid = getgid();
    char map[64];
    if (unshare(CLONE_NEWUSER) != 0) {
        snprintf(why, whylen, "unshare(CLONE_NEWUSER): %s", strerror(errno));
        return -1;
    }
    snprintf(map, sizeof map, "%u %u 1\n", (unsigned)uid, (unsigned)outer);
    if (write_file("/proc/self/uid_map", map) != 0 || write_file("/proc/self/setgroups", "deny") != 0) {
        snprintf(why, whylen, "cannot map the machine's uid: %s", strerror(errno));
        return -1;
    }
    snprintf(map, sizeof map, "%u %u 1\n", (unsigned)uid, (unsigned)outer_gid);
    if (write_file("/proc/self/gid_map", map) != 0) {
        snprintf(why, whylen, "cannot map the machine's gid: %s", strerror(errno));
        return -1;
    }
    return 0;
}

/* Report a failure to start on the ready pipe (the host reads it as the boot's error) and give up. */
static int boot_failed(int ready_fd, const char *why) {
    char line[700];
    int n = snprintf(line, sizeof line, "{\"error\": \"%s\"}\n", why);
    write_all(ready_fd, line, (size_t)n);
    return 3;
}

static void usage(void) {
    fprintf(stderr,
            "usage: init [--user UID] --ctl PATH --ready-fd N [--cwd DIR] [--relay-target PATH --relay-port N]\n"
            "            [--writable DIR]... [--device DIR]... [--exec-only FILE]... [--landlock]\n"
            "            [--landlock-required] [--noexec DIR]... [--seccomp-fd N] [--host-only] [--nest-user UID]\n");
    exit(2);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--launch") == 0) return launch(argc, argv);
    if (argc > 1 && strcmp(argv[1], "--park") == 0) return park(argc, argv);
    const char *ctl = NULL, *cwd = "/";
    int ready_fd = -1, relay_port = -1, want_landlock = 0, landlock_required = 0;
    long drop_uid = -1, nest_uid = -1;
    char *writable[16], *devices[16], *exec_only[16], *noexec[16];
    int nwritable = 0, ndevices = 0, nexec = 0, nnoexec = 0, seccomp_fd = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 < argc && strcmp(a, "--ctl") == 0) ctl = argv[++i];
        else if (i + 1 < argc && strcmp(a, "--ready-fd") == 0) ready_fd = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(a, "--cwd") == 0) cwd = argv[++i];
        else if (i + 1 < argc && strcmp(a, "--relay-target") == 0) relay_target = argv[++i];
        else if (i + 1 < argc && strcmp(a, "--relay-port") == 0) relay_port = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(a, "--writable") == 0 && nwritable < 16) writable[nwritable++] = argv[++i];
        else if (i + 1 < argc && strcmp(a, "--device") == 0 && ndevices < 16) devices[ndevices++] = argv[++i];
        else if (i + 1 < argc && strcmp(a, "--exec-only") == 0 && nexec < 16) exec_only[nexec++] = argv[++i];
        else if (i + 1 < argc && strcmp(a, "--noexec") == 0 && nnoexec < 16) noexec[nnoexec++] = argv[++i];
        else if (i + 1 < argc && strcmp(a, "--seccomp-fd") == 0) seccomp_fd = atoi(argv[++i]);
        else if (strcmp(a, "--host-only") == 0) host_only = 1;
        else if (strcmp(a, "--landlock") == 0) want_landlock = 1;
        else if (strcmp(a, "--landlock-required") == 0) landlock_required = 1;
        else if (i + 1 < argc && strcmp(a, "--user") == 0) drop_uid = (long)atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(a, "--nest-user") == 0) nest_uid = (long)atoi(argv[++i]);
        else usage();
    }
    if (!ctl || ready_fd < 0) usage();
    /* A governed machine: its writable mounts noexec while the init still holds CAP_SYS_ADMIN, then every
     * capability dropped, then the seccomp filter (bwrap would have loaded it before any of this could run). */
    char why[512] = "";
    for (int k = 0; k < nnoexec; k++)
        if (mount_noexec(noexec[k], why, sizeof why) != 0) return boot_failed(ready_fd, why);
    if (drop_uid >= 0 && drop_to((uid_t)drop_uid) != 0) return 1;
    if (nest_uid >= 0 && nest_user((uid_t)nest_uid, why, sizeof why) != 0) return boot_failed(ready_fd, why);
    /* Not dumpable (once the uid maps are written: a non-dumpable process cannot write its own): no process of the
     * machine (same uid) may open /proc/<init>/mem and make the init, which can exec, run code of its choosing.
     * Leaving root does this too; bwrap's own user namespace would have started us as the machine's uid. */
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    if (nnoexec && drop_capabilities(why, sizeof why) != 0) return boot_failed(ready_fd, why);
    if (seccomp_fd >= 0 && load_seccomp(seccomp_fd, why, sizeof why) != 0) return boot_failed(ready_fd, why);
    signal(SIGPIPE, SIG_IGN);
    /* Bind by a relative name: a run folder deep under a temp dir can exceed the 108-byte socket path limit. */
    char *dir = strdup(ctl);
    char *slash = strrchr(dir, '/');
    const char *name = ctl;
    if (slash) {
        *slash = 0;
        name = slash + 1;
        if (chdir(*dir ? dir : "/") != 0) {
            perror("chdir");
            return 1;
        }
    }
    unlink(name);
    int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s", name);
    if (listener < 0 || bind(listener, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(listener, 256) != 0) {
        perror("control socket");
        return 1;
    }
    if (chdir(cwd) != 0) {
        perror("chdir");
        return 1;
    }
    int relay_listener = -1, bound_port = -1;
    if (relay_target) {
        relay_listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int one = 1;
        setsockopt(relay_listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        struct sockaddr_in in = {.sin_family = AF_INET, .sin_port = htons((uint16_t)(relay_port < 0 ? 0 : relay_port))};
        in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t inlen = sizeof in;
        if (bind(relay_listener, (struct sockaddr *)&in, sizeof in) != 0 || listen(relay_listener, 128) != 0 ||
            getsockname(relay_listener, (struct sockaddr *)&in, &inlen) != 0) {
            perror("relay");
            return 1;
        }
        bound_port = ntohs(in.sin_port);
    }
    /* Landlock before any thread starts: every thread and every command inherits the domain. */
    int abi = 0;
    if (want_landlock) {
        abi = landlock_restrict(writable, nwritable, devices, ndevices, exec_only, nexec, why, sizeof why);
        /* an exec allowlist is never dropped for a weaker sandbox */
        if (!abi && (landlock_required || nexec)) return boot_failed(ready_fd, why);
    }
    if (relay_listener >= 0) {
        pthread_t t;
        if (pthread_create(&t, NULL, relay_serve, (void *)(intptr_t)relay_listener) != 0) {
            perror("relay thread");
            return 1;
        }
        pthread_detach(t);
    }
    char line[128];
    int n;
    if (bound_port >= 0)
        n = snprintf(line, sizeof line, "{\"pid\": %d, \"relay_port\": %d, \"landlock_abi\": %d}\n", getpid(),
                     bound_port, abi);
    else
        n = snprintf(line, sizeof line, "{\"pid\": %d, \"relay_port\": null, \"landlock_abi\": %d}\n", getpid(), abi);
    write_all(ready_fd, line, (size_t)n);
    close(ready_fd);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    while (1) {
        int conn = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
        if (conn < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE) continue;
            perror("accept");
            return 1;
        }
        pthread_t t;
        if (pthread_create(&t, &attr, serve_one, (void *)(intptr_t)conn) != 0) close(conn);
    }
}
