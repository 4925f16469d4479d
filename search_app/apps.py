from django.apps import AppConfig


class SearchAppConfig(AppConfig):
    name = "search_app"
    verbose_name = "Experimental search"

    def ready(self) -> None:
        from runtime_app.subjects import subject_type_register

        def search_project(subject_id: int) -> int | None:
            from search_app.models import Search

            return Search.objects.filter(pk=subject_id).values_list("project_id", flat=True).first()

        subject_type_register("search", search_project)
