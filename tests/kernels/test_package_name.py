"""Our `kernels` package shares its import name with Hugging Face's `kernels` distribution: the pin that keeps the two
apart, and the error that says so when they meet."""

from importlib import metadata

import pytest

import kernels


def test_installed_transformers_does_not_require_hub_kernels():
    # transformers 5.25 requires Hugging Face's `kernels` and imports it at `import transformers.activations`,
    # getting this package instead: every model test failed to import. pyproject pins transformers < 5.25.
    required = [r for r in metadata.requires("transformers") or [] if r.split(";")[0].strip().startswith("kernels")]
    assert all("extra ==" in r for r in required), required
    from transformers.activations import ACT2FN

    assert "silu" in ACT2FN


def test_missing_name_is_an_attribute_error_without_hub_kernels(monkeypatch):
    monkeypatch.setattr(kernels, "_hub_kernels_version", lambda: None)
    assert getattr(kernels, "CUDAProperties", None) is None
    with pytest.raises(ImportError, match="cannot import name 'CUDAProperties'"):
        from kernels import CUDAProperties  # noqa: F401


def test_hub_kernels_installed_gives_the_reason(monkeypatch):
    monkeypatch.setattr(kernels, "_hub_kernels_version", lambda: "0.19.1")
    with pytest.raises(ImportError, match=r"Hugging Face's `kernels` 0\.19\.1 is installed.*pip uninstall kernels"):
        from kernels import CUDAProperties  # noqa: F401
    # Dunder probes (pickle, inspect, copy) still see a plain missing attribute.
    assert getattr(kernels, "__wrapped__", None) is None
