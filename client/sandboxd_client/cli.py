"""``sandboxctl``: the command line for a running sandboxd daemon.

Exit status: the command's own exit code for ``exec``; 0 on success otherwise;
1 with one ``sandboxctl: ...`` line on standard error when the daemon refuses
or cannot be reached; 2 for usage errors.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import posixpath
import shutil
import signal
import stat
import sys
import tarfile
import tempfile
import termios
import threading
import tty as ttymode
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

from . import ExecHandle, ExecResult, Output, SandboxClient, Started, TLSOptions
from ._client import PoolClassInfo, ProcessInfo, SnapshotInfo, WorkspaceInfo
from .errors import NotFoundError, SandboxError, UnavailableError

__all__ = ["main"]


def _size(text: str) -> int:
    """Parse ``512m``, ``2g``, ``1048576`` (bytes; k/m/g are binary multiples)."""
    units = {"k": 1024, "m": 1024**2, "g": 1024**3}
    text = text.strip().lower().removesuffix("b").removesuffix("i")
    try:
        if text and text[-1] in units:
            return int(float(text[:-1]) * units[text[-1]])
        return int(text)
    except ValueError:
        msg = f"not a size: {text!r} (use e.g. 512m or 2g)"
        raise argparse.ArgumentTypeError(msg) from None


def _parser(*, command_split: bool = False) -> argparse.ArgumentParser:
    """The argument parser; ``command_split``: an exec's command was already cut off at ``--``."""
    parser = argparse.ArgumentParser(prog="sandboxctl", description="Drive a sandboxd daemon.")
    parser.add_argument("--socket", help="daemon Unix socket (env SANDBOXD_SOCKET)")
    parser.add_argument("--address", help="daemon HOST:PORT over TLS instead of the Unix socket (env SANDBOXD_ADDRESS)")
    parser.add_argument("--token", help="bearer token (env SANDBOXD_TOKEN)")
    parser.add_argument("--tls-ca", help="PEM CA that signed the daemon's certificate (env SANDBOXD_TLS_CA)")
    parser.add_argument("--tls-cert", help="PEM client certificate for mutual TLS (env SANDBOXD_TLS_CERT)")
    parser.add_argument("--tls-key", help="PEM key of --tls-cert (env SANDBOXD_TLS_KEY)")
    parser.add_argument("--tls-server-name", help="name to check the daemon's certificate against")
    commands = parser.add_subparsers(dest="command", required=True)

    create = commands.add_parser("create", help="create a workspace and print its id")
    create.add_argument("--image", default="", help="image (default: the daemon's)")
    create.add_argument("--memory", type=_size, default=0, help="memory limit, e.g. 512m")
    create.add_argument("--cpus", type=float, default=0, help="CPU quota in CPUs, e.g. 0.5")
    create.add_argument("--pids", type=int, default=0, help="process limit")
    create.add_argument("--disk", type=_size, default=0, help="size cap of /workspace (tmpfs), e.g. 256m")
    create.add_argument("--read-only", action="store_true", help="read-only root fs (/workspace, /tmp stay writable)")
    create.add_argument(
        "--network", choices=["none", "bridge", "allowlist"], default="", help="network policy (default none)"
    )
    create.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="HOST[:PORTS]",
        help="with --network allowlist: a host (or *.domain, IP, CIDR) it may reach; ports 80,443 by default",
    )
    create.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="add a label")
    create.add_argument("--name", default="", help="workspace id to use instead of a generated one")
    create.add_argument("--runtime", choices=["runc", "runsc"], default="", help="OCI runtime (runsc is gVisor)")
    create.add_argument(
        "--ttl", type=float, default=None, metavar="SECONDS", help="remove after this long idle; 0 never"
    )
    create.add_argument(
        "--env", "-e", action="append", default=[], metavar="NAME=VALUE", help="environment; VALUE may be secret:NAME"
    )
    create.add_argument(
        "--idle-action", choices=["delete", "pause"], default="", help="what --ttl and --lifetime do (default delete)"
    )
    create.add_argument(
        "--lifetime", type=float, default=0.0, metavar="SECONDS", help="end it this long after it is made, busy or not"
    )
    create.add_argument(
        "--no-auto-resume", action="store_true", help="calls on the paused workspace fail instead of resuming it"
    )
    create.add_argument("--from-snapshot", default="", metavar="SNAPSHOT", help="start from this snapshot's files")
    create.add_argument("--user", default="", help="user commands run as (default: the image's non-root user)")
    create.add_argument(
        "--cap-add", action="append", default=[], metavar="CAP", help="a capability every command keeps"
    )
    create.add_argument(
        "--root-cap", action="append", default=[], metavar="CAP", help="a capability commands run as root keep"
    )

    fork = commands.add_parser("fork", help="create a workspace from a snapshot and print its id")
    fork.add_argument("snapshot")
    fork.add_argument("--name", default="", help="workspace id to use instead of a generated one")
    fork.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="add a label")
    fork.add_argument("--env", "-e", action="append", default=[], metavar="NAME=VALUE", help="environment")
    fork.add_argument("--ttl", type=float, default=None, metavar="SECONDS", help="idle TTL; 0 never")

    pause = commands.add_parser("pause", help="freeze workspaces (no CPU, no timeouts running) until resumed")
    pause.add_argument("workspaces", nargs="+")
    resume = commands.add_parser("resume", help="thaw paused workspaces")
    resume.add_argument("workspaces", nargs="+")
    lifetime = commands.add_parser("lifetime", help="end a workspace SECONDS from now (0: never)")
    lifetime.add_argument("workspace")
    lifetime.add_argument("seconds", type=float)

    snapshot = commands.add_parser("snapshot", help="capture a workspace's files as a named snapshot")
    snapshot.add_argument("workspace")
    snapshot.add_argument("name")
    snapshot.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="add a label")
    snapshot.add_argument(
        "--memory", action="store_true", help="keep its running processes too (gVisor): forks start with them"
    )
    restore = commands.add_parser("restore", help="return a workspace to a snapshot, keeping its id")
    restore.add_argument("workspace")
    restore.add_argument("snapshot")
    snapshots = commands.add_parser("snapshots", help="list snapshots")
    snapshots.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="filter by label")
    snapshots.add_argument("-q", "--quiet", action="store_true", help="print names only")
    rmsnapshot = commands.add_parser("rmsnapshot", help="delete snapshots")
    rmsnapshot.add_argument("names", nargs="+")

    template = commands.add_parser("template", help="build templates (snapshots made from a Dockerfile)")
    template_commands = template.add_subparsers(dest="template_command", required=True)
    build = template_commands.add_parser("build", help="build DIR's Dockerfile (DIR the context) as template NAME")
    build.add_argument("context", nargs="?", default="", help="the build context directory (default: none)")
    build.add_argument("--name", "-n", required=True, help="the template's name")
    build.add_argument("--dockerfile", "-f", default="", help="the Dockerfile (default: CONTEXT/Dockerfile)")
    build.add_argument("--start", default="", metavar="CMD", help="run in the background at each workspace start")
    build.add_argument("--ready", default="", metavar="CMD", help="run until it exits 0 before a workspace is ready")
    build.add_argument("--workdir", default="", help="where its workspaces start (default: its last WORKDIR)")
    build.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="add a label")
    build.add_argument("--force", action="store_true", help="build every step again, ignoring the cache")
    build.add_argument("--timeout", type=float, default=0.0, help="seconds the build may take")
    build.add_argument("-q", "--quiet", action="store_true", help="print the name only, not the build's log")
    templates = commands.add_parser("templates", help="list templates")
    templates.add_argument("-q", "--quiet", action="store_true", help="print names only")

    commands.add_parser("pool", help="show the daemon's warm pool")

    run = commands.add_parser("exec", help="run a command, streaming its output; exits with its code")
    run.add_argument("workspace")
    run.add_argument("--workdir", "-w", default="")
    run.add_argument("--env", "-e", action="append", default=[], metavar="NAME=VALUE")
    run.add_argument("--timeout", type=float, default=None, help="seconds before the command is killed")
    run.add_argument(
        "--user", "-u", default="", help="run as this user (name, uid or uid:gid) instead of the workspace's"
    )
    run.add_argument(
        "-i",
        "--interactive",
        action="store_true",
        help="forward standard input to the command and close it at its end; without -i the command's "
        "stdin is closed from the start (it reads end of file at once), as with docker exec",
    )
    run.add_argument(
        "-t",
        "--tty",
        action="store_true",
        help="run under a terminal; with -i your terminal goes raw and keys, Ctrl-C and window size go through; "
        "without -i the terminal's input ends at once",
    )
    # Once the command is cut off at `--`, options may follow the workspace: they must not be
    # swallowed as the command's words (REMAINDER would take them, and they would be lost).
    run.add_argument("argv", nargs="*" if command_split else argparse.REMAINDER, help="-- COMMAND [ARGS...]")

    ps = commands.add_parser("ps", help="list a workspace's process sessions")
    ps.add_argument("workspace")

    kill = commands.add_parser("kill", help="end a process and everything it started (SIGTERM, grace, SIGKILL)")
    kill.add_argument("workspace")
    kill.add_argument("process_id")
    kill.add_argument("--grace", type=float, default=None, help="seconds between SIGTERM and SIGKILL (default 2)")

    network = commands.add_parser("network", help="change a running workspace's network policy")
    network.add_argument("workspace")
    network.add_argument("policy", choices=["none", "bridge", "allowlist"])
    network.add_argument("--allow", action="append", default=[], metavar="HOST[:PORTS]", help="as for create")
    forward = commands.add_parser(
        "port-forward",
        help="forward local ports to ports on a workspace's loopback until Ctrl-C (any network policy)",
    )
    forward.add_argument("workspace")
    forward.add_argument(
        "ports",
        nargs="+",
        metavar="[LOCAL:]REMOTE",
        help="8000 (the same port here), 8080:8000, or :8000 (any free one)",
    )
    forward.add_argument(
        "--listen-address",
        default="127.0.0.1",
        help="local address to listen on (default 127.0.0.1, kubectl's --address)",
    )
    ls = commands.add_parser("ls", help="list workspaces")
    ls.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="filter by label")
    ls.add_argument("-q", "--quiet", action="store_true", help="print ids only")

    rm = commands.add_parser("rm", help="delete workspaces")
    rm.add_argument("workspaces", nargs="+")

    cp = commands.add_parser("cp", help="copy files or trees between here and a workspace (WS:/path)")
    cp.add_argument("source", help="local path, WS:/path, or - (a tar archive on standard input)")
    cp.add_argument("destination", help="local path, WS:/path, or - (a tar archive on standard output)")
    cp.add_argument(
        "-a", "--archive", action="store_true", help="keep the files' owners when copying out (default: you own them)"
    )

    cat = commands.add_parser("cat", help="print a file from a workspace, byte for byte")
    cat.add_argument("workspace")
    cat.add_argument("path")

    commands.add_parser("health", help="check the daemon answers (gRPC health); exit 0 when SERVING")

    tool = commands.add_parser("tool", help="run one agent tool call and print what the model would see")
    tool.add_argument("workspace")
    tool.add_argument("name", help="exec_command, input_command, read_file, edit_file, write_file, ...")
    tool.add_argument("arguments", help="the call's arguments as a JSON object")
    tool.add_argument("--json", action="store_true", help="print the final message as JSON")
    tool.add_argument("--config", help="system_config.yaml whose tools.builtin to use")

    mcp = commands.add_parser("mcp", help="serve the agent tools on one workspace over MCP (stdio)")
    mcp.add_argument("workspace")
    mcp.add_argument("--mode", default="allow-all", choices=["allow-all", "deny-all", "read-only", "always-ask"])
    mcp.add_argument("--model", default="vision", choices=["vision", "text-only"])
    mcp.add_argument("--config", help="system_config.yaml whose tools.builtin to use")
    return parser


def _pairs(items: Sequence[str], what: str) -> dict[str, str]:
    result = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            msg = f"{what} must look like KEY=VALUE, got {item!r}"
            raise SandboxError(msg)
        result[key] = value
    return result


def _command_line(argv: Sequence[str]) -> str:
    words = list(argv)
    if words and words[0] == "--":
        words = words[1:]
    if not words:
        msg = "exec needs a command: sandboxctl exec WS -- COMMAND [ARGS...]"
        raise SandboxError(msg)
    if len(words) == 1:
        return words[0]  # one word is a shell command line as typed
    import shlex

    return shlex.join(words)


async def _run(opts: argparse.Namespace) -> int:
    tls = TLSOptions.from_env(os.environ)
    tls = TLSOptions(
        ca_file=opts.tls_ca or tls.ca_file,
        cert_file=opts.tls_cert or tls.cert_file,
        key_file=opts.tls_key or tls.key_file,
        server_name=opts.tls_server_name or tls.server_name,
    )
    try:
        client = SandboxClient(
            opts.address,
            socket_path=opts.socket,
            token=opts.token,
            tls=tls if tls != TLSOptions() else None,
        )
    except ValueError as exc:
        raise SandboxError(str(exc)) from None
    async with client:
        if opts.command == "create":
            workspace = await client.create_workspace(
                env=_pairs(opts.env, "--env"),
                runtime=opts.runtime,
                idle_ttl_s=opts.ttl,
                image=opts.image,
                memory_bytes=opts.memory,
                cpu_millis=round(opts.cpus * 1000),
                pids=opts.pids,
                disk_bytes=opts.disk,
                read_only_root_filesystem=opts.read_only,
                network=opts.network,
                allowed_hosts=opts.allow,
                labels=_pairs(opts.label, "--label"),
                workspace_id=opts.name,
                idle_action=opts.idle_action,
                auto_resume=False if opts.no_auto_resume else None,
                from_snapshot=opts.from_snapshot,
                user=opts.user,
                added_capabilities=opts.cap_add,
                root_capabilities=opts.root_cap,
                lifetime_s=opts.lifetime,
            )
            print(workspace.workspace_id)
            return 0
        if opts.command == "lifetime":
            info = await client.set_lifetime(opts.workspace, opts.seconds)
            print(info.expire_time.isoformat() if info.expire_time is not None else "never")
            return 0
        if opts.command == "fork":
            workspace = await client.create_workspace(
                from_snapshot=opts.snapshot,
                workspace_id=opts.name,
                labels=_pairs(opts.label, "--label"),
                env=_pairs(opts.env, "--env"),
                idle_ttl_s=opts.ttl,
            )
            print(workspace.workspace_id)
            return 0
        if opts.command in ("pause", "resume"):
            for workspace_id in opts.workspaces:
                if opts.command == "pause":
                    await client.pause_workspace(workspace_id)
                else:
                    await client.resume_workspace(workspace_id)
                print(workspace_id)
            return 0
        if opts.command == "snapshot":
            taken = await client.snapshot_workspace(
                opts.workspace, opts.name, labels=_pairs(opts.label, "--label"), include_memory=opts.memory
            )
            print(taken.name)
            return 0
        if opts.command == "restore":
            print((await client.restore_workspace(opts.workspace, opts.snapshot)).workspace_id)
            return 0
        if opts.command == "snapshots":
            _print_snapshots(await client.list_snapshots(_pairs(opts.label, "--label")), quiet=opts.quiet)
            return 0
        if opts.command == "rmsnapshot":
            for name in opts.names:
                await client.delete_snapshot(name)
                print(name)
            return 0
        if opts.command == "template":
            return await _build_template(client, opts)
        if opts.command == "templates":
            found = [info for info in await client.list_snapshots() if info.is_template]
            _print_templates(found, quiet=opts.quiet)
            return 0
        if opts.command == "pool":
            _print_pool(await client.get_pool())
            return 0
        if opts.command == "exec":
            return await _exec(client, opts)
        if opts.command == "ps":
            _print_processes(await client.list_processes(opts.workspace))
            return 0
        if opts.command == "kill":
            if opts.process_id not in {p.process_id for p in await client.list_processes(opts.workspace)}:
                msg = f"process {opts.process_id!r} not found in workspace {opts.workspace!r}"
                raise SandboxError(msg)
            exited = await client.kill(opts.process_id, grace_s=opts.grace)
            print(f"{opts.process_id} exited {exited.exit_code}" + (f" ({exited.signal})" if exited.signal else ""))
            return 0
        if opts.command == "network":
            info = await client.update_network(opts.workspace, opts.policy, allowed_hosts=opts.allow)
            print(f"{info.workspace_id} {info.network}" + "".join(f" {rule}" for rule in info.allowed_hosts))
            return 0
        if opts.command == "port-forward":
            return await _port_forward(client, opts)
        if opts.command == "ls":
            infos = await client.list_workspaces(_pairs(opts.label, "--label"))
            _print_workspaces(infos, quiet=opts.quiet)
            return 0
        if opts.command == "cp":
            await _copy(client, opts.source, opts.destination, archive=opts.archive)
            return 0
        if opts.command == "cat":
            await _cat(client, opts.workspace, opts.path)
            return 0
        if opts.command == "tool":
            return await _tool(client, opts)
        if opts.command == "health":
            status = await client.health()
            print(status)
            return 0 if status == "SERVING" else 1
        if opts.command == "mcp":
            return await _mcp(client, opts)
        if opts.command == "rm":
            for workspace_id in opts.workspaces:
                await client.delete_workspace(workspace_id)
                print(workspace_id)
            return 0
    return 2


def _port_pair(text: str) -> tuple[int, int]:
    """``[LOCAL:]REMOTE`` as (local, remote); an empty local is 0 (any free port)."""
    local, _, remote = text.rpartition(":") if ":" in text else (text, ":", text)
    try:
        pair = (int(local) if local else 0, int(remote))
    except ValueError:
        pair = (-1, -1)
    if not (0 <= pair[0] <= 65535 and 1 <= pair[1] <= 65535):
        msg = f"{text!r} is not [LOCAL:]REMOTE with ports 1-65535 (e.g. 8080:8000)"
        raise SandboxError(msg)
    return pair


async def _port_forward(client: SandboxClient, opts: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM, like ``kubectl port-forward``; each failed connection is a line on stderr."""
    await client.get_workspace(opts.workspace)  # a workspace that is not there fails now, not per connection
    pairs = [_port_pair(text) for text in opts.ports]

    def failed(error: SandboxError) -> None:
        print(f"error: {error.message}", file=sys.stderr, flush=True)

    forwards = [
        client.forward(opts.workspace, remote, local_host=opts.listen_address, local_port=local, on_error=failed)
        for local, remote in pairs
    ]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        for forward in forwards:
            try:
                address = await forward.start()
            except OSError as exc:
                msg = f"cannot listen on {opts.listen_address}:{forward.local_port}: {exc.strerror or exc}"
                raise SandboxError(msg) from None
            print(f"Forwarding from {address} -> {forward.port}", flush=True)
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        for forward in forwards:
            await forward.close()
    return 0


def _remote(spec: str) -> tuple[str, str] | None:
    """``WS:/path`` -> ``(WS, /path)``; a local path (``./a:b`` included) -> None."""
    head, sep, tail = spec.partition(":")
    if not sep or not head or "/" in head or head.startswith("."):
        return None
    return head, tail or "/workspace"


async def _tar_chunks(local: Path, arcname: str) -> AsyncIterator[bytes]:
    """A tar archive of ``local`` named ``arcname``, produced in a thread and streamed."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=16)

    class Sink:
        """What tarfile writes its stream to: each block goes to the queue."""

        def write(self, data: bytes) -> int:
            asyncio.run_coroutine_threadsafe(queue.put(bytes(data)), loop).result()
            return len(data)

    def produce() -> None:
        try:
            with tarfile.open(fileobj=Sink(), mode="w|", bufsize=65536, format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
                tar.add(str(local), arcname=arcname)
        finally:
            asyncio.run_coroutine_threadsafe(queue.put(None), loop).result()

    worker = loop.run_in_executor(None, produce)
    while (chunk := await queue.get()) is not None:
        yield chunk
    await worker


async def _copy(client: SandboxClient, source: str, destination: str, *, archive: bool = False) -> None:
    """Copy like ``docker cp``: into an existing directory, or to a new name.

    A destination ending in ``/`` is a directory (created when missing); ``-`` is a tar
    archive on standard input or output.
    """
    src, dst = _remote(source), _remote(destination)
    if dst is not None:
        await _copy_in(client, source, *dst)
        return
    assert src is not None
    workspace, path = src
    if destination == "-":
        await _download(client, workspace, path, _to_stdout)
        return
    local = Path(destination)
    if destination.endswith("/"):  # a directory by name, created when missing, as for copies in
        await asyncio.to_thread(local.mkdir, parents=True, exist_ok=True)
    into_dir = await asyncio.to_thread(local.is_dir)
    if not into_dir and not await asyncio.to_thread(local.parent.is_dir):
        msg = f"{local.parent}: no such directory"  # as docker cp: only a name ending in / is created
        raise SandboxError(msg)
    extraction = _Extraction(local if into_dir else local.parent, None if into_dir else local.name, archive=archive)

    def extract(reader: int) -> None:
        with os.fdopen(reader, "rb") as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                extraction.extract(tar, member)

    await _download(client, workspace, path, extract)


class _Extraction:
    """Extracts a downloaded archive member by member into ``base``; nothing lands outside it.

    The archive comes from the workspace, which may be hostile and may even forge what the
    daemon relays: every name is checked here, not left to tarfile's filters alone (older
    Pythons have known bypasses). Symlinks are kept as they are, as ``docker cp`` does, but
    nothing is ever written through one; a hard link may only point at a file this same
    archive created; an existing link or file in the way is replaced, never followed.
    """

    def __init__(self, base: Path, rename: str | None, *, archive: bool) -> None:
        """``rename``: the new name of the archive's top-level entry; ``archive``: keep owners."""
        self.base = base
        self.rename = rename
        self.owners = {} if archive else {"uid": os.getuid(), "gid": os.getgid(), "uname": None, "gname": None}
        self.files: set[str] = set()

    def _relative(self, name: str) -> str:
        parts = [part for part in name.split("/") if part not in ("", ".")]
        if not parts or name.startswith("/") or ".." in parts:
            msg = f"refusing archive entry {name!r}: it would land outside the destination"
            raise SandboxError(msg)
        if self.rename is not None:
            parts[0] = self.rename
        return "/".join(parts)

    def _check_parents(self, relative: str) -> None:
        path = self.base
        for part in relative.split("/")[:-1]:
            path = path / part
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:
                return  # the rest is created by the extraction itself, as real directories
            if not stat.S_ISDIR(mode):
                msg = f"refusing archive entry {relative!r}: {path} is a link or a file, not a directory"
                raise SandboxError(msg)

    def extract(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        """Extract one member (special files are skipped)."""
        if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
            return
        relative = self._relative(member.name)
        self._check_parents(relative)
        changes: dict[str, Any] = {"name": relative, **self.owners}
        if member.islnk():
            target = self._relative(member.linkname)
            if target not in self.files:
                msg = f"refusing hard link {relative!r}: it points outside what this copy created"
                raise SandboxError(msg)
            changes["linkname"] = target
        destination = self.base / relative
        if os.path.lexists(destination):
            if os.path.isdir(destination) and not os.path.islink(destination):
                if not member.isdir():
                    msg = f"cannot overwrite directory {destination} with a non-directory"
                    raise SandboxError(msg)
            elif member.isdir() and not os.path.islink(destination):
                msg = f"cannot copy a directory onto {destination}: it is a file"  # as docker cp
                raise SandboxError(msg)
            else:
                os.unlink(destination)  # replaced, never written through
        tar.extract(member.replace(**changes), self.base, filter="tar")
        if member.isfile() or member.islnk():
            self.files.add(relative)


async def _copy_in(client: SandboxClient, source: str, workspace: str, path: str) -> None:
    if source == "-":
        # A tar archive on standard input is extracted into the directory, as docker cp does.
        await client.upload(workspace, path, _stdin_chunks())
        return
    local = Path(source)
    if not await asyncio.to_thread(os.path.lexists, local):
        msg = f"{source}: no such file or directory"
        raise SandboxError(msg)
    if path.endswith("/"):
        into_dir = True  # a directory by name; the upload creates it when missing
    else:
        try:
            into_dir = (await client.stat(workspace, path, follow_symlinks=True)).type == "directory"
        except NotFoundError:
            into_dir = False
    if into_dir:
        target, arcname = path, local.name
    else:
        # A relative name resolves against /workspace in the daemon, like every other path.
        target, arcname = posixpath.dirname(path) or ".", posixpath.basename(path)
    await client.upload(workspace, target, _tar_chunks(local, arcname))


async def _stdin_chunks() -> AsyncIterator[bytes]:
    stdin = sys.stdin.buffer
    while chunk := await asyncio.to_thread(os.read, stdin.fileno(), 1 << 20):
        yield chunk


def _to_stdout(reader: int) -> None:
    with os.fdopen(reader, "rb") as stream:
        shutil.copyfileobj(stream, sys.stdout.buffer, 1 << 20)
    sys.stdout.buffer.flush()


async def _download(
    client: SandboxClient, workspace: str, path: str, consume: Callable[[int], None], *, follow: bool = False
) -> None:
    """Stream a Download into a pipe; ``consume`` (run in a thread) gets the read end's fd.

    The daemon's error (not found, say) wins over what the half-fed consumer then
    complains about; a broken archive is reported in one line too.
    """
    reader, writer = os.pipe()
    loop = asyncio.get_running_loop()
    worker = loop.run_in_executor(None, consume, reader)
    failure: BaseException | None = None
    try:
        with os.fdopen(writer, "wb") as sink:
            async for chunk in client.download(workspace, path, follow_symlinks=follow):
                await loop.run_in_executor(None, sink.write, chunk)
    except (SandboxError, BrokenPipeError) as exc:
        failure = exc
    try:
        await worker
    except (tarfile.TarError, OSError) as exc:
        if failure is None:
            msg = f"cannot unpack {path}: {exc}"
            raise SandboxError(msg) from None
    if failure is not None and not isinstance(failure, BrokenPipeError):
        raise failure


async def _cat(client: SandboxClient, workspace: str, path: str) -> None:
    def emit(reader: int) -> None:
        with os.fdopen(reader, "rb") as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                if not member.isfile():
                    msg = f"{path} is not a regular file"
                    raise SandboxError(msg)
                source = tar.extractfile(member)
                assert source is not None
                while chunk := source.read(65536):
                    sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()

    await _download(client, workspace, path, emit, follow=True)


def _definitions(config: str | None) -> list[Any]:
    from .tools import builtin_definitions

    if config:
        from .config import load_tools

        return load_tools(config)
    return list(builtin_definitions().values())


async def _tool(client: SandboxClient, opts: argparse.Namespace) -> int:
    """One call through the Environment (mode allow-all), printed as the model sees it."""
    import json

    from .approval import Approval
    from .environment import Environment
    from .tools import ToolCall, make_tool

    try:
        arguments = json.loads(opts.arguments)
    except json.JSONDecodeError as exc:
        msg = f"the arguments are not valid JSON: {exc}"
        raise SandboxError(msg) from None
    workspace = await client.get_workspace(opts.workspace)
    tools = [make_tool(d) for d in _definitions(opts.config)]
    environment = Environment(workspace, tools=tools, approval=Approval(mode="allow-all"))
    output = await environment.call(ToolCall(tool_call_id="cli", name=opts.name, arguments=arguments))
    if opts.json:
        message = {
            "tool_call_id": output.tool_call_id,
            "name": output.name,
            "output": output.output,
            "stop_reason": output.stop_reason,
            "exit_code": output.metadata.get("exit_code"),
            "process_id": output.metadata.get("process_id"),
            "images": list(output.images),
            "untrusted": output.untrusted,
        }
        print(json.dumps(message, ensure_ascii=False, indent=2))
    else:
        print(output.output)
    return 0 if output.stop_reason not in {"failed", "aborted"} else 1


async def _mcp(client: SandboxClient, opts: argparse.Namespace) -> int:
    from .approval import Approval
    from .environment import Environment
    from .mcp_server import serve_stdio
    from .tools import assemble

    workspace = await client.get_workspace(opts.workspace)
    tools = assemble(_definitions(opts.config) if opts.config else _default_definitions(), model=opts.model)
    await serve_stdio(Environment(workspace, tools=tools, approval=Approval(mode=opts.mode)))
    return 0


def _default_definitions() -> list[Any]:
    from .tools import default_definitions

    return default_definitions()


def _terminal_size() -> tuple[int, int]:
    size = shutil.get_terminal_size()
    return size.columns, size.lines


def _stdin_reader(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[bytes]) -> None:
    """Read standard input in a daemon thread (works for ttys, pipes and files alike)."""
    fd = sys.stdin.fileno()
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:
            data = b""
        loop.call_soon_threadsafe(queue.put_nowait, data)
        if not data:
            return


async def _forward_stdin(client: SandboxClient, handle: ExecHandle, started: asyncio.Event, *, keys: bool) -> None:
    """Send standard input on: as raw bytes, except that with ``keys`` a lone Ctrl-C byte is Ctrl-C.

    ``keys`` is for a raw terminal, where Ctrl-C arrives as a byte instead of a signal.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    threading.Thread(target=_stdin_reader, args=(loop, queue), daemon=True).start()
    await started.wait()
    while True:
        data = await queue.get()
        for start in range(0, len(data), 1 << 20):
            piece = data[start : start + (1 << 20)]
            if keys and piece == b"\x03":
                await client.input(handle.process_id, "\u0003").wait()
            else:
                await client.input(handle.process_id, data=piece).wait()
        if not data:
            await client.input(handle.process_id, close_stdin=True).wait()
            return


async def _exec(client: SandboxClient, opts: argparse.Namespace) -> int:
    """Stream a command; forward Ctrl-C (and with -i stdin, with -t window size) to it.

    Without -i nothing will ever be written to the command's stdin, so it starts closed: a
    command that reads it (``cat``, a prompt, ``apt-get`` without ``-y``) sees end of file at
    once instead of waiting for its timeout. Under -t that end is the terminal's end-of-file
    character.
    """
    tty = bool(opts.tty)
    interactive = bool(opts.interactive)
    handle = client.exec(
        opts.workspace,
        _command_line(opts.argv),
        workdir=opts.workdir,
        env=_pairs(opts.env, "--env"),
        timeout_s=opts.timeout,
        tty=tty,
        terminal_size=_terminal_size() if tty else None,
        follow=True,
        user=opts.user,
        stdin_closed=not interactive,
    )
    loop = asyncio.get_running_loop()
    started = asyncio.Event()
    background: set[asyncio.Task[object]] = set()

    def send(**options: object) -> None:
        if handle.process_id:
            task = loop.create_task(client.input(handle.process_id, **options).wait())  # type: ignore[arg-type]
            background.add(task)
            task.add_done_callback(background.discard)

    saved_mode = None
    stdin_is_tty = sys.stdin.isatty()
    keys = tty and interactive and stdin_is_tty
    if keys:
        saved_mode = termios.tcgetattr(sys.stdin.fileno())
        ttymode.setraw(sys.stdin.fileno())  # Ctrl-C now arrives as a byte and is forwarded as one
    if tty:
        loop.add_signal_handler(signal.SIGWINCH, lambda: send(terminal_size=_terminal_size()))
    loop.add_signal_handler(signal.SIGINT, lambda: send(chars="\u0003"))
    forwarder = loop.create_task(_forward_stdin(client, handle, started, keys=keys)) if interactive else None
    try:
        async for event in handle:
            if isinstance(event, Started):
                started.set()
            elif isinstance(event, Output) and event.data:
                stream = sys.stdout.buffer if event.stream == "stdout" else sys.stderr.buffer
                stream.write(event.data)
                stream.flush()
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        if tty:
            loop.remove_signal_handler(signal.SIGWINCH)
        if saved_mode is not None:
            termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, saved_mode)
        if forwarder is not None:
            forwarder.cancel()
    result = await handle.wait()
    if note := _stop_note(result):
        print(f"sandboxctl: {note}", file=sys.stderr)
    return result.exit_code if result.exit_code is not None else 1


def _stop_note(result: ExecResult) -> str:
    """One line on why a command ended, when its exit code alone cannot tell (137 could be anything)."""
    ended_by = f" (ended by {result.signal})" if result.signal else ""
    if result.oom_killed:
        return result.message or "the command was killed by the OOM killer"
    if result.stop_reason == "timeout":
        return f"the command timed out{ended_by}"
    if result.stop_reason == "killed":
        return f"the command was killed{ended_by}"
    if result.stop_reason == "failed" and result.message:
        return result.message
    return ""


def _print_processes(processes: Sequence[ProcessInfo]) -> None:
    rows: list[Sequence[str]] = [("PROCESS", "PID", "STATE", "EXIT", "REASON", "COMMAND")]
    for p in processes:
        exit_text = reason = ""
        if p.exited is not None:
            exit_text = str(p.exited.exit_code) + (f" {p.exited.signal}" if p.exited.signal else "")
            reason = "oom" if p.exited.oom_killed else p.exited.stop_reason
        rows.append((p.process_id, str(p.pid), "running" if p.running else "exited", exit_text, reason, p.command))
    _print_table(rows)


def _print_table(rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def _print_workspaces(infos: Sequence[WorkspaceInfo], *, quiet: bool) -> None:
    if quiet:
        for info in infos:
            print(info.workspace_id)
        return
    rows: list[Sequence[str]] = [("WORKSPACE", "STATE", "IMAGE", "MEMORY", "NETWORK", "RUNTIME", "TTL", "CREATED")]
    for info in infos:
        rows.append(
            (
                info.workspace_id,
                info.state,
                info.image,
                f"{info.memory_bytes // 1024**2}MiB",
                info.network,
                info.runtime,
                f"{info.idle_ttl_s:g}s" if info.idle_ttl_s else "-",
                info.create_time.strftime("%Y-%m-%d %H:%M:%S"),
            )
        )
    _print_table(rows)


def _print_snapshots(infos: Sequence[SnapshotInfo], *, quiet: bool) -> None:
    if quiet:
        for info in infos:
            print(info.name)
        return
    rows: list[Sequence[str]] = [("SNAPSHOT", "SOURCE", "IMAGE", "SIZE", "MEMORY", "CREATED")]
    for info in infos:
        rows.append(
            (
                info.name,
                info.source_workspace_id,
                info.image,
                f"{info.size_bytes / 1024**2:.1f}MiB",
                f"{info.memory_bytes / 1024**2:.1f}MiB" if info.include_memory else "-",
                info.create_time.strftime("%Y-%m-%d %H:%M:%S"),
            )
        )
    _print_table(rows)


async def _build_template(client: SandboxClient, opts: argparse.Namespace) -> int:
    """``template build``: DIR as the context (a tar archive streamed as it is read), its Dockerfile."""
    context = Path(opts.context) if opts.context else None
    if context is not None and not context.is_dir():
        print(f"error: {opts.context} is not a directory", file=sys.stderr)
        return 2
    dockerfile = Path(opts.dockerfile) if opts.dockerfile else (context / "Dockerfile" if context else None)
    if dockerfile is None:
        print("error: give a context directory holding a Dockerfile, or --dockerfile", file=sys.stderr)
        return 2
    try:
        text = dockerfile.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        print(f"error: cannot read the Dockerfile {dockerfile}: {exc}", file=sys.stderr)
        return 2

    async def archive() -> AsyncIterator[bytes]:
        if context is None:
            return
        with tempfile.TemporaryFile() as spool:
            await asyncio.to_thread(_tar_directory, context, spool)
            spool.seek(0)
            while piece := await asyncio.to_thread(spool.read, 1 << 20):
                yield piece

    built = await client.build_template(
        opts.name,
        text,
        context=archive(),
        start_command=opts.start,
        ready_command=opts.ready,
        working_dir=opts.workdir,
        labels=_pairs(opts.label, "--label"),
        force=opts.force,
        timeout_s=opts.timeout,
        on_log=None if opts.quiet else (lambda line: print(line, file=sys.stderr, flush=True)),
    )
    if not opts.quiet and built.cached:
        print(f"template {built.template.name} is built from this content already", file=sys.stderr)
    print(built.template.name)
    return 0


def _tar_directory(directory: Path, out: Any) -> None:
    """``directory``'s tree as an uncompressed tar archive into ``out``, links kept as links."""
    with tarfile.open(fileobj=out, mode="w") as tar:
        for entry in sorted(directory.iterdir()):
            tar.add(entry, arcname=entry.name)


def _print_templates(infos: Sequence[SnapshotInfo], *, quiet: bool) -> None:
    if quiet:
        for info in infos:
            print(info.name)
        return
    rows: list[Sequence[str]] = [("TEMPLATE", "SIZE", "START", "CREATED")]
    for info in infos:
        start = info.start_command.replace("\n", " ")
        rows.append(
            (
                info.name,
                f"{info.size_bytes / 1024**2:.1f}MiB",
                (start[:37] + "...") if len(start) > 40 else (start or "-"),
                info.create_time.strftime("%Y-%m-%d %H:%M:%S"),
            )
        )
    _print_table(rows)


def _print_pool(classes: Sequence[PoolClassInfo]) -> None:
    if not classes:
        print("the daemon keeps no warm pool (SANDBOXD_POOL_SIZE=0 and no pool file)")
        return
    rows: list[Sequence[str]] = [
        ("CLASS", "IMAGE", "MEMORY", "CPUS", "NETWORK", "RUNTIME", "READY", "STARTING", "SIZE", "CLAIMS", "MISSES")
    ]
    for info in classes:
        rows.append(
            (
                info.name,
                info.image,
                f"{info.memory_bytes // 1024**2}MiB",
                f"{info.cpu_millis / 1000:g}",
                info.network,
                info.runtime,
                str(info.ready),
                str(info.starting),
                str(info.size),
                str(info.claims),
                str(info.misses),
            )
        )
    _print_table(rows)


def _split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """Split ``... exec [OPTIONS] WS [OPTIONS] -- CMD...`` at the first ``--`` after ``exec``.

    Everything after ``--`` is the command, untouched, so options may come before
    or after the workspace.
    """
    if "exec" in argv and "--" in argv[argv.index("exec") :]:
        cut = argv.index("--", argv.index("exec"))
        return argv[:cut], argv[cut + 1 :]
    return argv, None


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``sandboxctl``; return its exit status."""
    head, command = _split_command(list(sys.argv[1:] if argv is None else argv))
    parser = _parser(command_split=command is not None)
    opts = parser.parse_args(head)
    if opts.command == "cp" and (_remote(opts.source) is None) == (_remote(opts.destination) is None):
        parser.error("cp copies between here and a workspace: exactly one side must be WS:/path")
    if command is not None:
        if opts.argv:
            parser.error(f"unexpected arguments before '--': {' '.join(opts.argv)}")
        opts.argv = command
    try:
        return asyncio.run(_run(opts))
    except SandboxError as exc:
        print(f"sandboxctl: {exc.message}", file=sys.stderr)
        if isinstance(exc, UnavailableError) and exc.workspace_id:
            # A create that got no answer: it may have been made. Repeated with its id it is
            # ALREADY_EXISTS if so, so the way back is to see or remove it.
            print(
                f"sandboxctl: workspace {exc.workspace_id} may exist: `sandboxctl ls` shows it,"
                f" `sandboxctl rm {exc.workspace_id}` removes it",
                file=sys.stderr,
            )
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
