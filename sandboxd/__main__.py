"""Command line: ``sandboxd serve`` (the default) and ``sandboxd images build``.

``python -m sandboxd`` is ``sandboxd serve``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

import structlog

from .backend.docker import DockerBackend
from .errors import SandboxdError
from .logging import configure_logging
from .settings import Settings

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sandboxd", description="Sandboxed container execution daemon.")
    commands = parser.add_subparsers(dest="command")
    serve = commands.add_parser("serve", help="run the daemon (default)")
    serve.add_argument("--socket", help="Unix socket path (env SANDBOXD_SOCKET; default: see README)")
    serve.add_argument("--listen", metavar="HOST:PORT", help="also listen on TCP (no authentication yet)")
    serve.add_argument("--instance", help="label value marking this daemon's containers (env SANDBOXD_INSTANCE)")
    serve.add_argument("--no-build", action="store_true", help="do not build the default image on start")
    images = commands.add_parser("images", help="manage workspace images")
    image_commands = images.add_subparsers(dest="images_command", required=True)
    build = image_commands.add_parser("build", help="find or build the default workspace image")
    build.add_argument("--route", choices=["auto", "registry", "offline"], help="where the Debian base comes from")
    build.add_argument("--force", action="store_true", help="rebuild even when up to date")
    return parser


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


async def _images_build(settings: Settings, opts: argparse.Namespace) -> None:
    from .images import ensure_default_image

    backend = DockerBackend(docker_host=settings.docker_host, instance=settings.instance)
    try:
        await ensure_default_image(
            backend,
            settings.default_image,
            route=opts.route or settings.image_route,
            progress=_progress,
            force=opts.force,
        )
    finally:
        await backend.close()


async def _serve(settings: Settings, opts: argparse.Namespace) -> None:
    from .api.server import serve

    backend = DockerBackend(
        docker_host=settings.docker_host,
        instance=settings.instance,
        timeout_s=settings.docker_timeout_s,
        retries=settings.docker_retries,
    )
    await serve(settings, backend, build_image=not opts.no_build, progress=_progress)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in {"serve", "images", "-h", "--help"}:
        args = ["serve", *args]  # `sandboxd --socket X` and `python -m sandboxd` mean serve
    opts = _parser().parse_args(args)
    command = opts.command
    try:
        settings = Settings.from_env(
            os.environ,
            socket_path=getattr(opts, "socket", None),
            listen_address=getattr(opts, "listen", None),
            instance=getattr(opts, "instance", None),
        )
        configure_logging(level=settings.log_level, fmt=settings.log_format)
        if command == "images":
            asyncio.run(_images_build(settings, opts))
        else:
            asyncio.run(_serve(settings, opts))
    except SandboxdError as exc:
        structlog.get_logger("sandboxd").error("daemon.failed", error=exc.message)
        print(f"sandboxd: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
