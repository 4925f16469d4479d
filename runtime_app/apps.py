from django.apps import AppConfig


class RuntimeAppConfig(AppConfig):
    name = "runtime_app"
    verbose_name = "Runtime"

    def ready(self) -> None:
        from django.contrib.auth import get_user_model
        from django.contrib.auth.models import Group
        from django.db.models.signals import m2m_changed, post_migrate, post_save, pre_delete, pre_save

        from runtime_app import roles, signals
        from runtime_app.models import ProjectMembership

        # After every app, so permissions of apps migrated later are included too.
        post_migrate.connect(roles.roles_sync_after_migrate, dispatch_uid="crucible_roles")
        # Role grants and revocations go to the audit log, from either side of the m2m.
        m2m_changed.connect(signals.role_membership_changed, sender=get_user_model().groups.through,
                            dispatch_uid="crucible_role_audit")
        # Leaving a project or losing the approve permission withdraws pending decisions,
        # whichever door made the change (services, the admin, the ORM).
        pre_delete.connect(signals.membership_deleting, sender=ProjectMembership,
                           dispatch_uid="crucible_membership_end")
        user_model = get_user_model()
        for through in (user_model.groups.through, user_model.user_permissions.through,
                        Group.permissions.through):
            m2m_changed.connect(signals.approve_permission_changing, sender=through,
                                dispatch_uid=f"crucible_approver_standing_{through._meta.label_lower}")
        pre_save.connect(signals.user_saving, sender=user_model, dispatch_uid="crucible_user_saving")
        post_save.connect(signals.user_saved, sender=user_model, dispatch_uid="crucible_user_saved")
