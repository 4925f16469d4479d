from django.apps import AppConfig


class RuntimeAppConfig(AppConfig):
    name = "runtime_app"
    verbose_name = "Runtime"

    def ready(self) -> None:
        # Django's documented place to wire signal receivers: their module imports models.
        from runtime_app import hooks  # noqa: PLC0415 - it imports models: only once apps are ready

        hooks.connect()
