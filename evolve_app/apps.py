from django.apps import AppConfig


class EvolveAppConfig(AppConfig):
    name = "evolve_app"
    verbose_name = "Agent evolution"

    def ready(self) -> None:
        from runtime_app.subjects import (
            project_section_register,
            subject_label_register,
            subject_type_register,
        )

        def agent_project(subject_id: int) -> int | None:
            from evolve_app.models import Agent

            return Agent.objects.filter(pk=subject_id).values_list("project_id", flat=True).first()

        def agents_section(user: object, project: object) -> object:
            from evolve_app.selectors import project_agents_section

            return project_agents_section(user, project)

        def agent_labels(ids: list[int]) -> dict[int, str]:
            from evolve_app.models import Agent

            names = Agent.objects.filter(pk__in=ids).values_list("pk", "name")
            return {pk: f"agent {name}" for pk, name in names}

        subject_label_register("agent", agent_labels)
        subject_type_register("agent", agent_project)
        project_section_register("agents", 20, agents_section)
