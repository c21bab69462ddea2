"""The critic's value model loads with the configured attention implementation.

verl 0.9.1 builds the actor and reference models from ``actor_rollout_ref.model`` (whose
``override_config.attn_implementation`` the project sets to ``sdpa``), but its value-model
loader, ``verl.utils.model.load_valuehead_model``, passes ``attn_implementation=
"flash_attention_2"`` to transformers whatever ``critic.model.override_config`` says. The `gpu`
extra installs no ``flash-attn`` distribution, and transformers 5.8.1 then tries to fetch a hub
kernel, which fails on an offline node: PPO's critic could not load.

:func:`install` (called by the plug-in, in every process that imports verl) makes that loader
honour the implementation the critic's model config already carries (``_attn_implementation``,
set by verl from ``critic.model.override_config``). A flash-attention setting keeps verl's own
loader; anything else loads the backbone's ``*ForTokenClassification`` head with one output,
which is what verl's loader tries first.
"""

from __future__ import annotations

import functools
import logging

__all__ = ["install", "load_valuehead_model"]

log = logging.getLogger(__name__)

_MARK = "_spader_configured_attention"


def load_valuehead_model(local_path, torch_dtype, model_config, trust_remote_code, *, _verl_loader=None):
    """verl's ``load_valuehead_model`` with the attention implementation of ``model_config``.

    Args:
        local_path: the critic's model directory.
        torch_dtype: parameter dtype.
        model_config: the critic's Hugging Face config (``num_labels`` 1, ``_attn_implementation``
            from ``critic.model.override_config.attn_implementation``).
        trust_remote_code: passed through.
        _verl_loader: verl's original loader (for flash-attention settings).
    Returns:
        The value model (a token-classification model with one label).
    """
    impl = getattr(model_config, "_attn_implementation", None)
    if impl is None or str(impl).startswith("flash_attention"):
        if _verl_loader is None:
            raise RuntimeError(f"critic attention {impl!r} is verl's own path, but no verl loader was given")
        return _verl_loader(local_path, torch_dtype, model_config, trust_remote_code)
    from transformers import AutoModelForTokenClassification

    log.info("critic value model: %s with attention %s", local_path, impl)
    return AutoModelForTokenClassification.from_pretrained(
        pretrained_model_name_or_path=local_path,
        torch_dtype=torch_dtype,
        config=model_config,
        attn_implementation=impl,
        trust_remote_code=trust_remote_code,
    )


def install() -> bool:
    """Route ``verl.utils.model.load_valuehead_model`` through :func:`load_valuehead_model`
    (idempotent). Returns True when it was installed by this call."""
    import verl.utils.model as verl_model

    current = verl_model.load_valuehead_model
    if getattr(current, _MARK, False):
        return False
    wrapped = functools.partial(load_valuehead_model, _verl_loader=current)
    functools.update_wrapper(wrapped, current)
    setattr(wrapped, _MARK, True)
    verl_model.load_valuehead_model = wrapped
    return True
