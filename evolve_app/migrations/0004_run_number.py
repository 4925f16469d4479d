"""Each evolution run gets its agent's own number (run 1, 2, 3 …), in the order they were made."""

from django.db import migrations, models


def _number_runs(apps, schema_editor) -> None:
    EvolutionRun = apps.get_model("evolve_app", "EvolutionRun")
    counts: dict[int, int] = {}
    for run in EvolutionRun.objects.order_by("agent_id", "created_at", "id").only("pk", "agent_id"):
        counts[run.agent_id] = counts.get(run.agent_id, 0) + 1
        EvolutionRun.objects.filter(pk=run.pk).update(number=counts[run.agent_id])


class Migration(migrations.Migration):

    dependencies = [
        ("evolve_app", "0003_run_lease"),
    ]

    operations = [
        migrations.AddField(
            model_name="evolutionrun",
            name="number",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.RunPython(_number_runs, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="evolutionrun",
            constraint=models.UniqueConstraint(fields=("agent", "number"), name="evolution_run_number_per_agent"),
        ),
    ]
