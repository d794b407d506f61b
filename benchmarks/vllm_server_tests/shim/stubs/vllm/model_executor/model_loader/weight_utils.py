"""Stub of vLLM's weight download helper: nothing is downloaded."""


def download_weights_from_hf(model_name_or_path, *args, **kwargs):
    """The model id itself: the shim serves the default model under whatever name the test passes, so the
    returned value is only used as the served model name."""
    return str(model_name_or_path)
