"""Approval: exactly one allow/deny decision per complete tool call.

Who asks: a ``user`` call is never asked about -- the click is the
intent; an ``agent`` call follows the policy; a ``scheduler`` call may only run
``read`` tools, and "ask" counts as deny for it since nobody is there to answer.
``user_only`` tools refuse agent and scheduler calls.

What the policy is: a per-effect policy (``{"read": "allow", "write": "ask"}``)
when one is given for the tool's effect, otherwise the mode:
``allow-all``, ``deny-all``, ``read-only`` (``r`` tools whose effect is
``read`` allowed, the rest asked) or ``always-ask``. Asking calls the ``approve`` callback; with no
callback the answer is deny (the conservative default for unattended runs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Literal

from .tools._types import Actor, ApproveFn, ToolCall, ToolDefinitionConfig

__all__ = ["Approval", "ApprovalDecision", "Mode", "Rule"]

Mode = Literal["allow-all", "deny-all", "read-only", "always-ask"]
Rule = Literal["allow", "ask", "deny"]
MODES: tuple[Mode, ...] = ("allow-all", "deny-all", "read-only", "always-ask")
RULES: tuple[Rule, ...] = ("allow", "ask", "deny")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ApprovalDecision:
    """One decision, as recorded in the trace (``approval_decision``)."""

    decision: Literal["allow", "deny"]
    asked: bool
    """Whether the approve callback was consulted."""
    reason: str
    actor: Actor
    mode: Mode
    effect: str


class Approval:
    """Decides tool calls.

    Args:
        approve: the callback consulted when the rule is "ask".
        mode: the approval mode.
        policy: per-effect rules that take precedence over the mode.
    """

    def __init__(
        self,
        *,
        approve: ApproveFn | None = None,
        mode: Mode = "always-ask",
        policy: Mapping[str, Rule] | None = None,
    ) -> None:
        """Configure the decisions."""
        if mode not in MODES:
            msg = f"unknown approval mode {mode!r}; use one of {', '.join(MODES)}"
            raise ValueError(msg)
        for effect, rule in (policy or {}).items():
            if rule not in RULES:
                msg = f"policy for {effect!r} is {rule!r}; use one of {', '.join(RULES)}"
                raise ValueError(msg)
        self.approve = approve
        self.mode = mode
        self.policy = dict(policy or {})

    def rule(self, definition: ToolDefinitionConfig) -> Rule:
        """The rule for a tool before the actor is considered."""
        effect = definition.resolved_effect
        if effect in self.policy:
            return self.policy[effect]
        if self.mode == "allow-all":
            return "allow"
        if self.mode == "deny-all":
            return "deny"
        if self.mode == "read-only":
            # Both must say "read": an `r` tool whose effect is, say, `money` is still asked about.
            return "allow" if definition.permission == "r" and effect == "read" else "ask"
        return "ask"

    async def decide(self, call: ToolCall, definition: ToolDefinitionConfig, actor: Actor) -> ApprovalDecision:
        """Decide one complete call; never raises (a failing callback counts as deny)."""
        effect = definition.resolved_effect

        def result(decision: Literal["allow", "deny"], reason: str, *, asked: bool = False) -> ApprovalDecision:
            return ApprovalDecision(
                decision=decision, asked=asked, reason=reason, actor=actor, mode=self.mode, effect=effect
            )

        if definition.user_only and actor != "user":
            return result("deny", f"{definition.name} can only be used by the user")
        if actor == "user":
            return result("allow", "a user's own action is never asked about")
        rule = self.rule(definition)
        if actor == "scheduler":
            if effect != "read":
                return result("deny", f"scheduled runs may only use read tools; {definition.name} is {effect}")
            if rule != "allow":
                return result("deny", "nobody is there to ask during a scheduled run")
            return result("allow", "read tool allowed for scheduled runs")
        if rule == "allow":
            return result("allow", f"{effect} tools are allowed ({self._source(effect)})")
        if rule == "deny":
            return result("deny", f"{effect} tools are denied ({self._source(effect)})")
        if self.approve is None:
            return result("deny", "approval needed and no approve callback was given")
        try:
            answer = await self.approve(call)
        except Exception as exc:  # a broken callback must not approve anything
            return result("deny", f"the approve callback failed: {exc}", asked=True)
        if answer == "allow":
            return result("allow", "approved", asked=True)
        return result("deny", "denied", asked=True)

    def _source(self, effect: str) -> str:
        return f"policy for {effect}" if effect in self.policy else f"mode {self.mode}"
