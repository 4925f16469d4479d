"""The Celery app: broker and options come from Django settings (CELERY_*)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crucible.settings")

app = Celery("crucible")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
