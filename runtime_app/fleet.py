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
    kind: str  # anthropic | bedrock | openai-compatible | command
    description: str
    pinned_models: dict[str, str] = field(default_factory=dict)
    needs_command: bool = False
    key_variable: str = ""  # the server environment variable holding the API key
    base_url_variable: str = ""  # …and the one naming the server, if any
    default_base_url: str = ""

    def base_url(self) -> str | None:
        import os

        return (os.environ.get(self.base_url_variable) if self.base_url_variable else None) or \
            self.default_base_url or None


PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in (
        Preset("anthropic", "anthropic", "Anthropic's API through the official SDK",
               key_variable="ANTHROPIC_API_KEY", base_url_variable="ANTHROPIC_BASE_URL"),
        Preset("bedrock", "bedrock", "Anthropic models on AWS Bedrock (the standard AWS environment)",
               key_variable="AWS_BEARER_TOKEN_BEDROCK", base_url_variable="BEDROCK_BASE_URL"),
        Preset("openai", "openai-compatible", "OpenAI's API",
               key_variable="OPENAI_API_KEY", base_url_variable="OPENAI_BASE_URL"),
        Preset("deepseek", "openai-compatible", "DeepSeek's OpenAI-compatible endpoint",
               key_variable="DEEPSEEK_API_KEY", base_url_variable="DEEPSEEK_BASE_URL",
               default_base_url="https://api.deepseek.com"),
        Preset("local", "openai-compatible", "an OpenAI-compatible server at LOCAL_LLM_BASE_URL",
               key_variable="LOCAL_LLM_API_KEY", base_url_variable="LOCAL_LLM_BASE_URL",
               default_base_url="http://127.0.0.1:8080/v1"),
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
