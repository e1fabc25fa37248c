"""One module per architecture family: each turns a transformers config into an ArchSpec,
stating only what differs from Llama (``worker.engine.models.spec.base_spec``)."""
