from django.urls import path

from search_app import views

urlpatterns = [
    path("", views.search_list, name="search_list"),
    path("specs/new/", views.spec_new, name="spec_new"),
    path("specs/validate/", views.spec_validate_partial, name="spec_validate"),
    path("specs/draft/", views.spec_draft, name="spec_draft"),
    path("specs/refs/", views.spec_refs, name="spec_refs"),
    path("specs/<int:spec_id>/", views.spec_edit, name="spec_edit"),
    path("specs/<int:spec_id>/duplicate/", views.spec_duplicate, name="spec_duplicate"),
    path("specs/<int:spec_id>/diff/", views.spec_diff, name="spec_diff"),
    path("<str:search_id>/", views.search_detail, name="search_detail"),
    path("<str:search_id>/record.json", views.search_record, name="search_record"),
    path("<str:search_id>/run/", views.search_run_partial, name="search_run_partial"),
    path("<str:search_id>/start/", views.search_start, name="search_start"),
    path("<str:search_id>/cancel/", views.search_cancel, name="search_cancel"),
    path("<str:search_id>/compare/", views.search_compare, name="search_compare"),
    path("<str:search_id>/compare/diff/", views.search_compare_diff, name="search_compare_diff"),
    path("<str:search_id>/candidates/", views.search_candidates, name="search_candidates"),
    path("<str:search_id>/candidates/<str:candidate_id>/", views.candidate_detail, name="candidate_detail"),
    path("<str:search_id>/candidates/<str:candidate_id>/patch.diff", views.candidate_patch,
         name="candidate_patch"),
    path("<str:search_id>/candidates/<str:candidate_id>/live/", views.candidate_live_tail,
         name="candidate_live_tail"),
    path("<str:search_id>/candidates/<str:candidate_id>/comment/", views.candidate_comment,
         name="candidate_comment"),
    path("<str:search_id>/candidates/<str:candidate_id>/decide/", views.candidate_decide,
         name="candidate_decide"),
    path("<str:search_id>/merge/", views.search_merge, name="search_merge"),
]
