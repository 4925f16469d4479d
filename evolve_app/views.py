"""Pages of evolve_app."""

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET


@require_GET
def agent_list(request: HttpRequest) -> HttpResponse:
    return render(request, "evolve_app/agent_list.html")
