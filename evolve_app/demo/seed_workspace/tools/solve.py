"""The demo agent's solver: it knows how to compute, but not what to compute.

It reads the task from stdin and answers on stdout. What to do with a task comes only from
the workspace: every fenced ```rule block in `skills/*/SKILL.md`, and every memory entry
(`memory/*.jsonl`) that carries a `"rule": {"when": ..., "answer": ...}` object. A rule is

    when: a regular expression searched in the task (case-insensitive, multi-line);
          {number}, {date}, {text} and {word} stand for common shapes; named groups
          become variables (numbers become numbers)
    answer: an expression over those variables: + - * / // %, numbers, strings, and
          the functions in FUNCTIONS below

The first rule that matches answers (skills in name order, then memory). No rule: exit 3
with a message on stderr. Standard library only; it runs inside the sandbox.
"""

from __future__ import annotations

import ast
import datetime
import json
import operator
import re
import sys
from collections.abc import Callable
from pathlib import Path

WORKSPACE = Path(__file__).resolve().parent.parent
NO_RULE = 3
SHAPES = {
    "{number}": r"-?\d+(?:\.\d+)?",
    "{date}": r"\d{4}-\d{2}-\d{2}",
    "{text}": r"[^\n]+",
    "{word}": r"\w+",
}
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
MAX_TEXT = 100_000
Value = int | float | str  # what a rule's names and expressions hold


class RuleError(Exception):
    pass


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise RuleError(f"expected text, got {value!r}")
    return value


def _whole(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise RuleError(f"expected a whole number, got {value!r}")
    return int(value)


def _date(value: object) -> datetime.date:
    try:
        return datetime.date.fromisoformat(_text(value))
    except ValueError as error:
        raise RuleError(f"not a YYYY-MM-DD date: {value!r}") from error


def _to_base(number: object, base: object) -> str:
    number, base = _whole(number), _whole(base)
    if not 2 <= base <= 36:
        raise RuleError(f"base {base} is not between 2 and 36")
    sign, number = ("-", -number) if number < 0 else ("", number)
    digits = ""
    while True:
        number, digit = divmod(number, base)
        digits = DIGITS[digit] + digits
        if not number:
            return sign + digits


FUNCTIONS: dict[str, Callable[..., Value]] = {
    "reverse": lambda s: _text(s)[::-1],
    "upper": lambda s: _text(s).upper(),
    "lower": lambda s: _text(s).lower(),
    "title": lambda s: _text(s).title(),
    "strip": lambda s: _text(s).strip(),
    "length": lambda s: len(_text(s)),
    "count_any": lambda s, chars: sum(1 for c in _text(s) if c in _text(chars)),
    "add_days": lambda d, n: (_date(d) + datetime.timedelta(days=_whole(n))).isoformat(),
    "days_between": lambda a, b: (_date(b) - _date(a)).days,
    "weekday": lambda d: WEEKDAYS[_date(d).weekday()],
    "to_base": _to_base,
    "from_base": lambda s, base: int(_text(s), _whole(base)),
    "round": lambda x, n=0: round(x, _whole(n)),
    "abs": abs,
}
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
             ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}


def evaluate(node: ast.AST, names: dict[str, Value]) -> Value:
    """A small, safe expression language: no attributes, no power, no names but the rule's."""
    if isinstance(node, ast.Expression):
        return evaluate(node.body, names)
    if (isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str))
            and not isinstance(node.value, bool)):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in names:
            raise RuleError(f"the answer uses {node.id!r}, which the pattern does not capture")
        return names[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = evaluate(node.operand, names)
        if isinstance(value, str):
            raise RuleError("a sign in front of text")
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        left, right = evaluate(node.left, names), evaluate(node.right, names)
        texts = isinstance(left, str) + isinstance(right, str)
        if texts and not (texts == 2 and isinstance(node.op, ast.Add)):
            raise RuleError("text only supports + with other text")
        try:
            result: Value = OPERATORS[type(node.op)](left, right)
            return result
        except ZeroDivisionError as error:
            raise RuleError("division by zero") from error
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        function = FUNCTIONS.get(node.func.id)
        if function is None:
            raise RuleError(f"unknown function {node.func.id!r}; known: {', '.join(sorted(FUNCTIONS))}")
        try:
            return function(*(evaluate(arg, names) for arg in node.args))
        except (TypeError, ValueError) as error:
            raise RuleError(f"{node.func.id}: {error}") from error
    raise RuleError(f"unsupported expression: {ast.unparse(node)}")


def parse_rules(text: str, source: str) -> list[dict[str, str]]:
    """Rules from every ```rule block of a markdown text; each `when:` starts a new rule."""
    rules: list[dict[str, str]] = []
    for block in re.findall(r"^```rule[ \t]*\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
        for line in block.splitlines():
            key, _, value = line.partition(":")
            key, value = key.strip().lower(), value.strip()
            if key == "when":
                rules.append({"when": value, "answer": "", "source": source})
            elif key == "answer" and rules and not rules[-1]["answer"]:
                rules[-1]["answer"] = value
    return [rule for rule in rules if rule["when"] and rule["answer"]]


def load_rules() -> list[dict[str, str]]:
    rules = []
    for skill in sorted(WORKSPACE.glob("skills/*/SKILL.md")):
        rules += parse_rules(skill.read_text(errors="replace"), str(skill.relative_to(WORKSPACE)))
    for memory in sorted(WORKSPACE.glob("memory/*.jsonl")):
        for number, line in enumerate(memory.read_text(errors="replace").splitlines(), 1):
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            rule = entry.get("rule") if isinstance(entry, dict) else None
            when, answer = (rule.get("when"), rule.get("answer")) if isinstance(rule, dict) else (None, None)
            if isinstance(when, str) and isinstance(answer, str):
                source = f"{memory.relative_to(WORKSPACE)}:{number}"
                rules.append({"when": when, "answer": answer, "source": source})
    return rules


def render(value: object) -> str:
    if isinstance(value, bool):
        raise RuleError("the answer is a truth value, not a number or text")
    if isinstance(value, float):
        if value == int(value):
            return str(int(value))
        return f"{value:.9f}".rstrip("0").rstrip(".")
    return str(value)


def solve(task: str, rules: list[dict[str, str]]) -> tuple[str, dict[str, str]] | None:
    for rule in rules:
        pattern = rule["when"]
        for shape, regex in SHAPES.items():
            pattern = pattern.replace(shape, regex)
        try:
            found = re.search(pattern, task, re.IGNORECASE | re.MULTILINE)
        except re.error as error:
            print(f"skipped a rule in {rule['source']}: bad pattern ({error})", file=sys.stderr)
            continue
        if not found:
            continue
        names: dict[str, Value] = {}
        for name, value in found.groupdict().items():
            value = value or ""
            names[name] = (float(value) if "." in value else int(value)) if NUMBER.fullmatch(value) else value
        try:
            answer = render(evaluate(ast.parse(rule["answer"], mode="eval"), names))
        except (RuleError, SyntaxError) as error:
            print(f"a rule in {rule['source']} matched but failed: {error}", file=sys.stderr)
            continue
        return answer, rule
    return None


def main() -> int:
    task = sys.stdin.read(MAX_TEXT)
    rules = load_rules()
    solved = solve(task, rules)
    if solved is None:
        sources = sorted({rule["source"] for rule in rules}) or ["none"]
        print(f"no rule in the workspace matches this task (rules come from: {', '.join(sources)})",
              file=sys.stderr)
        return NO_RULE
    answer, rule = solved
    print(f"applied the rule from {rule['source']}: when {rule['when']}", file=sys.stderr)
    print(answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
