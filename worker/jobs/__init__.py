"""The job lifecycle: every move of a job that touches both its system of record (SQL)
and its transport (Redis) is made here, always SQL first, then Redis.

- :mod:`worker.jobs.enqueue`: rows committed, then one message per job published;
- :mod:`worker.jobs.cancel`: a cancel recorded in SQL, then signalled to the worker;
- :mod:`worker.jobs.dead_letter`: a job failed in SQL, then its entry moved aside;
- :mod:`worker.jobs.hand_back`: a held job requeued in SQL, then its entry re-published;
- :mod:`worker.jobs.republish`: open jobs no stream carries published again.

The status transitions themselves are one table, ``worker/store/job_lifecycle.py``, which
every status UPDATE of the store uses. ``worker.queue`` is Redis only and ``worker.store``
SQL only; only this package (and the service above it) joins them.
"""
