from django.apps import AppConfig


class EvolveAppConfig(AppConfig):
    name = "evolve_app"
    verbose_name = "Agent evolution"
