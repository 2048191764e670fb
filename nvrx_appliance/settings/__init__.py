"""Settings: ChainSpec and everything about resolving it (flags > environment > config
file > defaults), validating it and deriving what follows from it. Nothing here is
about Slurm; submit writes the result once into run.json and every reader takes it
from there."""
