"""Template builds under abuse: other tenants' images, the build cache, the plane's keys, uploads and memory.

Each test is an attack on the build paths: a Dockerfile reaching another tenant's template
(``COPY --from`` its image, a parser directive rewriting the daemon's labels), a step reading
another tenant's layer through the shared build cache, the E2B routes without a key, a small
gzip upload whose tar header asks for hundreds of MiB, a build log or a ready command printing
without end, a failed build leaving its layers behind, and the same build started twice.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import resource
import tarfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox, Template
from sandboxd_client import FailedPreconditionError, InvalidArgumentError, SandboxClient

from sandboxd.tenancy import create_token
from tests.conftest import DaemonThread, make_settings

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]


class Tenants:
    """A daemon that takes tokens (two tenants), its E2B plane on, uploads limited to 1 MiB."""

    def __init__(self, tmp_path: Path) -> None:
        tokens = tmp_path / "tokens.json"
        self.key_a = create_token(tokens, "team-a")
        self.key_b = create_token(tokens, "team-b")
        settings = make_settings(
            tmp_path,
            tokens_file=str(tokens),
            e2b_address="127.0.0.1:0",
            template_context_bytes=1 << 20,
            template_ready_timeout_s=5.0,
        )
        self.thread = DaemonThread(settings).start()
        self.url = f"http://{self.thread.daemon.e2b.address}"

    def client(self, key: str) -> SandboxClient:
        return SandboxClient(socket_path=self.thread.socket_path, token=key, retries=False)


@pytest.fixture
def tenants(tmp_path: Path, e2b_image: str) -> Iterator[Tenants]:
    made = Tenants(tmp_path)
    try:
        yield made
    finally:
        made.thread.stop()


async def test_a_build_cannot_read_another_tenants_template(
    tenants: Tenants, default_image: str, docker_client
) -> None:  # type: ignore[no-untyped-def]
    """B names A's template image (its reference is a digest anyone may compute): in FROM, in COPY --from,
    through a build argument, behind a comment inside a continuation: each is refused, and nothing is built."""
    async with tenants.client(tenants.key_a) as a, tenants.client(tenants.key_b) as b:
        await a.build_template("secret", f"FROM {default_image}\nUSER root\nRUN echo a-private > /a-private\n")
        (a_image,) = docker_client.images.list(
            filters={"label": ["sandboxd.tenant=team-a", "sandboxd.snapshot=secret"]}
        )[0].tags
        assert a_image.startswith("sandboxd/snapshot:")
        attempts = {
            "from": (f"FROM {a_image}\n", InvalidArgumentError),
            "copy-from": (f"FROM {default_image}\nCOPY --from={a_image} /a-private /x\n", InvalidArgumentError),
            "arg": (f"ARG B={a_image}\nFROM $B\n", InvalidArgumentError),
            "comment": (f"FROM \\\n# a comment inside the continuation\n{a_image}\n", InvalidArgumentError),
            "form-feed": (f"FROM {default_image}\fFROM {a_image}\n", InvalidArgumentError),
        }
        for name, (dockerfile, error) in attempts.items():
            with pytest.raises(error):
                await b.build_template(f"steal-{name}", dockerfile)
        # The one that parses (the comment is dropped, as the engine drops it) is refused as a snapshot.
        assert await b.list_snapshots() == []


async def test_a_parser_directive_cannot_rewrite_the_daemons_labels(tenants: Tenants, default_image: str) -> None:
    """``# escape=`` would make the daemon's LABEL line split on a start command's spaces: refused;
    a start command full of quotes, spaces and label syntax is kept as it was, as B's."""
    async with tenants.client(tenants.key_a) as a, tenants.client(tenants.key_b) as b:
        with pytest.raises(InvalidArgumentError, match="parser directives"):
            await b.build_template(
                "planted", f"# escape=`\nFROM {default_image}\n", start_command=" sandboxd.tenant=team-a z="
            )
        start = '" sandboxd.tenant=team-a "x\\" $HOME z='
        built = await b.build_template("quoted", f"FROM {default_image}\n", start_command=start)
        assert built.template.start_command == start
        assert [s.name for s in await b.list_snapshots()] == ["quoted"]
        assert await a.list_snapshots() == []


async def test_the_build_cache_is_not_shared_between_tenants(tenants: Tenants, default_image: str) -> None:
    """A's step writes a random nonce; B's identical step runs again (no cache from A) and sees its own.
    A build step has one CPU at most."""
    step = "RUN head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \\n' > /tmp/nonce; echo nonce=$(cat /tmp/nonce)\n"
    quota = "RUN echo quota=$(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null || cat /sys/fs/cgroup/cpu.max)\n"
    seen_a: list[str] = []
    seen_b: list[str] = []
    async with tenants.client(tenants.key_a) as a, tenants.client(tenants.key_b) as b:
        await a.build_template("nonce", f"FROM {default_image}\nUSER root\n{step}{quota}", on_log=seen_a.append)
        await b.build_template("nonce", f"FROM {default_image}\nUSER root\n{step}{quota}", on_log=seen_b.append)
    nonce_a = [line for line in seen_a if line.startswith("nonce=")]
    nonce_b = [line for line in seen_b if line.startswith("nonce=")]
    assert len(nonce_a) == len(nonce_b) == 1 and nonce_a != nonce_b
    assert " ---> Using cache" not in seen_b
    assert next(line for line in seen_a if line.startswith("quota=")) in ("quota=100000", "quota=100000 100000")


async def test_a_failed_build_leaves_no_layers(tenants: Tenants, default_image: str, docker_client) -> None:  # type: ignore[no-untyped-def]
    """Two steps made, the third fails: the images of the two are removed with the build."""
    marker = hashlib.sha256(str(id(tenants)).encode()).hexdigest()[:12]
    dockerfile = f"FROM {default_image}\nRUN echo {marker}-one\nRUN echo {marker}-two\nRUN exit 3\n"
    async with tenants.client(tenants.key_a) as a:
        with pytest.raises(FailedPreconditionError, match="step 4 failed"):
            await a.build_template("leaky", dockerfile)
    left = [
        image.id
        for image in docker_client.images.list(all=True)
        if marker in " ".join((image.attrs.get("ContainerConfig") or image.attrs.get("Config") or {}).get("Cmd") or [])
    ]
    assert left == []


async def test_the_plane_takes_no_template_call_without_a_valid_key(tenants: Tenants) -> None:
    """POST /v3/templates and the file links are 401 without a key the daemon takes; a good key is served."""
    files_hash = hashlib.sha256(b"f").hexdigest()
    async with httpx.AsyncClient(base_url=tenants.url, timeout=30) as http:
        for headers in ({}, {"X-API-Key": "not-a-key"}):
            assert (await http.post("/v3/templates", json={"name": "x"}, headers=headers)).status_code == 401
            assert (await http.get(f"/templates/x/files/{files_hash}", headers=headers)).status_code == 401
        good = {"X-API-Key": tenants.key_a}
        assert (await http.post("/v3/templates", json={"name": "x"}, headers=good)).status_code == 202
        assert (await http.get(f"/templates/x/files/{files_hash}", headers=good)).status_code == 201


async def test_a_keys_records_and_uploads_are_bounded(tenants: Tenants) -> None:
    """150 build requests never started by A: A keeps at most 100 records, and B is served; oversized tags
    are refused; five uploads of 1000 KiB each keep at most the 1 MiB limit on the daemon's disk."""
    plane = tenants.thread.daemon.e2b.templates
    async with httpx.AsyncClient(base_url=tenants.url, timeout=30) as http:
        key_a, key_b = {"X-API-Key": tenants.key_a}, {"X-API-Key": tenants.key_b}
        for _ in range(150):
            assert (await http.post("/v3/templates", json={"name": "junk"}, headers=key_a)).status_code == 202
        assert len(plane._builds) == 100
        assert (await http.post("/v3/templates", json={"name": "mine"}, headers=key_b)).status_code == 202
        big = await http.post("/v3/templates", json={"name": "x", "tags": ["t" * (100 << 10)]}, headers=key_a)
        assert big.status_code == 413
        for i in range(5):
            link = await http.get(f"/templates/x/files/{hashlib.sha256(str(i).encode()).hexdigest()}", headers=key_a)
            out = io.BytesIO()
            with tarfile.open(fileobj=out, mode="w") as tar:
                info = tarfile.TarInfo("f")
                info.size = 1000 * 1024
                tar.addfile(info, io.BytesIO(b"\0" * info.size))
            assert (await http.put(link.json()["url"], content=out.getvalue())).status_code == 200
    kept = sum(path.stat().st_size for path in plane._dir.iterdir())
    assert 0 < kept <= 1 << 20


async def test_a_small_gzip_upload_cannot_make_the_daemon_hold_hundreds_of_mib(
    tenants: Tenants, tmp_path: Path
) -> None:
    """A 400 KiB gzip whose GNU long-name header says 400 MiB: refused (400), the daemon's peak grows < 64 MiB."""
    bomb = tmp_path / "bomb.tar.gz"
    size = 400 << 20
    with gzip.open(bomb, "wb", compresslevel=9) as out:
        info = tarfile.TarInfo("././@LongLink")
        info.size, info.type = size, tarfile.GNUTYPE_LONGNAME
        out.write(info.tobuf(format=tarfile.USTAR_FORMAT))
        chunk = b"a" * (1 << 20)
        for _ in range(size >> 20):
            out.write(chunk)
        out.write(tarfile.TarInfo("f").tobuf(format=tarfile.GNU_FORMAT) + b"\0" * 1024)
    body = bomb.read_bytes()
    assert len(body) < 1 << 20
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    async with httpx.AsyncClient(base_url=tenants.url, timeout=120) as http:
        key = {"X-API-Key": tenants.key_a}
        link = await http.get(f"/templates/x/files/{hashlib.sha256(b'bomb').hexdigest()}", headers=key)
        answer = await http.put(link.json()["url"], content=body)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    assert answer.status_code == 400
    assert grown < 64 << 20


async def test_a_ready_commands_output_is_not_held(tenants: Tenants, default_image: str) -> None:
    """A ready command printing without end, then failing: the create fails in its bound with the output's
    end, and the daemon's peak memory grows by less than 64 MiB."""
    async with tenants.client(tenants.key_a) as a:
        await a.build_template("noisy", f"FROM {default_image}\n", ready_command="yes | head -c 300000000; exit 1")
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        with pytest.raises(FailedPreconditionError, match="did not succeed"):
            await a.create_workspace(from_snapshot="noisy")
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
        assert grown < 64 << 20
        assert await a.list_workspaces() == []


def test_e2b_builds_keep_a_bounded_log_copy_dotfiles_and_start_once(
    tenants: Tenants, default_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step printing 30,000 lines: the build is ready and its record keeps the last 10,000; ``copy('.env')``
    copies the dotfile; the same build id started twice at once is started once (409)."""
    monkeypatch.setenv("E2B_API_URL", tenants.url)
    monkeypatch.setenv("E2B_SANDBOX_URL", tenants.url)
    monkeypatch.setenv("E2B_API_KEY", tenants.key_a)
    (tmp_path / ".env").write_text("FROM_DOTFILE=1\n")
    template = (
        Template(file_context_path=str(tmp_path))
        .from_image(default_image)
        .copy(".env", "/home/user/.env")
        .run_cmd("seq 1 30000")
    )
    info = Template.build(template, "chatty")
    plane = tenants.thread.daemon.e2b.templates
    record = plane._builds[info.build_id]
    assert record.status == "ready" and len(record.entries) == 10_000 and record.skipped > 0
    sandbox = Sandbox.create(template="chatty")
    try:
        assert sandbox.commands.run("cat /home/user/.env").stdout == "FROM_DOTFILE=1\n"
    finally:
        sandbox.kill()

    async def twice() -> list[int]:
        key = {"X-API-Key": tenants.key_a}
        async with httpx.AsyncClient(base_url=tenants.url, timeout=60) as http:
            asked = (await http.post("/v3/templates", json={"name": "twice"}, headers=key)).json()
            path = f"/v2/templates/twice/builds/{asked['buildID']}"
            body = {"fromImage": default_image, "steps": [], "force": False}
            answers = await asyncio.gather(*(http.post(path, json=body, headers=key) for _ in range(2)))
            status = f"/templates/twice/builds/{asked['buildID']}/status"
            while (await http.get(status, headers=key)).json()["status"] == "building":
                await asyncio.sleep(0.2)  # the one build ends before its daemon does
        return sorted(a.status_code for a in answers)

    assert asyncio.run(twice()) == [202, 409]
