from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError

from runtime_app.keys import VARIABLE_CHOICES, provider_key_set
from runtime_app.models import (
    ApiToken,
    AuditEntry,
    Event,
    PriceOverride,
    Project,
    ProjectMembership,
    ProviderKey,
    ProviderPreset,
    Receipt,
    Repository,
    WorkerHeartbeat,
)


class ProjectMembershipInline(admin.TabularInline):
    model = ProjectMembership
    extra = 1
    autocomplete_fields = ["user"]


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["name", "created_by", "created_at"]
    search_fields = ["name"]
    inlines = [ProjectMembershipInline]


@admin.register(ProjectMembership)
class ProjectMembershipAdmin(admin.ModelAdmin):
    list_display = ["project", "user", "role", "added_at"]
    list_filter = ["project", "role"]


class ReadOnlyAdmin(admin.ModelAdmin):
    """Append-only records: visible in the admin, never edited there."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ["id", "project", "subject_type", "subject_id", "kind", "created_at"]
    list_filter = ["kind", "subject_type"]


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "actor_name", "action", "project", "target"]
    list_filter = ["action"]


@admin.register(Receipt)
class ReceiptAdmin(ReadOnlyAdmin):
    list_display = ["id", "kind", "label", "project", "isolation", "exit_code", "timed_out", "started_at"]
    list_filter = ["kind", "isolation", "timed_out"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["name", "user", "prefix", "created_at", "last_used_at", "revoked_at"]
    readonly_fields = ["prefix", "token_sha256", "created_at", "last_used_at"]

    def has_add_permission(self, request, obj=None) -> bool:
        return False  # tokens are made on the account page, where the secret is shown once


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(ReadOnlyAdmin):
    list_display = ["hostname", "last_seen_at"]


@admin.register(Repository)
class RepositoryAdmin(admin.ModelAdmin):
    list_display = ["name", "project", "path", "created_at"]
    list_filter = ["project"]


@admin.register(PriceOverride)
class PriceOverrideAdmin(admin.ModelAdmin):
    list_display = ["model_prefix", "input", "output", "cache_write", "cache_read", "note", "updated_at"]
    search_fields = ["model_prefix"]


class ProviderKeyForm(forms.ModelForm):
    value = forms.CharField(widget=forms.PasswordInput(render_value=False), strip=True,
                            help_text="Write-only: stored encrypted; only its last four characters show.")

    class Meta:
        model = ProviderKey
        fields = ["variable"]
        widgets = {"variable": forms.Select(choices=[(v, v) for v in VARIABLE_CHOICES])}

    def clean_value(self) -> str:
        value = self.cleaned_data["value"]
        if len(value) < 8 or any(c.isspace() for c in value):
            raise ValidationError("Paste the whole key: at least 8 characters, no spaces.")
        return value


@admin.register(ProviderKey)
class ProviderKeyAdmin(admin.ModelAdmin):
    """Keys go in through provider_key_set (encrypted, audited); they never come out."""

    form = ProviderKeyForm
    list_display = ["variable", "hint", "updated_by", "updated_at"]

    def has_module_permission(self, request) -> bool:
        return request.user.is_superuser

    def has_view_permission(self, request, obj=None) -> bool:
        return request.user.is_superuser

    def has_add_permission(self, request) -> bool:
        return request.user.is_superuser

    def has_change_permission(self, request, obj=None) -> bool:
        return request.user.is_superuser

    def save_model(self, request, obj, form, change) -> None:
        saved = provider_key_set(request.user, form.cleaned_data["variable"], form.cleaned_data["value"])
        obj.pk, obj.ciphertext, obj.hint = saved.pk, saved.ciphertext, saved.hint


@admin.register(ProviderPreset)
class ProviderPresetAdmin(admin.ModelAdmin):
    list_display = ["name", "kind", "model", "efforts", "base_url", "key_variable", "concurrency",
                    "price_model"]
    search_fields = ["name", "model"]
