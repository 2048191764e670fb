"""What a chain looks like from outside: Slurm's view and the work dir's files, read.

Below every adapter: status, cancel, the workflows and the watcher all observe through
it, and it imports none of them (only the settings and run.json below it).
"""
