"""OpenTelemetry for inflight: spans from enqueue to result, engine and job metrics.

Off unless the standard ``OTEL_*`` variables configure an exporter. Importing this
package creates no provider and starts no thread: an entry point calls
``worker.telemetry.setup.configure_telemetry(service_name)`` once. Torch-free (import-linter
contract in pyproject.toml).
"""
