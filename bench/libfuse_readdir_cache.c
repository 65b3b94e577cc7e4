/* The kernel's directory cache (FOPEN_CACHE_DIR + FOPEN_KEEP_CACHE on OPENDIR), measured with
 * the low-level libfuse3 API: the root directory lists N synthetic names. Built and driven by
 * bench/libfuse_caps.py; never installed.
 *
 *   libfuse_readdir_cache MOUNTPOINT ENTRIES [--cache-readdir] */
#define FUSE_USE_VERSION 34
#include <errno.h>
#include <fuse_lowlevel.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static long entries;
static int cache_readdir;

static void rc_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct stat st = { .st_ino = ino, .st_nlink = 2, .st_mode = S_IFDIR | 0755 };

	(void)fi;
	if (ino != FUSE_ROOT_ID) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	fuse_reply_attr(req, &st, 120.0);
}

static void rc_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	(void)parent;
	(void)name;
	fuse_reply_err(req, ENOENT);
}

static void rc_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	fi->cache_readdir = cache_readdir;
	fi->keep_cache = cache_readdir;
	fuse_reply_open(req, fi);
}

static void rc_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
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

static void rc_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	(void)fi;
	fuse_reply_err(req, 0);
}

static const struct fuse_lowlevel_ops rc_ops = {
	.lookup = rc_lookup,
	.getattr = rc_getattr,
	.opendir = rc_opendir,
	.readdir = rc_readdir,
	.releasedir = rc_releasedir,
};

int main(int argc, char **argv)
{
	char *fargv[] = { argv[0], NULL };
	struct fuse_args args = FUSE_ARGS_INIT(1, fargv);
	struct fuse_session *se;
	int rc;

	if (argc < 3) {
		fprintf(stderr, "usage: %s MOUNTPOINT ENTRIES [--cache-readdir]\n", argv[0]);
		return 2;
	}
	entries = atol(argv[2]);
	cache_readdir = argc > 3 && !strcmp(argv[3], "--cache-readdir");
	se = fuse_session_new(&args, &rc_ops, sizeof(rc_ops), NULL);
	if (!se || fuse_set_signal_handlers(se) || fuse_session_mount(se, argv[1]))
		return 1;
	rc = fuse_session_loop(se);
	fuse_session_unmount(se);
	fuse_remove_signal_handlers(se);
	fuse_session_destroy(se);
	return rc ? 1 : 0;
}
