from django.urls import path

from evolve_app import views

urlpatterns = [path("", views.agent_list, name="agent_list")]
