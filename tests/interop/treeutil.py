"""Build test trees and describe them for comparison."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from harness import sha256_file, write_random

BASE_MTIME = 1_000_000_000  # 2001-09-09, far from "now"

UNICODE_DIR = "dir with space"
UNICODE_FILE = "ünïcødé 文件.bin"

# relpath -> (size, mode). Sizes straddle the 64 KiB sync chunk (SYNC_DATA_MAX):
# below it adb sends SEND+DATA+DONE in one write, above it a DATA stream.
TREE_FILES = {
    "a.bin": (100_000, 0o640),
    "empty.bin": (0, 0o644),
    "tool.sh": (4_000, 0o755),
    "odd.bin": (65_536, 0o751),
    "wide.bin": (70_000, 0o664),
    "sub/deep/er/nested.bin": (300_000, 0o600),
    "sub/sibling.txt": (10, 0o644),
    f"{UNICODE_DIR}/{UNICODE_FILE}": (12_345, 0o644),
}
# relpath -> relative target (points at a file in the tree)
TREE_LINKS = {
    "links/to_a": "../a.bin",
}
TREE_EMPTY_DIRS = ["emptydir", "sub/empty_too"]


def build_tree(root: Path, files=None, links=None, empty_dirs=None) -> dict:
    """Create a tree; give every entry a distinct old mtime. Returns describe(root)."""
    files = TREE_FILES if files is None else files
    links = TREE_LINKS if links is None else links
    empty_dirs = TREE_EMPTY_DIRS if empty_dirs is None else empty_dirs
    root.mkdir(parents=True, exist_ok=True)
    for i, (rel, (size, mode)) in enumerate(sorted(files.items())):
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        write_random(p, size)
        os.chmod(p, mode)
        t = BASE_MTIME + 1000 * (i + 1)
        os.utime(p, (t, t))
    for i, (rel, target) in enumerate(sorted(links.items())):
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, p)
        t = BASE_MTIME + 500_000 + 1000 * (i + 1)
        os.utime(p, (t, t), follow_symlinks=False)
    for rel in empty_dirs:
        (root / rel).mkdir(parents=True, exist_ok=True)
    return describe(root)


def describe(root: Path) -> dict:
    """relpath -> entry for every non-directory; directories are implied.

    Entry: ("file", sha256, mode & 0o7777, mtime seconds) or
           ("link", target, None, lstat mtime seconds).
    """
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            p = Path(dirpath) / name
            rel = p.relative_to(root).as_posix()
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p), None, int(st.st_mtime))
            elif stat.S_ISREG(st.st_mode):
                out[rel] = ("file", sha256_file(p), stat.S_IMODE(st.st_mode), int(st.st_mtime))
            else:
                out[rel] = ("other", oct(st.st_mode), None, None)
    return out


def all_dirs(root: Path) -> set[str]:
    res = set()
    for dirpath, dirnames, _ in os.walk(root):
        for d in dirnames:
            res.add((Path(dirpath) / d).relative_to(root).as_posix())
    return res


def nonempty_dirs(root: Path) -> set[str]:
    """Directories that (transitively) contain at least one non-directory."""
    res = set()
    for rel in describe(root):
        parts = rel.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            res.add("/".join(parts[:i]))
    return res
