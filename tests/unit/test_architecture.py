"""The house's import rules (docs/architecture.md), read from the source with `ast`.

A module imports its own package and the layers below it: never a package beside it
(chain -> watch) or above it (observe -> workflows). click is imported under cli/ only.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

PACKAGE = "nvrx_appliance"
SOURCE = Path(__file__).resolve().parents[2] / PACKAGE

# Lower numbers sit lower; packages of one number are side by side.
LAYERS = {
    "settings": 1,
    "manifest": 2,  # run.json holds a ChainSpec, and the workload argv settings/ builds
    "observe": 3,
    "image": 4,
    "goodput": 4,  # the account of a chain's allocation: read through observe/, pure core
    "checkpoints": 4,  # what works on the checkpoint directory: names, retention, fall-back
    # The in-job side, by who runs it: the training program, the guard each rank runs
    # around it, and the entrypoint each node runs around ft_launcher.
    "workloads": 5,
    # Planning a run before its first submit (ETTR at scale): a pure core over goodput's
    # model; a chain's history reaches it through api.py. Beside the workloads, never
    # importing them.
    "plan": 5,
    "rank": 6,
    "node": 7,
    # The host side's adapters, side by side with the node's entrypoint.
    "chain": 7,  # the chain's host-side operations: submit, status, logs, cancel, the list
    "watch": 7,
    "devcluster": 7,
    "api": 8,  # the one way in: workflows and the CLI reach the adapters through it
    "workflows": 9,
    "cli": 10,  # every click command; nothing imports it
}
# What runs inside the job; nothing on the host side imports it (the nvrx-entrypoint
# command line, cli/entrypoint.py, is its one door).
IN_JOB = {"workloads", "rank", "node"}
HOST = {"plan", "chain", "watch", "devcluster", "api", "workflows"}
VOCABULARY = 0  # the other top-level modules: layout, files, clock, exitcodes, ...
# Names that repeat on purpose, one role each (docs/architecture.md): a module of cli/
# is the command line of what bears its name below (cli/qualify.py: workflows/qualify.py).
ROLE_NAMES = {"__init__.py", "__main__.py", "main.py"}
ROLE_FOLDERS = {"cli"}


def layer_of(module: str) -> tuple[str, int] | None:
    """The layer of a dotted module name inside the package; None outside it."""
    parts = module.split(".")
    if parts[0] != PACKAGE or len(parts) < 2:
        return None
    if parts[1] in LAYERS:
        return parts[1], LAYERS[parts[1]]
    return parts[1], VOCABULARY


def imported(tree: ast.AST) -> set[str]:
    """Every module an import names, functions' own imports included; `from X import Y`
    counts as X.Y, so importing a package's module by name is seen."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def violation(importer: str, target: str) -> str | None:
    """Why importer may not import target, or None if it may."""
    mine, theirs = layer_of(importer), layer_of(target)
    if mine is None or theirs is None or mine[0] == theirs[0]:
        return None
    (name, rank), (other, other_rank) = mine, theirs
    if rank == VOCABULARY:
        return None if other_rank == VOCABULARY else f"the vocabulary ({name}) imports {other}"
    if name in HOST and other in IN_JOB:
        return f"{name} imports {other} (host code imports in-job code)"
    if other_rank < rank:
        return None
    direction = "sideways" if other_rank == rank else "upward"
    return f"{name} imports {other} ({direction})"


def module_name(path: Path, root: Path) -> str:
    relative = path.relative_to(root.parent).with_suffix("")
    parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
    return ".".join(parts)


def violations(root: Path = SOURCE) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        importer = module_name(path, root)
        for target in sorted(imported(ast.parse(path.read_text(), str(path)))):
            why = violation(importer, target)
            if why:
                found.append(f"{path.relative_to(root.parent)}: {why} ({target})")
    return found


def test_the_rules_refuse_sideways_and_upward_imports_and_allow_downward_ones():
    assert violation("nvrx_appliance.chain.status", "nvrx_appliance.watch.findings")
    assert violation("nvrx_appliance.chain.submit", "nvrx_appliance.node.control")
    assert violation("nvrx_appliance.observe.slurm", "nvrx_appliance.workflows.demo")
    assert violation("nvrx_appliance.settings.resolve", "nvrx_appliance.observe.types")
    assert violation("nvrx_appliance.manifest", "nvrx_appliance.chain.render")
    assert violation("nvrx_appliance.settings.program_argv", "nvrx_appliance.manifest")
    assert violation("nvrx_appliance.chain.submit", "nvrx_appliance.api")
    assert violation("nvrx_appliance.api", "nvrx_appliance.workflows.qualify")
    assert violation("nvrx_appliance.workflows.qualify", "nvrx_appliance.cli.chain")
    assert violation("nvrx_appliance.layout", "nvrx_appliance.settings.chain")
    assert violation("nvrx_appliance.manifest", "nvrx_appliance.layout") is None
    assert violation("nvrx_appliance.workflows.demo", "nvrx_appliance.api") is None
    assert violation("nvrx_appliance.watch.detectors", "nvrx_appliance.observe.types") is None
    assert violation("nvrx_appliance.chain.submit", "nvrx_appliance.manifest") is None
    assert violation("nvrx_appliance.manifest", "nvrx_appliance.settings.chain") is None
    assert violation("nvrx_appliance.cli.watch", "nvrx_appliance.watch.run_loop") is None
    assert violation("nvrx_appliance.watch.watcher", "nvrx_appliance.goodput.account") is None
    assert violation("nvrx_appliance.goodput.gather", "nvrx_appliance.chain.sources")
    # The in-job rooms: a workload knows nothing of the guard, a guard nothing of the
    # node's entrypoint, and the host side nothing of any of them.
    assert violation("nvrx_appliance.workloads.trainer", "nvrx_appliance.rank.guard")
    assert violation("nvrx_appliance.rank.guard", "nvrx_appliance.node.lifecycle")
    assert violation("nvrx_appliance.chain.status", "nvrx_appliance.rank.workload_exit")
    assert violation("nvrx_appliance.api", "nvrx_appliance.node.launch")
    assert violation("nvrx_appliance.workflows.demo", "nvrx_appliance.workloads.cpu")
    assert violation("nvrx_appliance.checkpoints.fallback", "nvrx_appliance.workloads.trainer")
    assert violation("nvrx_appliance.node.time_limit", "nvrx_appliance.rank.guard") is None
    assert violation("nvrx_appliance.rank.guard", "nvrx_appliance.checkpoints.fallback") is None
    assert (
        violation("nvrx_appliance.workloads.trainer", "nvrx_appliance.checkpoints.checkpoint_dir")
        is None
    )


def test_an_import_inside_a_function_counts_too(tmp_path):
    package = tmp_path / PACKAGE / "chain"
    package.mkdir(parents=True)
    (package / "status.py").write_text(
        "def view():\n    from nvrx_appliance import watch\n    return watch\n"
    )
    assert violations(tmp_path / PACKAGE) == [
        f"{PACKAGE}/chain/status.py: chain imports watch (sideways) (nvrx_appliance.watch)"
    ]


def test_no_package_imports_one_beside_or_above_it():
    assert violations() == []


def test_no_two_modules_share_a_name_unless_it_is_a_role():
    names = Counter(
        path.name
        for path in SOURCE.rglob("*.py")
        if path.relative_to(SOURCE).parts[0] not in ROLE_FOLDERS
    )
    assert sorted(n for n, count in names.items() if count > 1 and n not in ROLE_NAMES) == []


def click_importers(root: Path = SOURCE) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).parts[0] in ROLE_FOLDERS:
            continue
        names = imported(ast.parse(path.read_text(), str(path)))
        if any(name == "click" or name.startswith("click.") for name in names):
            found.append(str(path.relative_to(root.parent)))
    return found


def test_click_is_imported_under_cli_only():
    assert click_importers() == []


def test_a_click_import_outside_cli_is_found(tmp_path):
    package = tmp_path / PACKAGE / "settings"
    package.mkdir(parents=True)
    (package / "options.py").write_text("import click\n")
    assert click_importers(tmp_path / PACKAGE) == [f"{PACKAGE}/settings/options.py"]


# Commands that change Slurm's queue or a node; observe/ only reads (chain/job_control.py
# submits and cancels, jobhost/ cancels and excludes from the job's host).
CHANGING_SLURM = ("sbatch", "scancel", "scontrol update")


def changing_calls(root: Path) -> list[str]:
    """Every argv written as a list or tuple that starts with a changing command."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.List | ast.Tuple):
                continue
            words = [e.value for e in node.elts[:2] if isinstance(e, ast.Constant)]
            command = " ".join(str(w) for w in words)
            if any(command == c or command.startswith(c + " ") for c in CHANGING_SLURM):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}: {words[0]}")
    return found


def test_observe_only_reads_slurm_and_changes_nothing():
    assert changing_calls(SOURCE / "observe") == []
    assert changing_calls(SOURCE / "chain")  # where they are: the rule sees them
