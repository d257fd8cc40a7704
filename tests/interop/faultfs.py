#!/usr/bin/env python3
"""A passthrough FUSE filesystem whose writes or fsyncs fail, for test_disk_full.py.

    faultfs.py BACKING MOUNTPOINT --fail-write-over N [--errno EIO|EDQUOT|ENOSPC]
    faultfs.py BACKING MOUNTPOINT --fail-fsync-over N [--errno ...]

Every operation goes to the directory BACKING, except that a write that would
make a file longer than N bytes fails with the errno (EIO: a failing disk;
EDQUOT: a quota, which this kernel, built without CONFIG_QUOTA, cannot
enforce itself), or an fsync of a file longer than N bytes does (the classic
lost write: every write(2) succeeded, the data never reached storage). Smaller files work, so a test
can check that a later small transfer on the same connection succeeds.

Runs in the foreground (fusepy over libfuse2, which mounts with mount(2)
when run as root); `umount MOUNTPOINT` ends it. Prints "ready" once mounted.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
import threading
import time

from fuse import FUSE, FuseOSError, Operations


class FaultFS(Operations):
    def __init__(self, root: str, write_over: int | None, fsync_over: int | None, error: int):
        self.root = root
        self.error = error
        self.write_over = write_over
        self.fsync_over = fsync_over

    def _p(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def __call__(self, op, *args):
        try:
            return super().__call__(op, *args)
        except OSError as e:
            if isinstance(e, FuseOSError):
                raise
            raise FuseOSError(e.errno or errno.EIO) from None

    # --- metadata ---
    def getattr(self, path, fh=None):
        st = os.fstat(fh) if fh is not None else os.lstat(self._p(path))
        return {k: getattr(st, k) for k in (
            "st_mode", "st_nlink", "st_uid", "st_gid", "st_size",
            "st_atime", "st_mtime", "st_ctime")}

    def access(self, path, amode):
        if not os.access(self._p(path), amode):
            raise FuseOSError(errno.EACCES)

    def chmod(self, path, mode):
        os.chmod(self._p(path), mode)

    def chown(self, path, uid, gid):
        os.chown(self._p(path), uid, gid, follow_symlinks=False)

    def utimens(self, path, times=None):
        os.utime(self._p(path), times, follow_symlinks=False)

    def statfs(self, path):
        sv = os.statvfs(self._p(path))
        return {k: getattr(sv, k) for k in (
            "f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree",
            "f_files", "f_flag", "f_frsize", "f_namemax")}

    # --- directories and names ---
    def readdir(self, path, fh):
        return [".", ".."] + os.listdir(self._p(path))

    def mkdir(self, path, mode):
        os.mkdir(self._p(path), mode)

    def rmdir(self, path):
        os.rmdir(self._p(path))

    def unlink(self, path):
        os.unlink(self._p(path))

    def rename(self, old, new):
        os.rename(self._p(old), self._p(new))

    def symlink(self, target, source):
        os.symlink(source, self._p(target))

    def readlink(self, path):
        return os.readlink(self._p(path))

    def fsyncdir(self, path, datasync, fh):
        return 0

    # --- files ---
    def create(self, path, mode, fi=None):
        return os.open(self._p(path), os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)

    def open(self, path, flags):
        return os.open(self._p(path), flags & ~os.O_CREAT)

    def read(self, path, size, offset, fh):
        return os.pread(fh, size, offset)

    def write(self, path, data, offset, fh):
        if self.write_over is not None and offset + len(data) > self.write_over:
            raise FuseOSError(self.error)
        return os.pwrite(fh, data, offset)

    def truncate(self, path, length, fh=None):
        if fh is not None:
            os.ftruncate(fh, length)
        else:
            os.truncate(self._p(path), length)

    def flush(self, path, fh):
        return 0

    def fsync(self, path, datasync, fh):
        if self.fsync_over is not None and os.fstat(fh).st_size > self.fsync_over:
            raise FuseOSError(self.error)
        return 0

    def release(self, path, fh):
        os.close(fh)
        return 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("backing")
    ap.add_argument("mountpoint")
    ap.add_argument("--fail-write-over", type=int)
    ap.add_argument("--fail-fsync-over", type=int)
    ap.add_argument("--errno", default="EIO", choices=["EIO", "EDQUOT", "ENOSPC"])
    a = ap.parse_args()
    mountpoint = a.mountpoint

    def announce() -> None:
        # FUSE() blocks while serving: say "ready" once the mount shows up.
        for _ in range(200):
            if os.path.ismount(mountpoint):
                print("ready", flush=True)
                return
            time.sleep(0.05)
        print("not mounted", flush=True)

    threading.Thread(target=announce, daemon=True).start()
    FUSE(FaultFS(a.backing, a.fail_write_over, a.fail_fsync_over,
                 getattr(errno, a.errno)), mountpoint,
         foreground=True, nothreads=True, big_writes=True, fsname="faultfs")
    sys.exit(0)


if __name__ == "__main__":
    main()
