"""`{{ text|markdown }}`: a person's markdown as sanitised HTML (runtime_app.markdown)."""

from __future__ import annotations

from django import template
from django.utils.safestring import SafeString, mark_safe

from runtime_app.markdown import markdown_html

register = template.Library()


@register.filter(is_safe=False)
def markdown(text: str) -> SafeString:
    # Safe to mark: nh3 has just removed every tag, attribute and URL scheme not allowed.
    return mark_safe(markdown_html(str(text or "")))  # noqa: S308
