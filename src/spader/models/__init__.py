"""Model helpers: hub downloads and tiny randomly initialised models for tests and the demo."""
