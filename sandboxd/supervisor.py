"""In-container process supervisor (stdlib only, Python >= 3.6).

The daemon never runs a user's command directly through ``docker exec``: it runs
this file as ``python3 -I -S -c SOURCE KEY VALUE ...`` (an ``env:NAME VALUE``
pair per environment variable of the command) and the supervisor starts the
command. It imports no ``json`` -- that alone would add ~12 ms to every command
-- so its reports are written by a small encoder and the daemon's frames to it
are plain text. That buys what a bare exec cannot give:

* the command is its own session and process-group leader with default signal
  dispositions, so Ctrl-C reaches its whole group (SPEC §2.3);
* the supervisor is a child subreaper, so every descendant -- even one that
  called ``setsid`` or double-forked -- stays in its tree and can be killed;
* the exact wait status of the top-level command (signal vs. exit code) and
  whether the cgroup OOM killer struck while it ran;
* the call ends when the top-level command exits even if ``server &`` still
  holds the output pipes, which the supervisor keeps draining (SPEC §6);
* the command's timeout (config ``timeout_s``) is enforced here, in the
  container, over everything the command started -- also what outlives the
  top-level shell -- and even if the daemon goes away.

It is a module of the daemon package only so that it is linted and tested; it
must import nothing outside the standard library and must keep working on the
oldest Python 3 a workspace image may carry.

Wire protocol over the exec's stdin/stdout: frames of one type byte, a 4-byte
big-endian payload length, then the payload.

Supervisor -> daemon (stdout):
    ``P`` started ``{"pid": int}``; ``F`` failed to start
    ``{"stage": str, "errno": int, "message": str}``; ``1`` stdout bytes;
    ``2`` stderr bytes; ``X`` exited ``{"exit_code": int, "signal": int,
    "oom_kills": int, "timed_out": bool, "leftovers": int, "spill_path": str}``
    (always the last frame; ``leftovers`` counts processes of the command still
    alive; ``spill_path`` is set when the output passed ``spill_after_bytes`` and
    was copied, whole, to that file).
Daemon -> supervisor (stdin):
    ``E`` the command's environment, ``NAME\0VALUE\0...``: the first frame, sent
    before anything else when the config says ``env_on_stdin 1``, so values
    (secrets among them) never appear in an argv that ``ps`` shows;
    ``I`` bytes for the command's stdin; ``C`` close its stdin; ``S`` signal the
    process group, ``"NUMBER,INTERRUPT"`` (signal 0 only marks a Ctrl-C); ``K``
    kill the whole tree, ``"GRACE_SECONDS"``; ``W`` terminal size ``"COLUMNS,ROWS"``.

A second mode, ``mode reap``, kills every process carrying a
marker environment entry; the daemon uses it when the supervisor of a command
is gone (the command exited, or the supervisor itself was killed), and, with a
bare ``NAME=`` marker, after a restart to end every command it lost.
"""

import errno
import os
import select
import signal
import struct
import sys
import time

HEADER = struct.Struct(">cI")
READ_SIZE = 65536
MAX_PENDING_INPUT = 16 * 1024 * 1024
READY = b"\0"
"""Written by the child once all but its execve is done: a report is JSON, so never this."""
PR_SET_CHILD_SUBREAPER = 36
PR_SET_DUMPABLE = 4
_CATCHABLE = [s for s in range(1, 65) if s not in (signal.SIGKILL, signal.SIGSTOP)]
_OOM_FILES = ("/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events")


def json_text(value):
    """One JSON value: the stdlib ``json`` costs ~12 ms of start-up per command, so not used."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    out = []
    for char in str(value):
        code = ord(char)
        if char in '"\\':
            out.append("\\" + char)
        elif code < 0x20 or 0xD800 <= code <= 0xDFFF:
            out.append("\\u%04x" % code)
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def dumps(obj):
    """A flat dict as JSON bytes."""
    return ("{" + ",".join(json_text(k) + ":" + json_text(v) for k, v in obj.items()) + "}").encode("utf-8")


def parse_tokens(tokens):
    """``KEY VALUE ...`` argv strings -> (config, env): ``env:NAME`` keys go to env."""
    config, env = {}, {}
    for key, value in zip(tokens[0::2], tokens[1::2]):
        if key.startswith("env:"):
            env[key[4:]] = value
        else:
            config[key] = value
    return config, env


def oom_kill_count():
    """Return the container's cgroup OOM-kill counter (v1 or v2), or 0."""
    for path in _OOM_FILES:
        try:
            with open(path) as fh:
                for line in fh:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return 0


def set_subreaper():
    """Make orphaned descendants reparent to this process and shield it from them; best effort.

    Not dumpable: the command runs as the same user, and could otherwise open
    ``/proc/$PPID/fd/1`` to forge frames to the daemon, or read the environment
    (secrets included) out of this process. ``execve`` makes the command dumpable
    again, so its own tools (``ps``, ``gdb`` on its children) are unaffected.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except Exception:  # noqa: BLE001 - no ctypes or no prctl: marker scan still works
        pass


def read_exact(fd, size):
    """Read exactly ``size`` bytes from a blocking fd; None at end of file first."""
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def read_env_frame(fd):
    """The ``E`` frame that opens stdin, as a dict; None when stdin ends or says something else."""
    head = read_exact(fd, HEADER.size)
    if head is None:
        return None
    kind, size = HEADER.unpack(head)
    payload = read_exact(fd, size)
    if kind != b"E" or payload is None:
        return None
    fields = payload.split(b"\0")[:-1]
    return {
        name.decode("utf-8", "surrogateescape"): value.decode("utf-8", "surrogateescape")
        for name, value in zip(fields[0::2], fields[1::2])
    }


def process_table():
    """Return ``{pid: (state, ppid, pgid, sid)}`` for every visible process."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2 :].split()
        table[int(name)] = (fields[0], int(fields[1]), int(fields[2]), int(fields[3]))
    return table


def has_marker(pid, marker):
    """Whether process ``pid`` carries the ``marker`` (``NAME=value``, or ``NAME=`` for any value)."""
    return marker_value(pid, marker) is not None


MARKER_IN_ARGV = [False]
"""Reap mode's ``marker_in_argv``: also match a full marker in the argv of a process whose
environment cannot be read (file operations). Off otherwise, so that a reap of a command's
marker never takes a supervisor (which names that marker in its own argv) for a stray."""


def marker_value(pid, marker):
    """The value of ``pid``'s environment entry matching ``marker`` (``NAME=value`` or ``NAME=``), or None."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as fh:
            env = fh.read()
    except OSError:
        # A non-dumpable process (the daemon's own file operations) hides its environment:
        # those carry their full marker in their argv too, which anyone may read.
        if marker.endswith(b"=") or not MARKER_IN_ARGV[0]:
            return None
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as fh:
                return marker.partition(b"=")[2] if marker in fh.read() else None
        except OSError:
            return None
    if marker.endswith(b"="):
        start = (b"\0" + env).find(b"\0" + marker)
        if start < 0:
            return None
        value = env[start + len(marker) :]
        return value[: value.find(b"\0")] if b"\0" in value else value
    if (b"\0" + env).find(b"\0" + marker + b"\0") >= 0 or env.endswith(b"\0" + marker):
        return marker.partition(b"=")[2]
    return None


def tree(root, leader, marker):
    """Return the live pids a command started, excluding this process.

    Args:
        root: pid of this supervisor (the subreaper every orphan reparents to).
        leader: pid of the command's session leader, or 0.
        marker: ``NAME=value`` bytes inherited through the environment, or b"".
    """
    table = process_table()
    children = {}
    for pid, (_state, ppid, _pgid, _sid) in table.items():
        children.setdefault(ppid, []).append(pid)
    found = set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    for pid, (_state, _ppid, pgid, sid) in table.items():
        if leader and leader in (pgid, sid):
            found.add(pid)
        elif marker and pid not in found and has_marker(pid, marker):
            found.add(pid)
    me = os.getpid()
    return sorted(p for p in found if p != me and table.get(p, (b"Z",))[0] != b"Z")


def signal_all(pids, sig):
    """Send ``sig`` to each pid, ignoring ones that are already gone."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def reap_children(statuses):
    """Collect every exited child without blocking, recording their wait statuses."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        statuses[pid] = status


def hard_kill(root, leader, marker, reap=None):
    """Freeze then SIGKILL the tree until nothing of it is left (fork bombs included)."""
    for _ in range(200):
        pids = tree(root, leader, marker)
        if not pids:
            return True
        signal_all(pids, signal.SIGSTOP)
        signal_all(pids, signal.SIGKILL)
        if reap is not None:
            reap()
        time.sleep(0.005)
    return not tree(root, leader, marker)


class Spill(object):
    """Copy of the output in a file, started only once it passes ``after`` bytes."""

    def __init__(self, path, after):
        self.path = path
        self.after = after
        self.head = []
        self.size = 0
        self.fh = None
        self.broken = not path or after <= 0

    def feed(self, data):
        if self.broken:
            return
        self.size += len(data)
        try:
            if self.fh is None:
                self.head.append(data)
                if self.size <= self.after:
                    return
                directory = os.path.dirname(self.path)
                if not os.path.isdir(directory):
                    os.makedirs(directory)
                self.fh = open(self.path, "wb")
                data = b"".join(self.head)
                self.head = []
            self.fh.write(data)
        except OSError:
            # No room or no permission: the caller simply gets no spill file.
            self.broken = True
            self.head = []

    def close(self):
        if self.fh is not None:
            try:
                self.fh.close()
            except OSError:
                self.broken = True
        return self.path if self.fh is not None and not self.broken else ""


def write_all(fd, data):
    """Write all of ``data`` to a blocking fd."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class Supervisor:
    """Runs one command and relays it over the frame protocol."""

    def __init__(self, config, env):
        self.command = config["command"]
        self.cwd = config.get("cwd") or "/"
        self.tty = config.get("tty") == "1"
        self.columns = int(config.get("columns") or 80)
        self.rows = int(config.get("rows") or 24)
        self.marker = config.get("marker", "").encode()
        self.shell = config.get("shell") or ""
        self.pid = 0
        self.statuses = {}
        self.out_fds = {}  # fd -> frame type
        self.stdin_fd = -1
        self.stdin_pending = b""
        self.stdin_close = False
        self.in_buf = b""
        self.in_open = True
        self.out_ok = True
        self.interrupted = False
        self.kill_deadline = None
        self.oom_before = oom_kill_count()
        # The timeout bounds everything the command started, even what outlives the
        # top-level shell (a fork bomb's `:|:&` returns at once); 0 means none.
        timeout_s = float(config.get("timeout_s") or 0)
        self.deadline = time.monotonic() + timeout_s if timeout_s > 0 else None
        self.grace_s = float(config.get("grace_s") or 2.0)
        self.timed_out = False
        self.spill = Spill(config.get("spill_path") or "", int(config.get("spill_after_bytes") or 0))
        # The command's own environment is applied to the child only: a caller's PATH or
        # LD_PRELOAD must not change how this supervisor runs.
        self.env = dict(os.environ)
        self.env.update(env)
        self.merge_stderr = config.get("merge_stderr") == "1"
        self.env_on_stdin = config.get("env_on_stdin") == "1"
        self.last_input = b"\n"

    # -- frames -----------------------------------------------------------
    def send(self, kind, payload):
        if not self.out_ok:
            return
        try:
            write_all(1, HEADER.pack(kind, len(payload)) + payload)
        except OSError:
            # The daemon went away: keep running the command, stop reporting.
            self.out_ok = False

    def send_json(self, kind, obj):
        self.send(kind, dumps(obj))

    # -- start ------------------------------------------------------------
    def argv(self):
        """Return ``(program, argv)``: ``bash -lc CMD``, or ``sh -c CMD`` without bash."""
        if self.shell:
            return self.shell, [os.path.basename(self.shell), "-c", "--", self.command]
        # "--" so that a command starting with "-" is a command, not an option of the shell.
        for directory in self.env.get("PATH", "/usr/bin:/bin").split(":"):
            candidate = os.path.join(directory or ".", "bash")
            if os.access(candidate, os.X_OK):
                return candidate, ["bash", "-lc", "--", self.command]
        return "/bin/sh", ["sh", "-c", "--", self.command]

    def start(self):
        program, argv = self.argv()
        err_r, err_w = os.pipe()
        # The child waits on this until its pid is reported: a command that kills us at once
        # (`kill -9 $PPID`) must not beat the report, or the daemon would think it never started.
        go_r, go_w = os.pipe()
        if self.tty:
            import pty

            master, slave = pty.openpty()
            self.set_winsize(slave)
            child_fds = (slave, slave, slave)
            self.out_fds = {master: b"1"}
            self.stdin_fd = master
            close_in_parent = [slave]
        else:
            in_r, in_w = os.pipe()
            out_r, out_w = os.pipe()
            if self.merge_stderr:
                child_fds = (in_r, out_w, out_w)
                self.out_fds = {out_r: b"1"}
                close_in_parent = [in_r, out_w]
            else:
                errs_r, errs_w = os.pipe()
                child_fds = (in_r, out_w, errs_w)
                self.out_fds = {out_r: b"1", errs_r: b"2"}
                close_in_parent = [in_r, out_w, errs_w]
            self.stdin_fd = in_w
        try:
            pid = os.fork()
        except OSError as exc:
            # Typically EAGAIN: the workspace's pids limit is reached (a fork bomb, say).
            report = {"stage": "fork", "errno": exc.errno or 0, "message": "fork: %s" % (exc.strerror or exc)}
            self.send(b"F", dumps(report))
            return False
        if pid == 0:  # child: never returns
            os.close(go_w)
            self.exec_child(program, argv, child_fds, err_r, err_w, go_r)
        self.pid = pid
        for fd in close_in_parent + [err_w, go_r]:
            os.close(fd)
        # Everything before execve is done (or failed) when the child writes READY or a report.
        failure = os.read(err_r, 4096)
        if failure == READY:
            self.send_json(b"P", {"pid": pid})
            os.close(go_w)  # go: the child execs (a failure of execve itself follows on err_r)
            failure = b""
        else:
            os.close(go_w)
            if not failure:  # it died without a word (a signal) before it could run the command
                failure = dumps(
                    {"stage": "exec", "errno": 0, "message": "the command's process died before it started"}
                )
        while True:
            chunk = os.read(err_r, 4096)
            if not chunk:
                break
            failure += chunk
        os.close(err_r)
        if failure:
            os.waitpid(pid, 0)
            self.send(b"F", failure)
            return False
        for fd in list(self.out_fds) + [self.stdin_fd]:
            os.set_blocking(fd, False)
        return True

    def exec_child(self, program, argv, child_fds, err_r, err_w, go_r):
        stage = "setsid"
        try:
            os.close(err_r)
            os.setsid()
            for target, fd in enumerate(child_fds):
                os.dup2(fd, target)
            if self.tty:
                import fcntl
                import termios

                stage = "controlling terminal"
                fcntl.ioctl(0, termios.TIOCSCTTY, 0)
            for fd in set(child_fds):
                if fd > 2:
                    os.close(fd)
            stage = "signals"
            for sig in _CATCHABLE:
                try:
                    signal.signal(sig, signal.SIG_DFL)
                except (OSError, ValueError):
                    pass
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            try:
                # Under memory pressure the kernel should pick the command, not us.
                with open("/proc/self/oom_score_adj", "w") as fh:
                    fh.write("500")
            except OSError:
                pass
            stage = "chdir"
            os.chdir(self.cwd)
            stage = "exec"
            os.write(err_w, READY)
            os.read(go_r, 1)  # EOF once the supervisor has reported this pid
            os.close(go_r)
            os.execve(program, argv, self.env)
        except OSError as exc:
            message = "%s: %s" % (stage, exc.strerror or exc)
            if stage == "chdir":
                message = "working directory %s: %s" % (self.cwd, exc.strerror)
            report = {"stage": stage, "errno": exc.errno or 0, "message": message}
            os.write(err_w, dumps(report))
        finally:
            os._exit(127)

    def set_winsize(self, fd):
        import fcntl
        import termios

        rows = max(1, min(self.rows, 65535))
        columns = max(1, min(self.columns, 65535))
        try:
            fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        except OSError:
            pass

    # -- commands from the daemon ------------------------------------------
    def handle_frames(self):
        while len(self.in_buf) >= HEADER.size:
            kind, length = HEADER.unpack_from(self.in_buf)
            if len(self.in_buf) < HEADER.size + length:
                return
            payload = self.in_buf[HEADER.size : HEADER.size + length]
            self.in_buf = self.in_buf[HEADER.size + length :]
            self.handle(kind, payload)

    def handle(self, kind, payload):
        if kind == b"I":
            if payload:
                self.last_input = payload[-1:]
            # Bounded: input the command does not read is dropped past this, not hoarded.
            room = MAX_PENDING_INPUT - len(self.stdin_pending)
            self.stdin_pending += payload[: max(0, room)]
            self.flush_stdin()
        elif kind == b"C":
            self.stdin_close = True
            if self.tty:
                # ^D ends input only at the start of a line; after a partial line it first
                # flushes that line, so a second one is needed.
                self.stdin_pending += b"\x04" if self.last_input in (b"\n", b"\r") else b"\x04\x04"
            self.flush_stdin()
        elif kind == b"S":
            number_text, _, interrupt = payload.decode().partition(",")
            self.interrupted = self.interrupted or interrupt == "1"
            number = int(number_text)
            if number:
                try:
                    os.killpg(self.pid, number)
                except OSError:
                    pass
        elif kind == b"K":
            self.start_kill(float(payload.decode() or self.grace_s))
        elif kind == b"W":
            columns, _, rows = payload.decode().partition(",")
            self.columns, self.rows = int(columns), int(rows)
            if self.tty:
                self.set_winsize(self.stdin_fd)
                try:
                    os.killpg(self.pid, signal.SIGWINCH)
                except OSError:
                    pass

    def start_kill(self, grace_s):
        """First rung of the ladder: SIGTERM to the whole tree; SIGKILL after ``grace_s``."""
        if self.kill_deadline is None:
            self.kill_deadline = time.monotonic() + grace_s
            signal_all(tree(os.getpid(), self.pid, self.marker), signal.SIGTERM)

    def check_deadline(self):
        if self.deadline is not None and not self.timed_out and time.monotonic() >= self.deadline:
            self.timed_out = True
            self.start_kill(self.grace_s)

    def flush_stdin(self):
        if self.stdin_fd < 0:
            return
        while self.stdin_pending:
            try:
                written = os.write(self.stdin_fd, self.stdin_pending)
            except BlockingIOError:
                return
            except OSError:
                # The command closed its stdin: what it did not read is gone.
                self.stdin_pending = b""
                break
            self.stdin_pending = self.stdin_pending[written:]
        if self.stdin_close and not self.tty:
            os.close(self.stdin_fd)
            self.stdin_fd = -1

    # -- output -----------------------------------------------------------
    def read_output(self, fd, forward):
        """Read one chunk from ``fd``; return False once it is at end of file."""
        try:
            data = os.read(fd, READ_SIZE)
        except BlockingIOError:
            return True
        except OSError as exc:
            if exc.errno != errno.EIO:  # EIO: the pty's last holder closed it
                raise
            data = b""
        if not data:
            kind = self.out_fds.pop(fd)
            if not (self.tty and kind == b"1" and fd == self.stdin_fd):
                os.close(fd)
            return False
        if forward:
            self.emit(self.out_fds[fd], data)
        return True

    def emit(self, kind, data):
        """Forward output to the daemon, and to the spill file once there is one."""
        self.send(kind, data)
        self.spill.feed(data)

    def drain_ready(self):
        """Forward everything already buffered in the pipes, without waiting for more."""
        for fd in list(self.out_fds):
            for _ in range(64):  # bounded: a background writer may never stop
                try:
                    data = os.read(fd, READ_SIZE)
                except BlockingIOError:
                    break
                except OSError:
                    break
                if not data:
                    break
                self.emit(self.out_fds[fd], data)

    # -- main loop ----------------------------------------------------------
    def run(self):
        set_subreaper()
        if self.env_on_stdin:
            env = read_env_frame(0)
            if env is None:
                self.send_json(
                    b"F", {"stage": "env", "errno": 0, "message": "the daemon never sent the command's environment"}
                )
                return 0
            self.env.update(env)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(sig, signal.SIG_IGN)
        # A SIGCHLD wakes select() at once, so an exit is seen without polling.
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda _sig, _frame: None)
        os.set_blocking(0, False)
        if not self.start():
            return 0
        status = self.loop()
        self.drain_ready()
        if self.kill_deadline is not None:
            # The rest of the tree gets the remainder of its grace to exit on SIGTERM.
            while time.monotonic() < self.kill_deadline and self.remaining():
                time.sleep(0.02)
                self.drain_ready()
        if self.interrupted or self.kill_deadline is not None:
            # The command as a whole was stopped: nothing it started may outlive it.
            hard_kill(os.getpid(), self.pid, self.marker, lambda: reap_children(self.statuses))
        exit_code, sig = decode_status(status)
        oom = max(0, oom_kill_count() - self.oom_before)
        report = {
            "exit_code": exit_code,
            "signal": sig,
            "oom_kills": oom,
            "timed_out": self.timed_out,
            "leftovers": len(self.remaining()),
            "spill_path": self.spill.close(),
        }
        self.send_json(b"X", report)
        self.finish()
        return 0

    def remaining(self):
        reap_children(self.statuses)
        return tree(os.getpid(), self.pid, self.marker)

    def loop(self):
        """Relay until the top-level command has exited; return its wait status."""
        while True:
            reap_children(self.statuses)
            if self.pid in self.statuses:
                return self.statuses.pop(self.pid)
            self.check_deadline()
            if self.kill_deadline is not None and time.monotonic() >= self.kill_deadline:
                hard_kill(os.getpid(), self.pid, self.marker, lambda: reap_children(self.statuses))
                continue
            rlist = [self.wake_r, *self.out_fds]
            if self.in_open:
                rlist.append(0)
            wlist = [self.stdin_fd] if self.stdin_pending and self.stdin_fd >= 0 else []
            timeout = self.wait_s()
            if self.kill_deadline is not None:
                timeout = max(0.0, min(0.05, self.kill_deadline - time.monotonic()))
            try:
                readable, writable, _ = select.select(rlist, wlist, [], timeout)
            except InterruptedError:
                continue
            if writable:
                self.flush_stdin()
            for fd in readable:
                if fd == self.wake_r:
                    self.drain_wakeups()
                elif fd == 0:
                    self.read_commands()
                elif fd in self.out_fds:
                    self.read_output(fd, forward=True)

    def read_commands(self):
        try:
            data = os.read(0, READ_SIZE)
        except BlockingIOError:
            return
        if not data:
            # The daemon hung up: the command keeps running unobserved.
            self.in_open = False
            self.out_ok = False
            return
        self.in_buf += data
        self.handle_frames()

    def finish(self):
        """After the exit report: stop talking and keep draining background writers."""
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        self.out_ok = False
        if self.stdin_fd >= 0 and self.stdin_fd not in self.out_fds:
            os.close(self.stdin_fd)
        next_scan = 0.0
        while True:
            now = time.monotonic()
            if now >= next_scan:
                # Stay while anything of the command lives: as its subreaper, and to
                # enforce its timeout on what outlived the top-level shell.
                alive = bool(self.remaining())
                next_scan = now + 1.0
                if not alive and not self.out_fds:
                    return
            self.check_deadline()
            if self.kill_deadline is not None and now >= self.kill_deadline:
                hard_kill(os.getpid(), self.pid, self.marker, lambda: reap_children(self.statuses))
                self.kill_deadline = None
            try:
                readable, _, _ = select.select(list(self.out_fds) + [self.wake_r], [], [], self.wait_s())
            except InterruptedError:
                continue
            for fd in readable:
                if fd == self.wake_r:
                    self.drain_wakeups()
                elif not self.read_output(fd, forward=False):
                    next_scan = 0.0  # a pipe closed: maybe nothing is left, look now
            reap_children(self.statuses)

    def wait_s(self):
        """How long select() may sleep: until the next deadline, at most a second."""
        wait = 1.0
        for moment in (self.deadline if not self.timed_out else None, self.kill_deadline):
            if moment is not None:
                wait = min(wait, max(0.0, moment - time.monotonic()))
        return wait

    def drain_wakeups(self):
        while True:
            try:
                if not os.read(self.wake_r, 4096):
                    return
            except BlockingIOError:
                return


def decode_status(status):
    """Turn a wait status into ``(exit_code, signal_number)``; a signal N gives 128+N."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return 128 + sig, sig
    return os.WEXITSTATUS(status), 0


def reap_marked(config):
    """Reap mode: SIGTERM every process carrying the marker, wait, then SIGKILL the rest."""
    marker = config["marker"].encode()
    MARKER_IN_ARGV[0] = config.get("marker_in_argv") == "1"
    me = os.getpid()
    found = tree(me, 0, marker)
    values = sorted(set(v.decode("utf-8", "replace") for v in (marker_value(p, marker) for p in found) if v))
    signal_all(found, signal.SIGTERM)
    deadline = time.monotonic() + float(config.get("grace_s") or 2.0)
    pids = found
    while pids and time.monotonic() < deadline:
        time.sleep(0.05)
        pids = tree(me, 0, marker)
    hard_kill(me, 0, marker)
    sys.stdout.write(dumps({"killed": len(found), "markers": ",".join(values)}).decode())
    return 0


def main(argv):
    config, env = parse_tokens(argv[1:])
    if config.get("mode") == "reap":
        return reap_marked(config)
    return Supervisor(config, env).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
