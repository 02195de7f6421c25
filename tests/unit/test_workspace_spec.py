"""Workspace spec validation and defaults, and the label round trip (no Docker)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from sandboxd.errors import InvalidSpecError
from sandboxd.models import IdleAction, NetworkPolicy, ResourceLimits, Runtime, SecurityOptions, WorkspaceSpec
from sandboxd.settings import Settings
from sandboxd.workspaces import WorkspaceManager, spec_from_json, spec_to_json


@pytest.fixture
def manager() -> WorkspaceManager:
    return WorkspaceManager(backend=None, settings=Settings.from_env({}), processes=None)  # type: ignore[arg-type]


class TestResolve:
    def test_hardened_defaults(self, manager: WorkspaceManager) -> None:
        """An empty spec gets the default image, limits, no network, runc and no added capability."""
        spec = manager.resolve(WorkspaceSpec())
        assert spec.image == "sandboxd/base:bookworm"
        assert spec.limits == ResourceLimits(memory_bytes=1024**3, cpu_millis=1000, pids=512)
        assert spec.network is NetworkPolicy.NONE
        assert spec.runtime is Runtime.RUNC
        assert spec.working_dir == "/workspace"
        assert spec.security == SecurityOptions()
        assert (spec.idle_action, spec.auto_resume) == (IdleAction.DELETE, True)

    def test_capabilities_are_normalised(self, manager: WorkspaceManager) -> None:
        """cap_net_raw and NET_RAW name the same capability; duplicates collapse."""
        spec = manager.resolve(WorkspaceSpec(security=SecurityOptions(added_capabilities=("cap_net_raw", "NET_RAW"))))
        assert spec.security.added_capabilities == ("NET_RAW",)

    def test_root_capabilities_are_normalised_and_held_by_the_agent_only(self, manager: WorkspaceManager) -> None:
        """Root capabilities read as added ones do; the container holds them for the agent to hand to root."""
        spec = manager.resolve(
            WorkspaceSpec(security=SecurityOptions(root_capabilities=("cap_chown", "SETUID", "CHOWN")))
        )
        assert spec.security.root_capabilities == ("CHOWN", "SETUID")
        assert spec.security.added_capabilities == ()
        with pytest.raises(InvalidSpecError, match="unknown capability 'CAP_EVERYTHING'"):
            manager.resolve(WorkspaceSpec(security=SecurityOptions(root_capabilities=("CAP_EVERYTHING",))))
        with pytest.raises(InvalidSpecError, match="root_capabilities has 65 entries"):
            manager.resolve(WorkspaceSpec(security=SecurityOptions(root_capabilities=("CHOWN",) * 65)))

    @pytest.mark.parametrize(
        ("spec", "message"),
        [
            (WorkspaceSpec(limits=ResourceLimits(memory_bytes=-1)), "memory_bytes must not be negative"),
            (WorkspaceSpec(limits=ResourceLimits(memory_bytes=1024)), "memory_bytes must be between"),
            (WorkspaceSpec(limits=ResourceLimits(memory_bytes=10**15)), "memory_bytes must be between"),
            (WorkspaceSpec(limits=ResourceLimits(pids=-5)), "pids must not be negative"),
            (WorkspaceSpec(limits=ResourceLimits(cpu_millis=2**63 - 1)), r"cpu_millis must be between 10 and \d+ \("),
            (WorkspaceSpec(limits=ResourceLimits(pids=2**63 - 1)), "pids must be between 16 and 4194304"),
            (WorkspaceSpec(idle_ttl_s=1e-9), r"idle_ttl must be 0 \(never\) or at least 1 s"),
            (WorkspaceSpec(idle_ttl_s=-1.0), r"idle_ttl must be 0 \(never\) or at least 1 s"),
            (WorkspaceSpec(labels={"Sandboxd.Managed": "x"}), "reserved"),
            (WorkspaceSpec(labels={"bad key": "x"}), "labels key"),
            (WorkspaceSpec(env={"1X": "y"}), "1X"),
            (WorkspaceSpec(env={"X": "a\0b"}), "NUL"),
            (WorkspaceSpec(working_dir="rel/dir"), "absolute"),
            (WorkspaceSpec(security=SecurityOptions(user="a b")), "security.user"),
            (WorkspaceSpec(idle_ttl_s=-1), "idle_ttl"),
            (WorkspaceSpec(image=" spaced"), "image"),
        ],
    )
    def test_invalid(self, manager: WorkspaceManager, spec: WorkspaceSpec, message: str) -> None:
        """Each malformed field is refused with a message naming it."""
        with pytest.raises(InvalidSpecError, match=message):
            manager.resolve(spec)

    def test_label_round_trip(self, manager: WorkspaceManager) -> None:
        """The spec stored in the container label reads back identical."""
        spec = manager.resolve(
            WorkspaceSpec(
                env={"A": "1"},
                labels={"team": "x"},
                network=NetworkPolicy.BRIDGE,
                idle_ttl_s=30.0,
                security=SecurityOptions(added_capabilities=("NET_RAW",), user="sandbox", root_capabilities=("CHOWN",)),
                idle_action=IdleAction.PAUSE,
                auto_resume=False,
            )
        )
        assert (spec.idle_action, spec.auto_resume) == (IdleAction.PAUSE, False)
        assert spec_from_json(spec_to_json(spec)) == dataclasses.replace(spec)

    def test_a_label_of_an_older_release_reads_with_the_defaults(self, manager: WorkspaceManager) -> None:
        """A stored spec without idle_action or auto_resume (written before they existed) still reads."""
        stored = json.loads(spec_to_json(manager.resolve(WorkspaceSpec())))
        del stored["auto_resume"], stored["idle_action"]
        spec = spec_from_json(json.dumps(stored))
        assert (spec.idle_action, spec.auto_resume) == (None, None)
