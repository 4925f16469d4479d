from django.apps import AppConfig


class RuntimeAppConfig(AppConfig):
    name = "runtime_app"
    verbose_name = "Runtime"

    def ready(self) -> None:
        from django.contrib.auth import get_user_model
        from django.db.models.signals import post_save, pre_delete, pre_save

        from runtime_app import signals
        from runtime_app.models import ProjectMembership

        # Leaving a project, a role dropping below approver or losing the account withdraws
        # pending decisions, and every role change is audited, whichever door made the change
        # (services, the admin, the ORM).
        pre_delete.connect(signals.membership_deleting, sender=ProjectMembership,
                           dispatch_uid="crucible_membership_end")
        pre_save.connect(signals.membership_saving, sender=ProjectMembership,
                         dispatch_uid="crucible_membership_saving")
        post_save.connect(signals.membership_saved, sender=ProjectMembership,
                          dispatch_uid="crucible_membership_saved")
        user_model = get_user_model()
        pre_save.connect(signals.user_saving, sender=user_model, dispatch_uid="crucible_user_saving")
        post_save.connect(signals.user_saved, sender=user_model, dispatch_uid="crucible_user_saved")
