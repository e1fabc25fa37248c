"""SQL store: the system of record for jobs, batches, workers and engine iterations.

Importing this package creates nothing: engines and sessions are made by
``worker.store.db.make_engine`` / ``make_session_factory`` when a caller asks.
"""
