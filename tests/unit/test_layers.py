"""The layering docs/development.md's "Code layout" states, checked on the source: no import runs back up, and
fuse/ is a protocol library that knows nothing of the tree, the formats or the stores. Every import counts,
those inside functions too: one run late still runs back up."""

from __future__ import annotations

import ast
from pathlib import Path

import shardfs

PACKAGE = Path(shardfs.__file__).parent
# Lowest first, in the order the Code layout gives them; a module may import its own layer's and those before.
LAYERS = [
    ("shardfs", "shardfs.options", "shardfs.cache", "shardfs.metrics", "shardfs.context", "shardfs.codecs",
     "shardfs.logs", "shardfs.errors", "shardfs.request"),
    ("shardfs.stores",),
    ("shardfs.shards",),
    ("shardfs.files",),
    ("shardfs.formats",),
    ("shardfs.views",),
    ("shardfs.tree", "shardfs.collection"),
    ("shardfs.source",),
    ("shardfs.check",),
    ("shardfs.fuse",),
    ("shardfs.fs",),
    ("shardfs.service",),
    ("shardfs.host",),
    ("shardfs.csi",),
    ("shardfs.slurm",),
    ("shardfs.cli", "shardfs.__main__"),
]  # fmt: skip


def module_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or path.is_dir()


def imported(path: Path) -> set[str]:
    """The shardfs modules path imports: `from shardfs.fuse import serve` imports shardfs.fuse.serve."""
    found = set()
    package = module_of(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            anchor = package[: len(package) - node.level + 1] if node.level else []
            base = ".".join([*anchor, *([node.module] if node.module else [])])
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names if is_module(f"{base}.{alias.name}")}
    return {name for name in found if name == "shardfs" or name.startswith("shardfs.")}


def within(module: str, name: str) -> bool:
    """Whether module is name or lies under it (the package itself holds only what LAYERS names apart)."""
    return module == name or (name != "shardfs" and module.startswith(f"{name}."))


def layer_of(module: str) -> int:
    """The index in LAYERS of the longest name module is, or lies under."""
    matches = [(len(name), i) for i, names in enumerate(LAYERS) for name in names if within(module, name)]
    assert matches, f"{module} is in no layer: place it in LAYERS, where the Code layout says it is"
    return max(matches)[1]


def imports() -> dict[str, set[str]]:
    return {module_of(path): imported(path) for path in sorted(PACKAGE.rglob("*.py"))}


def test_no_import_runs_back_up() -> None:
    upward = [
        f"{module} imports {name}"
        for module, names in imports().items()
        for name in sorted(names)
        if layer_of(name) > layer_of(module)
    ]
    assert upward == []


def test_fuse_imports_only_fuse_and_the_modules_at_the_bottom() -> None:
    """fuse/ speaks the kernel's protocol to any `Filesystem`: the tree, the bridge, the formats and the stores are
    the caller's (fs/), as go-fuse keeps fs/ beside fuse/."""
    fuse = {module: names for module, names in imports().items() if within(module, "shardfs.fuse")}
    assert {"shardfs.fuse.serve", "shardfs.fuse.session"} <= set(fuse)
    above = [
        f"{module} imports {name}"
        for module, names in fuse.items()
        for name in sorted(names)
        if not within(name, "shardfs.fuse") and layer_of(name) != 0
    ]
    assert above == []
