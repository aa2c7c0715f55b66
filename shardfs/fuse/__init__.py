"""shardfs's own FUSE session, a protocol library: the kernel protocol over /dev/fuse (wire), serving requests
(session) of a filesystem by node id (filesystem), directory listings sliced by offset (listing), mounting
(mount), connections seen from fusectl (connections), what a kept connection's next daemon must know (record).
The tree served as a filesystem is `fs/`'s."""
