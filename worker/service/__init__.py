"""The long-lived worker: intake from Redis, the engine loop, the output writer and the
heartbeat, wired together by ``worker.service.worker.WorkerProcess``."""
