"""Infrastructure shared by every stage: configuration checks, downloads, MLflow tracking and the
glue that runs a Snakemake job's script."""
