"""The step-level supervised baselines R3-RAG and StepSearch, beyond their pure reward code.

* :mod:`.evidence` - StepSearch's gold evidence per training question (rule ``build_evidence``).
* :mod:`.judge` - R3-RAG's step judge, a client of an OpenAI-compatible endpoint.
* :mod:`.judge_server` - the judge served by sglang on GPUs of the training node (started by
  :mod:`spader.training.scorer_launch`).

The rewards themselves are in :mod:`spader.methods.stepsearch.gain`, :mod:`spader.methods.r3rag.scoring` and
:mod:`spader.methods.steps`; the verl glue in :mod:`spader.integrations.verl.scorer_rewards`.
This ``__init__`` imports nothing.
"""
