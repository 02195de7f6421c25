"""read_file / edit_file / write_file semantics as pure functions (no Docker)."""

from __future__ import annotations

import io
import time

import pytest

from sandboxd.errors import FailedPreconditionError, InvalidSpecError
from sandboxd.files import (
    apply_edit,
    count_lines,
    edit_diff,
    format_page,
    resolve_path,
    sniff_image,
    unified_diff,
    write_summary,
)


class TestPaths:
    def test_relative_paths_resolve_against_workspace(self) -> None:
        """Relative paths are under /workspace; absolute ones stay as given."""
        assert resolve_path("src/a.py") == "/workspace/src/a.py"
        assert resolve_path("/etc/hostname") == "/etc/hostname"

    @pytest.mark.parametrize("bad", ["", "a\0b"])
    def test_bad_paths(self, bad: str) -> None:
        """Empty paths and NUL characters are refused."""
        with pytest.raises(InvalidSpecError):
            resolve_path(bad)

    @pytest.mark.parametrize(("data", "lines"), [(b"", 0), (b"a", 1), (b"a\n", 1), (b"a\nb", 2), (b"\n\n", 2)])
    def test_count_lines(self, data: bytes, lines: int) -> None:
        """A last line without a newline still counts."""
        assert count_lines(data) == lines


class TestFormatPage:
    def test_cat_n(self) -> None:
        """Right-aligned 6-wide numbers, a tab, the text; no trailer at the end of the file."""
        page = format_page([(5, b"hello"), (0, b"")], first_line=1, total_lines=2)
        assert page.content == "     1\thello\n     2\t"
        assert page.next_offset == 0

    def test_trailer_names_next_offset(self) -> None:
        """When lines remain, the trailer says how many and where to continue."""
        page = format_page([(1, b"x")], first_line=7, total_lines=10)
        assert page.content == "     7\tx\n[3 more lines; continue with offset=8.]"
        assert page.next_offset == 8


class TestApplyEdit:
    def test_exact_once(self) -> None:
        """One occurrence is replaced; the rest of the bytes stay."""
        outcome = apply_edit(b"a\nb\nc", "c", "C", replace_all=False, path="/w/t")
        assert outcome.data == b"a\nb\nC"
        assert outcome.message.startswith("Replaced 1 occurrence(s) in /w/t\n--- a/w/t")

    def test_crlf_only_when_consistent(self) -> None:
        """A file mixing LF and CRLF is matched exactly (LF does not stand for CRLF there)."""
        with pytest.raises(InvalidSpecError, match="not found"):
            apply_edit(b"a\r\nb\nc\r\n", "a\nb", "x", replace_all=False, path="p")

    def test_crlf_with_crlf_old_string(self) -> None:
        """An old_string already in CRLF also matches a CRLF file."""
        assert (
            apply_edit(b"x=1\r\ny=2\r\n", "x=1\r\n", "x=3\r\n", replace_all=False, path="p").data == b"x=3\r\ny=2\r\n"
        )

    def test_binary_refused(self) -> None:
        """A file with NUL bytes is not edited."""
        with pytest.raises(FailedPreconditionError, match="binary"):
            apply_edit(b"a\0b", "a", "c", replace_all=False, path="p")

    def test_many_occurrences_listed(self) -> None:
        """The error lists at most 20 line numbers and counts the rest."""
        with pytest.raises(InvalidSpecError, match=r"occurs 25 times .*lines 1, 2, .*, 20 and 5 more"):
            apply_edit(b"x\n" * 25, "x", "y", replace_all=False, path="p")

    def test_large_edit_is_fast(self) -> None:
        """10000 sites among 80000 repetitive lines: diffed from the sites in well under a second."""
        text = "".join(f"hit {i}: OLD\n" + "-\n" * 7 for i in range(10000)).encode()
        start = time.monotonic()
        outcome = apply_edit(text, "OLD", "NEW", replace_all=True, path="p")
        assert time.monotonic() - start < 5
        assert outcome.replacements == 10000
        assert outcome.diff.splitlines()[-1] == "…and 9995 more replacements"


class TestEditDiff:
    def _check(self, old_text: str, old: str, new: str) -> list[str]:
        positions = []
        start = old_text.find(old)
        while start >= 0:
            positions.append(start)
            start = old_text.find(old, start + len(old))
        diff = edit_diff(old_text, positions, old, new, "f").splitlines()
        # The diff must agree with difflib's on what changed (same - and + lines).
        reference = unified_diff(old_text, old_text.replace(old, new), "f").splitlines()
        assert [line for line in diff if line[:1] in "+-\\"] == [line for line in reference if line[:1] in "+-\\"]
        return diff

    def test_adjacent_sites_share_a_hunk(self) -> None:
        """Sites within 6 lines share a hunk; far ones get their own."""
        text = "".join(f"{'X' if i in (2, 5, 30) else '.'}{i}\n" for i in range(40))
        diff = self._check(text, "X", "Y")
        assert sum(line.startswith("@@") for line in diff) == 2
        assert "@@ -1,9 +1,9 @@" in diff
        assert "@@ -28,7 +28,7 @@" in diff

    def test_two_sites_on_one_line(self) -> None:
        """Two occurrences on one line are one changed line."""
        diff = self._check("a a\nb\n", "a", "z")
        assert diff[2:] == ["@@ -1,2 +1,2 @@", "-a a", "+z z", " b"]

    def test_removed_newline_joins_lines(self) -> None:
        """Replacing 'b\\n' with 'B' in the middle joins B with the next line."""
        diff = self._check("a\nb\nc\n", "b\n", "B")
        assert diff[2:] == ["@@ -1,3 +1,2 @@", " a", "-b", "-c", "+Bc"]

    def test_inserted_lines_shift_later_hunks(self) -> None:
        """A site that adds lines moves the new-side start of every later hunk."""
        text = "".join(f"{'X' if i in (1, 20) else '.'}\n" for i in range(30))
        diff = self._check(text, "X", "Y\nY")
        assert "@@ -18,7 +19,8 @@" in diff

    def test_no_newline_at_end(self) -> None:
        """The last line without a newline carries the marker on both sides."""
        diff = self._check("a\nb\nc", "c", "C")
        assert diff[-4:] == ["-c", "\\ No newline at end of file", "+C", "\\ No newline at end of file"]


class TestWriteSummary:
    def test_created(self) -> None:
        """A new file reports lines and bytes."""
        assert write_summary("/w/x", b"a\nb", None, old_size=-1, created=True) == (
            "Created /w/x (2 lines, 3 bytes)",
            "",
        )

    def test_small_overwrite_has_a_diff(self) -> None:
        """A small change shows the diff."""
        message, diff = write_summary("/w/x", b"a\nB\n", b"a\nb\n", old_size=4, created=False)
        assert message.splitlines()[0] == "Overwrote /w/x (2 lines, 4 bytes; was 2 lines, 4 bytes)"
        assert diff.splitlines()[2:] == ["@@ -1,2 +1,2 @@", " a", "-b", "+B"]

    def test_unchanged(self) -> None:
        """Writing the same bytes says so."""
        assert write_summary("/w/x", b"a\n", b"a\n", old_size=2, created=False)[0].endswith("The content is unchanged.")

    def test_big_old_content_not_fetched(self) -> None:
        """When the old content was too big to fetch, only sizes are reported."""
        assert write_summary("/w/x", b"a\n", None, old_size=9_000_000, created=False) == (
            "Overwrote /w/x (1 lines, 2 bytes; was 9000000 bytes)",
            "",
        )


class TestSniffImage:
    def test_png(self) -> None:
        """A PNG is recognised by content with its size."""
        from PIL import Image

        buffer = io.BytesIO()
        Image.new("RGB", (4, 9)).save(buffer, "PNG")
        image = sniff_image(buffer.getvalue(), "x.bin")
        assert (image.mime_type, image.width, image.height) == ("image/png", 4, 9)

    def test_other_formats_refused(self) -> None:
        """A BMP is an image, but not one of the four formats."""
        from PIL import Image

        buffer = io.BytesIO()
        Image.new("RGB", (4, 9)).save(buffer, "BMP")
        with pytest.raises(FailedPreconditionError, match="only png, jpeg, gif and webp"):
            sniff_image(buffer.getvalue(), "x.bmp")


def test_split_lines_only_on_newline() -> None:
    """Form feeds, separators, NEL, U+2028 and lone CRs stay inside their line."""
    from sandboxd.files import split_lines

    assert split_lines("a\x0cb\x1cc\x85d\u2028e\rf\ng\n") == ["a\x0cb\x1cc\x85d\u2028e\rf\n", "g\n"]
    assert split_lines("x\ny") == ["x\n", "y"]
    assert split_lines("") == []
