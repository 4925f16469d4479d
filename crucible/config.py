"""Crucible's settings from the environment: every variable known, typed and checked.

A wrong or unknown variable stops start-up with one line naming it (see manage.py).
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
import secrets
import stat
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

BASE_DIR = Path(__file__).resolve().parent.parent


class ConfigError(Exception):
    """A setting from the environment is unknown or malformed."""


@dataclass(frozen=True)
class Variable:
    name: str
    help: str
    default: str | None = None


# The single list of variables Crucible reads; README.md documents each of them.
VARIABLES: tuple[Variable, ...] = (
    Variable("CRUCIBLE_DATA_DIR", "where SQLite, the embedded broker, worktrees and keys live", "var"),
    Variable("CRUCIBLE_SECRET_KEY", "Django secret key; generated into the data dir if unset"),
    Variable("CRUCIBLE_DEBUG", "Django debug pages (never in production)", "false"),
    Variable("CRUCIBLE_ALLOWED_HOSTS", "comma-separated host names served", "127.0.0.1,localhost"),
    Variable("CRUCIBLE_CSRF_TRUSTED_ORIGINS", "comma-separated origins, e.g. https://crucible.example"),
    Variable("CRUCIBLE_HTTPS", "served behind HTTPS: secure cookies, HSTS, redirect", "false"),
    Variable("CRUCIBLE_HOST", "address `manage.py serve` binds", "127.0.0.1"),
    Variable("CRUCIBLE_PORT", "port `manage.py serve` binds", "8000"),
    Variable("CRUCIBLE_ADMIN_USERNAME", "the admin account `make run` creates", "admin"),
    Variable("CRUCIBLE_ADMIN_PASSWORD", "its password; generated and printed once if unset"),
    Variable("CRUCIBLE_WORKER_CONCURRENCY", "Celery worker processes `manage.py serve` starts", "2"),
    Variable("CRUCIBLE_EVENT_POLL_SECONDS", "how often live pages poll the DB for events"),
    Variable("CRUCIBLE_LOG_LEVEL", "DEBUG, INFO, WARNING or ERROR", "INFO"),
    Variable("CRUCIBLE_REPO_ROOTS", "comma-separated absolute dirs repositories may be registered under"),
    Variable("CRUCIBLE_REPO_URLS", "comma-separated git URL prefixes repositories may be registered (cloned) "
             "from, e.g. https://github.com/acme/"),
    Variable("CRUCIBLE_READ_ROOTS", "comma-separated absolute dirs a spec's read_paths may name "
             "(host paths its commands read, read-only)"),
    Variable("CRUCIBLE_EVALUATOR_ROOTS", "comma-separated absolute dirs hidden evaluator files may be "
             "read from at freeze"),
    Variable("CRUCIBLE_ALLOWED_EXTENSIONS",
             "comma-separated dotted paths of engines, agents and benchmarks the web and API may name"),
    Variable("CRUCIBLE_SANDBOX", "bubblewrap for commands: required, preferred or off", "preferred"),
    Variable("CRUCIBLE_SANDBOX_UID", "the unprivileged uid (and gid) sandboxed commands run as when the "
             "server runs as root", "65534"),
    Variable("CRUCIBLE_SANDBOX_TOOLCHAIN", "comma-separated absolute dirs commands may read besides /usr, "
             "/etc, /bin, /lib* and Crucible's Python (e.g. /opt/node)"),
    Variable("CRUCIBLE_LANE_DIR", "where the measurement-lane lock lives; workers on one host must share it "
             "(default: the data dir's locks/)"),
    Variable("CRUCIBLE_GIT_URL", "the web node's base URL workers fetch search baselines from when the "
             "repository is not on their disk, e.g. http://web.internal:8000"),
    Variable("CRUCIBLE_STEP_LEASE_SECONDS", "how long a worker's claim on a step lasts unrenewed", "60"),
    Variable("CRUCIBLE_AGENT_CLI_DIR", "where scripts/install_agent_clis.sh put the coding-agent CLIs the "
             "claude-code, codex and aider presets run", "var/agent-clis"),
    Variable("CRUCIBLE_PROVIDER_CONCURRENCY", "model calls in flight per provider account, machine-wide",
             "8"),
    Variable("CRUCIBLE_REQUIRED_APPROVALS", "approvals a winner needs before it can be merged", "1"),
    Variable("CRUCIBLE_SELF_APPROVAL", "whether a search's author may approve its winner", "false"),
    Variable("CRUCIBLE_DRAFT_MODEL", "preset:model the spec editor's draft button asks"),
    Variable("CRUCIBLE_AGENT_MODEL", "preset:model a reference agent (e.g. an A-Evolve seed) uses when its "
             "manifest names neither a preset nor a model"),
    Variable("CRUCIBLE_EMAIL_BACKEND", "where notification emails go: console, smtp or off", "console"),
    Variable("CRUCIBLE_EMAIL_HOST", "the SMTP server (with CRUCIBLE_EMAIL_BACKEND=smtp)", "localhost"),
    Variable("CRUCIBLE_EMAIL_PORT", "its port", "25"),
    Variable("CRUCIBLE_EMAIL_USER", "the SMTP user name, if the server wants one"),
    Variable("CRUCIBLE_EMAIL_PASSWORD", "its password"),
    Variable("CRUCIBLE_EMAIL_SECURITY", "none, starttls or ssl", "none"),
    Variable("CRUCIBLE_EMAIL_FROM", "the From address of notification emails", "crucible@localhost"),
    Variable("CRUCIBLE_WEBHOOK_ALLOW_LOOPBACK", "webhooks may point at loopback addresses (single-machine "
             "setups, tests)", "false"),
    Variable("CRUCIBLE_WEBHOOK_RETRY_SECONDS", "the first retry's delay of a failed webhook delivery; later "
             "ones wait 4, 20 and 120 times as long", "30"),
    Variable("CRUCIBLE_REQUIRE_SERVICES", "tests: a missing service fails instead of skipping", "false"),
    Variable("CRUCIBLE_BENCH_REDIS_URL", "benches only (bench/): the Redis their Redis lanes use; the app "
             "never reads it", "redis://127.0.0.1:6379/9"),
    Variable("CRUCIBLE_AEVOLVE_USER", "the account an A-Evolve script (crucible.aevolve) runs as (default: "
             "the admin account, else the first superuser, else a local `aevolve` account)"),
    Variable("CRUCIBLE_AEVOLVE_PROJECT", "the project an A-Evolve script's runs go in; made if missing",
             "a-evolve"),
    Variable("CRUCIBLE_AEVOLVE_PRESET", "the fleet preset an A-Evolve script's evolver model is called "
             "through (default: the one A-Evolve's provider choice names: bedrock, anthropic or openai)"),
    Variable("DATABASE_URL", "postgres://user:pass@host/db (default: SQLite in the data dir)"),
    Variable("REDIS_URL", "redis://host:6379/0: Celery broker and channel layer (distributed)"),
)
KNOWN_NAMES = frozenset(v.name for v in VARIABLES)
_DEFAULTS = {v.name: v.default for v in VARIABLES}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class Config:
    data_dir: Path
    secret_key: str | None
    debug: bool
    allowed_hosts: list[str]
    csrf_trusted_origins: list[str]
    https: bool
    host: str
    port: int
    admin_username: str
    admin_password: str | None
    worker_concurrency: int
    event_poll_seconds: float
    log_level: str
    require_services: bool
    repo_roots: list[Path]
    repo_urls: tuple[str, ...]
    read_roots: list[Path]
    evaluator_roots: list[Path]
    allowed_extensions: tuple[str, ...]
    sandbox: str
    sandbox_uid: int
    sandbox_toolchain: list[Path]
    lane_dir: Path | None
    git_url: str
    agent_cli_dir: Path
    step_lease_seconds: int
    provider_concurrency: int
    required_approvals: int
    self_approval: bool
    draft_model: str
    agent_model: str
    email_backend: str
    email_host: str
    email_port: int
    email_user: str
    email_password: str
    email_security: str
    email_from: str
    webhook_allow_loopback: bool
    webhook_retry_seconds: float
    database_url: str | None
    redis_url: str | None


def _boolean(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean; use true or false")


def _integer(name: str, raw: str, low: int, high: int) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a whole number") from None
    if not low <= value <= high:
        raise ConfigError(f"{name}={value} is out of range; expected {low} to {high}")
    return value


def _number(name: str, raw: str, low: float, high: float) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if not low <= value <= high:
        raise ConfigError(f"{name}={value} is out of range; expected {low} to {high}")
    return value


def _url(name: str, raw: str, schemes: tuple[str, ...]) -> str:
    parsed = urlparse(raw.strip())
    if parsed.scheme not in schemes:
        raise ConfigError(
            f"{name} must start with {' or '.join(s + '://' for s in schemes)}; got {raw!r}"
        )
    if parsed.scheme != "sqlite" and not parsed.hostname:
        raise ConfigError(f"{name}={raw!r} names no host")
    return raw.strip()


def _words(raw: str) -> list[str]:
    return [word.strip() for word in raw.split(",") if word.strip()]


def _directories(name: str, raw: str) -> list[Path]:
    roots = []
    for word in _words(raw):
        path = Path(word)
        if not path.is_absolute():
            raise ConfigError(f"{name}: {word!r} is not an absolute path")
        roots.append(Path(os.path.normpath(path)))
    return roots


def _url_prefixes(name: str, raw: str) -> tuple[str, ...]:
    prefixes = []
    for word in _words(raw):
        parsed = urlparse(word)
        if parsed.scheme not in ("https", "http", "ssh", "git", "file"):
            raise ConfigError(f"{name}: {word!r} must start with https://, http://, ssh://, git:// or file://")
        if parsed.scheme != "file" and not parsed.hostname:
            raise ConfigError(f"{name}: {word!r} names no host")
        if parsed.username or parsed.password or parsed.query or parsed.fragment:
            raise ConfigError(f"{name}: {word!r} may not hold a user, password, query or fragment")
        prefixes.append(word)
    return tuple(prefixes)


def _directory(name: str, raw: str) -> Path | None:
    roots = _directories(name, raw)
    if len(roots) > 1:
        raise ConfigError(f"{name}={raw!r}: give one absolute directory")
    return roots[0] if roots else None


_DOTTED_PATH = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+(?::[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)?")


def _dotted_paths(name: str, raw: str) -> tuple[str, ...]:
    paths = []
    for word in _words(raw):
        if not _DOTTED_PATH.fullmatch(word):
            raise ConfigError(f"{name}: {word!r} is not a dotted path such as package.module.Name")
        paths.append(word)
    return tuple(paths)


def _draft_model(raw: str, name: str = "CRUCIBLE_DRAFT_MODEL") -> str:
    value = raw.strip()
    if value and (value.count(":") < 1 or not all(part.strip() for part in value.split(":", 1))):
        raise ConfigError(f"{name}={raw!r}; use preset:model, e.g. anthropic:claude-sonnet-4-5")
    return value


def _unknown_variables(environ: Mapping[str, str]) -> None:
    for name in sorted(environ):
        if name.startswith("CRUCIBLE_") and name not in KNOWN_NAMES:
            close = difflib.get_close_matches(name, KNOWN_NAMES, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise ConfigError(f"{name} is not a Crucible setting{hint}")


def load(environ: Mapping[str, str] | None = None) -> Config:
    """Read and check every variable; raise ConfigError naming the first bad one."""
    env = os.environ if environ is None else environ
    _unknown_variables(env)

    def get(name: str) -> str | None:
        value = env.get(name)
        return _DEFAULTS[name] if value is None else value

    data_dir = Path(get("CRUCIBLE_DATA_DIR") or "var")
    if not data_dir.is_absolute():
        data_dir = BASE_DIR / data_dir
    redis_url = get("REDIS_URL") or None
    if redis_url:
        redis_url = _url("REDIS_URL", redis_url, ("redis", "rediss"))
    database_url = get("DATABASE_URL") or None
    if database_url:
        database_url = _url("DATABASE_URL", database_url, ("postgres", "postgresql", "sqlite"))
    log_level = (get("CRUCIBLE_LOG_LEVEL") or "INFO").upper()
    if log_level not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
        raise ConfigError(f"CRUCIBLE_LOG_LEVEL={log_level!r}; use DEBUG, INFO, WARNING or ERROR")
    poll = get("CRUCIBLE_EVENT_POLL_SECONDS")
    # Without Redis the channel layer cannot cross processes, so pages poll often.
    event_poll_seconds = (
        _number("CRUCIBLE_EVENT_POLL_SECONDS", poll, 0.05, 60) if poll else (5.0 if redis_url else 0.5)
    )
    sandbox = (get("CRUCIBLE_SANDBOX") or "preferred").strip().lower()
    if sandbox not in {"required", "preferred", "off"}:
        raise ConfigError(f"CRUCIBLE_SANDBOX={sandbox!r}; use required, preferred or off")
    secret_key = get("CRUCIBLE_SECRET_KEY") or None
    git_url = (get("CRUCIBLE_GIT_URL") or "").strip()
    if "@" in urlparse(git_url).netloc:  # the fetch token is derived per search, never configured
        raise ConfigError("CRUCIBLE_GIT_URL has a user or password; workers authenticate per search")
    email_backend = (get("CRUCIBLE_EMAIL_BACKEND") or "console").strip().lower()
    if email_backend not in {"console", "smtp", "off"}:
        raise ConfigError(f"CRUCIBLE_EMAIL_BACKEND={email_backend!r}; use console, smtp or off")
    email_security = (get("CRUCIBLE_EMAIL_SECURITY") or "none").strip().lower()
    if email_security not in {"none", "starttls", "ssl"}:
        raise ConfigError(f"CRUCIBLE_EMAIL_SECURITY={email_security!r}; use none, starttls or ssl")
    email_from = (get("CRUCIBLE_EMAIL_FROM") or "crucible@localhost").strip()
    if "@" not in email_from or any(c.isspace() for c in email_from.split("<")[-1]):
        raise ConfigError(f"CRUCIBLE_EMAIL_FROM={email_from!r} is not an email address")
    if secret_key is not None and len(secret_key) < 32:
        raise ConfigError("CRUCIBLE_SECRET_KEY is shorter than 32 characters")
    return Config(
        data_dir=data_dir,
        secret_key=secret_key,
        debug=_boolean("CRUCIBLE_DEBUG", get("CRUCIBLE_DEBUG") or ""),
        allowed_hosts=_words(get("CRUCIBLE_ALLOWED_HOSTS") or ""),
        csrf_trusted_origins=[
            _url("CRUCIBLE_CSRF_TRUSTED_ORIGINS", origin, ("http", "https"))
            for origin in _words(get("CRUCIBLE_CSRF_TRUSTED_ORIGINS") or "")
        ],
        https=_boolean("CRUCIBLE_HTTPS", get("CRUCIBLE_HTTPS") or ""),
        host=get("CRUCIBLE_HOST") or "127.0.0.1",
        port=_integer("CRUCIBLE_PORT", get("CRUCIBLE_PORT") or "", 1, 65535),
        admin_username=get("CRUCIBLE_ADMIN_USERNAME") or "admin",
        admin_password=get("CRUCIBLE_ADMIN_PASSWORD") or None,
        worker_concurrency=_integer(
            "CRUCIBLE_WORKER_CONCURRENCY", get("CRUCIBLE_WORKER_CONCURRENCY") or "", 1, 64
        ),
        event_poll_seconds=event_poll_seconds,
        log_level=log_level,
        require_services=_boolean(
            "CRUCIBLE_REQUIRE_SERVICES", get("CRUCIBLE_REQUIRE_SERVICES") or ""
        ),
        database_url=database_url,
        redis_url=redis_url,
        repo_roots=_directories("CRUCIBLE_REPO_ROOTS", get("CRUCIBLE_REPO_ROOTS") or ""),
        repo_urls=_url_prefixes("CRUCIBLE_REPO_URLS", get("CRUCIBLE_REPO_URLS") or ""),
        read_roots=_directories("CRUCIBLE_READ_ROOTS", get("CRUCIBLE_READ_ROOTS") or ""),
        evaluator_roots=_directories("CRUCIBLE_EVALUATOR_ROOTS", get("CRUCIBLE_EVALUATOR_ROOTS") or ""),
        allowed_extensions=_dotted_paths(
            "CRUCIBLE_ALLOWED_EXTENSIONS", get("CRUCIBLE_ALLOWED_EXTENSIONS") or ""
        ),
        sandbox=sandbox,
        sandbox_uid=_integer("CRUCIBLE_SANDBOX_UID", get("CRUCIBLE_SANDBOX_UID") or "", 1, 2**31 - 2),
        sandbox_toolchain=_directories("CRUCIBLE_SANDBOX_TOOLCHAIN", get("CRUCIBLE_SANDBOX_TOOLCHAIN") or ""),
        lane_dir=_directory("CRUCIBLE_LANE_DIR", get("CRUCIBLE_LANE_DIR") or ""),
        git_url=_url("CRUCIBLE_GIT_URL", git_url, ("http", "https")).rstrip("/") if git_url else "",
        # Relative to the checkout (not the working directory), where CI installs them.
        agent_cli_dir=Path(__file__).resolve().parent.parent
        / (get("CRUCIBLE_AGENT_CLI_DIR") or "var/agent-clis"),
        draft_model=_draft_model(get("CRUCIBLE_DRAFT_MODEL") or ""),
        agent_model=_draft_model(get("CRUCIBLE_AGENT_MODEL") or "", "CRUCIBLE_AGENT_MODEL"),
        provider_concurrency=_integer(
            "CRUCIBLE_PROVIDER_CONCURRENCY", get("CRUCIBLE_PROVIDER_CONCURRENCY") or "", 1, 256
        ),
        step_lease_seconds=_integer(
            "CRUCIBLE_STEP_LEASE_SECONDS", get("CRUCIBLE_STEP_LEASE_SECONDS") or "", 3, 3600
        ),
        required_approvals=_integer(
            "CRUCIBLE_REQUIRED_APPROVALS", get("CRUCIBLE_REQUIRED_APPROVALS") or "", 1, 20
        ),
        self_approval=_boolean("CRUCIBLE_SELF_APPROVAL", get("CRUCIBLE_SELF_APPROVAL") or ""),
        email_backend=email_backend,
        email_host=(get("CRUCIBLE_EMAIL_HOST") or "localhost").strip(),
        email_port=_integer("CRUCIBLE_EMAIL_PORT", get("CRUCIBLE_EMAIL_PORT") or "", 1, 65535),
        email_user=get("CRUCIBLE_EMAIL_USER") or "",
        email_password=get("CRUCIBLE_EMAIL_PASSWORD") or "",
        email_security=email_security,
        email_from=email_from,
        webhook_allow_loopback=_boolean(
            "CRUCIBLE_WEBHOOK_ALLOW_LOOPBACK", get("CRUCIBLE_WEBHOOK_ALLOW_LOOPBACK") or ""
        ),
        webhook_retry_seconds=_number(
            "CRUCIBLE_WEBHOOK_RETRY_SECONDS", get("CRUCIBLE_WEBHOOK_RETRY_SECONDS") or "", 0, 3600
        ),
    )


def persistent_secret(path: Path, make: Callable[[], str] = lambda: secrets.token_urlsafe(50)) -> str:
    """Return the secret stored at path, creating it (mode 600) on first use."""
    if path.exists():
        private_tighten(path)
        return path.read_text().strip()
    path.parent.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    value = make()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process (web or worker) made it first
        return path.read_text().strip()
    with os.fdopen(fd, "w") as handle:
        handle.write(value)
    return value


PRIVATE_DIR_MODE, PRIVATE_FILE_MODE = 0o700, 0o600
# Files SQLite keeps beside a database; they hold its pages (sessions included) too.
SQLITE_COMPANIONS = ("", "-wal", "-shm", "-journal")


def private_tighten(path: Path) -> None:
    """Take group and other permissions off `path` (an older install may have left them);
    never loosens, never follows a symlink; a file Crucible's user does not own is reported."""
    try:
        current = os.lstat(path).st_mode
        if stat.S_ISLNK(current) or not stat.S_IMODE(current) & 0o077:
            return
        os.chmod(path, stat.S_IMODE(current) & 0o700)
    except FileNotFoundError:
        pass
    except OSError as error:
        print(f"crucible: could not make {path} private to its owner: {error}", file=sys.stderr)


def private_dir(path: Path) -> Path:
    """A directory only Crucible's user can enter: created 0700, tightened if it exists."""
    path.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    private_tighten(path)
    return path


def private_file(path: Path) -> Path:
    """An existing file tightened, a missing one created empty with mode 600 (so SQLite, which
    gives its -wal and -shm files the database's mode, opens a file that is private already)."""
    if not path.exists():
        # Made first by another process, or not makeable here: SQLite then says why when it opens.
        with contextlib.suppress(FileExistsError, FileNotFoundError, PermissionError):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE))
    for suffix in SQLITE_COMPANIONS:
        private_tighten(path.with_name(path.name + suffix))
    return path


def data_dir_secure(data_dir: Path, *private_trees: Path) -> None:
    """The data dir 0700, every file at its top 0600 (the database and its companions, the
    secret key, key files, beat's schedule), and each of `private_trees` (e.g. the broker's
    queue) 0700 for its directories and 0600 for its files. Runs at every start."""
    private_dir(data_dir)
    for entry in data_dir.iterdir():
        if entry.is_file() and not entry.is_symlink():
            private_tighten(entry)
    for tree in private_trees:
        if not tree.is_dir() or tree.is_symlink():
            continue
        private_tighten(tree)
        for root, dirs, files in os.walk(tree):
            for name in (*dirs, *files):
                private_tighten(Path(root) / name)


def load_or_exit() -> Config:
    """load() for process entry points (Daphne, Celery): one line and exit 2 on error."""
    try:
        return load()
    except ConfigError as error:
        print(f"crucible: configuration error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
