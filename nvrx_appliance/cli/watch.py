"""`nvrx-watch <job id>` (also `nvrx-appliance watch`): the command line of the watcher
(watch/run_loop.py runs it; its docstring says where each setting and secret comes from)."""

from __future__ import annotations

import os
import sys
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the backport the wheel requires there
    import tomli as tomllib

import click

from nvrx_appliance import __version__, api
from nvrx_appliance.cli import help as clihelp
from nvrx_appliance.layout import Layout
from nvrx_appliance.watch import alerts, detectors, run_loop, target
from nvrx_appliance.watch.config import (
    Thresholds,
    env_name,
    reference_environment,
    reference_key_refusal,
    thresholds_fields,
)
from nvrx_appliance.watch.run_loop import PAGERDUTY_EVENTS_URL, SECRETS


def _option(*decls: str, fallback_env: str = "", **kwargs: Any):
    """A click option that also reads NVRX_WATCH_<FLAG> and shows it in --help;
    `fallback_env` is read after it (the name the submit side uses for the same value)."""
    envvar = [env_name(decls[0]), *([fallback_env] if fallback_env else [])]
    return click.option(*decls, envvar=envvar, show_envvar=True, **kwargs)


def _dashed(name: str) -> str:
    return name.replace("_", "-")


# The reference watcher's flags that carried a secret on the command line, where every
# user sees it in `ps` and it lands in shell history: refused, naming what replaces them.
REFUSED_SECRET_FLAGS = {
    "webhook_url": "NVRX_WATCH_WEBHOOK_URL or --webhook-url-file",
    "heartbeat_url": "NVRX_WATCH_HEARTBEAT_URL or --heartbeat-url-file",
    "pd_routing_key": "NVRX_WATCH_PAGERDUTY_ROUTING_KEY or --pagerduty-routing-key-file",
}
# Parameters a --config file may not set: they act at once or are not settings.
NOT_IN_CONFIG = {
    "config",
    "list_detectors",
    "alert_rules",
    "version",
    "help",
    *REFUSED_SECRET_FLAGS,
}


def _refused_secret_message(name: str) -> str:
    return (
        f"--{_dashed(name)} would show the secret to every user of this machine (ps, shell "
        f"history); set {REFUSED_SECRET_FLAGS[name]} instead"
    )


def _refused_secret_flags(func):
    def refuse(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if value is not None and not ctx.resilient_parsing:
            raise click.UsageError(_refused_secret_message(param.name or ""), ctx)

    for name in REFUSED_SECRET_FLAGS:  # hidden: they exist only to say what replaced them
        func = click.option(
            "--" + _dashed(name), name, hidden=True, expose_value=False, callback=refuse
        )(func)
    return func


def _read_config(ctx: click.Context, _param: Any, path: str | None) -> None:
    """--config FILE: a flat TOML table keyed by the flags' names (dashes or
    underscores); the command line and NVRX_WATCH_* variables win over it."""
    if not path or ctx.resilient_parsing:
        return
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise click.BadParameter(f"cannot read {path} ({exc.strerror}); fix the path") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"{path} is not valid TOML: {exc}") from None
    settable = {p.name for p in ctx.command.params if p.name not in NOT_IN_CONFIG}
    defaults: dict[str, Any] = {}
    for key, value in data.items():
        name = key.lstrip("-").replace("-", "_")
        if name in REFUSED_SECRET_FLAGS:
            raise click.BadParameter(f"{path}: {key}: {_refused_secret_message(name)}")
        refusal = reference_key_refusal(name)
        if refusal:
            raise click.BadParameter(f"{path}: {refusal} (the reference watcher's key)")
        if name not in settable:
            raise click.BadParameter(
                f"{path}: unknown setting {key!r}; keys are nvrx-watch's flag names "
                "(see nvrx-watch --help)"
            )
        defaults[name] = value
    ctx.default_map = {**(ctx.default_map or {}), **defaults}


def _threshold_options(func):
    for f in reversed(thresholds_fields()):
        unit = f" ({f.metadata['unit']})" if f.metadata["unit"] else ""
        func = _option(
            "--" + f.name.replace("_", "-"),
            f.name,
            type=type(f.default),
            default=f.default,
            show_default=True,
            help=f"Threshold{unit}: {f.metadata['why']}.",
        )(func)
    return func


def _list_detectors(ctx: click.Context, _param: Any, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    defaults = Thresholds()
    by_name = {f.name: f for f in thresholds_fields()}
    for d in detectors.ALL:
        needs = ", ".join(d.needs) or "nothing"
        click.echo(f"{d.name}  [{d.family}, {d.severity}; needs {needs}]")
        click.echo(f"    {d.summary}")
        for name in d.thresholds:
            unit = by_name[name].metadata["unit"]
            default = getattr(defaults, name)
            click.echo(
                f"    --{name.replace('_', '-')} {default:g}{unit}: {by_name[name].metadata['why']}"
            )
    ctx.exit(0)


def _alert_rules(ctx: click.Context, _param: Any, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    click.echo(str(alerts.RULES))  # the path alone, for `cp "$(nvrx-watch --alert-rules)" ...`
    ctx.exit(0)


def _runbook_base(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is None or ctx.resilient_parsing:
        return
    problem = alerts.base_problem(value)
    if problem:
        raise click.BadParameter(problem, ctx=ctx, param=param)
    click.echo(alerts.with_runbook_base(alerts.RULES.read_text(), value), nl=False)
    ctx.exit(0)


@click.command(
    "watch",
    context_settings=clihelp.CONTEXT,
    epilog="Exit status: 0 clean, 1 degraded (a source could not be observed; no heartbeat), "
    "2 at least one critical finding (or a usage error). Secrets come from the environment: "
    + ", ".join(SECRETS.values())
    + ", or from the --...-file flags.",
)
@click.argument("job_id", metavar="[NAME|JOB_ID]", required=False, envvar="NVRX_WATCH_JOB_ID")
@click.version_option(__version__, prog_name="nvrx-watch")
@_option(
    "--config",
    type=click.Path(dir_okay=False),
    is_eager=True,
    expose_value=False,
    callback=_read_config,
    help="TOML file of settings keyed by the flags' names (grace = 300, act = true); "
    "flags and NVRX_WATCH_* variables win over it.",
)
@_option(
    "--job-name",
    fallback_env="NVRX_JOB_NAME",
    default="",
    help="Chain (Slurm job) name; default: the job id's.",
)
@_option(
    "--user",
    default="",
    help="The chain's owner (an SRE watching another's chain by --job-name); default: the "
    "job id's owner, else you. --act still acts only on your own jobs.",
)
@_option(
    "--work-dir",
    fallback_env="NVRX_WORK_DIR",
    default="",
    help="The run's work dir, when run.json or the batch script do not say.",
)
@_option("--cycle-info-glob", default="", help="Where the NVRx cycle-info files are (a glob).")
@_option(
    "--checkpoint-file",
    "--checkpoint-iteration-file",
    "checkpoint_file",  # also its key in --config files, so it keeps this name
    fallback_env="NVRX_WATCH_CHECKPOINT_ITERATION_FILE",
    default="",
    help="The checkpoint-iteration tracker file (may be a glob).",
)
@_option(
    "--max-restarts",
    type=int,
    default=None,
    help="ft_launcher --max-restarts; default: run.json's.",
)
@_option(
    "--platform",
    type=click.Choice(["slurm", "none"]),
    default="slurm",
    show_default=True,
    help="none: cycle-info files only, no chain detectors (needs --work-dir or --cycle-info-glob).",
)
@_option(
    "--once", is_flag=True, help="One pass, then exit with its status (the default; for cron)."
)
@_option(
    "--interval",
    type=click.IntRange(min=0),
    default=0,
    help="Run a pass every N seconds until stopped (0: once).",
)
@_option(
    "--act", is_flag=True, help="Run the corrective action (only on your own jobs of this chain)."
)
@_option(
    "--dry-run",
    is_flag=True,
    help="Decide and log only: run no action (even with --act), page nobody, write no state, "
    "metrics or heartbeat. Start here.",
)
@_option("--disable", default="", help="Comma list of detectors to skip.")
@click.option(
    "--list-detectors",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_list_detectors,
    help="List the detectors, their thresholds and why, then exit.",
)
@click.option(
    "--alert-rules",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_alert_rules,
    help="Print the path of the Prometheus alert rules for --metrics-file's series "
    "(installed with nvrx-watch; docs/watch.md, Alert rules), then exit.",
)
@click.option(
    "--runbook-base",
    metavar="URL",
    expose_value=False,
    is_eager=True,
    callback=_runbook_base,
    help="Print the alert rules with every runbook_url under URL, the address your team "
    "serves this project's docs/ at (e.g. https://git.example/nvrx-appliance/-/blob/v1/), "
    "then exit.",
)
@_option(
    "--alert-cooldown",
    type=float,
    default=3600.0,
    show_default=True,
    help="Seconds before a finding that persists is paged again.",
)
@_option(
    "--command-timeout",
    type=float,
    default=30.0,
    show_default=True,
    help="Seconds each Slurm command may take.",
)
@_option("--state-file", default="", help="The watcher's state (default ~/.nvrx_watch/state.json).")
@_option(
    "--state-dir",
    default="",
    help="Keep the state in DIR/state.json (and its cycle cache beside it); or --state-file.",
)
@_option("--metrics-file", default="", help="Prometheus textfile to write (node_exporter).")
@_option(
    "--pagerduty-url",
    default=PAGERDUTY_EVENTS_URL,
    show_default=True,
    help="PagerDuty Events v2 endpoint.",
)
@_option(
    "--pagerduty-allow-http",
    is_flag=True,
    help="Accept a plain-http --pagerduty-url (a local relay): the routing key travels in clear.",
)
@_option("--pagerduty-routing-key-file", default="", help="File holding the PagerDuty routing key.")
@_option(
    "--webhook-url-file", default="", help="File holding the JSON webhook URL (Slack-compatible)."
)
@_option("--heartbeat-url-file", default="", help="File holding the dead-man heartbeat URL.")
@_option("--log-file", default="", help="Also append the log here.")
@_option(
    "--verbose", "-v", is_flag=True, help="Also log each source's state and the skipped detectors."
)
@_refused_secret_flags
@_threshold_options
def watch(**options: Any) -> None:
    """Watch a chain from outside the job: reconcile it, detect restart anomalies, page.

    The chain is named as every nvrx-appliance command names it: its name or any Slurm
    job id of it (or --work-dir); owner and the run's files resolve from it.
    Observe-only unless --act.
    """
    logger = run_loop.make_logger(options["log_file"], options["verbose"])
    try:
        settings = run_loop.settings_from(options, warn=_warn, environ=_environment())
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    thresholds = Thresholds(**{f.name: options[f.name] for f in thresholds_fields()})
    job_id, job_name, work_dir = _chain(options)
    request = target.Request(
        job_id=job_id,
        job_name=job_name,
        work_dir=work_dir,
        cycle_info_glob=options["cycle_info_glob"],
        tracker=options["checkpoint_file"],
        max_restarts=options["max_restarts"],
        platform=options["platform"],
        user=options["user"],
    )
    if request.platform == "none" and not (request.work_dir or request.cycle_info_glob):
        raise click.UsageError("--platform none needs --work-dir or --cycle-info-glob")
    if options["once"] and options["interval"]:
        raise click.UsageError("--once and --interval N exclude each other; pick one")
    try:
        code = run_loop.loop(request, settings, thresholds, logger, options["interval"])
    except target.ResolveError as exc:
        raise click.UsageError(str(exc)) from None
    sys.exit(code)


def _chain(options: dict[str, Any]) -> tuple[str, str, str]:
    """(job id, job name, work dir) of the chain asked for, found as every command finds
    a chain (api.find_chain). A name must lead to a chain; a job id Slurm cannot place
    now is left to the watcher, which remembers the ids it watched and reports itself
    blind while Slurm does not answer."""
    given, name, work_dir = options["job_id"] or "", options["job_name"], options["work_dir"]
    if not given or options["platform"] == "none":
        return given, name, work_dir
    try:
        found = api.find_chain(given, work_dir=work_dir or None, user=options["user"] or None)
    except api.ChainNotFound as exc:
        if given.isdigit():
            return given, name, work_dir
        raise click.UsageError(str(exc)) from None
    except api.SlurmUnreachable:
        # Blind: the watcher's pass says so (and pages); a name is all there is to go on.
        return (given, name, work_dir) if given.isdigit() else ("", name or given, work_dir)
    job_id = given if given.isdigit() else found.generation or next(reversed(found.job_ids), "")
    # Slurm's work dir is the chain's only when run.json is there: a chain the appliance
    # did not submit (the reference deployment's own sbatch, while migrating) runs in a
    # directory of its own, and the watcher must find its files from its batch script.
    ours = Layout(found.work_dir).run_json.is_file()
    return job_id, name or found.job_name, work_dir or (str(found.work_dir) if ours else "")


def variables(command: click.Command) -> set[str]:
    """Every environment variable nvrx-watch reads: its options' and the secrets'."""
    found = set(SECRETS.values())
    for param in command.params:
        envvar = param.envvar
        found.update([envvar] if isinstance(envvar, str) else envvar or [])
    return found


def _environment() -> dict[str, str]:
    """The environment, with the reference watcher's names read under ours; one of them
    that cannot be honoured, or an NVRX_WATCH_* name nvrx-watch does not read, is a usage
    error (config.reference_environment)."""
    known = variables(click.get_current_context().command)
    environ, notices, refusals = reference_environment(os.environ, known)
    if refusals:
        raise click.UsageError("; ".join(refusals))
    for notice in notices:
        click.echo(f"nvrx-watch: notice: {notice}", err=True)
    return environ


def _warn(line: str) -> None:
    click.echo(f"nvrx-watch: warning: {line}", err=True)


def main() -> None:
    watch.main(prog_name="nvrx-watch")
