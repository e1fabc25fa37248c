"""Torch-free request vocabulary shared by the engine, the service and the API."""
