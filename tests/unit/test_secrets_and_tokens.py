"""Secret masking across chunk boundaries, secret references, and bearer-token lookup (no engine needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandboxd.audit import AuditLog, audit_fields, set_audit_tenant, start_audit
from sandboxd.errors import InvalidSpecError, UnauthenticatedError
from sandboxd.secrets import BytesRedactor, SecretStore
from sandboxd.tenancy import DEFAULT_TENANT, Authenticator, create_token

VALUES = {"demo": "s3cr3t-demo-value", "short": "abcd", "nested": "demo-value"}


def _run(redactor: BytesRedactor, chunks: list[bytes]) -> bytes:
    return b"".join(redactor.feed(chunk) for chunk in chunks) + redactor.flush()


@pytest.mark.parametrize("cut", range(1, 40))
def test_every_split_point_is_masked(cut: int) -> None:
    text = b"x=s3cr3t-demo-value; y=abcd; z=abc" + b"!" * 5
    expected = b"x=[REDACTED:demo]; y=[REDACTED:short]; z=abc!!!!!"
    assert _run(BytesRedactor(VALUES), [text[:cut], text[cut:]]) == expected


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
        store.check(env, "env")
    del env["D"]
    store.check(env, "env")
    assert store.resolve(env) == {"A": "value-from-file", "B": "value-from-env", "C": "plain"}
    assert set(store.values) == {"demo", "env_one"}


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


def test_unwritable_audit_log_refuses_to_start(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(InvalidSpecError, match=r"cannot open the audit log .*SANDBOXD_AUDIT_LOG"):
        AuditLog(str(blocker / "audit.jsonl"))
    assert not AuditLog("off").enabled
