"""The Celery app: broker and options come from Django settings (CELERY_*)."""

import os

from celery import Celery

from crucible.config import load_or_exit

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crucible.settings")
# Workers started directly (`celery -A crucible worker`) report bad settings in one line too.
load_or_exit()

app = Celery("crucible")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
