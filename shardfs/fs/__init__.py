"""The virtual tree served as a FUSE filesystem (`fuse/filesystem.py`'s protocol), beside the protocol library
`fuse/` as go-fuse keeps `fs/` beside `fuse/`: the bridge, its node ids, its read-ahead across files, and a
tree handed to fuse/'s session to serve (serve)."""
