"""In-container file operations (stdlib only, Python >= 3.6).

The daemon runs this file as ``python3 -I -S -c SOURCE REQUEST_JSON`` through
``docker exec`` *as the workspace user*, so paths (symlinks included) resolve
inside the container and permissions are the shell's. It only does primitive
operations; the file semantics (``cat -n``, exact replace, diffs) live in the
daemon's ``sandboxd/files.py``.

Frames (one type byte, 4-byte big-endian length, payload), as for the supervisor:

stdout: ``D`` data bytes; ``L`` one selected line (8-byte big-endian character
count of the whole line, then its first bytes); ``R`` the result as JSON, or
``E`` an error as JSON ``{"code", "errno", "message"}`` -- exactly one of the
two, always last.
stdin (``write`` and ``upload``): ``I`` bytes, ``C`` end of data.
"""

import codecs
import errno
import hashlib
import json
import os
import stat
import struct
import sys
import tarfile
import tempfile

HEADER = struct.Struct(">cI")
CHUNK = 65536
PROC_FILE_CAP = 64 * 1024 * 1024
"""Most bytes read from a file that reports size 0 (``/proc``, ``/sys``)."""


class OpError(Exception):
    def __init__(self, code, message, err=0):
        Exception.__init__(self, message)
        self.code = code
        self.message = message
        self.errno = err


_CODES = {
    errno.ENOENT: "not_found",
    errno.ENOTDIR: "not_directory",
    errno.EISDIR: "is_directory",
    errno.EACCES: "permission",
    errno.EPERM: "permission",
    errno.EROFS: "permission",
    errno.EEXIST: "exists",
    errno.ENOTEMPTY: "not_empty",
    errno.ENOSPC: "no_space",
    errno.EDQUOT: "no_space",
    errno.ELOOP: "invalid",
    errno.ENAMETOOLONG: "invalid",
    errno.EXDEV: "invalid",
    errno.EINVAL: "invalid",
}


def from_os_error(exc, path):
    code = _CODES.get(exc.errno, "io")
    return OpError(code, "%s: %s" % (path, exc.strerror or exc), exc.errno or 0)


def send(kind, payload):
    data = HEADER.pack(kind, len(payload)) + payload
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]


def send_json(kind, obj):
    send(kind, json.dumps(obj).encode())


class FrameOut:
    """A write-only file object that turns writes into ``D`` frames."""

    def __init__(self):
        self.pending = b""

    def write(self, data):
        self.pending += bytes(data)
        while len(self.pending) >= CHUNK:
            send(b"D", self.pending[:CHUNK])
            self.pending = self.pending[CHUNK:]
        return len(data)

    def flush(self):
        if self.pending:
            send(b"D", self.pending)
            self.pending = b""


class FrameIn:
    """A read-only file object over the ``I`` frames on stdin, ending at ``C``."""

    def __init__(self):
        self.buffer = b""
        self.data = b""
        self.done = False

    def _fill(self):
        while not self.done:
            while len(self.buffer) >= HEADER.size:
                kind, length = HEADER.unpack_from(self.buffer)
                if len(self.buffer) < HEADER.size + length:
                    break
                payload = self.buffer[HEADER.size : HEADER.size + length]
                self.buffer = self.buffer[HEADER.size + length :]
                if kind == b"C":
                    self.done = True
                    return
                self.data += payload
                return
            chunk = os.read(0, CHUNK)
            if not chunk:
                # The daemon hung up before its end-of-data frame: the call was cancelled.
                # Committing what arrived would leave a truncated file.
                raise OpError("aborted", "the data stream was cut off before its end; nothing was written")
            self.buffer += chunk

    def read(self, size=-1):
        while (size < 0 or len(self.data) < size) and not self.done:
            self._fill()
        if size < 0:
            size = len(self.data)
        out, self.data = self.data[:size], self.data[size:]
        return out

    def chunks(self):
        while True:
            piece = self.read(CHUNK)
            if not piece:
                return
            yield piece


def file_type(mode):
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISREG(mode):
        return "file"
    return "other"


def describe(path, name=None, follow=False):
    st = os.stat(path) if follow else os.lstat(path)
    info = {
        "name": name if name is not None else os.path.basename(path.rstrip("/")) or "/",
        "path": path,
        "type": file_type(st.st_mode),
        "size": st.st_size,
        "mode": stat.S_IMODE(st.st_mode),
        "mtime": st.st_mtime,
        "target": "",
    }
    if stat.S_ISLNK(st.st_mode):
        info["target"] = os.readlink(path)
    return info


def open_regular(path):
    """Open ``path`` for reading, refusing directories and special files.

    Opened non-blocking first, so a FIFO cannot hang the call before it is refused.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise from_os_error(exc, path)
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode):
        os.close(fd)
        raise OpError("is_directory", "%s is a directory" % path, errno.EISDIR)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise OpError("invalid", "%s is not a regular file" % path)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb"), st


def read_limit(st, cap):
    """Bytes to read: the size when opened (a file that keeps growing cannot hold the call),
    or up to ``cap`` for files that report no size (``/proc``)."""
    return st.st_size if st.st_size > 0 else cap


def op_read(req):
    path = req["path"]
    max_bytes = int(req["max_bytes"])
    fh, st = open_regular(path)
    with fh:
        if st.st_size > max_bytes:
            raise OpError("too_large", "%s is %d bytes; the limit is %d" % (path, st.st_size, max_bytes))
        digest = hashlib.sha256()
        total = 0
        remaining = read_limit(st, max_bytes + 1)
        while remaining > 0:
            chunk = fh.read(min(CHUNK, remaining))
            remaining -= len(chunk)
            if not chunk:
                break
            total += len(chunk)
            if total > max_bytes:
                raise OpError("too_large", "%s grew past the %d-byte limit while being read" % (path, max_bytes))
            digest.update(chunk)
            send(b"D", chunk)
    return {"size": total, "sha256": digest.hexdigest(), "mode": stat.S_IMODE(st.st_mode)}


def op_read_text(req):
    """Scan a file once: count lines, look for NUL, keep the lines of one page."""
    path = req["path"]
    first = int(req["offset"])
    last = first + int(req["limit"]) - 1
    keep = int(req["keep_bytes"])
    fh, st = open_regular(path)
    lines = []  # (chars, kept bytes)
    ends_cr = False
    line_no = 1
    current = b""
    chars = 0
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    binary = False
    size = 0
    last_byte = b""
    remaining = read_limit(st, PROC_FILE_CAP)
    with fh:
        while remaining > 0:
            chunk = fh.read(min(1 << 20, remaining))
            if not chunk:
                break
            remaining -= len(chunk)
            size += len(chunk)
            last_byte = chunk[-1:]
            if b"\0" in chunk:
                binary = True
                break
            start = 0
            while True:
                end = chunk.find(b"\n", start)
                piece = chunk[start:] if end < 0 else chunk[start:end]
                if first <= line_no <= last:
                    if len(current) < keep:
                        current += piece[: keep - len(current)]
                    chars += len(decoder.decode(piece))
                    if piece:
                        ends_cr = piece.endswith(b"\r")
                if end < 0:
                    break
                if first <= line_no <= last:
                    chars += len(decoder.decode(b"", True))
                    # A CR before the newline is a line ending, not shown and not counted.
                    lines.append((chars - (1 if ends_cr else 0), current))
                    current, chars, ends_cr = b"", 0, False
                    decoder.reset()
                line_no += 1
                start = end + 1
    if binary:
        raise OpError("binary", "%s contains NUL bytes" % path)
    total = line_no - 1
    if size and last_byte != b"\n":
        total += 1
        if first <= line_no <= last:
            chars += len(decoder.decode(b"", True))
            lines.append((chars, current))
    for count, kept in lines:
        send(b"L", struct.pack(">Q", count) + kept)
    return {"total_lines": total, "size": size}


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(CHUNK)
            if not chunk:
                return digest.hexdigest()
            digest.update(chunk)


def stat_or_none(path):
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise from_os_error(exc, path)


def check_target(st, path, target):
    if st is None:
        return
    if stat.S_ISDIR(st.st_mode):
        raise OpError("is_directory", "%s is a directory" % path, errno.EISDIR)
    if not stat.S_ISREG(st.st_mode):
        raise OpError("invalid", "%s is not a regular file" % path)
    if not os.access(target, os.W_OK):
        raise OpError("permission", "%s: Permission denied" % path, errno.EACCES)


class DirectoryLock(object):
    """flock on the parent directory: writers through fileops (EditFile's compare-and-swap
    among them) take turns, whatever name or link they reached the file by."""

    def __init__(self, directory):
        self.directory = directory
        self.fd = -1

    def __enter__(self):
        import fcntl

        try:
            self.fd = os.open(self.directory, os.O_RDONLY)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except OSError:
            pass  # an unreadable directory cannot be locked; the write still happens
        return self

    def __exit__(self, *exc_info):
        if self.fd >= 0:
            os.close(self.fd)  # closing drops the lock
        return False


def copy_stream(source, out):
    size = 0
    for piece in source.chunks():
        out.write(piece)
        size += len(piece)
    return size


def op_write(req):
    """Write stdin's bytes to ``path``: atomically (temp file + rename) where the directory allows it.

    The data is received in full before the file is touched, so a cancelled call
    changes nothing. The compare-and-swap check (``expect_sha256``) and the
    commit happen together under a lock on the directory.
    """
    path = req["path"]
    if path.endswith("/"):
        raise OpError("is_directory", "%s names a directory, not a file" % path, errno.EISDIR)
    target = os.path.realpath(path) if os.path.islink(path) else path
    parent = os.path.dirname(target) or "."
    if req.get("mkdirs"):
        try:
            os.makedirs(parent, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise OpError("not_directory", "%s: a parent of this path is not a directory" % path, errno.ENOTDIR)
        except OSError as exc:
            raise from_os_error(exc, parent)
    st = stat_or_none(target)
    check_target(st, path, target)
    source = FrameIn()
    atomic = os.access(parent, os.W_OK | os.X_OK) and (st is None or st.st_uid == os.getuid())
    if atomic:
        try:
            # ".NAME.XXXXXXXX.tmp" beside the target: cut to fit NAME_MAX (255 bytes) whatever NAME is.
            stem = os.fsencode(os.path.basename(target))[:200].decode("utf-8", "ignore")
            fd, staged = tempfile.mkstemp(dir=parent, prefix="." + stem + ".", suffix=".tmp")
        except OSError as exc:
            raise from_os_error(exc, parent)
        spool = os.fdopen(fd, "w+b")
    else:
        # The directory is not ours to create files in, but the file is writable: it will be
        # written in place, as the shell's `>` would; the data waits in a spool until then.
        staged = None
        spool = tempfile.SpooledTemporaryFile(max_size=8 * 1024 * 1024)
    try:
        with spool:
            size = copy_stream(source, spool)
            spool.flush()
            with DirectoryLock(parent):
                st = stat_or_none(target)
                check_target(st, path, target)
                expect = req.get("expect_sha256")
                if expect is not None:
                    current = "absent" if st is None else sha256_of(target)
                    if current != expect:
                        raise OpError("conflict", "%s changed since it was read" % path)
                old_size = st.st_size if st is not None else -1
                if st is not None and 0 <= old_size <= int(req.get("return_old_max", 0)):
                    with open(target, "rb") as fh:
                        for chunk in iter(lambda: fh.read(CHUNK), b""):
                            send(b"D", chunk)
                if staged is not None:
                    os.fsync(spool.fileno())
                    if st is not None:
                        os.fchmod(spool.fileno(), stat.S_IMODE(st.st_mode))
                    else:
                        umask = os.umask(0)
                        os.umask(umask)
                        os.fchmod(spool.fileno(), 0o666 & ~umask)
                    os.rename(staged, target)
                    staged = None
                else:
                    spool.seek(0)
                    with open(target, "r+b" if st is not None else "wb") as out:
                        out.truncate(0)
                        for chunk in iter(lambda: spool.read(CHUNK), b""):
                            out.write(chunk)
                        out.flush()
                        os.fsync(out.fileno())
    except OSError as exc:
        raise from_os_error(exc, path)
    finally:
        if staged is not None:
            try:
                os.unlink(staged)
            except OSError:
                pass
    if atomic:
        try:
            dir_fd = os.open(parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError:
            pass
    if st is not None:
        bump_mtime(target, st)
    return {"created": st is None, "size": size, "old_size": old_size, "atomic": atomic}


def bump_mtime(path, old):
    """Make sure a rewrite moves the modification time to a later whole second.

    Timestamp caches compare whole seconds (and size): Python's .pyc files would
    keep serving the old code after a same-size edit made within the same second
    as the last run. Best effort; never fails the write.
    """
    try:
        new = os.stat(path)
        if int(new.st_mtime) <= int(old.st_mtime):
            later = (int(old.st_mtime) + 1) * 1000000000
            os.utime(path, ns=(new.st_atime_ns, later))
    except OSError:
        pass


def op_stat(req):
    try:
        return describe(req["path"], follow=bool(req.get("follow")))
    except OSError as exc:
        raise from_os_error(exc, req["path"])


def op_list(req):
    path = req["path"]
    try:
        names = sorted(os.listdir(path))
    except OSError as exc:
        raise from_os_error(exc, path)
    out = FrameOut()
    count = 0
    for name in names:
        try:
            entry = describe(os.path.join(path, name), name=name)
        except OSError:
            continue  # removed while listing
        out.write(json.dumps(entry).encode() + b"\n")  # one per line, in data frames
        count += 1
    out.flush()
    return {"count": count}


def op_remove(req):
    path = req["path"]
    try:
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode):
            if req.get("recursive"):
                import shutil

                shutil.rmtree(path)
            else:
                os.rmdir(path)
        else:
            os.unlink(path)
    except OSError as exc:
        raise from_os_error(exc, getattr(exc, "filename", None) or path)
    return {}


def op_move(req):
    source, destination = req["source"], req["destination"]
    try:
        if not req.get("overwrite") and os.path.lexists(destination):
            raise OpError("exists", "%s already exists" % destination, errno.EEXIST)
        try:
            os.rename(source, destination)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            # Another filesystem (say /workspace to /tmp): copy, then remove, as mv does.
            import shutil

            if os.path.isdir(source) and not os.path.islink(source):
                shutil.copytree(source, destination, symlinks=True)
                shutil.rmtree(source)
            else:
                shutil.copy2(source, destination, follow_symlinks=False)
                os.unlink(source)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            raise OpError("invalid", "cannot move %s into itself (%s)" % (source, destination), exc.errno)
        raise from_os_error(exc, source)
    return {}


def op_download(req):
    """A tar of a file or tree; FIFOs, sockets and devices are left out (a copy has no use for them)."""
    path = req["path"].rstrip("/") or "/"
    if req.get("follow"):
        path = os.path.realpath(path)
    try:
        os.lstat(path)
    except OSError as exc:
        raise from_os_error(exc, path)

    def keep(member):
        return member if (member.isfile() or member.isdir() or member.issym() or member.islnk()) else None

    out = FrameOut()
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as archive:
        archive.add(path, arcname=os.path.basename(path) or "root", recursive=True, filter=keep)
    out.flush()
    return {}


def _safe_name(name, root_ok=False):
    """``name`` normalised; refused when it is absolute, climbs, or (unless ``root_ok``) is empty."""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if name.startswith("/") or ".." in parts or not (parts or root_ok):
        raise OpError("invalid", "unsafe path in archive: %r" % name)
    return "/".join(parts)


def _inside(root, name):
    """The path of archive member ``name`` under ``root``, refusing one that passes through a symlink
    (a link in the archive, or already there, would carry later members outside ``root``)."""
    name = _safe_name(name)
    parts = name.split("/")
    for depth in range(1, len(parts)):
        if os.path.islink(os.path.join(root, *parts[:depth])):
            raise OpError("invalid", "unsafe path in archive: %r goes through a symlink" % name)
    return os.path.join(root, name)


def op_upload(req):
    """Extract a tar stream from stdin into a directory, refusing names that leave it."""
    root = req["path"]
    try:
        os.makedirs(root, exist_ok=True)
    except OSError as exc:
        raise from_os_error(exc, root)
    count = 0
    size = 0
    try:
        with tarfile.open(fileobj=FrameIn(), mode="r|*") as archive:
            for member in archive:
                if member.isdir() and not member.name.startswith("/") and not _safe_name(member.name, root_ok=True):
                    continue  # "./": the directory being extracted into (`tar -C src -cf - .` starts so)
                target = _inside(root, member.name)
                if member.isdir():
                    os.makedirs(target, exist_ok=True)
                    os.chmod(target, member.mode & 0o7777 | 0o700)
                elif member.isfile():
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    if os.path.islink(target):
                        os.unlink(target)
                    source = archive.extractfile(member)
                    with open(target, "wb") as out:
                        while True:
                            chunk = source.read(CHUNK)
                            if not chunk:
                                break
                            out.write(chunk)
                            size += len(chunk)
                    os.chmod(target, member.mode & 0o7777)
                elif member.issym():
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    if os.path.lexists(target):
                        os.unlink(target)
                    os.symlink(member.linkname, target)
                elif member.islnk():
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    os.link(_inside(root, member.linkname), target)
                else:
                    continue  # devices and fifos are not extracted
                count += 1
    except tarfile.TarError as exc:
        raise OpError("invalid", "not a valid tar stream: %s" % exc)
    except OSError as exc:
        raise from_os_error(exc, getattr(exc, "filename", None) or root)
    return {"entries": count, "size": size}


def op_fetch(req):
    """GET an http(s) URL from inside the workspace (so its network policy applies)."""
    import urllib.request

    url = req["url"]
    max_bytes = int(req["max_bytes"])
    try:
        response = urllib.request.urlopen(url, timeout=float(req.get("timeout_s", 30)))
    except Exception as exc:  # every failure becomes the same kind of error
        raise OpError("network", "cannot fetch %s: %s" % (url, exc))
    total = 0
    with response:
        while True:
            chunk = response.read(CHUNK)
            if not chunk:
                break
            total += len(chunk)
            if total > max_bytes:
                raise OpError("too_large", "%s is larger than %d bytes" % (url, max_bytes))
            send(b"D", chunk)
    return {"size": total, "content_type": response.headers.get("Content-Type", "")}


OPS = {
    "read": op_read,
    "read_text": op_read_text,
    "write": op_write,
    "stat": op_stat,
    "list": op_list,
    "remove": op_remove,
    "move": op_move,
    "download": op_download,
    "upload": op_upload,
    "fetch": op_fetch,
}


def main(argv):
    req = json.loads(argv[1])
    try:
        result = OPS[req["op"]](req)
    except OpError as exc:
        send_json(b"E", {"code": exc.code, "errno": exc.errno, "message": exc.message})
        return 0
    except OSError as exc:
        error = from_os_error(exc, getattr(exc, "filename", None) or req.get("path", ""))
        send_json(b"E", {"code": error.code, "errno": error.errno, "message": error.message})
        return 0
    send_json(b"R", result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
