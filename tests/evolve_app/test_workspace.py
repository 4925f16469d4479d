"""The workspace contract: validation with file and line, typed reads and writes, and git."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from evolve_app.agents import agent_for
from evolve_app.types import SkillMeta
from evolve_app.workspace import (
    AgentWorkspace,
    Problem,
    WorkspaceError,
    WorkspaceInvalid,
    manifest_warnings,
    workspace_changed_paths,
    workspace_changes,
    workspace_check,
    workspace_import,
    workspace_manifest,
    workspace_restore,
    workspace_snapshot,
    workspace_validate,
)
from tests.evolve_app.helpers import SEED_MANIFEST
from tests.gitrepo import git


def problems_in(root: Path, path: str) -> list[Problem]:
    return [problem for problem in workspace_validate(root) if problem.path == path]


def only_problem(root: Path, path: str = "manifest.yaml") -> Problem:
    problems = workspace_validate(root)
    assert len(problems) == 1, problems
    assert problems[0].path == path
    return problems[0]


# ------------------------------------------------------------------------------------ manifest


def test_a_seed_style_manifest_with_only_agent_layers_and_reload_strategy_opens_with_defaults(workspace):
    assert workspace_validate(workspace) == []
    manifest = workspace_manifest(workspace)
    assert manifest.name == "agent"  # the folder's name
    assert manifest.contract_version == "1"
    assert manifest.absent == ("name", "version", "contract_version")
    assert manifest.agent.entrypoint == "agent_evolve.agents.swe.agent.SweAgent"
    assert manifest.evolvable_layers == ["prompts", "skills", "memory"]
    assert manifest.reload_strategy == "hot"


def test_a_full_upstream_manifest_with_contract_version_1_0_opens(make_workspace):
    root = make_workspace(extra={"manifest.yaml": 'name: reasoning-agent\nversion: 0.1.0\n'
                                 'contract_version: "1.0"\n' + SEED_MANIFEST})
    manifest = workspace_manifest(root)
    assert (manifest.name, manifest.version, manifest.contract_version) == ("reasoning-agent", "0.1.0", "1")
    assert manifest.absent == ()


def test_a_version_that_yaml_reads_as_a_number_keeps_its_text(make_workspace):
    root = make_workspace(extra={"manifest.yaml": "version: 1.10\nname: 2024\n" + SEED_MANIFEST})
    manifest = workspace_manifest(root)
    assert (manifest.version, manifest.name) == ("1.10", "2024")


def test_a_yaml_syntax_error_in_the_manifest_is_reported_with_its_line_and_column(make_workspace):
    root = make_workspace(extra={"manifest.yaml": "agent:\n  type: reference\n  entrypoint: [a.b\n"
                                 "reload_strategy: hot\n"})
    problem = only_problem(root)
    assert problem.message.startswith("YAML syntax error")
    # Where the unclosed `[` opens, not the next line where PyYAML gave up (it says that too).
    assert (problem.line, problem.column) == (3, 15)
    assert problem.message.endswith("at line 4, column 16")


def test_an_unclosed_bracket_on_line_5_is_reported_at_line_5(make_workspace):
    manifest = ('name: a\n'
                'contract_version: "1.0"\n'
                "agent: {type: reference, entrypoint: x.Y}\n"
                "reload_strategy: hot\n"
                "evolvable_layers: [prompts, skills\n"  # line 5: never closed
                "version: 2\n")
    problem = only_problem(make_workspace(extra={"manifest.yaml": manifest}))
    assert (problem.line, problem.column) == (5, 19)  # PyYAML's own mark is line 6
    quoted = only_problem(make_workspace(extra={"manifest.yaml": SEED_MANIFEST.replace(
        "reload_strategy: hot", 'reload_strategy: "hot')}, name="quoted"))
    assert (quoted.line, quoted.column) == (10, 18) and "quoted text that starts here" in quoted.message


def test_a_reference_agent_without_an_entrypoint_is_crucible_s_as_in_a_evolve(make_workspace):
    manifest = "evolvable_layers: [prompts]\nreload_strategy: cold\nagent:\n  type: reference\n"
    root = make_workspace(extra={"manifest.yaml": manifest})
    assert workspace_validate(root) == []
    assert type(agent_for(root)).__name__ == "ReferenceLLMAgent"


def test_a_wrongly_typed_field_is_reported_at_its_value(make_workspace):
    manifest = SEED_MANIFEST.replace("type: reference", "type: [reference]").replace(
        "evolvable_layers:\n  - prompts\n  - skills\n  - memory", "evolvable_layers: prompts")
    problems = workspace_validate(make_workspace(extra={"manifest.yaml": manifest}))
    assert [(p.line, p.message) for p in problems] == [
        (2, "agent.type: expected a string, got a list"),
        (5, "evolvable_layers: expected a list, got a string ('prompts')"),
    ]


def test_an_entrypoint_that_is_not_a_dotted_path_is_reported(make_workspace):
    manifest = SEED_MANIFEST.replace("agent_evolve.agents.swe.agent.SweAgent", "my agent")
    problem = only_problem(make_workspace(extra={"manifest.yaml": manifest}))
    assert (problem.line, problem.column) == (3, 15)
    assert "not a dotted Python path" in problem.message


def test_an_unknown_key_is_reported_at_its_line_with_a_did_you_mean(make_workspace):
    manifest = SEED_MANIFEST.replace("reload_strategy: hot", "reload_strategy: hot\nreload_stratgy: cold") \
        .replace("  entrypoint:", "  entrypiont: x.Y\n  entrypoint:")
    root = make_workspace(extra={"manifest.yaml": manifest})
    problems, warnings = workspace_check(root)
    assert problems == []  # A-Evolve ignores unknown keys: warnings, never errors
    assert [(p.line, p.column, p.message) for p in warnings] == [
        (3, 3, "unknown key 'entrypiont' in agent, kept but not used by Crucible; did you mean "
               "'entrypoint'?"),
        (12, 1, "unknown key 'reload_stratgy' in the manifest, kept but not used by Crucible; did you mean "
                "'reload_strategy'?"),
    ]
    assert manifest_warnings(root) == warnings
    assert workspace_manifest(root).extra == {"agent.entrypiont": "x.Y", "reload_stratgy": "cold"}


def test_a_misspelt_required_key_is_a_warning_and_the_missing_key_error_names_it(make_workspace):
    manifest = SEED_MANIFEST.replace("reload_strategy: hot", "reload_stratgy: hot")
    problems, warnings = workspace_check(make_workspace(extra={"manifest.yaml": manifest}))
    assert [str(p) for p in problems] == [
        "manifest.yaml:10:1: missing required key 'reload_strategy' (hot or cold); 'reload_stratgy' on "
        "line 10 looks like a misspelling of it"]
    assert str(warnings[0]).startswith("manifest.yaml:10:1: unknown key 'reload_stratgy'")


def test_an_a_evolve_manifest_with_description_and_every_documented_agent_key_opens(make_workspace):
    manifest = ('name: arc-mas\nversion: 0.1.0\ncontract_version: "1.0"\n'
                "description: Multi-agent ARC solver\n" + SEED_MANIFEST.replace(
                    "  entrypoint: agent_evolve.agents.swe.agent.SweAgent\n",
                    "  entrypoint: agent_evolve.agents.arc.ArcAgent\n  command: python run.py\n"
                    "  preset: anthropic\n  model: claude-sonnet-4-5\n  effort: high\n"
                    "  timeout_seconds: 120\n"
                    "  temperature: 0.2\n"))
    root = make_workspace(extra={"manifest.yaml": manifest})
    problems, warnings = workspace_check(root)
    assert problems == []
    assert [(p.line, p.column, p.message.split(",")[0]) for p in warnings] == [
        (4, 1, "unknown key 'description' in the manifest"),
        (13, 3, "unknown key 'temperature' in agent"),
    ]
    agent = workspace_manifest(root).agent
    assert (agent.command, agent.preset, agent.model, agent.effort, agent.timeout_seconds) == (
        "python run.py", "anthropic", "claude-sonnet-4-5", "high", 120)
    workspace_import(root)
    assert "description: Multi-agent ARC solver" in (root / "manifest.yaml").read_text()  # kept as written


def test_a_bad_evolvable_layer_is_reported_at_its_list_item_with_a_suggestion(make_workspace):
    manifest = SEED_MANIFEST.replace("  - skills", "  - skils")
    problem = only_problem(make_workspace(extra={"manifest.yaml": manifest}))
    assert (problem.line, problem.column) == (7, 5)
    assert problem.message == ("evolvable_layers[1]: 'skils' is not allowed; use one of prompts, skills, "
                               "memory, tools (did you mean 'skills'?)")


def test_a_bad_reload_strategy_is_reported_at_its_value(make_workspace):
    manifest = SEED_MANIFEST.replace("reload_strategy: hot", "reload_strategy: warm")
    problem = only_problem(make_workspace(extra={"manifest.yaml": manifest}))
    assert (problem.line, problem.column) == (10, 18)
    assert "'warm' is not allowed; use one of hot, cold" in problem.message


def test_every_manifest_problem_is_reported_at_once(make_workspace):
    manifest = ('contract_version: "2"\nagent:\n  type: reference\n'
                "evolvable_layers: [prompts, prompts, weights]\nreload_strategy: 3\ncolour: blue\n")
    problems = workspace_validate(make_workspace(extra={"manifest.yaml": manifest}))
    messages = [(p.line, p.message.split(":")[0]) for p in problems]
    assert messages == [
        (1, "contract_version '2' is not supported; this Crucible reads contract version 1 (write \"1\")"),
        (4, "evolvable_layers"),  # listed twice
        (5, "reload_strategy"),
    ]
    warnings = workspace_check(make_workspace(extra={"manifest.yaml": manifest}, name="b"))[1]
    assert [p.message for p in warnings] == [
        "evolvable_layers: 'weights' is not a layer Crucible evolves (prompts, skills, memory, tools); "
        "no engine may change it",
        "unknown key 'colour' in the manifest, kept but not used by Crucible (known keys: name, version, "
        "contract_version, agent, evolvable_layers, reload_strategy)"]


def test_a_duplicate_key_is_reported_on_its_second_line(make_workspace):
    manifest = SEED_MANIFEST + "reload_strategy: cold\n"
    problem = only_problem(make_workspace(extra={"manifest.yaml": manifest}))
    assert problem.line == 11 and problem.message == "key 'reload_strategy' appears twice (first on line 10)"


def test_a_missing_or_empty_manifest_is_a_problem(make_workspace, tmp_path):
    assert only_problem(make_workspace(extra={"manifest.yaml": None})).message.startswith("missing")
    assert only_problem(make_workspace(extra={"manifest.yaml": "# nothing\n"}, name="b")).message \
        .startswith("empty")


def test_an_alias_bomb_in_the_manifest_is_refused_without_expanding_it(make_workspace):
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8))
    problem = only_problem(make_workspace(extra={"manifest.yaml": bomb}))
    assert "YAML nodes" in problem.message


# ------------------------------------------------------------------------------------ other files


def test_a_missing_system_prompt_is_a_problem(make_workspace):
    problem = only_problem(make_workspace(extra={"prompts/system.md": None}), "prompts/system.md")
    assert problem.message == "missing: the system prompt is required"


def test_a_skill_without_front_matter_is_reported_on_line_1(make_workspace):
    root = make_workspace(extra={"skills/verify/SKILL.md": "# Verify\n\nRun the tests.\n"})
    problem = only_problem(root, "skills/verify/SKILL.md")
    assert problem.line == 1 and problem.message.startswith("no front matter")


def test_a_skill_whose_name_differs_from_its_folder_is_reported_on_the_name_line(make_workspace):
    root = make_workspace(extra={"skills/verify/SKILL.md": "---\ndescription: check\nname: verifier\n---\n"})
    problem = only_problem(root, "skills/verify/SKILL.md")
    assert (problem.line, problem.column) == (3, 7)
    assert "differs from its folder skills/verify/" in problem.message


def test_bad_skill_front_matter_is_reported_on_the_line_of_the_file(make_workspace):
    root = make_workspace(extra={
        "skills/a/SKILL.md": "---\nname: a\ndescription: [unclosed\n---\n",
        "skills/b/SKILL.md": "---\nname: b\n",
        "skills/c/SKILL.md": "---\nname: c\ndescription: ''\n---\n",
        "skills/Bad_Name/SKILL.md": "---\nname: Bad_Name\ndescription: x\n---\n",
    })
    problems = [(p.path, p.line, p.message.split(":")[0]) for p in workspace_validate(root)]
    assert problems == [
        ("skills/Bad_Name/SKILL.md", None, "skill folder 'Bad_Name'"),
        ("skills/Bad_Name/SKILL.md", 2, "name 'Bad_Name'"),
        ("skills/a/SKILL.md", 3, "YAML syntax error"),
        ("skills/b/SKILL.md", 1, "the front matter is not closed"),
        ("skills/c/SKILL.md", 3, "description"),
    ]


def test_invalid_memory_lines_are_reported_with_their_line_numbers(make_workspace):
    root = make_workspace(extra={"memory/episodic.jsonl": '{"a": 1}\n{"b": \n\n[1, 2]\n{"c": 3}\n'})
    problems = [(p.line, p.message) for p in problems_in(root, "memory/episodic.jsonl")]
    assert problems == [(2, "not valid JSON: Expecting value"),
                        (4, "each line must be a JSON object, not a list")]


def test_a_file_that_is_not_utf8_is_a_problem_not_a_crash(make_workspace):
    root = make_workspace(extra={"prompts/system.md": b"line one\ncaf\xe9\n",
                                 "manifest.yaml": SEED_MANIFEST.encode() + b"# \xff\n"})
    problems = {p.path: (p.line, p.column, p.message) for p in workspace_validate(root)}
    assert problems["prompts/system.md"][:2] == (2, 4)
    assert problems["prompts/system.md"][2].startswith("not UTF-8 text (byte 0xe9")
    assert problems["manifest.yaml"][:2] == (11, 3)


def test_registry_errors_and_entries_pointing_at_missing_tools_are_reported(make_workspace):
    root = make_workspace(extra={
        "tools/registry.yaml": "tools:\n  - name: bash\n  - name: search\n  - description: no name\n"
                               "  - name: bash\n",
        "tools/broken.py": "def run(:\n",
    })
    problems = [(p.path, p.line, p.message) for p in workspace_validate(root)]
    assert problems == [
        ("tools/broken.py", 1, "Python syntax error: invalid syntax"),
        ("tools/registry.yaml", 3, "registry entry 'search' points at tools/search.py, which is missing"),
        ("tools/registry.yaml", 4, "each registry entry needs 'name:' (a string)"),
        ("tools/registry.yaml", 5, "registry entry 'bash' appears twice (first on line 2)"),
    ]
    broken = make_workspace(extra={"tools/registry.yaml": "tools: {bash: 1}\n"}, name="b")
    assert only_problem(broken, "tools/registry.yaml").line == 1
    syntax = make_workspace(extra={"tools/registry.yaml": "tools:\n - name: a\n  - name: b\n"}, name="c")
    assert only_problem(syntax, "tools/registry.yaml").line == 3


def test_a_symlink_in_the_workspace_is_a_problem(make_workspace):
    root = make_workspace()
    (root / "skills" / "linked").symlink_to("/etc")
    assert only_problem(root, "skills/linked").message == "a symlink; a workspace holds plain files only"


# ------------------------------------------------------------------------------------ reads and writes


def test_the_workspace_reads_and_writes_every_part_of_the_contract(workspace):
    ws = AgentWorkspace(workspace)
    assert ws.read_prompt() == "You are a careful software engineer.\n"
    ws.write_prompt("Be brief.\n")
    assert (workspace / "prompts/system.md").read_text() == "Be brief.\n"

    assert ws.list_fragments() == ["reasoning.md"]
    ws.write_fragment("checks.md", "Check twice.\n")
    assert ws.read_fragment("checks.md") == "Check twice.\n"
    assert ws.list_fragments() == ["checks.md", "reasoning.md"]

    assert ws.list_skills() == [SkillMeta("code-search", "Find code fast.", "skills/code-search")]
    ws.write_skill("verify", "---\nname: verify\ndescription: Run the tests.\n---\nRun them.\n")
    assert ws.read_skill("verify").endswith("Run them.\n")
    assert [skill.name for skill in ws.list_skills()] == ["code-search", "verify"]
    ws.delete_skill("code-search")
    assert not (workspace / "skills/code-search").exists()

    ws.write_draft("retry", "Retry flaky tests once.\n")
    assert ws.read_draft("retry") == "Retry flaky tests once.\n"
    assert ws.list_drafts() == [{"name": "retry", "content": "Retry flaky tests once.\n"}]
    assert ws.list_skills()[0].name == "verify"  # drafts are not skills

    ws.add_memory({"lesson": "pin versions", "note": "line\nbreak"})
    ws.add_memory({"rule": "é"}, category="semantic")
    assert ws.read_memories("episodic")[-1] == {"lesson": "pin versions", "note": "line\nbreak"}
    assert len((workspace / "memory/episodic.jsonl").read_text().splitlines()) == 2
    assert ws.read_all_memories(limit=2) == [
        {"lesson": "pin versions", "note": "line\nbreak", "_category": "episodic"},
        {"rule": "é", "_category": "semantic"},
    ]

    assert ws.read_tool_registry() == [{"name": "bash", "description": "run a command"}]
    ws.write_tool("grep.py", "def run(pattern):\n    return pattern\n")
    ws.write_tool_registry([*ws.read_tool_registry(), {"name": "grep"}])
    assert ws.read_tool("grep") == "def run(pattern):\n    return pattern\n"
    assert [entry["name"] for entry in ws.read_tool_registry()] == ["bash", "grep"]
    assert ws.manifest.reload_strategy == "hot"
    assert ws.validate() == []


@pytest.mark.parametrize("name", ["..", "../x", "/etc/passwd", ".hidden", "a/b", "Verify", "", "x" * 65,
                                  "a b", "a\n", None])
def test_names_with_path_tricks_are_refused(workspace, name):
    ws = AgentWorkspace(workspace)
    for call in (lambda: ws.read_skill(name), lambda: ws.write_draft(name, "x"),
                 lambda: ws.add_memory({}, category=name), lambda: ws.read_fragment(name),
                 lambda: ws.write_tool(name, "x = 1\n"), lambda: ws.delete_skill(name)):
        with pytest.raises(WorkspaceError):
            call()
    assert sorted(p.name for p in workspace.iterdir()) == ["manifest.yaml", "memory", "prompts", "skills",
                                                             "tools"]


def test_write_skill_refuses_front_matter_that_names_another_skill_or_has_none(workspace):
    ws = AgentWorkspace(workspace)
    with pytest.raises(WorkspaceError, match="line 2: name 'other' differs from its folder"):
        ws.write_skill("verify", "---\nname: other\ndescription: x\n---\n")
    with pytest.raises(WorkspaceError, match="line 1: no front matter"):
        ws.write_skill("verify", "# Verify\n")
    assert not (workspace / "skills/verify").exists()


def test_reads_and_writes_refuse_a_path_through_a_symlink(workspace, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "SKILL.md").write_text("---\nname: leak\ndescription: secret\n---\n")
    (workspace / "skills" / "leak").symlink_to(outside)
    ws = AgentWorkspace(workspace)
    with pytest.raises(WorkspaceError, match="symlink"):
        ws.read_skill("leak")
    with pytest.raises(WorkspaceError, match="symlink"):
        ws.write_skill("leak", "---\nname: leak\ndescription: x\n---\n")
    assert [skill.name for skill in ws.list_skills()] == ["code-search"]
    assert (outside / "SKILL.md").read_text().endswith("secret\n---\n")


def test_write_tool_refuses_code_that_does_not_parse_and_missing_parts_raise(workspace):
    ws = AgentWorkspace(workspace)
    with pytest.raises(WorkspaceError, match=r"tools/bad\.py line 1: Python syntax error"):
        ws.write_tool("bad", "def (:\n")
    with pytest.raises(WorkspaceError, match=r"skills/nope/SKILL\.md does not exist"):
        ws.read_skill("nope")
    (workspace / "prompts/system.md").unlink()
    with pytest.raises(WorkspaceError, match=r"the system prompt: prompts/system\.md does not exist"):
        ws.read_prompt()


def test_memories_skip_bad_lines_and_add_memory_completes_a_torn_last_line(workspace):
    (workspace / "memory/episodic.jsonl").write_text('{"a": 1}\nnot json\n[1]\n{"b": 2}')
    ws = AgentWorkspace(workspace)
    assert ws.read_memories("episodic") == [{"a": 1}, {"b": 2}]
    ws.add_memory({"c": 3})
    assert ws.read_memories("episodic", limit=2) == [{"b": 2}, {"c": 3}]
    assert ws.read_memories("semantic") == []


# ------------------------------------------------------------------------------------ git


def test_import_commits_everything_and_tags_the_first_commit_evo_0(workspace):
    sha = workspace_import(workspace)
    assert git(workspace, "rev-parse", "evo-0^{commit}") == sha
    assert git(workspace, "tag") == "evo-0"
    assert git(workspace, "cat-file", "-t", "evo-0") == "tag"  # annotated
    assert git(workspace, "symbolic-ref", "HEAD") == "refs/heads/main"
    assert git(workspace, "status", "--porcelain") == ""
    assert git(workspace, "ls-files").splitlines() == [
        "manifest.yaml", "memory/episodic.jsonl", "prompts/fragments/reasoning.md", "prompts/system.md",
        "skills/code-search/SKILL.md", "tools/bash.py", "tools/registry.yaml",
    ]
    assert "Crucible-Snapshot: import" in git(workspace, "log", "-1", "--format=%B")
    assert git(workspace, "fsck", "--strict") == ""


def test_import_of_an_invalid_workspace_raises_with_every_problem_and_makes_no_repo(make_workspace):
    root = make_workspace(extra={"prompts/system.md": None, "memory/episodic.jsonl": "oops\n"})
    with pytest.raises(WorkspaceInvalid) as caught:
        workspace_import(root)
    assert [p.path for p in caught.value.problems] == ["memory/episodic.jsonl", "prompts/system.md"]
    assert not (root / ".git").exists()


def test_import_of_an_existing_repository_commits_its_changes_and_does_not_retag(workspace):
    git(workspace, "init", "-q", "-b", "trunk")
    git(workspace, "add", "-A")
    git(workspace, "commit", "-q", "-m", "mine")
    git(workspace, "tag", "evo-0")
    first = git(workspace, "rev-parse", "HEAD")
    (workspace / "prompts/system.md").write_text("Changed.\n")

    sha = workspace_import(workspace)
    assert git(workspace, "rev-parse", "HEAD~1") == first
    assert git(workspace, "rev-parse", "trunk") == sha
    assert git(workspace, "rev-parse", "evo-0^{commit}") == first  # not moved
    assert git(workspace, "status", "--porcelain") == ""
    assert workspace_import(workspace) == sha  # nothing to commit: HEAD, no new commit
    assert git(workspace, "rev-list", "--count", "HEAD") == "2"


def test_an_existing_repository_without_evo_0_gets_it_on_its_head(workspace):
    git(workspace, "init", "-q", "-b", "main")
    git(workspace, "add", "-A")
    git(workspace, "commit", "-q", "-m", "mine")
    sha = workspace_import(workspace)
    assert sha == git(workspace, "rev-parse", "HEAD") == git(workspace, "rev-parse", "evo-0^{commit}")


def test_evolution_observations_stay_outside_the_workspace_history(imported_workspace):
    root = imported_workspace
    assert "/evolution/" in (root / ".git/info/exclude").read_text().splitlines()
    files_ = {"evolution/observations/batch_0001.jsonl": '{"task_id": "t1"}\n'}
    for rel, text in files_.items():
        (root / rel).parent.mkdir(parents=True)
        (root / rel).write_text(text)
    workspace_snapshot(root, "pre-evo-1", "Before cycle 1")
    assert "evolution" not in git(root, "ls-tree", "-r", "--name-only", "pre-evo-1")
    assert git(root, "status", "--porcelain", "--ignored") == "!! evolution/"


def test_a_snapshot_commits_additions_changes_and_deletions_and_tags_them(imported_workspace):
    root = imported_workspace
    ws = AgentWorkspace(root)
    ws.write_prompt("New prompt.\n")
    ws.write_skill("verify", "---\nname: verify\ndescription: x\n---\n")
    ws.delete_skill("code-search")
    (root / "tools/bash.py").chmod(0o755)
    sha = workspace_snapshot(root, "evo-1", "Cycle 1: evolved", {"Crucible-Cycle": "1"})

    assert git(root, "rev-parse", "evo-1^{commit}") == sha == git(root, "rev-parse", "main")
    assert git(root, "cat-file", "-t", "evo-1") == "tag"
    assert git(root, "status", "--porcelain") == ""
    assert git(root, "diff", "--name-status", "--no-renames", "evo-0", "evo-1").splitlines() == [
        "M\tprompts/system.md", "D\tskills/code-search/SKILL.md", "A\tskills/verify/SKILL.md",
        "M\ttools/bash.py",
    ]
    assert git(root, "ls-tree", "evo-1", "tools/bash.py").startswith("100755")
    body = git(root, "log", "-1", "--format=%B", "evo-1")
    assert body.startswith("Cycle 1: evolved") and "Crucible-Cycle: 1" in body


def test_a_snapshot_without_changes_is_its_own_commit_with_the_same_tree(imported_workspace):
    root = imported_workspace
    first = workspace_snapshot(root, "pre-evo-1", "Before cycle 1")
    second = workspace_snapshot(root, "evo-1", "Cycle 1: no change")
    assert first != second
    assert git(root, "rev-parse", "evo-1^") == first
    assert git(root, "rev-parse", "evo-1^{tree}") == git(root, "rev-parse", "evo-0^{tree}")


def test_a_snapshot_refuses_to_move_an_existing_tag_and_commits_nothing(imported_workspace):
    root = imported_workspace
    workspace_snapshot(root, "evo-1", "Cycle 1")
    head = git(root, "rev-parse", "HEAD")
    (root / "prompts/system.md").write_text("Other.\n")
    with pytest.raises(WorkspaceError, match="tag evo-1 already exists; snapshot tags are never moved"):
        workspace_snapshot(root, "evo-1", "again")
    with pytest.raises(WorkspaceError, match="not a valid tag name"):
        workspace_snapshot(root, "bad..tag", "x")
    assert git(root, "rev-parse", "HEAD") == head == git(root, "rev-parse", "evo-1^{commit}")


def test_changed_paths_lists_the_name_status_between_two_refs(imported_workspace):
    root = imported_workspace
    AgentWorkspace(root).write_prompt("Changed.\n")
    AgentWorkspace(root).add_memory({"x": 1}, "semantic")
    (root / "tools/bash.py").unlink()
    workspace_snapshot(root, "evo-1", "Cycle 1")
    assert workspace_changed_paths(root, "evo-0", "evo-1") == [
        ("A", "memory/semantic.jsonl"), ("M", "prompts/system.md"), ("D", "tools/bash.py"),
    ]
    with pytest.raises(WorkspaceError, match="no branch, tag or commit"):
        workspace_changed_paths(root, "--output=/tmp/x", "evo-1")


def test_working_tree_changes_against_a_ref_include_untracked_files_and_leave_the_index_alone(
        imported_workspace):
    root = imported_workspace
    index = (root / ".git/index").read_bytes()
    AgentWorkspace(root).write_prompt("Changed.\n")
    (root / "manifest.yaml").unlink()
    (root / "notes.txt").write_text("new\n")
    (root / "evolution").mkdir()
    (root / "evolution/batch.jsonl").write_text("{}\n")
    assert workspace_changes(root, "evo-0") == [
        ("D", "manifest.yaml"), ("A", "notes.txt"), ("M", "prompts/system.md")]
    assert (root / ".git/index").read_bytes() == index
    status = git(root, "status", "--porcelain").splitlines()  # the index still holds evo-0
    assert sorted(line.strip() for line in status) == [
        "?? notes.txt", "D manifest.yaml", "M prompts/system.md"]


def test_restore_removes_added_files_and_brings_back_deleted_and_changed_ones(imported_workspace):
    root = imported_workspace
    (root / ".gitignore").write_text("*.cache\n")
    pre = workspace_snapshot(root, "pre-evo-1", "Before cycle 1")
    ws = AgentWorkspace(root)
    ws.write_skill("verify", "---\nname: verify\ndescription: x\n---\n")
    ws.write_prompt("Mutated.\n")
    (root / "tools/bash.py").unlink()
    (root / "skills/code-search").rename(root / "skills/moved")
    (root / "notes.txt").write_text("stray\n")
    (root / "evolution").mkdir()
    (root / "evolution/batch_0001.jsonl").write_text("{}\n")
    workspace_snapshot(root, "evo-1", "Cycle 1 (rejected)")
    (root / "uncommitted.md").write_text("also goes\n")
    (root / "run.cache").write_text("kept: ignored and untracked\n")

    assert workspace_restore(root, "pre-evo-1") == pre
    assert git(root, "rev-parse", "HEAD") == git(root, "rev-parse", "evo-1^{commit}")  # history untouched
    assert git(root, "diff", "--stat", "pre-evo-1") == ""  # working tree equals pre-evo-1
    assert git(root, "diff", "--cached", "--stat", "pre-evo-1") == ""  # and so does the index
    status = git(root, "status", "--porcelain", "--no-renames", "--untracked-files=all")
    assert sorted(status.splitlines()) == [
        "A  skills/code-search/SKILL.md", "A  tools/bash.py", "D  notes.txt", "D  skills/moved/SKILL.md",
        "D  skills/verify/SKILL.md", "M  prompts/system.md",
    ]
    assert not (root / "skills/verify").exists() and not (root / "skills/moved").exists()
    assert not (root / "uncommitted.md").exists()
    assert (root / "tools/bash.py").read_text() == "def run(command):\n    return command\n"
    assert (root / "run.cache").exists()
    assert (root / "evolution/batch_0001.jsonl").read_text() == "{}\n"
    assert workspace_validate(root) == []


def test_restore_removes_a_file_only_the_rejected_gitignore_ignored(imported_workspace):
    root = imported_workspace
    workspace_snapshot(root, "pre-evo-1", "Before cycle 1")
    (root / ".gitignore").write_text("*.cache\n")
    (root / "run.cache").write_text("would slip into the next snapshot\n")
    workspace_restore(root, "pre-evo-1")
    assert not (root / ".gitignore").exists() and not (root / "run.cache").exists()


def test_git_operations_on_a_folder_that_is_not_a_repository_say_so(workspace):
    with pytest.raises(WorkspaceError, match="not a git repository"):
        workspace_snapshot(workspace, "evo-1", "x")
    with pytest.raises(WorkspaceError, match="absolute path"):
        AgentWorkspace("relative/path")
    assert not os.path.exists(workspace / ".git")
    assert json.loads((workspace / "memory/episodic.jsonl").read_text())["lesson"]
