"""Source formats: each turns a source directory into a mount plan (rewritten files and providers)."""
