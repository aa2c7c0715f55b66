"""shardfs's own FUSE session: the kernel protocol over /dev/fuse (wire), serving requests (session),
mounting (mount), and tree answers as replies (adapter)."""
