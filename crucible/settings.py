"""Django settings for Crucible, all from the environment (see crucible/config.py)."""

from __future__ import annotations

from pathlib import Path

import dj_database_url

from crucible.config import BASE_DIR, data_dir_secure, load, persistent_secret, private_dir, private_file

CONFIG = load()
DATA_DIR = CONFIG.data_dir
# Sessions, keys and the queue live here: only Crucible's user may enter (see docs/security.md).
private_dir(DATA_DIR)

SECRET_KEY = CONFIG.secret_key or persistent_secret(DATA_DIR / "secret_key")
DEBUG = CONFIG.debug
ALLOWED_HOSTS = CONFIG.allowed_hosts
CSRF_TRUSTED_ORIGINS = CONFIG.csrf_trusted_origins

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django_htmx",
    "channels",
    "ninja",
    "runtime_app",
    "search_app",
    "evolve_app",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "runtime_app.signals.AuditActorMiddleware",
    # Every page needs a login unless its view is marked login_not_required.
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # A page's git reads (GET, HEAD) do not wait for timing trials (runtime_app/lane.py).
    "runtime_app.lane.PageReadsMiddleware",
]

# "derived": what a page derives from immutable content (a compare diff, a cycle's diff), keyed by
# the content's hashes, so an entry is never stale; per process, at most 64 entries of ≤ 2 MB.
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "derived": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "crucible-derived",
                "TIMEOUT": 3600, "OPTIONS": {"MAX_ENTRIES": 64}},
}

ROOT_URLCONF = "crucible.urls"
ASGI_APPLICATION = "crucible.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# SQLite by default: WAL lets the web server read while the worker writes, the busy
# timeout waits out the other writer, and IMMEDIATE transactions take the write lock
# up front so a read-then-write transaction never fails with "database is locked".
_SQLITE_OPTIONS = {
    "timeout": 30,
    "transaction_mode": "IMMEDIATE",
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=30000;",
}
if CONFIG.database_url:
    DATABASES = {"default": dj_database_url.parse(CONFIG.database_url, conn_max_age=60)}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": DATA_DIR / "crucible.sqlite3",
            # A file, not memory, so test subprocesses (worker, Daphne) share it.
            "TEST": {"NAME": DATA_DIR / "test.sqlite3"},
        }
    }
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Django's SQLite, whose writers of one process queue on a lock of the process (crucible/db/sqlite3).
    DATABASES["default"]["ENGINE"] = "crucible.db.sqlite3"
    DATABASES["default"].setdefault("OPTIONS", {}).update(_SQLITE_OPTIONS)
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    _SQLITE_NAME = str(DATABASES["default"]["NAME"])
    if _SQLITE_NAME and _SQLITE_NAME != ":memory:" and not _SQLITE_NAME.startswith("file:"):
        private_file(Path(_SQLITE_NAME))  # before SQLite first opens it, so it is never 0644
DATABASES["default"]["ATOMIC_REQUESTS"] = False
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_DIR / "static"
STATIC_ROOT.mkdir(exist_ok=True)
# Serve straight from the app and static/ dirs, so no collectstatic step is needed.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# Live events: Redis fans nudges out across processes; without it the in-memory layer
# nudges within one process and consumers poll the DB (EVENT_POLL_SECONDS).
if CONFIG.redis_url:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # redis-py 8 gives up on a read after 5 s, exactly channels_redis's 5 s blocking
            # pop: without a longer timeout every idle socket's consumer dies every 5 s.
            "CONFIG": {"hosts": [{"address": CONFIG.redis_url, "socket_timeout": 30}]},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
EVENT_POLL_SECONDS = CONFIG.event_poll_seconds

# Celery: tasks carry ids only; the DB holds all state, so results are not stored.
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BEAT_SCHEDULE_FILENAME = str(DATA_DIR / "celerybeat-schedule")
CELERY_BEAT_SCHEDULE = {
    "worker-heartbeat": {"task": "runtime_app.tasks.worker_heartbeat", "schedule": 10.0},
    # Takes back steps whose worker died and re-drives running searches (lost messages).
    "steps-reconcile": {"task": "search_app.tasks.steps_reconcile", "schedule": 5.0},
    # The same for evolution runs: a run whose worker died is taken over once its lease passes.
    "evolution-runs-reconcile": {"task": "evolve_app.tasks.evolution_runs_reconcile", "schedule": 15.0},
    # Webhook deliveries whose retry is due, or whose worker died mid-attempt, are sent again.
    "webhook-deliveries-reconcile": {"task": "runtime_app.tasks.webhook_deliveries_reconcile",
                                     "schedule": 15.0},
}
if CONFIG.redis_url:
    CELERY_BROKER_URL = CONFIG.redis_url
    # Above the longest step, so a slow step is not redelivered while it still runs.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 6 * 3600}
else:
    _BROKER_DIR = DATA_DIR / "broker"
    CELERY_BROKER_URL = "filesystem://"
    # kombu's filesystem transport with atomic writes and a reader that sets a bad file aside
    # instead of dying on it (kombu issue #1551): see runtime_app/broker.py.
    CELERY_BROKER_TRANSPORT = "runtime_app.broker:Transport"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_BROKER_DIR / "queue"),
        "data_folder_out": str(_BROKER_DIR / "queue"),
        "control_folder": str(_BROKER_DIR / "control"),
        "processed_folder": str(_BROKER_DIR / "processed"),
        "quarantine_folder": str(_BROKER_DIR / "quarantine"),
        "store_processed": False,
        # The default (1 s) moves about two tasks a second; 0.05 s keeps steps flowing.
        "polling_interval": 0.05,
    }
    for _name in ("queue", "control", "processed", "quarantine"):
        private_dir(_BROKER_DIR / _name)

# Tighten what an older install (or a process with a looser umask) left readable by others.
data_dir_secure(DATA_DIR, DATA_DIR / "broker")

# Security: the same posture everywhere; HTTPS-only parts switch on with CRUCIBLE_HTTPS.
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # htmx reads the token from the page, not the cookie
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
if CONFIG.https:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = 31536000
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True

NINJA_PAGINATION_PER_PAGE = 50

# Notification emails (runtime_app/notifications.py): the log by default (runtime_app/mail.py: never
# a command's standard output), SMTP when configured.
EMAIL_BACKEND = {
    "console": "runtime_app.mail.LogEmailBackend",
    "smtp": "django.core.mail.backends.smtp.EmailBackend",
    "off": "django.core.mail.backends.dummy.EmailBackend",
}[CONFIG.email_backend]
EMAIL_HOST = CONFIG.email_host
EMAIL_PORT = CONFIG.email_port
EMAIL_HOST_USER = CONFIG.email_user
EMAIL_HOST_PASSWORD = CONFIG.email_password
EMAIL_USE_TLS = CONFIG.email_security == "starttls"
EMAIL_USE_SSL = CONFIG.email_security == "ssl"
EMAIL_TIMEOUT = 10
DEFAULT_FROM_EMAIL = SERVER_EMAIL = CONFIG.email_from

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": CONFIG.log_level},
    # Routine periodic tasks (the whole beat schedule) are sent, received and done at DEBUG.
    "filters": {"routine_tasks": {"()": "crucible.celery.RoutineTaskFilter",
                                  "tasks": [entry["task"] for entry in CELERY_BEAT_SCHEDULE.values()]}},
    "loggers": {
        # The provider SDKs' HTTP clients log every request URL at INFO: noise, not evidence.
        **{name: {"level": "WARNING"} for name in ("daphne", "httpx", "httpx2", "openai", "anthropic")},
        # dulwich's upload-pack logs each baseline fetch's capabilities at INFO (search_app/git_http.py).
        "dulwich": {"level": "WARNING"},
        **{name: {"filters": ["routine_tasks"]} for name in ("celery.beat", "celery.worker.strategy",
                                                             "celery.app.trace")},
    },
}
