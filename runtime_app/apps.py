from django.apps import AppConfig


class RuntimeAppConfig(AppConfig):
    name = "runtime_app"
    verbose_name = "Runtime"

    def ready(self) -> None:
        from django.contrib.auth import get_user_model
        from django.db.models.signals import m2m_changed, post_migrate

        from runtime_app import roles, signals

        # After every app, so permissions of apps migrated later are included too.
        post_migrate.connect(roles.roles_sync_after_migrate, dispatch_uid="crucible_roles")
        # Role grants and revocations go to the audit log, from either side of the m2m.
        m2m_changed.connect(signals.role_membership_changed, sender=get_user_model().groups.through,
                            dispatch_uid="crucible_role_audit")
