from django.urls import path

from runtime_app import views

urlpatterns = [
    path("", views.home, name="home"),
    path("projects/new/", views.project_create, name="project_create"),
    path("projects/<int:project_id>/", views.project_detail, name="project_detail"),
    path("projects/<int:project_id>/ping/", views.project_ping, name="project_ping"),
    path("projects/<int:project_id>/members/", views.project_members, name="project_members"),
    path("projects/<int:project_id>/members/add/", views.project_member_add, name="project_member_add"),
    path("projects/<int:project_id>/members/<int:user_id>/role/", views.project_member_role,
         name="project_member_role"),
    path("projects/<int:project_id>/members/<int:user_id>/remove/", views.project_member_remove,
         name="project_member_remove"),
    path("projects/<int:project_id>/invitations/<int:invitation_id>/resend/", views.invitation_resend,
         name="invitation_resend"),
    path("projects/<int:project_id>/invitations/<int:invitation_id>/revoke/", views.invitation_revoke,
         name="invitation_revoke"),
    # An invitee, signed out, sets a password here: the link's token is the key (views.invitation_accept).
    path("invitations/<str:token>/", views.invitation_accept, name="invitation_accept"),
    path("projects/<int:project_id>/webhooks/", views.webhooks, name="webhooks"),
    path("projects/<int:project_id>/webhooks/<int:webhook_id>/deactivate/", views.webhook_deactivate,
         name="webhook_deactivate"),
    path("projects/<int:project_id>/webhooks/<int:webhook_id>/delete/", views.webhook_delete,
         name="webhook_delete"),
    path("repositories/", views.repositories, name="repositories"),
    path("repositories/register/", views.repository_register, name="repository_register"),
    path("repositories/<int:repository_id>/", views.repository_detail, name="repository_detail"),
    path("receipts/<int:receipt_id>/", views.receipt_detail, name="receipt_detail"),
    path("receipts/<int:receipt_id>.json", views.receipt_json, name="receipt_json"),
    path("audit/", views.audit_log, name="audit_log"),
    path("account/", views.account, name="account"),
    path("account/notifications/", views.notification_settings, name="notification_settings"),
    path("account/tokens/<int:token_id>/revoke/", views.api_token_revoke, name="api_token_revoke"),
]
