"""The REST API: one NinjaAPI with each app's router, session or token auth."""

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja import NinjaAPI

from evolve_app.api import router as evolve_router
from runtime_app.api import router as runtime_router
from runtime_app.auth import ApiTokenAuth, api_auth
from search_app.api import router as search_router
from search_app.services import Conflict


def docs_auth(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """The schema and docs for a signed-in browser or a bearer token, like every other route;
    without either, the login page (a wrong token: 401, as elsewhere)."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            if "Authorization" not in request.headers:
                return redirect_to_login(request.get_full_path())
            if ApiTokenAuth()(request) is None:
                return JsonResponse({"detail": "Unauthorized"}, status=401)
        return view(request, *args, **kwargs)

    return wrapper


api = NinjaAPI(
    title="Crucible API",
    version="1",
    urls_namespace="api",
    auth=api_auth,
    docs_decorator=docs_auth,
)
api.add_router("/", runtime_router)
api.add_router("/", search_router)
api.add_router("/", evolve_router)


def api_urls(ninja_api: NinjaAPI) -> tuple:
    """The API's URLs with operations exempt from the page login redirect.

    Ninja authenticates each operation itself (401, not a redirect to the login page); the docs
    and schema authenticate through docs_auth (a session or a bearer token).
    """
    patterns, app_name, namespace = ninja_api.urls
    for pattern in patterns:
        pattern.callback.login_required = False
    return patterns, app_name, namespace


def _refusal(request: HttpRequest, error: ValidationError, status: int) -> HttpResponse:
    errors = error.message_dict if hasattr(error, "error_dict") else {"__all__": error.messages}
    detail = "; ".join(f"{field}: {' '.join(msgs)}" if field != "__all__" else " ".join(msgs)
                       for field, msgs in errors.items())
    return api.create_response(request, {"detail": detail, "errors": errors}, status=status)


@api.exception_handler(ValidationError)
def validation_error(request: HttpRequest, error: ValidationError) -> HttpResponse:
    return _refusal(request, error, 400)


@api.exception_handler(Conflict)
def conflict(request: HttpRequest, error: Conflict) -> HttpResponse:
    return _refusal(request, error, 409)


@api.exception_handler(PermissionDenied)
def permission_denied(request: HttpRequest, error: PermissionDenied) -> HttpResponse:
    return api.create_response(
        request, {"detail": str(error) or "You do not have permission."}, status=403
    )
