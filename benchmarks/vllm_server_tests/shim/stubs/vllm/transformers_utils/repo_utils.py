"""Stub of vLLM's Hugging Face hub helper: nothing is downloaded."""


class _NoDownloadHub:
    def snapshot_download(self, repo_id, *args, **kwargs):
        """The repo id itself. It only names LoRA adapters, whose flags the shim drops, so it is never read."""
        return str(repo_id)


def hf_api(*args, **kwargs):
    return _NoDownloadHub()
