"""A template's Dockerfile as the daemon hands it to the engine: one instruction a line, every image a FROM."""

from __future__ import annotations

import pytest

from sandboxd.errors import InvalidSpecError
from sandboxd.templates import canonical_dockerfile


def test_continuations_and_comments_are_read_as_the_engine_reads_them() -> None:
    """Comment lines go, inside a continuation too; each stage gets the tenant's scope label after FROM."""
    canonical = canonical_dockerfile(
        "FROM base:1 AS build\nRUN echo a \\\n  # a comment\n  b\n\nFROM base:2\nCOPY --from=build /x /y\n"
        "COPY --from=0 /a /b\n",
        "SCOPE",
    )
    assert canonical.text == (
        "FROM base:1 AS build\n"
        'LABEL "sandboxd.build_scope"="SCOPE"\n'
        "RUN echo a   b\n"
        "FROM base:2\n"
        'LABEL "sandboxd.build_scope"="SCOPE"\n'
        "COPY --from=build /x /y\n"
        "COPY --from=0 /a /b\n"
    )
    assert canonical.bases == ("base:1", "base:2")
    # The engine's steps, as the caller's instructions: the daemon's labels are none of theirs.
    assert canonical.steps == (1, 0, 2, 3, 0, 4, 5)


def test_a_comment_inside_a_from_continuation_names_the_image_the_engine_will_use() -> None:
    assert canonical_dockerfile("FROM \\\n# hidden\nreal/image:1\n", "s").bases == ("real/image:1",)


@pytest.mark.parametrize(
    ("dockerfile", "words"),
    [
        ("# escape=`\nFROM a\n", "parser directives"),
        ("# syntax=docker/dockerfile:1\nFROM a\n", "parser directives"),
        ("ARG B=x\nFROM $B\n", "ARG before FROM"),
        ("FROM a\nFROM ${X}\n", "FROM must name an image"),
        ("FROM a\nCOPY --from=other/image:1 /x /y\n", "earlier stage"),
        ("FROM a AS one\nCOPY --from=one /x /y\n", "earlier stage"),  # itself, not an earlier one
        ("FROM a\nADD --from=1 /x /y\n", "earlier stage"),
        ("FROM a\fFROM b\n", "line break"),
        ("FROM a\rRUN x\n", "line break"),
        ("FROM a\nONBUILD COPY --from=x / /\n", "not an instruction"),
        ("RUN true\n", "must start with FROM"),
        ("# only a comment\n", "no FROM"),
    ],
)
def test_what_could_reach_an_image_unchecked_is_refused(dockerfile: str, words: str) -> None:
    with pytest.raises(InvalidSpecError, match=words):
        canonical_dockerfile(dockerfile, "s")


def test_crlf_and_a_directive_like_comment_after_the_first_instruction_are_taken() -> None:
    canonical = canonical_dockerfile("FROM a\r\n# key=value, a comment here\r\nRUN true\r\n", "s")
    assert canonical.text.splitlines()[-1] == "RUN true"
