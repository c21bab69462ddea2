"""The config's sections, one module per top-level key or small group of keys.

:mod:`.base` holds what every section shares (the :class:`~.base.Section` base, bounds, name
types); the others hold one section each, with its nested sections: :mod:`.mlflow`,
:mod:`.corpus`, :mod:`.datasets`, :mod:`.mix`, :mod:`.retrieval`, :mod:`.backbones`,
:mod:`.variants`, :mod:`.training`, :mod:`.agent`, :mod:`.evaluation`, :mod:`.baselines`
(``stepsearch`` and ``judge``) and :mod:`.hardware` (with ``code_reruns``). The whole
configuration, the rules between sections and the re-exports of every section are in
:mod:`spader.config.model`, which is where the package imports them from.
"""
