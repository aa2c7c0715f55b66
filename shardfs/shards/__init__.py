"""Index maths for sharded formats: where a key's bytes are, or that it is absent. No FUSE, no JSON walking."""
