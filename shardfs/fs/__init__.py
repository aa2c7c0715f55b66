"""The virtual tree served as a FUSE filesystem (`fuse/filesystem.py`'s protocol), beside the protocol library
`fuse/` as go-fuse keeps `fs/` beside `fuse/`: the bridge, its node ids and its read-ahead across files."""
