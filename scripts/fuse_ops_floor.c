/* The floor of each user operation through FUSE on this machine: a filesystem in C that speaks
 * the kernel's protocol itself (as zarrfs does, no libfuse), answers every request from memory
 * at once, asks the kernel for the same features as zarrfs (READDIRPLUS, HANDLE_KILLPRIV_V2,
 * 1 MiB writes) and counts the requests it gets by type. scripts/bench_ops.py builds it, runs the
 * same operations through it and through zarrfs, and prints both.
 *
 *   gcc -O2 scripts/fuse_ops_floor.c -o /tmp/fuse_ops_floor
 *   /tmp/fuse_ops_floor MOUNTPOINT ENTRIES COUNTS_FILE [SPIN_US] &   # kill -USR1: counts to COUNTS_FILE
 *   fusermount3 -u MOUNTPOINT
 *
 * SPIN_US (0 by default): after each request, keep reading for up to that many microseconds
 * before sleeping in poll(), as zarrfs's loop does (-o spin=), so a client's next request finds
 * the daemon awake; the floor's wall time is then the least a spinning daemon gets.
 *
 * The tree: names starting with "e" in the root are files of 4096 bytes; "big" is a folder of
 * ENTRIES files named 0 .. ENTRIES-1; any other name is missing until created (a create is
 * answered, its bytes dropped). Mounted through fusermount3 (_FUSE_COMMFD).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <poll.h>
#include <time.h>
#include <unistd.h>

struct in_header { uint32_t len, opcode; uint64_t unique, nodeid; uint32_t uid, gid, pid; uint16_t extlen, pad; };
struct out_header { uint32_t len; int32_t error; uint64_t unique; };
struct attr {
    uint64_t ino, size, blocks, atime, mtime, ctime;
    uint32_t atimensec, mtimensec, ctimensec, mode, nlink, uid, gid, rdev, blksize, flags;
};
struct entry_out { uint64_t nodeid, generation, entry_valid, attr_valid; uint32_t entry_nsec, attr_nsec; struct attr attr; };
struct attr_out { uint64_t attr_valid; uint32_t attr_nsec, dummy; struct attr attr; };
struct open_out { uint64_t fh; uint32_t open_flags, padding; };
struct init_out {
    uint32_t major, minor, max_readahead, flags;
    uint16_t max_background, congestion_threshold;
    uint32_t max_write, time_gran;
    uint16_t max_pages, map_alignment;
    uint32_t flags2, unused[7];
};
struct rw_in { uint64_t fh, offset; uint32_t size, rw_flags; uint64_t lock_owner; uint32_t flags, padding; };
struct dirent_head { uint64_t ino, off; uint32_t namelen, type; };

enum { LOOKUP = 1, FORGET = 2, GETATTR = 3, SETATTR = 4, OPEN = 14, READ = 15, WRITE = 16, STATFS = 17,
       RELEASE = 18, GETXATTR = 22, LISTXATTR = 23, FLUSH = 25, INIT = 26, OPENDIR = 27, READDIR = 28,
       RELEASEDIR = 29, CREATE = 35, INTERRUPT = 36, DESTROY = 38, IOCTL = 39, BATCH_FORGET = 42,
       READDIRPLUS = 44 };
#define BIG 2
#define E_BASE (1ULL << 40)  /* node IDs of the "e" names: a hash of the name */
#define BIG_BASE (1ULL << 20) /* node IDs of big's files */
#define FILE_SIZE 4096
/* ASYNC_READ ATOMIC_O_TRUNC BIG_WRITES DO_READDIRPLUS ASYNC_DIO PARALLEL_DIROPS MAX_PAGES
 * HANDLE_KILLPRIV_V2: what zarrfs asks for (zarrfs/fuse/abi.py WANTED, less flags2's). */
#define WANTED ((1u << 0) | (1u << 3) | (1u << 5) | (1u << 13) | (1u << 15) | (1u << 18) | (1u << 22) | (1u << 28))
#define MAX_WRITE (1 << 20)
#define PAUSE_US 2.0  /* between two reads of a spinning loop */

static int fd;
static uint64_t entries, next_node = 1ULL << 48;
static uint64_t counts[64];
static volatile sig_atomic_t dump;
static char buf[MAX_WRITE + 8192], out[MAX_WRITE + 8192];

static void on_usr1(int sig) { (void)sig; dump = 1; }

static void dump_counts(const char *path) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    for (int i = 0; i < 64; i++)
        if (counts[i]) fprintf(f, "%d %llu\n", i, (unsigned long long)counts[i]);
    fclose(f);
    rename(tmp, path);
}

static void reply(uint64_t unique, int error, const void *data, size_t size) {
    struct out_header h = {sizeof h + (error ? 0 : size), -error, unique};
    struct iovec iov[2] = {{&h, sizeof h}, {(void *)data, error ? 0 : size}};
    if (writev(fd, iov, 2) < 0 && errno != ENOENT) perror("writev");
}

static void fill_attr(struct attr *a, uint64_t node) {
    memset(a, 0, sizeof *a);
    a->ino = node;
    a->nlink = 1;
    a->blksize = 1 << 20;
    if (node == 1 || node == BIG) {
        a->mode = S_IFDIR | 0755;
        return;
    }
    a->mode = S_IFREG | 0644;
    a->size = node >= (1ULL << 48) ? 0 : FILE_SIZE;  /* a created file starts empty */
    a->blocks = a->size / 512;
}

static void entry(uint64_t unique, uint64_t node) {
    struct entry_out e = {node, 0, 1, 1, 0, 0, {0}};
    if (!node) e.entry_valid = 1;  /* a missing name, cached as zarrfs's are */
    else fill_attr(&e.attr, node);
    reply(unique, 0, &e, sizeof e);
}

static uint64_t name_node(const char *name) {
    uint64_t h = 1469598103934665603ULL;
    for (; *name; name++) h = (h ^ (unsigned char)*name) * 1099511628211ULL;
    return E_BASE | (h & ((1ULL << 39) - 1));
}

static uint64_t lookup(uint64_t parent, const char *name) {
    if (parent == 1 && !strcmp(name, "big")) return BIG;
    if (parent == 1 && name[0] == 'e') return name_node(name);
    if (parent == BIG) {
        char *end;
        unsigned long long i = strtoull(name, &end, 10);
        if (*name && !*end && i < entries) return BIG_BASE + i;
    }
    return 0;
}

static void readdir(struct in_header *h, const struct rw_in *in, int plus) {
    size_t used = 0;
    uint64_t i = in->offset;
    if (h->nodeid != BIG) i = entries;  /* the root lists nothing */
    for (; i < entries; i++) {
        char name[32];
        int n = snprintf(name, sizeof name, "%llu", (unsigned long long)i);
        size_t rec = (sizeof(struct dirent_head) + n + 7) & ~7ULL;
        size_t need = rec + (plus ? sizeof(struct entry_out) : 0);
        if (used + need > in->size || used + need > sizeof out) break;
        if (plus) {
            struct entry_out e = {BIG_BASE + i, 0, 1, 1, 0, 0, {0}};
            fill_attr(&e.attr, BIG_BASE + i);
            memcpy(out + used, &e, sizeof e);
            used += sizeof e;
        }
        struct dirent_head d = {BIG_BASE + i, i + 1, n, S_IFREG >> 12};
        memset(out + used, 0, rec);
        memcpy(out + used, &d, sizeof d);
        memcpy(out + used + sizeof d, name, n);
        used += rec;
    }
    reply(h->unique, 0, out, used);
}

static void serve(struct in_header *h, char *arg) {
    counts[h->opcode < 64 ? h->opcode : 63]++;
    switch (h->opcode) {
    case INIT: {
        uint32_t *in = (uint32_t *)arg;
        struct init_out o = {7, in[1] < 39 ? in[1] : 39, in[2], in[3] & WANTED, 0, 0, MAX_WRITE, 1,
                             MAX_WRITE / 4096, 0, 0, {0}};
        reply(h->unique, 0, &o, sizeof o);
        return;
    }
    case LOOKUP: entry(h->unique, lookup(h->nodeid, arg)); return;
    case FORGET: case BATCH_FORGET: case INTERRUPT: return;
    case GETATTR: case SETATTR: {
        struct attr_out o = {1, 0, 0, {0}};
        fill_attr(&o.attr, h->nodeid);
        reply(h->unique, 0, &o, sizeof o);
        return;
    }
    case CREATE: {
        struct { struct entry_out e; struct open_out o; } r;
        memset(&r, 0, sizeof r);
        r.e.nodeid = next_node++;
        r.e.entry_valid = r.e.attr_valid = 1;
        fill_attr(&r.e.attr, r.e.nodeid);
        reply(h->unique, 0, &r, sizeof r);
        return;
    }
    case OPEN: case OPENDIR: {
        struct open_out o = {0, 0, 0};
        reply(h->unique, 0, &o, sizeof o);
        return;
    }
    case READ: {
        struct rw_in *in = (struct rw_in *)arg;
        uint64_t size = FILE_SIZE, n = in->offset >= size ? 0 : size - in->offset;
        if (n > in->size) n = in->size;
        memset(out, 'e', n);
        reply(h->unique, 0, out, n);
        return;
    }
    case WRITE: {
        uint32_t o[2] = {((struct rw_in *)arg)->size, 0};
        reply(h->unique, 0, o, sizeof o);
        return;
    }
    case STATFS: {
        uint64_t s[10] = {0};
        reply(h->unique, 0, s, 80);
        return;
    }
    case GETXATTR: reply(h->unique, ENODATA, NULL, 0); return;
    case LISTXATTR: {
        uint32_t o[2] = {0, 0};
        if (((uint32_t *)arg)[0]) reply(h->unique, 0, NULL, 0);
        else reply(h->unique, 0, o, sizeof o);
        return;
    }
    case READDIR: readdir(h, (struct rw_in *)arg, 0); return;
    case READDIRPLUS: readdir(h, (struct rw_in *)arg, 1); return;
    case FLUSH: case RELEASE: case RELEASEDIR: case DESTROY: reply(h->unique, 0, NULL, 0); return;
    case IOCTL: reply(h->unique, ENOTTY, NULL, 0); return;
    default: reply(h->unique, ENOSYS, NULL, 0);
    }
}

static int mount_fuse(const char *mountpoint) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        char s[16];
        close(sv[0]);
        snprintf(s, sizeof s, "%d", sv[1]);
        setenv("_FUSE_COMMFD", s, 1);
        execlp("fusermount3", "fusermount3", "-o", "rw,nosuid,nodev,fsname=floor,subtype=floor", "--",
               mountpoint, (char *)NULL);
        _exit(127);
    }
    close(sv[1]);
    char byte, control[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {&byte, 1};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof control};
    int got = -1;
    if (recvmsg(sv[0], &msg, 0) > 0) {
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        if (c && c->cmsg_type == SCM_RIGHTS) memcpy(&got, CMSG_DATA(c), sizeof got);
    }
    close(sv[0]);
    waitpid(pid, NULL, 0);
    return got;
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

int main(int argc, char **argv) {
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: %s MOUNTPOINT ENTRIES COUNTS_FILE [SPIN_US]\n", argv[0]);
        return 2;
    }
    entries = strtoull(argv[2], NULL, 10);
    double spin = argc == 5 ? strtod(argv[4], NULL) : 0, last = 0;
    struct sigaction sa = {.sa_handler = on_usr1};  /* no SA_RESTART: a read is interrupted */
    sigaction(SIGUSR1, &sa, NULL);
    fd = mount_fuse(argv[1]);
    if (fd < 0) {
        fprintf(stderr, "fuse_ops_floor: cannot mount %s\n", argv[1]);
        return 1;
    }
    if (spin > 0)
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    for (;;) {
        if (dump) {
            dump = 0;
            dump_counts(argv[3]);
        }
        ssize_t n = read(fd, buf, sizeof buf);
        if (n < 0 && errno == EAGAIN) {
            double t = now_us();
            if (t - last > spin) {
                struct pollfd p = {.fd = fd, .events = POLLIN};
                poll(&p, 1, -1);  /* the window passed: sleep until a request (or SIGUSR1) */
            } else {
                while (now_us() - t < PAUSE_US) {}  /* not a read a few hundred ns: each takes the queue's lock */
            }
            continue;
        }
        if (n < 0) {
            if (errno == EINTR || errno == ENOENT || errno == EAGAIN) continue;
            if (errno == ENODEV) return 0;  /* unmounted */
            perror("read");
            return 1;
        }
        if ((size_t)n < sizeof(struct in_header)) continue;
        serve((struct in_header *)buf, buf + sizeof(struct in_header));
        if (spin > 0)
            last = now_us();
    }
}
