"""Websocket routes of every app."""

from runtime_app.routing import websocket_urlpatterns as runtime_routes

websocket_urlpatterns = [*runtime_routes]
