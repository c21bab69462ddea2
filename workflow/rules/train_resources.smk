# The partition's time limit that caps a training job's runtime (train.smk); the rest of what a
# training job asks a scheduler for is spader.dag.TrainingResources (TRAINING, common.smk).


def profile_max_runtime(rule):
    """The `max_runtime` (minutes) that the profile's set-resources gives `rule` (the partition's
    time limit; None without one). Read from Snakemake's resource settings: a profile cannot set
    config values without taking `--config` away from the command line."""
    resources = workflow.resource_settings.overwrite_resources.get(rule) or {}
    limit = resources.get("max_runtime")
    value = getattr(limit, "value", limit)
    return None if value is None or callable(value) else int(value)
