"""Roles move from global groups into each project membership.

Each member gets the highest role their global groups gave them (approver, operator, else
viewer), and a project's creator, if still a member, becomes its project admin, so nobody loses
access. Members of the old operator group keep the right to create projects (the add project
permission). The three global groups and their two permissions are then removed.
"""

from django.conf import settings
from django.db import migrations, models

OLD_GROUPS = ("viewer", "operator", "approver")


def roles_from_groups(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    ContentType = apps.get_model("contenttypes", "ContentType")
    Membership = apps.get_model("runtime_app", "ProjectMembership")
    groups = {group.name: set(group.user_set.values_list("pk", flat=True))
              for group in Group.objects.filter(name__in=OLD_GROUPS)}
    for membership in Membership.objects.select_related("project"):
        if membership.project.created_by_id == membership.user_id:
            role = "admin"
        elif membership.user_id in groups.get("approver", ()):
            role = "approver"
        elif membership.user_id in groups.get("operator", ()):
            role = "operator"
        else:
            role = "viewer"
        Membership.objects.filter(pk=membership.pk).update(role=role)
    creators = groups.get("operator", set())
    if creators:
        content_type, _ = ContentType.objects.get_or_create(app_label="runtime_app", model="project")
        add_project, _ = Permission.objects.get_or_create(
            content_type=content_type, codename="add_project", defaults={"name": "Can add project"})
        User = apps.get_model(*settings.AUTH_USER_MODEL.split("."))
        for user in User.objects.filter(pk__in=creators):
            user.user_permissions.add(add_project)
    Group.objects.filter(name__in=OLD_GROUPS).delete()
    Permission.objects.filter(content_type__app_label="runtime_app",
                              codename__in=("operate_project", "approve_project")).delete()


class Migration(migrations.Migration):

    dependencies = [
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("runtime_app", "0008_notifications"),
    ]

    operations = [
        migrations.AlterModelOptions(name="project", options={"ordering": ["name"]}),
        migrations.AddField(
            model_name="projectmembership",
            name="role",
            field=models.CharField(
                choices=[("viewer", "viewer"), ("operator", "operator"), ("approver", "approver"),
                         ("admin", "project admin")],
                default="viewer", max_length=16),
        ),
        migrations.RunPython(roles_from_groups, migrations.RunPython.noop),
    ]
