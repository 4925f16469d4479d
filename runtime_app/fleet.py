"""The fleet's provider presets: what a spec's `worker.provider` may name.

Built-in presets cover the seed's providers; model listing and admin-managed presets
arrive with the fleet. A preset's pinned ids record which concrete model a freeze used
when the provider's model listing is not reachable.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.apps import apps
from django.conf import settings

EFFORTS = ("off", "low", "medium", "high", "max")  # what `reasoning_effort` may say


@dataclass(frozen=True)
class Preset:
    name: str
    kind: str  # anthropic | bedrock | openai-compatible | command | agent-cli
    description: str
    pinned_models: dict[str, str] = field(default_factory=dict)
    needs_command: bool = False
    key_variable: str = ""  # the server environment variable holding the API key
    base_url_variable: str = ""  # …and the one naming the server, if any
    default_base_url: str = ""
    default_model: str = ""  # used when a spec names the preset without a model
    concurrency: int = 0  # calls in flight for this account; 0: CRUCIBLE_PROVIDER_CONCURRENCY
    price_model: str = ""  # the price-table entry to charge by, if not the model id
    efforts: tuple[str, ...] = ()  # reasoning effort per round when a spec sets none; the last repeats
    managed: bool = False  # an administrator's preset (runtime_app.ProviderPreset)
    # An agent-cli preset: a coding-agent CLI run in the sandbox, its calls through the egress proxy.
    api: str = ""  # the API it speaks, the egress proxy's kind (runtime_app.egress.RULES)
    cli: str = ""  # its executable, relative to CRUCIBLE_AGENT_CLI_DIR
    argv: tuple[str, ...] = ()  # its command line; "{cli}" and "{model}" are filled in
    env: dict[str, str] = field(default_factory=dict)  # plain settings, through the sandbox's env
    # Set by the egress forwarder inside the sandbox ("{url}" is its URL): the base URL and the
    # placeholder key a CLI insists on, whose names the sandbox's env allow-list refuses.
    egress_env: dict[str, str] = field(default_factory=dict)

    def base_url(self) -> str | None:
        return (os.environ.get(self.base_url_variable) if self.base_url_variable else None) or \
            self.default_base_url or None

    def cli_path(self) -> Path:
        """The agent CLI's executable with every symlink resolved (the sandbox sees real paths)."""
        return (Path(settings.CONFIG.agent_cli_dir) / self.cli).resolve()

    def cli_argv(self, model: str) -> list[str]:
        return [part.replace("{cli}", str(self.cli_path())).replace("{model}", model) for part in self.argv]


# What an agent CLI sends as its key: the egress proxy strips it and injects the real one.
PLACEHOLDER_KEY = "crucible-egress-placeholder"


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
        Preset("claude-code", "agent-cli", "Claude Code in the sandbox, its calls through the egress proxy "
               "to Anthropic's API", key_variable="ANTHROPIC_API_KEY", base_url_variable="ANTHROPIC_BASE_URL",
               default_base_url="https://api.anthropic.com", api="anthropic", cli="node_modules/.bin/claude",
               argv=("{cli}", "-p", "--output-format", "stream-json", "--verbose", "--model", "{model}",
                     "--dangerously-skip-permissions"),
               # No telemetry or update checks (they would bypass the base URL); IS_SANDBOX: as root
               # (rlimits-only) it refuses to skip permissions otherwise, and the sandbox is the boundary.
               env={"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
                    "IS_SANDBOX": "1"},
               egress_env={"ANTHROPIC_BASE_URL": "{url}", "ANTHROPIC_API_KEY": PLACEHOLDER_KEY}),
        Preset("codex", "agent-cli", "Codex CLI in the sandbox, its calls through the egress proxy to "
               "OpenAI's Responses API", key_variable="OPENAI_API_KEY", base_url_variable="OPENAI_BASE_URL",
               default_base_url="https://api.openai.com/v1", api="openai", cli="node_modules/.bin/codex",
               # Codex takes its provider's URL only from its config: the shell adds the forwarder's.
               argv=("/bin/sh", "-c", 'mkdir -p "$HOME/.codex" && exec "$0" "$@" '
                     '-c "model_providers.crucible.base_url=$CRUCIBLE_EGRESS_URL/v1" -',
                     "{cli}", "exec", "--json", "--ephemeral", "--skip-git-repo-check",
                     "--dangerously-bypass-approvals-and-sandbox", "-m", "{model}",
                     "-c", "model_provider=crucible", "-c", "model_providers.crucible.name=crucible",
                     "-c", "model_providers.crucible.env_key=CRUCIBLE_PROVIDER_KEY",
                     "-c", "model_providers.crucible.wire_api=responses",
                     # The egress proxy retries 429/5xx itself; Codex's own retries would multiply them.
                     "-c", "model_providers.crucible.request_max_retries=0",
                     "-c", "model_providers.crucible.stream_max_retries=0",
                     # Without these it reaches ab.chatgpt.com (analytics), chatgpt.com and GitHub.
                     "-c", "analytics.enabled=false", "-c", "check_for_update_on_startup=false",
                     "-c", "features.plugins=false"),
               egress_env={"CRUCIBLE_PROVIDER_KEY": PLACEHOLDER_KEY}),
        Preset("aider", "agent-cli", "aider in the sandbox, its calls through the egress proxy to an "
               "OpenAI-compatible chat completions API", key_variable="OPENAI_API_KEY",
               base_url_variable="OPENAI_BASE_URL", default_base_url="https://api.openai.com/v1",
               api="openai", cli="aider/bin/aider",
               # litellm's bundled price table seeds aider's cache, or both fetch it from GitHub;
               # the history files go to HOME, not the worktree.
               argv=("/bin/sh", "-c", 'mkdir -p "$HOME/.aider/caches" && '
                     'cp "$(dirname "$0")"/../lib/python3*/site-packages/litellm/'
                     'model_prices_and_context_window_backup.json '
                     '"$HOME/.aider/caches/model_prices_and_context_window.json" && exec "$0" "$@" '
                     '--chat-history-file "$HOME/chat.md" --input-history-file "$HOME/input.txt"',
                     "{cli}", "--model", "openai/{model}", "--weak-model", "openai/{model}",
                     "--edit-format", "diff", "--message-file", "/dev/stdin", "--yes-always", "--no-git",
                     "--no-auto-commits", "--no-dirty-commits", "--no-gitignore", "--map-tokens", "0",
                     "--no-check-update", "--no-analytics", "--no-show-release-notes", "--no-pretty",
                     "--no-fancy-input", "--no-detect-urls", "--disable-playwright",
                     "--no-show-model-warnings"),
               env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"},
               egress_env={"OPENAI_API_BASE": "{url}/v1", "OPENAI_API_KEY": PLACEHOLDER_KEY}),
    )
}


def _managed_presets() -> Any:
    """The administrators' presets (runtime_app.models.ProviderPreset), looked up in the app
    registry: the models build a Preset from this module, so it does not import them back."""
    return apps.get_model("runtime_app", "ProviderPreset")


def preset_get(name: str) -> Preset | None:
    """A built-in preset, or an administrator's from the database; None if there is neither."""
    if name in PRESETS:
        return PRESETS[name]
    try:
        row = _managed_presets().objects.filter(name=name).first()
    except Exception:  # no database here (pure validation, or before migrate): built-ins only
        return None
    return row.as_preset() if row is not None else None


def preset_names() -> list[str]:
    """Every preset a spec may name: the built-ins, then the administrators' (if reachable)."""
    try:
        managed = list(_managed_presets().objects.order_by("name").values_list("name", flat=True))
    except Exception:  # no database here: built-ins only
        managed = []
    return [*PRESETS, *managed]


def preset_efforts(preset_name: str, rounds: int) -> list[str] | None:
    """The preset's default effort for each of `rounds` rounds, or None if it has none."""
    preset = preset_get(preset_name)
    if preset is None or not preset.efforts:
        return None
    return [preset.efforts[min(index, len(preset.efforts) - 1)] for index in range(rounds)]


def preset_resolve_model(preset_name: str, requested: str) -> tuple[str, str]:
    """(resolved model id, how it was resolved). Without a reachable model listing the
    preset's pinned id stands, or the requested id itself when nothing is pinned; a spec that
    names no model gets its preset's default model."""
    preset = preset_get(preset_name) or PRESETS["command"]
    if not requested and preset.default_model:
        return preset.default_model, "preset_default"
    if requested in preset.pinned_models:
        return preset.pinned_models[requested], "preset_pinned"
    return requested, "requested_as_pinned"


def host_is_local(host: str) -> bool:
    """A loopback or private-network address (a model server of one's own), not a cloud API."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_private
