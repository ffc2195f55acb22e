/* What FUSE itself allows on a machine: a libfuse3 filesystem that answers every lookup at
 * once (names starting with "e" exist, all others do not), served by one thread that polls
 * /dev/fuse for SPIN_US microseconds after each request before it sleeps (0: sleep at once,
 * as libfuse's own loop does). zarrfs/loop.py is the same loop in the daemon.
 *
 *   gcc -O2 scripts/fuse_floor.c -o /tmp/fuse_floor $(pkg-config --cflags --libs fuse3)
 *   mkdir -p /tmp/floor && /tmp/fuse_floor /tmp/floor 0 &     # or 200
 *   python3 -c 'import os, time
 *   t = time.perf_counter()
 *   for i in range(20000):
 *       os.path.exists(f"/tmp/floor/x{i}")
 *   print(20000 / (time.perf_counter() - t), "lookups/s")'
 *   fusermount3 -u /tmp/floor
 */
#define FUSE_USE_VERSION 31
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <fuse_lowlevel.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int floor_getattr(const char *path, struct stat *st, struct fuse_file_info *fi) {
    (void)fi;
    memset(st, 0, sizeof *st);
    if (!strcmp(path, "/")) {
        st->st_mode = S_IFDIR | 0755;
        st->st_nlink = 2;
        return 0;
    }
    if (path[1] == 'e') {
        st->st_mode = S_IFREG | 0644;
        st->st_nlink = 1;
        st->st_size = 10;
        return 0;
    }
    return -ENOENT;
}

static void *floor_init(struct fuse_conn_info *conn, struct fuse_config *cfg) {
    (void)conn;
    cfg->entry_timeout = cfg->attr_timeout = cfg->negative_timeout = 1;
    return NULL;
}

static const struct fuse_operations ops = {.getattr = floor_getattr, .init = floor_init};

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    double spin = atof(argv[2]) * 1e-6;
    char *args0[] = {argv[0]};
    struct fuse_args args = FUSE_ARGS_INIT(1, args0);
    struct fuse *f = fuse_new(&args, &ops, sizeof ops, NULL);
    if (!f || fuse_mount(f, argv[1])) return 1;
    struct fuse_session *se = fuse_get_session(f);
    fuse_set_signal_handlers(se);
    int fd = fuse_session_fd(se);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    struct fuse_buf buf = {0};
    double last = now();
    while (!fuse_session_exited(se)) {
        int res = fuse_session_receive_buf(se, &buf);
        if (res == -EAGAIN || res == -EINTR) {
            if (now() - last > spin) {
                struct pollfd p = {fd, POLLIN, 0};
                poll(&p, 1, 500);
                last = now();
            }
            continue;
        }
        if (res <= 0) break;
        fuse_session_process_buf(se, &buf);
        last = now();
    }
    free(buf.mem);
    fuse_session_reset(se);
    fuse_remove_signal_handlers(se);
    fuse_unmount(f);
    fuse_destroy(f);
    return 0;
}
