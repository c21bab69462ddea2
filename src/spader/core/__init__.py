"""The method itself, free of frameworks: text normalisation (norm_v1), the agent's text protocol
(prompt, parser), rewards, the step-wise peer advantage, reward densification and the metrics.

Nothing here imports verl, Ray, sglang or Snakemake; training, evaluation and data preparation all
call these same functions.
"""
