"""A decode step's whole layer stack in one native call (``csrc/decoder_cpu.cpp``): the
kernels of ``cpu_linear``, ``cpu_native`` and ``cpu_fused`` called from C++ in the order
the Python decoder calls them, so the result is the same bit for bit and the per-call cost
of Python (module calls, argument checks, views: about 40 us a layer) goes.

:func:`load` builds it for an instruction set as the other native kernels are built; the
model side (which models and steps take it) is ``worker/engine/models/native_stack.py``.
"""

from __future__ import annotations

from types import ModuleType

DECODER_NAME = "inflight_decoder_cpu"


def load(isa: str | None = None) -> ModuleType:
    """The build for ``isa`` (default: the widest this CPU runs, or ``INFLIGHT_CPU_ISA``),
    compiled on the first call on a machine (``cpu_native.build`` keeps it per process), with
    the linear kernel's flags for this CPU (``cpu_linear.chosen_build_flags``)."""
    from kernels import cpu_linear, cpu_native

    isa = isa or cpu_native.default_isa()
    return cpu_native.build(DECODER_NAME, "decoder_cpu.cpp", isa, cpu_linear.chosen_build_flags())
