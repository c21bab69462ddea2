"""Framework glue: the only place that imports verl, ray or sglang-side APIs."""
