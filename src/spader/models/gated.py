"""Gated hub models: their licence must be accepted with a hub account, and downloading them needs
that account's token. :func:`check_hub_token` says so before anything is fetched (the download
rule) or before a training job holds GPUs (its preflight). It checks a precondition and cannot
change what any stage computes, so its edits rerun nothing (``spader.infra.stage_code``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["GATED_MODELS", "HubTokenError", "check_hub_token", "hub_token_configured", "token_file"]

#: Hub organisations whose models are gated (a licence accepted with an account, downloads need a
#: token): the Llama backbone.
GATED_MODELS = ("meta-llama/",)


class HubTokenError(RuntimeError):
    """A gated model would be downloaded without a hub token; the message says what to do."""


def token_file(environ: Mapping[str, str]) -> Path:
    """Where ``hf auth login`` writes the token: ``$HF_TOKEN_PATH``, else ``$HF_HOME/token``, else
    ``~/.cache/huggingface/token``."""
    if environ.get("HF_TOKEN_PATH"):
        return Path(environ["HF_TOKEN_PATH"])
    home = environ.get("HF_HOME") or os.path.join(
        environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface"
    )
    return Path(home) / "token"


def hub_token_configured(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the hub client has a token: ``HF_TOKEN`` or the token file (:func:`token_file`)."""
    environ = os.environ if environ is None else environ
    if environ.get("HF_TOKEN", "").strip():
        return True
    path = token_file(environ)
    try:
        return path.is_file() and bool(path.read_text().strip())
    except OSError:
        return False


def _has_weights(model_dir: str | os.PathLike | None) -> bool:
    if model_dir is None or not (Path(model_dir) / "config.json").is_file():
        return False
    return any(Path(model_dir).glob("*.safetensors")) or any(Path(model_dir).glob("*.bin"))


def check_hub_token(
    model: str, model_dir: str | os.PathLike | None = None, *, environ: Mapping[str, str] | None = None
) -> None:
    """A gated hub model (:data:`GATED_MODELS`) whose weights are not in ``model_dir`` yet can be
    downloaded: a hub token is configured.

    Raises:
        HubTokenError: naming the model, its licence page and where the token goes.
    """
    if not str(model).startswith(GATED_MODELS) or _has_weights(model_dir):
        return
    environ = os.environ if environ is None else environ
    if not hub_token_configured(environ):
        raise HubTokenError(
            f"{model} is a gated model and no hub token is configured: accept its licence at "
            f"https://huggingface.co/{model} with your account, then set HF_TOKEN or run `hf auth login` "
            f"(it writes {token_file(environ)}) before its weights are downloaded"
        )
