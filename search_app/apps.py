from django.apps import AppConfig


class SearchAppConfig(AppConfig):
    name = "search_app"
    verbose_name = "Experimental search"
    # What this app adds to the demo project (runtime_app's crucible_setup finds it here).
    demo_setup = "search_app.demo.demo_setup"

    def ready(self) -> None:
        # Django's documented place to wire hooks: their module imports models.
        from search_app import hooks  # noqa: PLC0415 - it imports models: only once apps are ready

        hooks.connect()
