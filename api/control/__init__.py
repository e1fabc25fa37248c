"""The control plane: batch expansion and finalization, webhooks, periodic upkeep, and
the one submission path (``submit.py``) that the job routes, batch expansion and
``inflight enqueue`` share (it checks a callback URL against the webhooks' destination
policy, and expansion makes its jobs with it).

Plain functions taking a :class:`api.context.Context` do the work (tested directly);
``celery_app.make_celery`` wraps them as Celery tasks (run eagerly in the embedded default).
"""
