"""Command line: ``sandboxd serve`` (the default), ``sandboxd images build``, ``sandboxd token create``.

``python -m sandboxd`` is ``sandboxd serve``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
from collections.abc import Sequence

import structlog

from .backend.docker import DockerBackend
from .errors import SandboxdError
from .logging import configure_logging
from .secrets import SecretStore
from .settings import Settings

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sandboxd", description="Sandboxed container execution daemon.")
    commands = parser.add_subparsers(dest="command")
    serve = commands.add_parser("serve", help="run the daemon (default)")
    serve.add_argument("--socket", help="Unix socket path (env SANDBOXD_SOCKET; default: see README)")
    serve.add_argument("--listen", metavar="HOST:PORT", help="also listen on TCP; needs --tls-cert and --tls-key")
    serve.add_argument("--instance", help="label value marking this daemon's containers (env SANDBOXD_INSTANCE)")
    serve.add_argument(
        "--metrics-listen", metavar="HOST:PORT", help="serve Prometheus /metrics there (env SANDBOXD_METRICS_ADDRESS)"
    )
    serve.add_argument(
        "--e2b-listen", metavar="HOST:PORT", help="serve the E2B-compatible API there (env SANDBOXD_E2B_ADDRESS)"
    )
    serve.add_argument("--no-build", action="store_true", help="do not build the default image on start")
    serve.add_argument("--tokens-file", help="bearer tokens and their tenants (env SANDBOXD_TOKENS_FILE)")
    serve.add_argument("--tls-cert", help="PEM server certificate for --listen (env SANDBOXD_TLS_CERT_FILE)")
    serve.add_argument("--tls-key", help="PEM key of --tls-cert (env SANDBOXD_TLS_KEY_FILE)")
    serve.add_argument("--tls-client-ca", help="require client certificates signed by this CA (mutual TLS)")
    serve.add_argument("--audit-log", help="audit trail path, or 'off' (env SANDBOXD_AUDIT_LOG)")
    serve.add_argument("--secrets-file", help="JSON object of secrets for secret:NAME (env SANDBOXD_SECRETS_FILE)")
    token = commands.add_parser("token", help="manage bearer tokens")
    token_commands = token.add_subparsers(dest="token_command", required=True)
    create = token_commands.add_parser("create", help="add a token for a tenant and print it (once)")
    create.add_argument("--tenant", required=True, help="tenant name: lowercase letters, digits, '.', '_', '-'")
    create.add_argument("--tokens-file", help="the tokens file (env SANDBOXD_TOKENS_FILE; default: see README)")
    images = commands.add_parser("images", help="manage workspace images")
    image_commands = images.add_subparsers(dest="images_command", required=True)
    build = image_commands.add_parser("build", help="find or build the default workspace image and the egress proxy's")
    build.add_argument("--route", choices=["auto", "registry", "offline"], help="where the Debian base comes from")
    build.add_argument("--force", action="store_true", help="rebuild even when up to date")
    agent = commands.add_parser("agent", help="manage the in-container agent")
    agent_commands = agent.add_subparsers(dest="agent_command", required=True)
    agent_build = agent_commands.add_parser("build", help="build the agent (in a builder container) if missing")
    agent_build.add_argument("--test", action="store_true", help="run its Go tests again (vet, race detector)")
    agent_build.add_argument(
        "--route", choices=["auto", "registry", "offline"], help="where the Debian base comes from"
    )
    return parser


_progress_lock = threading.Lock()


def _progress(line: str) -> None:
    # Builds that run at once report from their own threads: one whole line at a time.
    with _progress_lock:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


async def _images_build(settings: Settings, opts: argparse.Namespace) -> None:
    from .images import ensure_default_image, ensure_e2b_image, ensure_egress_image

    backend = DockerBackend(docker_host=settings.docker_host, instance=settings.instance)
    try:
        await ensure_default_image(
            backend,
            settings.default_image,
            route=opts.route or settings.image_route,
            progress=_progress,
            force=opts.force,
        )
        await ensure_egress_image(backend, route=opts.route or settings.image_route, progress=_progress)
        await ensure_e2b_image(
            backend, settings.default_image, route=opts.route or settings.image_route, progress=_progress
        )
    finally:
        await backend.close()


async def _agent_build(settings: Settings, opts: argparse.Namespace) -> None:
    from .agentbuild import ensure_agent

    backend = DockerBackend(docker_host=settings.docker_host, instance=settings.instance)
    try:
        route = opts.route or settings.image_route
        build = await ensure_agent(backend, route=route, progress=_progress, test=opts.test)
        _progress(f"agent {build.image} is ready (volume {build.volume})")
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
    await serve(settings, backend, build_image=not opts.no_build, progress=_progress, environ=os.environ)


def _token_create(settings: Settings, opts: argparse.Namespace) -> None:
    from .tenancy import create_token, default_tokens_path

    path = settings.tokens_file or default_tokens_path(os.environ)
    token = create_token(path, opts.tenant)
    print(token)
    print(f"sandboxd: token for tenant {opts.tenant!r} added to {path}; it is shown only once", file=sys.stderr)
    if not settings.tokens_file:
        print(f"sandboxd: start the daemon with --tokens-file {path} to require tokens", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in {"serve", "images", "agent", "token", "-h", "--help"}:
        args = ["serve", *args]  # `sandboxd --socket X` and `python -m sandboxd` mean serve
    opts = _parser().parse_args(args)
    command = opts.command
    logging_ready = False
    try:
        settings = Settings.from_env(
            os.environ,
            socket_path=getattr(opts, "socket", None),
            metrics_address=getattr(opts, "metrics_listen", None),
            e2b_address=getattr(opts, "e2b_listen", None),
            listen_address=getattr(opts, "listen", None),
            instance=getattr(opts, "instance", None),
            tokens_file=getattr(opts, "tokens_file", None),
            tls_cert_file=getattr(opts, "tls_cert", None),
            tls_key_file=getattr(opts, "tls_key", None),
            tls_client_ca_file=getattr(opts, "tls_client_ca", None),
            audit_log=getattr(opts, "audit_log", None),
            secrets_file=getattr(opts, "secrets_file", None),
        )
        if command == "token":
            _token_create(settings, opts)
            return 0
        secret_store = SecretStore(settings.secrets_file, os.environ)
        configure_logging(level=settings.log_level, fmt=settings.log_format, mask=secret_store.mask_text)
        logging_ready = True
        if command == "images":
            asyncio.run(_images_build(settings, opts))
        elif command == "agent":
            asyncio.run(_agent_build(settings, opts))
        else:
            asyncio.run(_serve(settings, opts))
    except SandboxdError as exc:
        if logging_ready:  # one line, in the log's own format
            structlog.get_logger("sandboxd").error("daemon.failed", error=exc.message)
        else:
            print(f"sandboxd: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
