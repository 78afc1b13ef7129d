"""helpers.remove_orphans, which removes the shared-memory segments of MPI ranks the tests killed: a file some
process maps, or one just written, is kept; an old one nobody maps is removed."""

from __future__ import annotations

import mmap
import os
import time
from pathlib import Path

from helpers import remove_orphans


def test_only_old_unmapped_segments_are_removed(tmp_path: Path) -> None:
    old, young, mapped = (tmp_path / f"mpich_shm_{name}" for name in ("old", "young", "mapped"))
    for path in (old, young, mapped):
        path.write_bytes(b"\0" * 4096)
    hour_ago = time.time() - 3600
    for path in (old, mapped):
        os.utime(path, (hour_ago, hour_ago))
    with open(mapped, "r+b") as f, mmap.mmap(f.fileno(), 4096):
        assert remove_orphans({old, young, mapped}) == [old]
    assert not old.exists() and young.exists() and mapped.exists()
    assert remove_orphans({young, mapped}, min_age=-1) == [mapped, young]  # unmapped now, and no age asked
