from django.apps import AppConfig


class EvolveAppConfig(AppConfig):
    name = "evolve_app"
    verbose_name = "Agent evolution"

    def ready(self) -> None:
        from runtime_app.subjects import subject_type_register

        def agent_project(subject_id: int) -> int | None:
            from evolve_app.models import Agent

            return Agent.objects.filter(pk=subject_id).values_list("project_id", flat=True).first()

        subject_type_register("agent", agent_project)
