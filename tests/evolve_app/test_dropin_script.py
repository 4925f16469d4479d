"""A-Evolve's own quick-start script shape, with only its import line changed to `import crucible.aevolve
as ae`, run as a real subprocess: the user's BaseAgent (calling the real Anthropic SDK), their
BenchmarkAdapter, A-Evolve's EvolveConfig and default engine (SkillForge, as Crucible's aevolve-skillforge:
its model the loopback fake, its bash in the sandbox). The run and its cycles are in the database, with
receipts; the user's folder is byte for byte as it was; the result is A-Evolve's EvolutionResult."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from evolve_app.models import Cycle, EvolutionRun
from runtime_app import sandbox
from runtime_app.models import Receipt
from tests.evolve_app.helpers import files_write
from tests.fakes.anthropic_server import FakeAnthropic
from tests.helpers import REPO_ROOT, service_missing, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "sk-ant-test-secret-dropin-0123"

# A-Evolve's quick-start shape (README: "Bring Your Own Agent", then `ae.Evolver(...).run(cycles=N)`).
A_EVOLVE_SCRIPT = '''\
import dataclasses
import json

import anthropic
import agent_evolve as ae


class MyAgent(ae.BaseAgent):
    def solve(self, task: ae.Task) -> ae.Trajectory:
        skills = ", ".join(skill.name for skill in self.skills) or "none"
        reply = anthropic.Anthropic().messages.create(
            model="claude-sonnet-4-5", max_tokens=64,
            system=f"{self.system_prompt}\\nSkills: {skills}",
            messages=[{"role": "user", "content": task.input}])
        return ae.Trajectory(task_id=task.id, output=reply.content[0].text)


class MyBench(ae.BenchmarkAdapter):
    def get_tasks(self, split="train", limit=10):
        return [ae.Task(id=f"{split}-{n}", input=f"What is 6 x 7? ({n})") for n in range(limit)]

    def evaluate(self, task, trajectory):
        right = trajectory.output.strip() == "42"
        return ae.Feedback(success=right, score=float(right), detail="the answer is 42")


evolver = ae.Evolver(
    agent=MyAgent("./my_agent"),
    benchmark=MyBench(),
    config=ae.EvolveConfig(batch_size=5, max_cycles=10),
)
result = evolver.run(cycles=3)
print(json.dumps(dataclasses.asdict(result)))
'''

WRITE_SKILL = ("mkdir -p skills/multiply && printf -- '---\\nname: multiply\\ndescription: Multiply two "
               "numbers.\\n---\\n\\n6 x 7 = 42\\n' > skills/multiply/SKILL.md")


def model(request, _candidate):
    """The evolver (offered workspace_bash) writes a multiply skill, then says so; the user's agent
    answers 42 once its system prompt lists that skill."""
    if any(tool["name"] == "workspace_bash" for tool in request.get("tools", [])):
        last = request["messages"][-1]["content"]
        if isinstance(last, list) and any(block.get("type") == "tool_result" for block in last):
            return [{"type": "text", "text": "Added the multiply skill."}]
        return [{"type": "tool_use", "id": "toolu_0001", "name": "workspace_bash",
                 "input": {"command": WRITE_SKILL}}]
    system = json.dumps(request.get("system", ""))
    return [{"type": "text", "text": "42" if "multiply" in system else "41"}]


def tree_bytes(root: Path) -> dict[str, str]:
    return {str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
            if path.is_file() else "" for path in sorted(root.rglob("*"))}


def test_a_evolves_quick_start_script_runs_under_crucible_with_only_its_import_line_changed(tmp_path,
                                                                                           settings):
    ready, reason = sandbox.bubblewrap_probe()
    if not ready:
        service_missing(reason)  # A-Evolve's default engine runs its bash only in the sandbox
    settings.DATA_DIR = tmp_path / "data"
    settings.DATA_DIR.mkdir()
    folder = tmp_path / "my_agent"
    files_write(folder, {"prompts/system.md": "You answer arithmetic questions.\n",
                         "memory/episodic.jsonl": ""})
    before = tree_bytes(folder)
    script = A_EVOLVE_SCRIPT.replace("import agent_evolve as ae\n", "import crucible.aevolve as ae\n")
    changed = [pair for pair in zip(A_EVOLVE_SCRIPT.splitlines(), script.splitlines(), strict=True)
               if pair[0] != pair[1]]
    assert changed == [("import agent_evolve as ae", "import crucible.aevolve as ae")]
    (tmp_path / "evolve.py").write_text(script)
    with FakeAnthropic(script=model) as fake:
        env = subprocess_env(CRUCIBLE_DATA_DIR=str(settings.DATA_DIR), ANTHROPIC_API_KEY=KEY,
                             ANTHROPIC_BASE_URL=fake.base_url, CRUCIBLE_AEVOLVE_PRESET="anthropic",
                             PYTHONPATH=str(REPO_ROOT))
        done = subprocess.run([sys.executable, "evolve.py"], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(result) == {"cycles_completed", "final_score", "score_history", "converged", "details"}
    assert result["cycles_completed"] == 3 and result["score_history"] == [0.0, 1.0, 1.0]
    assert (result["final_score"], result["converged"]) == (1.0, False)
    run = EvolutionRun.objects.get(pk=result["details"]["run_id"])
    assert (run.driver, run.status, run.engine, run.cycles_planned) == ("script", "finished",
                                                                         "aevolve-skillforge", 3)
    assert run.benchmark == "__main__.MyBench"
    assert result["details"]["url"].endswith(run.get_absolute_url())
    cycles = list(Cycle.objects.filter(run=run).order_by("number"))
    assert [c.number for c in cycles] == [1, 2, 3]
    assert cycles[0].skills_added == ["multiply"] and cycles[0].status == "accepted"
    assert cycles[0].holdout_score == 0.0 and cycles[0].holdout_after == 1.0  # round(0.2 x 5) = 1 task
    assert cycles[0].observations.filter(split="train").count() == 5
    # The evolver's model calls and its sandboxed commands left receipts; the key is in none of them.
    calls = Receipt.objects.filter(kind="llm_call", label__startswith="aevolve-skillforge")
    commands = Receipt.objects.filter(label="aevolve-skillforge workspace_bash")
    assert calls.exists() and commands.exists()
    assert commands.first().detail["sandbox"]["network"].startswith("none")
    assert KEY not in json.dumps([receipt.as_dict() for receipt in Receipt.objects.all()])
    # Crucible evolved its own copy; the user's folder is byte for byte as it was, no work dir made.
    copy = Path(run.agent.path)
    assert (copy / "skills" / "multiply" / "SKILL.md").is_file() and copy.is_relative_to(settings.DATA_DIR)
    assert tree_bytes(folder) == before
    assert not (tmp_path / "evolution_workdir").exists()
