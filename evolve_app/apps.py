from django.apps import AppConfig


class EvolveAppConfig(AppConfig):
    name = "evolve_app"
    verbose_name = "Agent evolution"
    # What this app adds to the demo project (runtime_app's crucible_setup finds it here).
    demo_setup = "evolve_app.demo_setup.demo_setup"

    def ready(self) -> None:
        # Django's documented place to wire hooks: their module imports models.
        from evolve_app import hooks  # noqa: PLC0415 - it imports models: only once apps are ready

        hooks.connect()
