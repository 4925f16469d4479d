"""The fleet's provider presets: what a spec's `worker.provider` may name.

Built-in presets cover the seed's providers; model listing and admin-managed presets
arrive with the fleet. A preset's pinned ids record which concrete model a freeze used
when the provider's model listing is not reachable.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Preset:
    name: str
    kind: str  # anthropic | openai-compatible | command
    description: str
    pinned_models: dict[str, str] = field(default_factory=dict)
    needs_command: bool = False


PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in (
        Preset("anthropic", "anthropic", "Anthropic's API through the official SDK"),
        Preset("openai", "openai-compatible", "OpenAI's API"),
        Preset("deepseek", "openai-compatible", "DeepSeek's OpenAI-compatible endpoint"),
        Preset("local", "openai-compatible", "an OpenAI-compatible server at a configured URL"),
        Preset("command", "command", "any agent CLI run in the sandboxed worktree",
               needs_command=True),
    )
}


def preset_resolve_model(preset_name: str, requested: str) -> tuple[str, str]:
    """(resolved model id, how it was resolved). Without a reachable model listing the
    preset's pinned id stands, or the requested id itself when nothing is pinned."""
    preset = PRESETS[preset_name]
    if requested in preset.pinned_models:
        return preset.pinned_models[requested], "preset_pinned"
    return requested, "requested_as_pinned"
