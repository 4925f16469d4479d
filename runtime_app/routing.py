from django.urls import path

from runtime_app.consumers import EventConsumer

websocket_urlpatterns = [
    path("ws/events/", EventConsumer.as_asgi()),
    path("ws/events/<slug:subject_type>/<int:subject_id>/", EventConsumer.as_asgi()),
]
