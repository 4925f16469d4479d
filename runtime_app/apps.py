from django.apps import AppConfig


class RuntimeAppConfig(AppConfig):
    name = "runtime_app"
    verbose_name = "Runtime"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        from runtime_app import roles

        # After every app, so permissions of apps migrated later are included too.
        post_migrate.connect(roles.roles_sync_after_migrate, dispatch_uid="crucible_roles")
