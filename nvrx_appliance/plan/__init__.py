"""Planning a run before its first submit: the effective training time (ETTR) a run of
a given shape can expect from the appliance, and the settings that maximise it. A pure
core (docs/plan.md): inputs in, a Plan out; reading a chain's history goes through
api.py."""
