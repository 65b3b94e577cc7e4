/* A FUSE filesystem in kernel passthrough mode (FUSE_PASSTHROUGH, Linux >= 6.9), speaking
 * /dev/fuse directly: libfuse 3.14 (Debian 12) and pyfuse3 3.5 cannot ask for it. It serves
 * the regular files of one SOURCE directory, flat, read-only; each open hands the kernel the
 * SOURCE file as backing file (FUSE_DEV_IOC_BACKING_OPEN), so reads and re-reads go to that
 * file's own page cache and never reach this daemon. bench/reread.py measures it beside
 * journalfs: what the re-read row would reach if pyfuse3 offered passthrough.
 *
 *   fuse_passthrough SOURCE MOUNTPOINT     (as root; stays in the foreground until unmounted)
 *
 * Struct layouts and numbers are those of include/uapi/linux/fuse.h, protocol 7.40; they are
 * spelt out here because the installed header predates passthrough.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

enum { OP_LOOKUP = 1, OP_FORGET = 2, OP_GETATTR = 3, OP_OPEN = 14, OP_RELEASE = 18,
       OP_FLUSH = 25, OP_INIT = 26, OP_OPENDIR = 27, OP_READDIR = 28, OP_RELEASEDIR = 29,
       OP_INTERRUPT = 36, OP_DESTROY = 38, OP_BATCH_FORGET = 42 };

struct in_header { uint32_t len, opcode; uint64_t unique, nodeid; uint32_t uid, gid, pid;
                   uint16_t total_extlen, padding; };
struct out_header { uint32_t len; int32_t error; uint64_t unique; };
struct init_in { uint32_t major, minor, max_readahead, flags, flags2, unused[11]; };
struct init_out { uint32_t major, minor, max_readahead, flags; uint16_t max_background,
                  congestion_threshold; uint32_t max_write, time_gran; uint16_t max_pages,
                  map_alignment; uint32_t flags2, max_stack_depth; uint16_t request_timeout,
                  unused[11]; };
struct attr { uint64_t ino, size, blocks, atime, mtime, ctime; uint32_t atimensec, mtimensec,
              ctimensec, mode, nlink, uid, gid, rdev, blksize, flags; };
struct entry_out { uint64_t nodeid, generation, entry_valid, attr_valid;
                   uint32_t entry_valid_nsec, attr_valid_nsec; struct attr attr; };
struct attr_out { uint64_t attr_valid; uint32_t attr_valid_nsec, dummy; struct attr attr; };
struct open_out { uint64_t fh; uint32_t open_flags; int32_t backing_id; };
struct backing_map { int32_t fd; uint32_t flags; uint64_t padding; };

#define FUSE_ASYNC_READ (1u << 0)
#define FUSE_MAX_PAGES (1u << 22)
#define FUSE_INIT_EXT (1u << 30)
#define FUSE_PASSTHROUGH_FLAG2 (1u << 5) /* bit 37 of the 64-bit flags */
#define FOPEN_KEEP_CACHE (1u << 1)
#define FOPEN_PASSTHROUGH (1u << 7)
#define DEV_IOC_BACKING_OPEN _IOW(229, 1, struct backing_map)
#define DEV_IOC_BACKING_CLOSE _IOW(229, 2, uint32_t)

#define MAX_FILES 1024
static int source_fd;
static char names[MAX_FILES][256];
static int nfiles;

static void reply(int dev, uint64_t unique, int error, const void *body, size_t size) {
    char buf[sizeof(struct out_header) + 256];
    struct out_header *out = (struct out_header *)buf;
    out->len = sizeof(*out) + (error ? 0 : size);
    out->error = -error;
    out->unique = unique;
    if (!error && size)
        memcpy(buf + sizeof(*out), body, size);
    if (write(dev, buf, out->len) < 0 && errno != ENOENT)
        perror("fuse_passthrough: reply");
}

static void fill_attr(struct attr *a, const struct stat *st, uint64_t ino) {
    memset(a, 0, sizeof(*a));
    a->ino = ino;
    a->size = st->st_size;
    a->blocks = st->st_blocks;
    a->atime = st->st_atim.tv_sec, a->atimensec = st->st_atim.tv_nsec;
    a->mtime = st->st_mtim.tv_sec, a->mtimensec = st->st_mtim.tv_nsec;
    a->ctime = st->st_ctim.tv_sec, a->ctimensec = st->st_ctim.tv_nsec;
    a->mode = st->st_mode, a->nlink = st->st_nlink, a->uid = st->st_uid, a->gid = st->st_gid;
    a->blksize = st->st_blksize;
}

/* node ids: 1 the root, 2 + i the i-th regular file of SOURCE */
static int stat_node(uint64_t node, struct stat *st) {
    if (node == 1)
        return fstat(source_fd, st);
    if (node < 2 || node - 2 >= (uint64_t)nfiles)
        return errno = ENOENT, -1;
    return fstatat(source_fd, names[node - 2], st, AT_SYMLINK_NOFOLLOW);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s SOURCE MOUNTPOINT\n", argv[0]);
        return 2;
    }
    source_fd = open(argv[1], O_RDONLY | O_DIRECTORY);
    DIR *dir = source_fd < 0 ? NULL : fdopendir(dup(source_fd));
    if (!dir) {
        perror(argv[1]);
        return 1;
    }
    for (struct dirent *d; (d = readdir(dir)) && nfiles < MAX_FILES;)
        if (d->d_type == DT_REG && strlen(d->d_name) < sizeof(names[0]))
            strcpy(names[nfiles++], d->d_name);
    closedir(dir);
    int dev = open("/dev/fuse", O_RDWR | O_CLOEXEC);
    if (dev < 0) {
        perror("/dev/fuse");
        return 1;
    }
    char opts[128];
    snprintf(opts, sizeof(opts), "fd=%d,rootmode=40000,user_id=0,group_id=0,allow_other", dev);
    if (mount("fuse-passthrough", argv[2], "fuse.fuse-passthrough", MS_NOSUID | MS_NODEV,
              opts) < 0) {
        perror("mount");
        return 1;
    }
    size_t bufsize = (1 << 20) + 4096;
    char *buf = malloc(bufsize);
    for (;;) {
        ssize_t n = read(dev, buf, bufsize);
        if (n < 0) {
            if (errno == EINTR || errno == ENOENT || errno == EAGAIN)
                continue;
            if (errno == ENODEV)
                return 0; /* unmounted */
            perror("read /dev/fuse");
            return 1;
        }
        struct in_header *in = (struct in_header *)buf;
        void *arg = buf + sizeof(*in);
        struct stat st;
        switch (in->opcode) {
        case OP_INIT: {
            struct init_in *ii = arg;
            struct init_out io = {0};
            io.major = 7;
            io.minor = ii->minor < 40 ? ii->minor : 40;
            io.max_readahead = ii->max_readahead;
            io.flags = (ii->flags & (FUSE_ASYNC_READ | FUSE_MAX_PAGES | FUSE_INIT_EXT));
            io.flags2 = ii->flags2 & FUSE_PASSTHROUGH_FLAG2;
            io.max_stack_depth = 1;
            io.max_background = 16, io.congestion_threshold = 12;
            io.max_write = 1 << 20, io.max_pages = 256;
            if (!io.flags2)
                fprintf(stderr, "fuse_passthrough: the kernel offers no passthrough\n");
            reply(dev, in->unique, 0, &io, sizeof(io));
            break;
        }
        case OP_LOOKUP: {
            const char *name = arg;
            int found = -1;
            for (int i = 0; i < nfiles; i++)
                if (in->nodeid == 1 && strcmp(names[i], name) == 0)
                    found = i;
            if (found < 0 || stat_node(2 + found, &st) < 0) {
                reply(dev, in->unique, ENOENT, NULL, 0);
                break;
            }
            struct entry_out e = {.nodeid = 2 + found, .entry_valid = 3600, .attr_valid = 3600};
            fill_attr(&e.attr, &st, e.nodeid);
            reply(dev, in->unique, 0, &e, sizeof(e));
            break;
        }
        case OP_GETATTR: {
            if (stat_node(in->nodeid, &st) < 0) {
                reply(dev, in->unique, errno, NULL, 0);
                break;
            }
            struct attr_out a = {.attr_valid = 3600};
            fill_attr(&a.attr, &st, in->nodeid);
            reply(dev, in->unique, 0, &a, sizeof(a));
            break;
        }
        case OP_OPEN: {
            if (in->nodeid < 2 || in->nodeid - 2 >= (uint64_t)nfiles) {
                reply(dev, in->unique, EISDIR, NULL, 0);
                break;
            }
            int fd = openat(source_fd, names[in->nodeid - 2], O_RDONLY | O_NOFOLLOW);
            struct backing_map map = {.fd = fd};
            int id = fd < 0 ? -1 : ioctl(dev, DEV_IOC_BACKING_OPEN, &map);
            if (fd >= 0)
                close(fd); /* the kernel holds its own reference */
            if (id < 0) {
                reply(dev, in->unique, errno, NULL, 0);
                break;
            }
            /* the handle is the backing id, given back on release */
            struct open_out o = {.fh = (uint64_t)id, .open_flags = FOPEN_PASSTHROUGH,
                                 .backing_id = id};
            reply(dev, in->unique, 0, &o, sizeof(o));
            break;
        }
        case OP_FORGET: case OP_BATCH_FORGET: case OP_INTERRUPT:
            break; /* no reply */
        case OP_RELEASE: {
            uint32_t id = (uint32_t)*(uint64_t *)arg; /* fuse_release_in starts with fh */
            ioctl(dev, DEV_IOC_BACKING_CLOSE, &id);
            reply(dev, in->unique, 0, NULL, 0);
            break;
        }
        case OP_FLUSH: case OP_RELEASEDIR:
            reply(dev, in->unique, 0, NULL, 0);
            break;
        case OP_DESTROY:
            reply(dev, in->unique, 0, NULL, 0);
            return 0;
        default:
            reply(dev, in->unique, ENOSYS, NULL, 0);
        }
    }
}
