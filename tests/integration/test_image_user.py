"""Any image's own user owns its workspace (issue 27 item 1).

The engine makes a missing ``/workspace`` (the volume's mount point) and a missing working
directory as root, mode 0755, while commands run as the image's USER or the spec's user. The
agent gives the user what was made for it; an image's own directory is left as it is, and a
write that fails there says whose it is.
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator

import pytest
from sandboxd_client import PermissionDeniedError

from .helpers import skip_without
from .test_any_image import busybox_image as busybox_image  # the fixture

pytestmark = pytest.mark.docker

RUNTIMES = ["runc", pytest.param("runsc", marks=pytest.mark.runsc)]

_NO_WORKSPACE = "USER root\nRUN rm -rf /workspace\n"
_RECIPES = {
    # An image with USER 1000 (a passwd entry: the default image's sandbox) and no /workspace.
    "uid1000": _NO_WORKSPACE + "USER 1000\n",
    # A uid the image's passwd does not know.
    "bareuid": _NO_WORKSPACE + "USER 4242\n",
    "nobody": _NO_WORKSPACE + "USER nobody\n",
    # /workspace is the image's, another uid's, with a file in it.
    "foreign": _NO_WORKSPACE
    + "RUN install -d -o 2000 -g 2000 -m 0755 /workspace && echo theirs > /workspace/readme\nUSER 1000\n",
}


@pytest.fixture(scope="session")
def user_images(docker_client, default_image: str, busybox_image: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """The images above, and FROM scratch with busybox and no /workspace, no passwd, USER 1000:1000."""
    recipes = {name: f"FROM {default_image}\n{steps}" for name, steps in _RECIPES.items()}
    recipes["scratch"] = (
        f"FROM {busybox_image} AS busybox\nFROM scratch\nCOPY --from=busybox /bin /bin\n"
        "COPY --from=busybox /tmp /tmp\nENV PATH=/bin\nUSER 1000:1000\n"
    )
    built = {}
    for name, dockerfile in recipes.items():
        tag = f"sandboxd-test/user-{name}:1"
        docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True, forcerm=True)
        built[name] = tag
    return built


@pytest.fixture
async def make(client, request: pytest.FixtureRequest) -> AsyncIterator[object]:  # type: ignore[no-untyped-def]
    """Create workspaces under the test's runtime; delete them afterwards."""
    made = []
    runtime = request.node.callspec.params["runtime"]
    skip_without(runtime, request)

    async def create(image: str, **options: object):  # type: ignore[no-untyped-def]
        ws = await client.create_workspace(image=image, runtime=runtime, labels={"test": "image-user"}, **options)
        made.append(ws)
        return ws

    yield create
    for ws in made:
        await ws.delete()


async def _the_tools_work(ws, uid: str) -> None:  # type: ignore[no-untyped-def]
    """write_file, read_file, edit_file and exec in the workspace, and what they made is ``uid``'s."""
    await ws.write_file("a/b.txt", "x\ny\n")
    page = await ws.read_file("a/b.txt")
    assert page.content.splitlines() == ["     1\tx", "     2\ty"]
    await ws.edit_file("a/b.txt", "y", "z")
    result = await ws.exec(
        "id -u; stat -c '%u %a' /workspace /workspace/a; cat /workspace/a/b.txt; touch /workspace/c && echo made"
    ).wait()
    assert (result.stdout, result.exit_code) == (f"{uid}\n{uid} 755\n{uid} 755\nx\nz\nmade\n", 0), result


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize(
    ("image", "uid"), [("uid1000", "1000"), ("bareuid", "4242"), ("nobody", "65534"), ("scratch", "1000")]
)
async def test_the_images_user_owns_its_workspace(make, user_images, image: str, uid: str, runtime: str) -> None:
    """No /workspace in the image: the one the engine makes is the image user's, whoever that is."""
    ws = await make(user_images[image])
    await _the_tools_work(ws, uid)


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_the_specs_user_and_working_directory(make, user_images, runtime: str) -> None:
    """The spec's user wins over the image's; a missing working directory is made for it, its parents root's."""
    ws = await make(user_images["uid1000"], user="4343:4344", working_dir="/srv/app/src")
    await _the_tools_work(ws, "4343")
    result = await ws.exec("pwd; stat -c '%u:%g %a %n' /srv/app/src /srv/app /srv /workspace").wait()
    assert result.stdout == (
        "/srv/app/src\n4343:4344 755 /srv/app/src\n0:0 755 /srv/app\n0:0 755 /srv\n4343:4344 755 /workspace\n"
    )


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_an_image_s_own_workspace_is_left_and_the_error_says_whose(make, user_images, runtime: str) -> None:
    """/workspace is uid 2000's in the image: it stays so; reading works, a write says whose it is."""
    ws = await make(user_images["foreign"])
    assert (await ws.read_file("readme")).content == "     1\ttheirs"
    with pytest.raises(PermissionDeniedError) as caught:
        await ws.write_file("a/b.txt", "x\n")
    assert str(caught.value.message) == (
        "/workspace/a: Permission denied (/workspace belongs to uid 2000, mode 0755; this runs as uid 1000 (sandbox))"
    )
    result = await ws.exec("stat -c '%u %a' /workspace; ls /workspace").wait()
    assert result.stdout == "2000 755\nreadme\n"


@pytest.mark.parametrize("runtime", ["runc"])
async def test_a_working_directory_spelt_with_two_slashes_is_still_under_dev(make, user_images, runtime: str) -> None:
    """``//dev/x`` is ``/dev/x``: never given away. ``posixpath.normpath`` keeps two leading slashes
    (POSIX leaves them to the implementation), and the agent's ``Never`` check is a string prefix."""
    for spelt in ("/dev/x", "//dev/x"):
        ws = await make(user_images["uid1000"], working_dir=spelt)
        result = await ws.exec("stat -c '%u:%g %a' /dev/x").wait()
        assert (spelt, result.stdout) == (spelt, "0:0 755\n")
