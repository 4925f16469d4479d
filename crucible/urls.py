"""URL configuration: pages per app, Django admin, and the REST API under /api/."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_not_required
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic.base import RedirectView

from crucible.api import api, api_urls
from search_app.views import search_git

urlpatterns = [
    path("", include("runtime_app.urls")),
    path("searches/", include("search_app.urls")),
    path("agents/", include("evolve_app.urls")),
    # Workers without the repository on their disk fetch a search's baseline here (git_http.py).
    path("git/searches/<str:search_id>.git/<path:rest>", search_git, name="search_git"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path(
        "account/password/",
        auth_views.PasswordChangeView.as_view(success_url="/account/"),
        name="password_change",
    ),
    path("account/password/done/", auth_views.PasswordChangeDoneView.as_view(), name="password_change_done"),
    # Forgot a password: a link to set a new one is emailed (Crucible's own pages, templates/registration/).
    path("password/reset/", auth_views.PasswordResetView.as_view(subject_template_name=
         "registration/password_reset_subject.txt"), name="password_reset"),
    path("password/reset/sent/", auth_views.PasswordResetDoneView.as_view(), name="password_reset_done"),
    # The emailed link sets the password here (also invitations sent before runtime_app 0011).
    path("reset/<uidb64>/<token>/", auth_views.PasswordResetConfirmView.as_view(),
         name="password_reset_confirm"),
    path("reset/done/", auth_views.PasswordResetCompleteView.as_view(), name="password_reset_complete"),
    path("admin/", admin.site.urls),
    # Browsers ask for /favicon.ico on every page (the admin's too), logged in or not.
    path("favicon.ico", login_not_required(RedirectView.as_view(url=static("favicon.svg"), permanent=True))),
    path("api/", api_urls(api)),
]
