"""SmolLM3: Llama where some layers have no rope (``no_rope_layers[i] == 0``); windows,
when enabled, sit on the layers ``layer_types`` names."""

from __future__ import annotations

from worker.engine.models.spec import ArchSpec, base_spec, windows_from_layer_types


def smollm3(config) -> ArchSpec:
    layer_rope = tuple("default" if use else None for use in config.no_rope_layers)
    windows = windows_from_layer_types(config, enabled=bool(config.use_sliding_window))
    return base_spec(config, "smollm3", layer_rope=layer_rope, layer_windows=windows)
