"""examples/train_script.py as a chain of the seeds' design sees it: that design reads no
training-done marker, so the marker goes where nothing reads it, and every generation
queued after the end of training starts, loads the final checkpoint and stops."""

import os
import runpy
import sys
from pathlib import Path

EXAMPLE = Path(__file__).parents[1] / "examples" / "train_script.py"

if __name__ == "__main__":
    work = os.environ["NVRX_APPLIANCE_WORK_DIR"]
    os.environ["NVRX_APPLIANCE_TRAINING_DONE"] = os.path.join(work, "unread_training_done.txt")
    sys.argv[0] = str(EXAMPLE)
    runpy.run_path(str(EXAMPLE), run_name="__main__")
