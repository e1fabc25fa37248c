"""Hugging Face's ``kernels`` distribution shares our package's import name; transformers
5.25+ requires it and imports it (``from kernels import CUDAProperties``). Where it is
installed, asking our package for one of its names must say so instead of a bare
``cannot import name``; where it is not, our package behaves as any other."""

from __future__ import annotations

import importlib.metadata

import pytest

import kernels


def _pretend_installed(monkeypatch, version: str | None) -> None:
    real = importlib.metadata.version

    def version_of(name: str) -> str:
        if name == "kernels":
            if version is None:
                raise importlib.metadata.PackageNotFoundError(name)
            return version
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version_of)


def test_a_name_of_hugging_faces_kernels_names_the_clash_and_the_fix(monkeypatch) -> None:
    _pretend_installed(monkeypatch, "0.19.1")
    with pytest.raises(ImportError, match=r"Hugging Face's 'kernels' 0\.19\.1 .*pip uninstall kernels"):
        from kernels import CUDAProperties  # noqa: F401
    assert not hasattr(kernels, "__wrapped__")  # dunder probes stay AttributeErrors


def test_without_it_a_missing_name_is_an_attribute_error_and_submodules_import(monkeypatch) -> None:
    _pretend_installed(monkeypatch, None)
    assert not hasattr(kernels, "CUDAProperties")
    from kernels import cpu_native  # a submodule is still loaded by the import system

    assert cpu_native.__name__ == "kernels.cpu_native"
