from django.apps import AppConfig


class SearchAppConfig(AppConfig):
    name = "search_app"
    verbose_name = "Experimental search"

    def ready(self) -> None:
        # Django's documented place to wire hooks: their module imports models.
        from search_app import hooks

        hooks.connect()
