"""The inflight REST API (FastAPI) and its control plane (Celery).

Importing this package creates nothing: ``api.app.create_app(settings)`` builds an app.
"""
