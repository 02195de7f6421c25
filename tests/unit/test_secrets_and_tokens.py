"""Secret masking across chunk boundaries, secret references, and bearer-token lookup (no engine needed)."""

from __future__ import annotations

import contextvars
import json
from pathlib import Path

import pytest

from sandboxd.audit import AuditLog, audit_fields, set_audit_tenant, start_audit
from sandboxd.errors import InvalidSpecError, UnauthenticatedError
from sandboxd.secrets import BytesRedactor, SecretStore
from sandboxd.tenancy import (
    DEFAULT_TENANT,
    Authenticator,
    create_token,
    current_tenant,
    reset_tenant,
    tenant_scope,
)

VALUES = {"demo": "s3cr3t-demo-value", "short": "abcd", "nested": "demo-value"}


def _run(redactor: BytesRedactor, chunks: list[bytes]) -> bytes:
    return b"".join(redactor.feed(chunk) for chunk in chunks) + redactor.flush()


@pytest.mark.parametrize("cut", range(1, 40))
def test_every_split_point_is_masked(cut: int) -> None:
    text = b"x=s3cr3t-demo-value; y=abcd; z=abc" + b"!" * 5
    expected = b"x=[REDACTED:demo]; y=[REDACTED:short]; z=abc!!!!!"
    assert _run(BytesRedactor(VALUES), [text[:cut], text[cut:]]) == expected


@pytest.mark.parametrize("cut", range(1, 38))
def test_a_secret_inside_a_longer_one_never_unmasks_the_longer_one(cut: int) -> None:
    """The password inside the URL ends before the URL does: at no split may the URL's rest go out."""
    values = {"DB_PW": "hunter2pw", "DB_URL": "postgres://app:hunter2pw@db:5432/x"}
    text = b"url=postgres://app:hunter2pw@db:5432/x; pw=hunter2pw."
    expected = b"url=[REDACTED:DB_URL]; pw=[REDACTED:DB_PW]."
    assert _run(BytesRedactor(values), [text[:cut], text[cut:]]) == expected
    assert _run(BytesRedactor(values), [bytes([b]) for b in text]) == expected


def test_byte_at_a_time_and_longest_match_first() -> None:
    text = b"s3cr3t-demo-value demo-value"
    assert _run(BytesRedactor(VALUES), [bytes([b]) for b in text]) == b"[REDACTED:demo] [REDACTED:nested]"


def test_only_a_possible_secret_prefix_is_held_back() -> None:
    redactor = BytesRedactor(VALUES)
    assert redactor.feed(b"Password: ") == b"Password: "  # a prompt is never delayed
    assert redactor.feed(b"ok s3cr") == b"ok "  # "s3cr" may begin the secret
    assert redactor.feed(b"ew") == b"s3crew"  # it did not
    assert redactor.flush() == b""


def test_mask_text_never_regrows_and_no_secrets_is_identity() -> None:
    assert BytesRedactor({}).feed(b"anything") == b"anything"
    store = SecretStore("", {"SANDBOXD_SECRET_x": "REDACTED"})
    assert store.mask_text("a REDACTED b") == "a [REDACTED:x] b"


def test_references_resolve_only_for_the_command(tmp_path: Path) -> None:
    path = tmp_path / "secrets.json"
    path.write_text(json.dumps({"demo": "value-from-file"}))
    store = SecretStore(str(path), {"SANDBOXD_SECRET_env_one": "value-from-env", "OTHER": "x"})
    env = {"A": "secret:demo", "B": "secret:env_one", "C": "plain", "D": "secret:"}
    with pytest.raises(InvalidSpecError, match="env D: unknown secret ''"):
        store.check(env, "env", DEFAULT_TENANT)
    del env["D"]
    store.check(env, "env", DEFAULT_TENANT)
    assert store.resolve(env, DEFAULT_TENANT) == {"A": "value-from-file", "B": "value-from-env", "C": "plain"}
    assert set(store.values) == {"demo", "env_one"}


def test_a_secret_kept_to_some_tenants(tmp_path: Path) -> None:
    """Another tenant gets "unknown secret", exactly as for a name that does not exist; all mask it."""
    path = tmp_path / "secrets.json"
    path.write_text(json.dumps({"db": {"value": "team-a-db-pw", "tenants": ["team-a"]}, "shared": "for-everyone"}))
    store = SecretStore(str(path), {})
    env = {"PW": "secret:db", "S": "secret:shared"}
    store.check(env, "env", "team-a")
    assert store.resolve(env, "team-a") == {"PW": "team-a-db-pw", "S": "for-everyone"}
    with pytest.raises(InvalidSpecError, match=r"^env PW: unknown secret 'db' \(set it"):
        store.check(env, "env", "team-b")
    assert store.resolve(env, "team-b") == {"PW": "secret:db", "S": "for-everyone"}
    assert store.mask_text("team-a-db-pw") == "[REDACTED:db]"
    path.write_text(json.dumps({"db": {"value": "team-a-db-pw", "tenants": []}}))
    with pytest.raises(InvalidSpecError, match='needs a string "value" and a non-empty list of tenant names'):
        SecretStore(str(path), {})


def test_tokens_are_hashed_and_map_to_tenants(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    a, b = create_token(tokens, "team-a"), create_token(tokens, "team-b")
    assert a != b and a not in tokens.read_text()
    auth = Authenticator(str(tokens))
    auth.load()
    assert auth.tenant([("authorization", f"Bearer {a}")]) == "team-a"
    assert auth.tenant({"authorization": f"bearer {b}"}) == "team-b"
    for metadata in ([], [("authorization", "Basic xyz")], [("authorization", "Bearer sbd_nope")]):
        with pytest.raises(UnauthenticatedError):
            auth.tenant(metadata)
    assert Authenticator("").tenant([]) == DEFAULT_TENANT
    # A token added while the daemon runs works at once (the file is re-read on change).
    c = create_token(tokens, "team-c")
    assert auth.tenant([("authorization", f"Bearer {c}")]) == "team-c"


def test_broken_tokens_file_fails_start_and_hides_its_path_from_callers(tmp_path: Path) -> None:
    broken = tmp_path / "tokens.json"
    broken.write_text("{not json")
    with pytest.raises(InvalidSpecError, match="is not valid"):
        Authenticator(str(broken)).load()
    with pytest.raises(UnauthenticatedError) as caught:
        Authenticator(str(broken)).tenant([("authorization", "Bearer sbd_x")])
    assert str(tmp_path) not in caught.value.message


def test_audit_lines_are_masked_before_encoding(tmp_path: Path) -> None:
    secret = 'he said "hi"\\ok'
    store = SecretStore("", {"SANDBOXD_SECRET_q": secret})
    log = AuditLog(str(tmp_path / "audit.jsonl"), mask=store.mask_text)
    start_audit("/sandboxd.v1.ProcessService/Exec", "unix:")
    set_audit_tenant("team-a")
    audit_fields(command=f"echo '{secret}'", workspace_id="ws-1", ignored=None)
    log.finish(code="OK", duration_s=0.5)
    start_audit("/sandboxd.v1.WorkspaceService/ListWorkspaces", "unix:")
    log.finish(code="OK", duration_s=0.1)  # reads are not audited
    log.close()
    lines = (tmp_path / "audit.jsonl").read_text().splitlines()
    assert len(lines) == 1
    entry = json.loads(lines[0])
    assert entry["command"] == "echo '[REDACTED:q]'"
    assert (entry["rpc"], entry["tenant"], entry["workspace_id"], entry["code"]) == ("Exec", "team-a", "ws-1", "OK")
    assert "ignored" not in entry
    assert (tmp_path / "audit.jsonl").stat().st_mode & 0o777 == 0o600


def test_audit_follows_rotation_and_deletion(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(str(path))
    log.event("one")
    path.rename(tmp_path / "audit.jsonl.1")  # logrotate's default: move, then expect a new file
    log.event("two")
    path.unlink()
    log.event("three")
    log.close()
    assert [json.loads(line)["event"] for line in (tmp_path / "audit.jsonl.1").read_text().splitlines()] == ["one"]
    assert [json.loads(line)["event"] for line in path.read_text().splitlines()] == ["three"]
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_torn_audit_line_does_not_swallow_the_next(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write cut short (disk full) leaves half a line; the next entry still starts a line of its own."""
    import errno
    import os

    import sandboxd.audit

    path = tmp_path / "audit.jsonl"
    log = AuditLog(str(path))
    real_write = os.write
    calls = []

    def half_then_full_disk(fd: int, data: bytes) -> int:
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data)[:10])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(sandboxd.audit.os, "write", half_then_full_disk)
    log.event("lost")  # 10 bytes, then the disk is full: logged, never raised
    monkeypatch.setattr(sandboxd.audit.os, "write", real_write)
    log.event("kept")
    log.close()
    lines = path.read_text().splitlines()
    assert len(lines) == 2
    assert json.loads(lines[1])["event"] == "kept"
    assert calls == [calls[0], calls[0] - 10]  # the rest of the line was retried, not dropped at once


def test_unwritable_audit_log_refuses_to_start(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(InvalidSpecError, match=r"cannot open the audit log .*SANDBOXD_AUDIT_LOG"):
        AuditLog(str(blocker / "audit.jsonl"))
    assert not AuditLog("off").enabled


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_logs_mask_nested_fields_and_exception_text(fmt: str) -> None:
    """A secret inside a nested field or an exception's message never reaches a log line."""
    import io
    import logging

    import structlog

    from sandboxd.logging import configure_logging

    store = SecretStore("", {"SANDBOXD_SECRET_DB": "pw-9f8e7d"})
    out = io.StringIO()
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        configure_logging(fmt=fmt, stream=out, cache=False, mask=store.mask_text)
        log = structlog.get_logger("test.masking")
        log.info("nested", detail={"url": "db://u:pw-9f8e7d@h", "more": ["x pw-9f8e7d"]})
        try:
            _fail("connect failed for pw-9f8e7d")
        except RuntimeError:
            log.exception("boom")
    finally:
        root.handlers[:], root.level = saved
        structlog.reset_defaults()
    text = out.getvalue()
    assert "pw-9f8e7d" not in text
    assert text.count("[REDACTED:DB]") >= 3


def _fail(message: str) -> None:
    raise RuntimeError(message)


@pytest.mark.parametrize("cut", range(1, 18))
def test_overlapping_secrets_are_masked_as_one_region(cut: int) -> None:
    """`abcd` overlaps the start of `bcdefghijklmnop`: neither may show any part of the other."""
    values = {"SHORTA": "abcd", "LONGB": "bcdefghijklmnop"}
    text = b"abcdefghijklmnop."
    assert _run(BytesRedactor(values), [text[:cut], text[cut:]]) == b"[REDACTED:LONGB]."
    store = SecretStore("", {f"SANDBOXD_SECRET_{k}": v for k, v in values.items()})
    assert store.mask_text(text.decode()) == "[REDACTED:LONGB]."


def test_a_chain_of_overlapping_secrets_is_not_held_back_forever() -> None:
    """`abab…` matches `abab` and `baba` everywhere, and always ends in a possible secret start."""
    redactor = BytesRedactor({"A": "abab", "B": "baba"})
    shown = b""
    for _ in range(100):
        shown += redactor.feed(b"ab" * 50)
        assert len(redactor._pending) <= 2 * 4  # bounded by twice the longest secret, not by the output
    shown += redactor.flush()
    assert b"ab" not in shown.replace(b"[REDACTED:A]", b"").replace(b"[REDACTED:B]", b"")


def test_a_tenant_is_masked_only_for_the_secrets_it_may_use(tmp_path: Path) -> None:
    """Neither a mask nor a held-back tail may tell team-b anything about team-a's secret."""
    path = tmp_path / "secrets.json"
    path.write_text(json.dumps({"A_KEY": {"value": "sk-live-Qx7pZ93", "tenants": ["team-a"]}, "ALL": "shared-1234"}))
    store = SecretStore(str(path), {})
    for_b, for_a = store.redactor("team-b"), store.redactor("team-a")
    assert for_b.feed(b"sk-li") == b"sk-li"  # not a secret team-b may use: nothing held back
    assert for_a.feed(b"sk-li") == b""
    assert for_a.feed(b"ve-Qx7pZ93!") == b"[REDACTED:A_KEY]!"
    assert for_b.feed(b"shared-1234 sk-live-Qx7pZ93") == b"[REDACTED:ALL] sk-live-Qx7pZ93"
    assert store.mask_text("sk-live-Qx7pZ93", "team-b") == "sk-live-Qx7pZ93"
    assert store.mask_text("sk-live-Qx7pZ93") == "[REDACTED:A_KEY]"  # logs and audit: every secret


def test_a_multi_line_secret_under_a_terminal(tmp_path: Path) -> None:
    """A terminal prints the newline of a PEM key as CR LF: still masked."""
    pem = "-----BEGIN KEY-----\nMIIBOgIBAAJBAK\n-----END KEY-----"
    store = SecretStore("", {"SANDBOXD_SECRET_PEM": pem})
    tty_text = pem.replace("\n", "\r\n").encode() + b"\r\n"
    assert _run(store.redactor(DEFAULT_TENANT, tty=True), [tty_text[:20], tty_text[20:]]) == b"[REDACTED:PEM]\r\n"
    assert _run(store.redactor(DEFAULT_TENANT), [pem.encode()]) == b"[REDACTED:PEM]"


def test_a_tenant_scope_undone_from_another_context_is_no_error() -> None:
    """An abandoned stream's generator may be closed by the garbage collector in a task of
    another context (asyncio's async-generator finalizer): undoing its scope there must not
    raise (seen as 'Task exception was never retrieved ... created in a different Context')."""

    def scoped() -> contextvars.Token[str]:
        return tenant_scope("acme")

    call = contextvars.copy_context()
    token = call.run(scoped)
    contextvars.Context().run(reset_tenant, token)  # where the finalizer runs: no error
    assert call.run(current_tenant) == "acme"
    call.run(reset_tenant, token)
    assert call.run(current_tenant) == "default"


def test_a_line_below_the_level_costs_no_processing() -> None:
    """At ``warning``, an info line (every RPC's access line) is dropped before it is masked or
    rendered; a warning is still written, masked."""
    import io
    import logging

    import structlog

    from sandboxd.logging import configure_logging

    masked: list[str] = []

    def mask(text: str) -> str:
        masked.append(text)
        return text.replace("pw-1a2b3c", "[REDACTED]")

    out = io.StringIO()
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        configure_logging(level="warning", fmt="json", stream=out, cache=False, mask=mask)
        log = structlog.get_logger("test.level")
        log.info("rpc.finished", detail="quiet pw-1a2b3c")
        assert masked == []
        log.warning("loud", detail="seen pw-1a2b3c")
    finally:
        root.handlers[:], root.level = saved
        structlog.reset_defaults()
    text = out.getvalue()
    assert "quiet" not in text
    assert '"detail": "seen [REDACTED]"' in text
    assert "pw-1a2b3c" not in text
