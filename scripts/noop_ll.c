/* A no-op FUSE filesystem on libfuse3's low-level API: the limit of FUSE on a machine, for
 * scripts/bench.py. It serves the names and sizes of a listing (one "relpath size" per line) as
 * read-only files of zeros, from a table built at start, with what shardfs mounts with: ro,
 * default_permissions, day-long entry/attribute/negative timeouts, OPEN answered with ENOSYS (FUSE
 * no_open: the kernel then keeps pages across opens, as kernel_cache does) and libfuse's
 * multithreaded loop. Every request is answered in C: no lookup cost beyond a hash probe.
 *
 *     noop_ll LISTING MOUNTPOINT [-f] [-o ro,default_permissions,max_idle_threads=10,...]
 */
#define FUSE_USE_VERSION 312
#define _GNU_SOURCE  /* asprintf, getline, strndup */
#include <errno.h>
#include <fuse_lowlevel.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ONE_DAY 86400.0 /* shardfs/service/daemon.py's ONE_DAY */
#define BLOCK_SIZE (1 << 20) /* shardfs's st_blksize */

struct node {
	char *path;     /* relative to the root, "" for the root */
	const char *name;  /* the last component of path */
	off_t size;
	int is_dir;
	fuse_ino_t *children;  /* directories only */
	size_t nchildren, cap;
};

static struct node *nodes;  /* nodes[ino - 1]: the root is inode 1 (FUSE_ROOT_ID) */
static size_t nnodes, capnodes;
static fuse_ino_t *by_path;  /* open addressing on a hash of the whole path: inode, or 0 for empty */
static size_t nslots;  /* a power of two, at least twice the nodes */
static char zeros[BLOCK_SIZE];

static void *xrealloc(void *p, size_t n)
{
	p = realloc(p, n);
	if (!p) {
		perror("noop_ll");
		exit(1);
	}
	return p;
}

/* The slot of path in by_path: its inode, or the empty slot where it belongs. FNV-1a over the whole
 * path: glibc's hsearch shifts its 32-bit hash 4 bits a character, so only a key's first 8 characters
 * count, and the precomputed volume's names ("8_8_8/0-8_...") share theirs. */
static fuse_ino_t *slot(const char *path)
{
	uint64_t h = 14695981039346656037ULL;
	for (const char *c = path; *c; c++)
		h = (h ^ (unsigned char)*c) * 1099511628211ULL;
	for (size_t i = h & (nslots - 1);; i = (i + 1) & (nslots - 1))
		if (!by_path[i] || !strcmp(nodes[by_path[i] - 1].path, path))
			return &by_path[i];
}

/* The inode at path, made (with its ancestors, as directories) if it is not there yet. */
static fuse_ino_t intern(const char *path, int is_dir)
{
	fuse_ino_t *found = slot(path);
	if (*found)
		return *found;
	fuse_ino_t parent = 0;
	const char *slash = strrchr(path, '/');
	if (*path) {
		char *up = strndup(path, slash ? (size_t)(slash - path) : 0);
		parent = intern(up, 1);
		free(up);
	}
	if (nnodes == capnodes) {
		capnodes = capnodes ? 2 * capnodes : 1024;
		nodes = xrealloc(nodes, capnodes * sizeof *nodes);
	}
	struct node *n = &nodes[nnodes++];
	*n = (struct node){.path = strdup(path), .is_dir = is_dir};
	n->name = slash ? strrchr(n->path, '/') + 1 : n->path;
	fuse_ino_t ino = nnodes;
	if (2 * nnodes > nslots) {
		fprintf(stderr, "noop_ll: more directories than the table was sized for\n");
		exit(1);
	}
	*slot(path) = ino;  /* found again: the ancestors made since may have taken that slot */
	if (parent) {
		struct node *p = &nodes[parent - 1];  /* after the realloc above */
		if (p->nchildren == p->cap) {
			p->cap = p->cap ? 2 * p->cap : 8;
			p->children = xrealloc(p->children, p->cap * sizeof *p->children);
		}
		p->children[p->nchildren++] = ino;
	}
	return ino;
}

static void load(const char *listing)
{
	FILE *f = fopen(listing, "r");
	if (!f) {
		perror(listing);
		exit(1);
	}
	size_t lines = 0;
	for (int c; (c = getc(f)) != EOF;)
		lines += c == '\n';
	rewind(f);
	for (nslots = 1024; nslots < 4 * lines; nslots *= 2)
		;
	by_path = xrealloc(NULL, nslots * sizeof *by_path);
	memset(by_path, 0, nslots * sizeof *by_path);
	intern("", 1);
	char *line = NULL;
	size_t len = 0;
	while (getline(&line, &len, f) > 0) {
		char *space = strrchr(line, ' ');
		if (!space)
			continue;
		*space = '\0';
		fuse_ino_t ino = intern(line, 0);  /* before indexing nodes: interning may move them */
		nodes[ino - 1].size = strtoll(space + 1, NULL, 10);
	}
	free(line);
	fclose(f);
}

static struct stat attributes(fuse_ino_t ino)
{
	const struct node *n = &nodes[ino - 1];
	return (struct stat){
		.st_ino = ino,
		.st_mode = n->is_dir ? S_IFDIR | 0555 : S_IFREG | 0444,
		.st_nlink = n->is_dir ? 2 : 1,
		.st_uid = getuid(),
		.st_gid = getgid(),
		.st_size = n->size,
		.st_blocks = (n->size + 511) / 512,
		.st_blksize = BLOCK_SIZE,
	};
}

static void noop_init(void *userdata, struct fuse_conn_info *conn)
{
	(void)userdata;
	/* As shardfs logs it: whether the kernel takes ENOSYS for OPEN as "no open needed". */
	fprintf(stderr, "kernel sends OPEN: %s\n", conn->capable & FUSE_CAP_NO_OPEN_SUPPORT ? "no (no_open)" : "yes");
}

static void noop_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	const struct node *p = &nodes[parent - 1];
	char *path;
	if (asprintf(&path, "%s%s%s", p->path, *p->path ? "/" : "", name) < 0) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	/* ino 0 with a timeout is a negative entry: the kernel remembers the absence. */
	struct fuse_entry_param e = {.attr_timeout = ONE_DAY, .entry_timeout = ONE_DAY, .ino = *slot(path)};
	if (e.ino)
		e.attr = attributes(e.ino);
	free(path);
	fuse_reply_entry(req, &e);
}

static void noop_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)fi;
	struct stat st = attributes(ino);
	fuse_reply_attr(req, &st, ONE_DAY);
}

static void noop_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino, (void)fi;
	fuse_reply_err(req, ENOSYS);  /* no_open: no OPEN or RELEASE again for any file */
}

static void noop_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)fi;
	off_t left = nodes[ino - 1].size - off;
	size_t n = left <= 0 ? 0 : (size_t)left < size ? (size_t)left : size;
	fuse_reply_buf(req, zeros, n < sizeof zeros ? n : sizeof zeros);
}

/* ".", "..", then the children; an entry's offset is its index plus one. */
static void noop_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)fi;
	const struct node *d = &nodes[ino - 1];
	if (!d->is_dir) {
		fuse_reply_err(req, ENOTDIR);
		return;
	}
	char *buf = malloc(size);
	if (!buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	size_t used = 0;
	for (size_t i = off; i < d->nchildren + 2; i++) {
		fuse_ino_t child = i < 2 ? ino : d->children[i - 2];
		struct stat st = {.st_ino = child, .st_mode = nodes[child - 1].is_dir ? S_IFDIR : S_IFREG};
		const char *name = i == 0 ? "." : i == 1 ? ".." : nodes[child - 1].name;
		size_t need = fuse_add_direntry(req, buf + used, size - used, name, &st, (off_t)i + 1);
		if (need > size - used)
			break;
		used += need;
	}
	fuse_reply_buf(req, buf, used);
	free(buf);
}

static const struct fuse_lowlevel_ops ops = {
	.init = noop_init,
	.lookup = noop_lookup,
	.getattr = noop_getattr,
	.open = noop_open,
	.read = noop_read,
	.readdir = noop_readdir,
};

int main(int argc, char *argv[])
{
	if (argc < 3) {
		fprintf(stderr, "usage: %s LISTING MOUNTPOINT [FUSE options]\n", argv[0]);
		return 2;
	}
	load(argv[1]);
	struct fuse_args args = FUSE_ARGS_INIT(argc - 1, argv + 1);
	struct fuse_cmdline_opts opts;
	if (fuse_parse_cmdline(&args, &opts) != 0 || !opts.mountpoint)
		return 2;
	struct fuse_session *se = fuse_session_new(&args, &ops, sizeof ops, NULL);
	if (!se || fuse_set_signal_handlers(se) != 0 || fuse_session_mount(se, opts.mountpoint) != 0)
		return 1;
	struct fuse_loop_config *config = fuse_loop_cfg_create();
	fuse_loop_cfg_set_clone_fd(config, opts.clone_fd);
	fuse_loop_cfg_set_max_threads(config, opts.max_threads);
	fuse_loop_cfg_set_idle_threads(config, opts.max_idle_threads);
	int ret = fuse_session_loop_mt(se, config);
	fuse_loop_cfg_destroy(config);
	fuse_session_unmount(se);
	fuse_remove_signal_handlers(se);
	fuse_session_destroy(se);
	free(opts.mountpoint);
	fuse_opt_free_args(&args);
	return ret ? 1 : 0;
}
