"""URL configuration: pages per app, Django admin, and the REST API under /api/."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from crucible.api import api, api_urls

urlpatterns = [
    path("", include("runtime_app.urls")),
    path("searches/", include("search_app.urls")),
    path("agents/", include("evolve_app.urls")),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path(
        "account/password/",
        auth_views.PasswordChangeView.as_view(success_url="/account/"),
        name="password_change",
    ),
    path("admin/", admin.site.urls),
    path("api/", api_urls(api)),
]
