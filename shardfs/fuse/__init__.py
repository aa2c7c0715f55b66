"""shardfs's own FUSE session: the kernel protocol over /dev/fuse (wire), serving requests (session) of a
filesystem by node id (filesystem), the tree served as one (bridge, nodes), mounting (mount)."""
