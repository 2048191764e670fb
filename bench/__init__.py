"""Recovery benchmarks on the local Slurm cluster (issue 7): `python -m bench`.

What each kind of failure costs, split into its parts and held against the
scheduler's own floor measured in the same run. timing.py and extract.py are pure
(artefacts in, figures out); harness.py is the shell around the cluster; one module
per scenario; report.py renders the table and the JSON under bench/results/.
"""
