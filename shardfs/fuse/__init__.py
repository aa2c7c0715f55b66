"""shardfs's own FUSE session, a protocol library: the kernel protocol over /dev/fuse (wire), serving requests
(session) of a filesystem by node id (filesystem), directory listings sliced by offset (listing), mounting
(mount), connections seen from fusectl (connections), what a kept connection's next daemon must know (record),
`-o` options and a filesystem mounted and served on a target (serve). It imports nothing of shardfs above it but
the modules at the bottom: the tree served as a filesystem is `fs/`'s."""
