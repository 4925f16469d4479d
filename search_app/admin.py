from django.contrib import admin

from search_app.models import Search, Spec, SpecVersion


class SpecVersionInline(admin.TabularInline):
    model = SpecVersion
    extra = 0
    readonly_fields = ["number", "valid", "created_by", "created_at"]
    fields = ["number", "valid", "created_by", "created_at"]

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Spec)
class SpecAdmin(admin.ModelAdmin):
    list_display = ["title", "project", "created_by", "updated_at"]
    list_filter = ["project"]
    inlines = [SpecVersionInline]


@admin.register(SpecVersion)
class SpecVersionAdmin(admin.ModelAdmin):
    list_display = ["spec", "number", "valid", "created_at"]
    readonly_fields = ["spec", "number", "text", "valid", "created_by", "created_at"]

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Search)
class SearchAdmin(admin.ModelAdmin):
    """Frozen searches are read-only everywhere, the admin included."""

    list_display = ["search_id", "name", "project", "baseline_commit", "created_at"]
    list_filter = ["project"]

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
