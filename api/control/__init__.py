"""The control plane: batch expansion and finalization, webhooks, periodic upkeep.

Plain functions taking a :class:`api.context.Context` do the work (tested directly);
``celery_app.make_celery`` wraps them as Celery tasks (run eagerly in the embedded default).
"""
