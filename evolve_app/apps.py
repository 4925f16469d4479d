from django.apps import AppConfig


class EvolveAppConfig(AppConfig):
    name = "evolve_app"
    verbose_name = "Agent evolution"

    def ready(self) -> None:
        # Django's documented place to wire hooks: their module imports models.
        from evolve_app import hooks

        hooks.connect()
