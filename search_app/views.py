"""Pages of search_app."""

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET


@require_GET
def search_list(request: HttpRequest) -> HttpResponse:
    return render(request, "search_app/search_list.html")
