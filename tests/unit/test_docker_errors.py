"""The Docker backend's one table of engine errors, fed canned SDK errors (no engine needed).

The messages are the engine's own words, as Docker 20.10+ answers them (API 1.41).
"""

from __future__ import annotations

import http
import json

import docker.errors
import pytest
import requests

from sandboxd.backend.docker import DockerBackend
from sandboxd.backend.docker.errors import RULES, EngineError, EngineErrorKind, classify, kind_of, translate
from sandboxd.errors import BackendError, DockerUnavailableError, WorkspaceNotFoundError

HOST = "unix:///run/test-docker.sock"
CONTAINER = "5063a1ae65b46342c377e6eeb33e29be77cb66d57bbffa0f758854ef9e54ddd0"


def answer(status: int, message: str) -> docker.errors.APIError:
    """The error docker-py raises for an engine answer of ``status`` saying ``message``."""
    response = requests.Response()
    response.status_code = status
    response.reason = http.HTTPStatus(status).phrase
    response.url = "http+docker://localhost/v1.41/containers/create"
    response._content = json.dumps({"message": message}).encode()
    try:
        response.raise_for_status()
    except requests.exceptions.HTTPError as exc:
        try:
            docker.errors.create_api_error_from_http_exception(exc)
        except docker.errors.APIError as error:
            return error
    raise AssertionError(status)


class TestClassify:
    @pytest.mark.parametrize(
        ("status", "message", "kind"),
        [
            (404, "No such container: sandboxd-x-ws", EngineErrorKind.NOT_FOUND),
            (404, "No such image: nonexistent:1", EngineErrorKind.IMAGE_NOT_FOUND),
            (
                400,
                "no such image: INVALID::ref: invalid reference format: repository name must be lowercase",
                EngineErrorKind.INVALID_REFERENCE,
            ),
            (
                409,
                'Conflict. The container name "/sandboxd-x-ws" is already in use by container "abc". You have to '
                "remove (or rename) that container to be able to reuse that name.",
                EngineErrorKind.NAME_IN_USE,
            ),
            (
                409,
                'Error when allocating new name: Conflict. The container name "/sandboxd-x-ws" is already in use '
                'by container "abc".',
                EngineErrorKind.NAME_IN_USE,
            ),
            (409, f"removal of container {CONTAINER} is already in progress", EngineErrorKind.REMOVAL_IN_PROGRESS),
            (409, f"Container {CONTAINER} is not running", EngineErrorKind.NOT_RUNNING),
            (
                409,
                f"Container {CONTAINER} is paused, unpause the container before exec",
                EngineErrorKind.NOT_RUNNING,
            ),
            (500, "failed to copy file info: no space left on device", EngineErrorKind.NO_SPACE),
            (400, "failed to copy file info: no space left on device", EngineErrorKind.NO_SPACE),
            (
                500,
                "failed to create shim task: OCI runtime create failed: runc create failed: unable to start "
                "container process: error during container init: error running hook #0: fork/exec /proc/28906/exe: "
                "resource temporarily unavailable: unknown",
                EngineErrorKind.OUT_OF_RESOURCES,
            ),
            (500, "OCI runtime start failed: cannot allocate memory: unknown", EngineErrorKind.OUT_OF_RESOURCES),
            (409, f"Container {CONTAINER} is already paused", EngineErrorKind.OTHER),
            (500, f"Container {CONTAINER} is not paused", EngineErrorKind.OTHER),
            (400, "Unknown runtime specified nope", EngineErrorKind.OTHER),
        ],
    )
    def test_the_engines_answers_sort_by_status_and_words(
        self, status: int, message: str, kind: EngineErrorKind
    ) -> None:
        """Each answer the engine gives is the kind the table says."""
        assert classify(answer(status, message)) is kind

    def test_the_sdk_sorts_404s_into_its_own_types(self) -> None:
        """The canned answers are the SDK's own types: a missing image is ImageNotFound, else NotFound."""
        assert type(answer(404, "No such image: x:1")) is docker.errors.ImageNotFound
        assert type(answer(404, "No such volume: v")) is docker.errors.NotFound

    def test_the_words_count_only_under_their_status(self) -> None:
        """The same words under another status are another kind: the status is part of the key."""
        assert classify(answer(500, f"Container {CONTAINER} is not running")) is EngineErrorKind.OTHER
        assert classify(answer(500, "name is already in use")) is EngineErrorKind.OTHER
        assert classify(answer(404, "invalid reference format")) is EngineErrorKind.NOT_FOUND

    def test_a_bare_409_is_a_name_conflict(self) -> None:
        """A 409 without a message is told by its reason, Conflict, as before."""
        error = answer(409, "")
        assert error.explanation == ""
        assert classify(error) is EngineErrorKind.NAME_IN_USE

    def test_an_error_without_a_response_is_known_by_its_type(self) -> None:
        """An SDK error built without a response (no status) is still sorted by its type."""
        assert classify(docker.errors.NotFound("gone")) is EngineErrorKind.NOT_FOUND
        assert classify(docker.errors.ImageNotFound("gone")) is EngineErrorKind.IMAGE_NOT_FOUND
        assert classify(docker.errors.APIError("Conflict. it is already in use")) is EngineErrorKind.OTHER

    def test_not_found_rules_come_first(self) -> None:
        """The two not-found rows head the table, ImageNotFound before its parent NotFound."""
        assert [rule.kind for rule in RULES[:2]] == [EngineErrorKind.IMAGE_NOT_FOUND, EngineErrorKind.NOT_FOUND]


class TestTranslate:
    def test_an_answer_becomes_an_engine_error_with_its_kind(self) -> None:
        """A 409 name conflict is an EngineError, not transient, carrying the engine's words."""
        error = translate(answer(409, 'Conflict. The container name "/x" is already in use'), docker_host=HOST)
        assert isinstance(error, EngineError)
        assert isinstance(error, BackendError)
        assert error.kind is EngineErrorKind.NAME_IN_USE
        assert error.status_code == 409
        assert error.transient is False
        assert error.message == 'Docker engine error: Conflict. The container name "/x" is already in use'

    @pytest.mark.parametrize(
        ("status", "transient"), [(400, False), (404, False), (409, False), (500, True), (503, True)]
    )
    def test_a_5xx_is_transient(self, status: int, transient: bool) -> None:
        """The engine failing (5xx) may pass on a retry; its refusing (4xx) will not."""
        error = translate(answer(status, "something"), docker_host=HOST)
        assert isinstance(error, BackendError)
        assert error.transient is transient

    def test_no_answer_is_unavailable(self) -> None:
        """A refused connection, a timeout and an SDK failure mean the engine cannot be used."""
        refused = translate(requests.exceptions.ConnectionError("Connection refused"), docker_host=HOST)
        assert isinstance(refused, DockerUnavailableError)
        assert refused.message == f"Docker engine unreachable at {HOST}: Connection refused"
        late = translate(requests.exceptions.ReadTimeout("read timed out"), docker_host=HOST)
        assert isinstance(late, DockerUnavailableError)
        assert late.message == f"Docker engine at {HOST} did not answer in time"
        assert isinstance(translate(FileNotFoundError(2, "gone"), docker_host=HOST), DockerUnavailableError)
        assert isinstance(translate(docker.errors.DockerException("bad"), docker_host=HOST), DockerUnavailableError)

    def test_anything_else_is_a_plain_backend_error(self) -> None:
        """Another failure is a BackendError of kind OTHER that no retry repeats."""
        error = translate(RuntimeError("boom"), docker_host=HOST)
        assert type(error) is BackendError
        assert error.message == "Docker call failed: boom"
        assert error.transient is False
        assert kind_of(error) is EngineErrorKind.OTHER

    def test_a_sandboxd_error_is_kept(self) -> None:
        """An error of the daemon's own passes through unchanged."""
        own = WorkspaceNotFoundError("workspace 'x' not found")
        assert translate(own, docker_host=HOST) is own


class TestBackendError:
    def test_transient_is_a_field_false_by_default(self) -> None:
        """BackendError carries transient as a field of its own."""
        assert BackendError("refused").transient is False
        assert BackendError("failed", transient=True).transient is True


class TestCall:
    def _backend(self) -> DockerBackend:
        # A TCP address: no socket probe before the call, and nothing is ever connected.
        return DockerBackend(docker_host="tcp://127.0.0.1:9", instance="test", retries=False)

    async def test_not_found_passes_through_as_the_sdks_own(self) -> None:
        """Callers give not-found their own meaning: _call raises the SDK's NotFound as it is."""
        missing = answer(404, "No such container: x")

        def call() -> None:
            raise missing

        with pytest.raises(docker.errors.NotFound) as raised:
            await self._backend()._call(call)
        assert raised.value is missing

    async def test_an_answer_is_raised_classified(self) -> None:
        """Any other answer leaves _call as an EngineError of its kind, chained to the SDK's."""
        refusal = answer(409, f"Container {CONTAINER} is not running")

        def call() -> None:
            raise refusal

        with pytest.raises(EngineError) as raised:
            await self._backend()._call(call)
        assert raised.value.kind is EngineErrorKind.NOT_RUNNING
        assert raised.value.__cause__ is refusal
