/* A small libfuse3 filesystem to measure kernel FUSE capabilities that pyfuse3 3.5 does not
 * expose. Built and driven by bench/libfuse_caps.py; never installed. Two modes:
 *
 *   libfuse_caps SOURCE MOUNTPOINT [--cache-readdir] [--no-open] [--writeback] [--keep-cache]
 *                                  [-- extra fuse options...]
 *     a passthrough of SOURCE (high-level API) for no_open (ENOSYS to OPEN), the writeback
 *     cache and keep_cache;
 *   libfuse_caps --listing ENTRIES MOUNTPOINT [--cache-readdir]
 *     a root directory of ENTRIES synthetic names (low-level API: the high-level one did not
 *     let the kernel keep listings) for the directory cache (FOPEN_CACHE_DIR + KEEP_CACHE).
 *
 * Runs in the foreground, single-threaded like journalfs's one trio thread. */
#define FUSE_USE_VERSION 34
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <fuse_lowlevel.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

static int source_fd = -1;
static int cache_readdir, no_open, writeback, keep_cache;
static long entries; /* --listing */

/* --cache-readdir, in either mode: the kernel may keep this directory's listing */
static void offer_listing_cache(struct fuse_file_info *fi)
{
	fi->cache_readdir = cache_readdir;
	fi->keep_cache = cache_readdir;
}

/* FUSE paths start with "/": relative to the SOURCE fd, "." for the root. */
static const char *rel(const char *path)
{
	return path[1] ? path + 1 : ".";
}

static void *caps_init(struct fuse_conn_info *conn, struct fuse_config *cfg)
{
	cfg->use_ino = 1;
	cfg->entry_timeout = 120;
	cfg->attr_timeout = 120;
	cfg->negative_timeout = 0;
	if (writeback && (conn->capable & FUSE_CAP_WRITEBACK_CACHE))
		conn->want |= FUSE_CAP_WRITEBACK_CACHE;
	else
		conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
	return NULL;
}

static int caps_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
	int rc = (fi && fi->fh) ? fstat(fi->fh, st)
				: fstatat(source_fd, rel(path), st, AT_SYMLINK_NOFOLLOW);
	return rc ? -errno : 0;
}

static int caps_opendir(const char *path, struct fuse_file_info *fi)
{
	int fd = openat(source_fd, rel(path), O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
	DIR *dir;

	if (fd < 0)
		return -errno;
	dir = fdopendir(fd);
	if (!dir) {
		close(fd);
		return -errno;
	}
	fi->fh = (uint64_t)(uintptr_t)dir;
	offer_listing_cache(fi);
	return 0;
}

static int caps_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off,
			struct fuse_file_info *fi, enum fuse_readdir_flags flags)
{
	DIR *dir = (DIR *)(uintptr_t)fi->fh;
	struct dirent *de;

	(void)path;
	(void)flags;
	seekdir(dir, off);
	while ((de = readdir(dir)) != NULL) {
		struct stat st = { .st_ino = de->d_ino, .st_mode = (mode_t)de->d_type << 12 };
		if (fill(buf, de->d_name, &st, telldir(dir), 0))
			break;
	}
	return 0;
}

static int caps_releasedir(const char *path, struct fuse_file_info *fi)
{
	(void)path;
	closedir((DIR *)(uintptr_t)fi->fh);
	return 0;
}

static int caps_open(const char *path, struct fuse_file_info *fi)
{
	int fd;

	if (no_open)
		return -ENOSYS; /* the kernel then stops sending OPEN and RELEASE */
	fd = openat(source_fd, rel(path), (fi->flags & ~O_CREAT) | O_NOFOLLOW);
	if (fd < 0)
		return -errno;
	fi->fh = fd;
	fi->keep_cache = keep_cache;
	return 0;
}

static int caps_create(const char *path, mode_t mode, struct fuse_file_info *fi)
{
	int fd = openat(source_fd, rel(path), fi->flags | O_CREAT | O_NOFOLLOW, mode);

	if (fd < 0)
		return -errno;
	fi->fh = fd;
	return 0;
}

static int with_fd(const char *path, struct fuse_file_info *fi, int flags, int *owned)
{
	*owned = 0;
	if (fi && fi->fh)
		return fi->fh;
	*owned = 1; /* no_open: no handle, open per request */
	return openat(source_fd, rel(path), flags | O_NOFOLLOW);
}

/* pread or pwrite on the handle's fd, or on an fd opened for this request (no_open) */
static int transfer(const char *path, struct fuse_file_info *fi, int writing, char *buf,
		    size_t size, off_t off)
{
	int owned, fd = with_fd(path, fi, writing ? O_WRONLY : O_RDONLY, &owned);
	ssize_t n;

	if (fd < 0)
		return -errno;
	n = writing ? pwrite(fd, buf, size, off) : pread(fd, buf, size, off);
	if (n < 0)
		n = -errno;
	if (owned)
		close(fd);
	return n;
}

static int caps_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
	return transfer(path, fi, 0, buf, size, off);
}

static int caps_write(const char *path, const char *buf, size_t size, off_t off,
		      struct fuse_file_info *fi)
{
	return transfer(path, fi, 1, (char *)buf, size, off);
}

static int caps_release(const char *path, struct fuse_file_info *fi)
{
	(void)path;
	if (fi->fh)
		close(fi->fh);
	return 0;
}

static int caps_flush(const char *path, struct fuse_file_info *fi)
{
	(void)path;
	(void)fi;
	return 0;
}

static int caps_getxattr(const char *path, const char *name, char *value, size_t size)
{
	char full[PATH_MAX];
	ssize_t n;

	snprintf(full, sizeof(full), "/proc/self/fd/%d/%s", source_fd, rel(path));
	n = lgetxattr(full, name, value, size);
	return n < 0 ? -errno : n;
}

static int caps_truncate(const char *path, off_t size, struct fuse_file_info *fi)
{
	int owned, fd = with_fd(path, fi, O_WRONLY, &owned);
	int rc;

	if (fd < 0)
		return -errno;
	rc = ftruncate(fd, size) ? -errno : 0;
	if (owned)
		close(fd);
	return rc;
}

static int caps_utimens(const char *path, const struct timespec tv[2], struct fuse_file_info *fi)
{
	/* with the writeback cache the kernel keeps mtime/ctime and sends them on flush */
	if (fi && fi->fh)
		return futimens(fi->fh, tv) ? -errno : 0;
	return utimensat(source_fd, rel(path), tv, AT_SYMLINK_NOFOLLOW) ? -errno : 0;
}

static int caps_unlink(const char *path)
{
	return unlinkat(source_fd, rel(path), 0) ? -errno : 0;
}

static int caps_mkdir(const char *path, mode_t mode)
{
	return mkdirat(source_fd, rel(path), mode) ? -errno : 0;
}

static int caps_rmdir(const char *path)
{
	return unlinkat(source_fd, rel(path), AT_REMOVEDIR) ? -errno : 0;
}

static const struct fuse_operations caps_ops = {
	.init = caps_init,
	.getattr = caps_getattr,
	.opendir = caps_opendir,
	.readdir = caps_readdir,
	.releasedir = caps_releasedir,
	.open = caps_open,
	.create = caps_create,
	.read = caps_read,
	.write = caps_write,
	.release = caps_release,
	.flush = caps_flush,
	.getxattr = caps_getxattr,
	.truncate = caps_truncate,
	.utimens = caps_utimens,
	.unlink = caps_unlink,
	.mkdir = caps_mkdir,
	.rmdir = caps_rmdir,
};

/* ---- --listing: a synthetic root directory, low-level API ---- */

static void listing_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct stat st = { .st_ino = ino, .st_nlink = 2, .st_mode = S_IFDIR | 0755 };

	(void)fi;
	if (ino != FUSE_ROOT_ID) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	fuse_reply_attr(req, &st, 120.0);
}

static void listing_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	(void)parent;
	(void)name;
	fuse_reply_err(req, ENOENT);
}

static void listing_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	offer_listing_cache(fi);
	fuse_reply_open(req, fi);
}

static void listing_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	char *buf = malloc(size), name[32];
	size_t used = 0;
	long i;

	(void)ino;
	(void)fi;
	for (i = off; i < entries; i++) {
		struct stat st = { .st_ino = i + 2, .st_mode = S_IFREG };
		size_t need;

		snprintf(name, sizeof(name), "entry-%08ld", i);
		need = fuse_add_direntry(req, buf + used, size - used, name, &st, i + 1);
		if (need > size - used)
			break;
		used += need;
	}
	fuse_reply_buf(req, buf, used);
	free(buf);
}

static const struct fuse_lowlevel_ops listing_ops = {
	.lookup = listing_lookup,
	.getattr = listing_getattr,
	.opendir = listing_opendir,
	.readdir = listing_readdir,
	/* no releasedir: libfuse answers RELEASEDIR with success itself */
};

static int serve_listing(const char *prog, const char *mountpoint)
{
	char *fargv[] = { (char *)prog, NULL };
	struct fuse_args args = FUSE_ARGS_INIT(1, fargv);
	struct fuse_session *se;
	int rc;

	se = fuse_session_new(&args, &listing_ops, sizeof(listing_ops), NULL);
	if (!se || fuse_set_signal_handlers(se) || fuse_session_mount(se, mountpoint))
		return 1;
	rc = fuse_session_loop(se);
	fuse_session_unmount(se);
	fuse_remove_signal_handlers(se);
	fuse_session_destroy(se);
	return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
	char *fuse_argv[32];
	int fuse_argc = 0, listing = argc > 1 && !strcmp(argv[1], "--listing");
	int first = listing ? 4 : 3, i;

	if (argc < first) {
		fprintf(stderr, "usage: %s SOURCE MOUNTPOINT [options]\n"
			"       %s --listing ENTRIES MOUNTPOINT [--cache-readdir]\n", argv[0], argv[0]);
		return 2;
	}
	fuse_argv[fuse_argc++] = argv[0];
	fuse_argv[fuse_argc++] = "-f";
	fuse_argv[fuse_argc++] = "-s";
	for (i = first; i < argc && fuse_argc < 30; i++) {
		if (!strcmp(argv[i], "--cache-readdir"))
			cache_readdir = 1;
		else if (!strcmp(argv[i], "--no-open"))
			no_open = 1;
		else if (!strcmp(argv[i], "--writeback"))
			writeback = 1;
		else if (!strcmp(argv[i], "--keep-cache"))
			keep_cache = 1;
		else if (strcmp(argv[i], "--"))
			fuse_argv[fuse_argc++] = argv[i];
	}
	if (listing) {
		entries = atol(argv[2]);
		return serve_listing(argv[0], argv[3]);
	}
	source_fd = open(argv[1], O_RDONLY | O_DIRECTORY);
	if (source_fd < 0) {
		perror(argv[1]);
		return 1;
	}
	fuse_argv[fuse_argc++] = argv[2];
	return fuse_main(fuse_argc, fuse_argv, &caps_ops, NULL);
}
