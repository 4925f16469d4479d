from django.apps import AppConfig


class SearchAppConfig(AppConfig):
    name = "search_app"
    verbose_name = "Experimental search"

    def ready(self) -> None:
        from runtime_app.subjects import live_renderer_register, subject_type_register
        from search_app.live import search_live_fragments

        def search_project(subject_id: int) -> int | None:
            from search_app.models import Search

            return Search.objects.filter(pk=subject_id).values_list("project_id", flat=True).first()

        def candidate_project(subject_id: int) -> int | None:
            from search_app.models import Candidate

            found = Candidate.objects.filter(pk=subject_id).values_list("search__project_id", flat=True)
            return found.first()

        subject_type_register("search", search_project)
        subject_type_register("candidate", candidate_project)
        live_renderer_register("search", search_live_fragments)
