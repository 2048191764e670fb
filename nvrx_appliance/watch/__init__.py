"""nvrx-watch: sources -> snapshot -> pure detectors -> findings -> sinks."""
