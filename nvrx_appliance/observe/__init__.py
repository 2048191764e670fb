"""What a chain looks like from outside: Slurm's view and the work dir's files, read.

The lowest layer: status, cancel, the workflows and the watcher all observe through it,
and it imports none of them.
"""
