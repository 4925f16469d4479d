from django.urls import path

from evolve_app import views

# A run is named by the agent's own run number (its title's); an old link by database id redirects.
run = "<int:agent_id>/runs/<int:run_number>/"
cycle = run + "cycles/<int:number>/"

urlpatterns = [
    path("", views.agent_list, name="agent_list"),
    path("import/", views.agent_import, name="agent_import"),
    path("import/preview/", views.agent_import_preview, name="agent_import_preview"),
    path("demo/", views.agent_demo, name="agent_demo"),
    path("<int:agent_id>/", views.agent_detail, name="agent_detail"),
    path("<int:agent_id>/rollback/", views.agent_rollback, name="agent_rollback"),
    path("<int:agent_id>/file/", views.agent_file, name="agent_file"),
    path("<int:agent_id>/files/", views.agent_files, name="agent_files"),
    path("<int:agent_id>/compare/", views.agent_compare, name="agent_compare"),
    path("<int:agent_id>/runs/start/", views.evolution_run_start, name="evolution_run_start"),
    path(run, views.evolution_run_detail, name="evolution_run_detail"),
    path(run + "progress/", views.evolution_run_progress, name="evolution_run_progress"),
    path(run + "cancel/", views.evolution_run_cancel, name="evolution_run_cancel"),
    path(cycle, views.cycle_detail, name="cycle_detail"),
    path(cycle + "decide/", views.cycle_decide, name="cycle_decide"),
]
