"""The `deepthread` command: the composition root, where settings meet every package."""

from __future__ import annotations

import gc
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from bot.logs import JsonLogFormatter, configure_logging  # noqa: F401  # re-exported

# Only typer (and bot.logs, standard library only) at the top: `--help` must not load settings, httpx or any SDK
# (tests/unit/test_startup.py).
if TYPE_CHECKING:
    from collections.abc import Sequence

    from bot.conversation.core import ConversationCore
    from bot.platform import PlatformBundle
    from bot.supervisor import Child
    from config import Settings
    from research.report import ExportFormat
    from storage.conversations import SharedFile
    from storage.db import Sessions
    from storage.vocabulary import RunMode, RunOptions

# httpx imports its own command-line client (click, rich's progress bars and syntax, pygments) whenever those are
# installed, and they are (typer's and rich's): a few hundredths of a second of every start, for a tool deepthread
# never runs. A module marked absent is one Python's import raises ImportError for, and httpx then defines a stand-in.
sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]

app = typer.Typer(
    help="deepthread: a research bot for Slack and Discord that cites every claim.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def platform_bundles() -> list[PlatformBundle]:
    """Every chat platform deepthread speaks on, one bundle each: adding a platform is one line here."""
    from bot.console.bundle import BUNDLE as CONSOLE
    from bot.discord.bundle import BUNDLE as DISCORD
    from bot.slack.bundle import BUNDLE as SLACK

    return [SLACK, DISCORD, CONSOLE]


def configured_adapters(settings: Settings) -> list[str]:
    """The `deepthread` commands of the platform adapters whose settings are present (what `up` starts)."""
    return [bundle.adapter_command for bundle in platform_bundles() if bundle.adapter_command and bundle.configured(settings)]


def platform_core(bundle: PlatformBundle, settings: Settings,
                  sessions: Sessions | None = None) -> ConversationCore:
    """The conversation core speaking through `bundle`'s messenger and renderer (on DATABASE_URL without `sessions`)."""
    from bot.conversation.core import build_core

    outbound = bundle.outbound(settings)
    if outbound is None:
        raise ValueError(f"the {bundle.name} platform has no messenger")
    return build_core(settings, outbound.messenger, outbound.renderer, sessions=sessions)


def settings_or_exit() -> Settings:
    """The settings, or exit 2 with the one-line reason naming the bad variable."""
    from config import SettingsError, load_settings

    try:
        return load_settings()
    except SettingsError as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(code=2) from None


@app.command()
def migrate(revision: str = typer.Argument("head", help="Alembic revision to upgrade to.")) -> None:
    """Create or upgrade the database schema at DATABASE_URL; encrypt the stored Slack tokens with the first key of
    DEEPTHREAD_SECRET_KEY."""
    from storage.encryption import token_cipher
    from storage.migrate import upgrade

    settings = settings_or_exit()
    tokens = upgrade(settings.database_url, revision, token_cipher=token_cipher(settings.secret("deepthread_secret_key")))
    typer.echo(f"Database is at revision {revision}.")
    if tokens is not None and tokens.renewed:
        typer.echo(f"{tokens.renewed} stored Slack secrets encrypted with the first DEEPTHREAD_SECRET_KEY.")
    if tokens is not None and tokens.unreadable:
        typer.echo(f"{tokens.unreadable} stored Slack secrets cannot be read with any DEEPTHREAD_SECRET_KEY: put the "
                   "key that encrypted them back in the list.", err=True)
        raise typer.Exit(code=1)


@app.command()
def doctor() -> None:
    """Check every component: configured or not, reachable, what is missing (secrets masked)."""
    import httpx

    from bot.doctor import format_checks, run_checks

    settings = settings_or_exit()
    with httpx.Client(timeout=5.0) as http:
        checks = run_checks(settings, http, [bundle.doctor for bundle in platform_bundles() if bundle.doctor])
    typer.echo(format_checks(checks))
    if any(check.failed for check in checks):
        raise typer.Exit(code=1)


def _database(settings: Settings) -> Sessions:
    """The session factory of DATABASE_URL, its schema upgraded first (and the stored Slack tokens encrypted with the
    first DEEPTHREAD_SECRET_KEY)."""
    from storage.db import make_engine, make_session_factory
    from storage.encryption import token_cipher
    from storage.migrate import upgrade

    engine = make_engine(settings.database_url)
    upgrade(settings.database_url, engine=engine, token_cipher=token_cipher(settings.secret("deepthread_secret_key")))
    return make_session_factory(engine)


def _require_token_key(settings: Settings, sessions: Sessions) -> None:
    """With OAuth installs, exit 2 with one line unless DEEPTHREAD_SECRET_KEY is set and reads every stored token."""
    from bot.slack.bundle import oauth_mode
    from storage.encryption import token_cipher
    from storage.installations import token_key_problem

    if not oauth_mode(settings):
        return
    problem = token_key_problem(sessions, token_cipher(settings.secret("deepthread_secret_key")))
    if problem is not None:
        typer.echo(problem, err=True)
        raise typer.Exit(code=2)


def _request(mode: str, question: str, *, since: str | None = None, sites: Sequence[str] = (),
             depth: str | None = None, files_only: bool = False) -> tuple[str, RunOptions]:
    """The question and options, checked by the rules the chat uses; exits 2 with the chat's message when wrong."""
    from bot.conversation.commands import UsageProblem, parse_request

    words = [question.strip()]
    if since:
        words.append(f"--since {since}")
    words.extend(f"--site {site}" for site in sites)
    if depth:
        words.append(f"--{depth}")
    if files_only:
        words.append("--files-only")
    try:
        request = parse_request(" ".join(words), "research" if mode == "research" else "plan")
    except UsageProblem as problem:
        typer.echo(str(problem).replace("`", ""), err=True)
        raise typer.Exit(code=2) from None
    return request.question, request.options


def _shared_files(paths: Sequence[Path]) -> list[SharedFile]:
    """`--file` paths as files shared with the run (absolute, so a worker or a later run finds them); exits 2 naming
    one that is not a readable file."""
    if not paths:
        return []
    from bot.conversation.core import shared_files
    from research.files import FileRef, local_file_ref

    refs: dict[str, FileRef] = {}
    for path in paths:
        ref = local_file_ref(path)
        if ref is None:
            typer.echo(f"--file {path}: there is no such file.", err=True)
            raise typer.Exit(code=2)
        refs.setdefault(ref.file_id, ref)  # once, however often named
    return list(shared_files(list(refs.values())))


def _run_in_terminal(mode: RunMode, question: str, options: RunOptions, output_format: ExportFormat,
                     out: str | None, plan: dict[str, Any] | None = None, files: Sequence[SharedFile] = ()) -> int:
    """Create a run (following `plan`, when given), execute it here with a live display, then print or save its
    report; returns the run's id."""
    settings = settings_or_exit()
    question = question.strip()
    if not question:
        typer.echo("Usage: deepthread research \"your question\"", err=True)
        raise typer.Exit(code=2)
    # The engine, the LLM SDK and storage load only once the settings and the question are known to be good.
    import asyncio
    import signal

    from rich.console import Console
    from rich.live import Live

    from bot.console.bundle import TERMINAL, TERMINAL_USER
    from chat.console.render import render_progress
    from research.budget import CancelToken
    from research.cpu import cpu_pool
    from research.files import LocalFiles
    from storage.runs import export_run
    from worker.headless import create_run
    from ops.log_context import run_log_context
    from worker.attempt import RunAttempt
    from worker.runner import RunnerServices
    from worker.toolkit import build_research_tools, research_options

    pool = cpu_pool(2, task_timeout_seconds=settings.extract_timeout_seconds,
                    memory_limit_bytes=settings.extract_memory_limit_mb * 1024 * 1024)
    try:
        tools = build_research_tools(settings, cpu_pool=pool)
    except ValueError as error:
        pool.shutdown(wait=False)
        typer.echo(str(error), err=True)
        raise typer.Exit(code=2) from None
    tools.files = LocalFiles()
    if mode == "research":
        # Its processes start and import the readers while the run plans, not when its first pages arrive.
        from research.readers import load_readers

        pool.warm(load_readers)
    sessions = _database(settings)
    run_id = create_run(sessions, place=TERMINAL, requester=TERMINAL_USER, mode=mode, question=question, options=options,
                        plan=plan, files=files)
    console = Console(stderr=True)

    async def main() -> tuple[str, bool]:
        cancel = CancelToken()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGINT, cancel.cancel, "you (Ctrl-C)")
        services = RunnerServices(sessions=sessions, tools=tools, options=research_options(settings))
        with run_log_context(run_id), Live(console=console, refresh_per_second=8, transient=False) as live:
            attempt = await RunAttempt.start(run_id, services)
            if attempt is None:  # a run created a moment ago by this command: no one else can hold it
                raise RuntimeError(f"run {run_id} could not be started")

            async def on_state(progress) -> None:
                live.update(render_progress(progress))
            final = await attempt.execute(on_state=on_state, cancel=cancel)
            if final is None:  # execute() says why in the log: the database stayed unavailable
                raise RuntimeError(f"run {run_id} stopped before its outcome could be stored")
            live.update(render_progress(final))
        if not console.is_terminal:
            console.line()  # the last panel drawn on a pipe or file ends without a line break
        loop.remove_signal_handler(signal.SIGINT)
        await tools.llm.aclose()
        await tools.search_http.aclose()
        return final.state, final.partial

    try:
        state, partial = asyncio.run(main())
        text = export_run(sessions, run_id, output_format)
        if text is not None:
            # Printed before the pool's processes are stopped: waiting for them to exit took about a second.
            # A partial run finished (exit 0) without doing all that was asked: it never reads "done".
            _write_report(text, output_format, out,
                          done_line=f"Run {run_id} ended {'partial' if partial and state == 'done' else state}")
    finally:
        pool.stop_now()  # nothing more is asked of it: its processes are ended, not left a second to wind down
    if text is None:
        typer.echo(f"Run {run_id} ended {state} with no report.", err=True)
        raise typer.Exit(code=1)
    if state != "done":
        raise typer.Exit(code=1)
    return run_id


def _write_report(text: str, output_format: str, out: str | None, *, done_line: str | None = None) -> None:
    """The report to `out`, or to stdout: drawn as Markdown on a terminal, as it is when piped."""
    if out:
        with open(out, "w", encoding="utf-8") as handle:
            handle.write(text)
        if done_line:
            typer.echo(f"{done_line}; report written to {out}.", err=True)
    elif output_format == "md" and sys.stdout.isatty():
        from rich.console import Console
        from rich.markdown import Markdown

        Console().print(Markdown(text))
    else:
        typer.echo(text)


FORMATS: tuple[ExportFormat, ...] = ("md", "html", "json")


def _export_format(value: str) -> ExportFormat:
    """`value` as an export format; raises typer.BadParameter when it is not one."""
    if value not in FORMATS:
        raise typer.BadParameter(f"choose one of {', '.join(FORMATS)}")
    return value


def _check_format(value: str) -> str:
    # typer reads a callback's annotations at run time, where ExportFormat is not imported: hence plain str.
    return _export_format(value)


@app.command()
def research(
    question: str | None = typer.Argument(None, help="The question to research.", metavar="QUESTION",
                                          show_default=False),
    output_format: str = typer.Option("md", "--format", help="md, html or json.", callback=_check_format,
                                      metavar="FORMAT"),
    out: str | None = typer.Option(None, "--out", help="Write the report to this file instead of stdout.",
                                   metavar="FILE"),
    since: str | None = typer.Option(None, "--since", help="Only sources published on or after this date.",
                                     metavar="YYYY-MM-DD"),
    site: list[str] = typer.Option([], "--site", help="Only search this domain (repeatable).", metavar="DOMAIN"),
    deep: bool = typer.Option(False, "--deep", help="More rounds and sources."),
    quick: bool = typer.Option(False, "--quick", help="Fewer rounds and sources."),
    plan: int | None = typer.Option(None, "--plan", metavar="RUN_ID",
                                    help="Research as the plan `deepthread plan` drafted says (its run id), in place "
                                         "of QUESTION."),
    file: list[Path] = typer.Option([], "--file", metavar="PATH",
                                    help="A file to read and cite beside the web (repeatable): PDF, Word, Markdown, "
                                         "HTML, text or CSV."),
    files_only: bool = typer.Option(False, "--files-only", help="Only the --file files: no web search."),
) -> None:
    """Research a question here, with a live display of the phases; Ctrl-C stops and keeps what was found."""
    if deep and quick:
        typer.echo("Choose one of --deep or --quick, not both.", err=True)
        raise typer.Exit(code=2)
    if files_only and not file:
        typer.echo("--files-only needs at least one --file PATH to read.", err=True)
        raise typer.Exit(code=2)
    shared = _shared_files(file)
    if (question is None) == (plan is None):
        typer.echo('Usage: deepthread research "your question", or deepthread research --plan RUN_ID '
                   "(one of them).", err=True)
        raise typer.Exit(code=2)
    steps: dict[str, Any] | None = None
    carried: RunOptions | None = None
    if plan is not None:
        question, carried, steps = _drafted_plan(plan)
    checked, options = _request("research", question or "", since=since, sites=site,
                                depth="deep" if deep else "quick" if quick else None, files_only=files_only)
    if carried is not None:
        options = carried.merged(options)
    from bot.conversation.commands import scoped

    _run_in_terminal("research", checked, scoped(options, has_files=bool(shared)), _export_format(output_format), out,
                     plan=steps, files=shared)


def _drafted_plan(run_id: int) -> tuple[str, RunOptions, dict[str, Any]]:
    """The question, options and steps of plan run `run_id`, as approving it in the chat runs them; exits 1 with
    one line when there is no such finished plan."""
    from bot.conversation.rules import REVISION_MARKER
    from storage.conversations import load_run

    run = load_run(_database(settings_or_exit()), run_id)
    steps = (run.report_json or {}).get("plan") if run is not None and run.mode == "plan" else None
    if run is None or not steps or run.state != "done":
        typer.echo(f"Run {run_id} is not a finished plan: draft one with deepthread plan \"your question\" "
                   "(deepthread runs lists the runs).", err=True)
        raise typer.Exit(code=1)
    return run.question.split(REVISION_MARKER, 1)[0], run.options.carried(), steps


@app.command("plan")
def plan_command(question: str = typer.Argument(..., help="The question to plan research for.", metavar="QUESTION")) -> None:
    """Draft a research plan (no searching); then run it with `deepthread research --plan RUN_ID`."""
    checked, options = _request("plan", question)
    run_id = _run_in_terminal("plan", checked, options, "md", None)
    typer.echo(f"Run this plan: deepthread research --plan {run_id}", err=True)


@app.command()
def runs(limit: int = typer.Option(20, "--limit", help="How many of the latest runs to list.", metavar="N")) -> None:
    """List recent runs: id, state, mode, when, 👍/👎 feedback counts, and the question (cut to fit the terminal);
    then the watches, each with its state, next run and schedule."""
    import shutil

    from storage.runs import RUNS_HEADER, RUNS_WIDTH, WATCHES_HEADER, recent_runs, watch_lines

    settings = settings_or_exit()
    sessions = _database(settings)
    # COLUMNS, else the terminal's width; piped, 80 columns.
    width = shutil.get_terminal_size((RUNS_WIDTH, 24)).columns
    lines = recent_runs(sessions, limit, width)
    typer.echo(RUNS_HEADER if lines else "No runs yet.")
    for line in lines:
        typer.echo(line)
    watches = watch_lines(sessions, width)
    if watches:
        typer.echo()
        typer.echo(WATCHES_HEADER)
        for line in watches:
            typer.echo(line)


@app.command()
def export(
    run_id: int = typer.Argument(..., help="The run to export.", metavar="RUN_ID"),
    output_format: str = typer.Option("md", "--format", help="md, html or json.", callback=_check_format,
                                      metavar="FORMAT"),
    out: str | None = typer.Option(None, "--out", help="Write to this file instead of stdout.", metavar="FILE"),
) -> None:
    """Export a run's report as Markdown, self-contained HTML, or JSON with everything."""
    from storage.runs import export_run

    settings = settings_or_exit()
    try:
        text = export_run(_database(settings), run_id, _export_format(output_format))
    except LookupError:
        typer.echo(f"Run {run_id} does not exist (`deepthread runs` lists them).", err=True)
        raise typer.Exit(code=1) from None
    if text is None:
        typer.echo(f"Run {run_id} has no report.", err=True)
        raise typer.Exit(code=1)
    _write_report(text, output_format, out)


@app.command()
def prune(
    older_than: str | None = typer.Option(None, "--older-than", metavar="AGE",
                                          help="Age of the runs to delete: 90d (days), 12h, 2w, 3mo (30 days a month) "
                                               "or 30min; a bare m is refused (minutes or months?)."),
    workspace: str | None = typer.Option(None, "--workspace", metavar="ID",
                                         help="Delete everything stored of this workspace (a Slack team or Discord "
                                              "server id) instead: its threads, messages and runs (a run in "
                                              "flight is stopped and its thread kept for a later prune)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only count what would be deleted."),
) -> None:
    """Delete finished runs older than AGE with everything they gathered, old messages and threads left with no run;
    or, with --workspace, everything stored of one workspace."""
    import datetime as dt

    from storage.retention import count_prunable, count_workspace, forget_workspace, parse_age
    from storage.retention import prune as prune_runs

    if (older_than is None) == (workspace is None):
        typer.echo("Give --older-than AGE or --workspace ID (one of them).", err=True)
        raise typer.Exit(code=2)

    def amount(count: int, noun: str) -> str:
        return f"{count:,} {noun}{'' if count == 1 else 's'}"

    verb = "Would delete" if dry_run else "Deleted"
    if workspace is not None:
        settings = settings_or_exit()
        sessions = _database(settings)
        if dry_run:
            counts = count_workspace(sessions, workspace)
        else:
            counts = forget_workspace(sessions, workspace, by=PRUNE_CANCELLER)
            _flag_cancels(settings, counts.running, PRUNE_CANCELLER)
        typer.echo(f"{verb} {'what is' if counts.kept_conversations else 'everything'} stored of workspace {workspace}: "
                   f"{amount(counts.conversations, 'conversation')}, with {amount(counts.messages, 'message')} and {amount(counts.runs, 'run')} (with "
                   f"{amount(counts.sources, 'source')}, {amount(counts.passages, 'passage')}, "
                   f"{amount(counts.citations, 'citation')} and {amount(counts.events, 'event')})"
                   + (f", and {counts.watches:,} watch{'' if counts.watches == 1 else 'es'}." if counts.watches
                      else "."))
        if counts.kept_conversations:
            typer.echo(f"{'Would keep' if dry_run else 'Kept'} {amount(counts.kept_conversations, 'conversation')}: "
                       f"a run is still in flight ({amount(len(counts.in_flight), 'run')} "
                       f"{'to stop' if dry_run else 'stopped'}); they are removed by "
                       f"`deepthread prune --workspace {workspace}` once it ends.")
        return
    try:
        age = parse_age(older_than or "")
    except ValueError as error:
        typer.echo(f"--older-than: {error}.", err=True)
        raise typer.Exit(code=2) from None
    sessions = _database(settings_or_exit())
    cutoff = dt.datetime.now(dt.timezone.utc) - age
    counts = count_prunable(sessions, cutoff) if dry_run else prune_runs(sessions, cutoff)
    typer.echo(f"{verb} {amount(counts.runs, 'run')} created before "
               f"{cutoff:%Y-%m-%d %H:%M} UTC, with {amount(counts.sources, 'source')}, "
               f"{amount(counts.passages, 'passage')}, {amount(counts.citations, 'citation')} and "
               f"{amount(counts.events, 'event')}; {amount(counts.conversations, 'conversation')} left with no run "
               f"and {amount(counts.messages, 'message')} (theirs, and the older ones of other threads).")


PRUNE_CANCELLER = "deepthread prune"  # who stopped a run `prune --workspace` found in flight, as its thread shows


def _flag_cancels(settings: Settings, run_ids: Sequence[int], by: str) -> None:
    """Flag the runs in Redis as stopped by `by`, as `Queue.cancel` does; their rows say it already, and the workers
    read those within seconds when Redis cannot be reached."""
    if not run_ids:
        return
    from storage.redis import connect, resolve_redis_url
    from storage.shared_limits import REDIS_ERRORS, set_cancel_flag

    try:
        client = connect(resolve_redis_url(settings.redis_url, settings.data_dir), fail_fast=True)
        try:
            for run_id in run_ids:
                set_cancel_flag(client, run_id, by)
        finally:
            client.close()
    except REDIS_ERRORS as error:
        typer.echo(f"Redis unreachable ({type(error).__name__}): the workers read the stop from the runs' rows.",
                   err=True)


def _require_llm(settings: Settings) -> None:
    """Stop with one clear line when the LLM is not configured, before anything starts."""
    if not settings.llm_model:
        typer.echo("LLM_MODEL is not set: run `cp .env.example .env`, then put the model name (and LLM_API_KEY, "
                   "LLM_BASE_URL if needed) in .env.", err=True)
        raise typer.Exit(code=2)


@app.command()
def chat() -> None:
    """Talk to deepthread in this terminal: questions, /plan, /research, follow-ups, go; runs on the workers."""
    _chat()


def _chat(worker_log: Path | None = None) -> None:
    """The terminal chat; under `up`, `worker_log` is where the worker it supervises writes."""
    import asyncio

    from rich.console import Console

    from bot.console.chat import NO_WORKER, TerminalChat
    from bot.conversation.core import build_core
    from chat.console.messenger import ConsoleMessenger
    from chat.console.render import ConsoleRenderer

    settings = settings_or_exit()
    _require_llm(settings)
    sessions = _database(settings)
    console = Console()
    messenger = ConsoleMessenger(console)
    core = build_core(settings, messenger, ConsoleRenderer(), sessions=sessions)
    no_worker = NO_WORKER
    if worker_log is not None:
        no_worker = (f"The worker is not answering yet (it may still be starting, or it stopped and is being "
                     f"started again): its log is {worker_log}. This run waits in the queue until it is up.")
    asyncio.run(TerminalChat(core, sessions, messenger, console, exports=Path(settings.data_dir) / "exports",
                             no_worker=no_worker).run())


@app.command()
def up() -> None:
    """Run deepthread: migrate, start a worker, the scheduler of watches (beat) and every adapter whose tokens are set
    (or the terminal chat)."""
    _up()


def up_children(settings: Settings, adapters: Sequence[str], *, interactive: bool,
                worker_argv: list[str] | None = None) -> list[Child]:
    """What `up` supervises: a worker (`worker_argv` instead of `deepthread worker`), the beat that sends it the watch
    tick, and the adapters; with the chat on screen, the worker and the beat write to DATA_DIR/logs instead."""
    from bot.supervisor import Child

    logs = Path(settings.data_dir) / "logs"
    children = [Child("worker", log_path=logs / "worker.log" if interactive else None, argv=worker_argv),
                Child("beat", log_path=logs / "beat.log" if interactive else None)]
    children.extend(Child(adapter) for adapter in adapters)
    return children


def _up(worker_argv: list[str] | None = None) -> None:
    """`deepthread up`; `worker_argv` runs instead of `deepthread worker` (tests).

    SIGTERM, SIGHUP and Ctrl-C stop it like leaving the chat. Leaving the chat, the prompt comes back at once and the
    worker stops in the background (`Supervisor.stop_in_background`); otherwise `up` exits once its children have."""
    import os

    from bot.supervisor import Supervisor, ignore_stop_signals, interrupt_on_stop_signals

    settings = settings_or_exit()
    _require_llm(settings)
    _require_token_key(settings, _database(settings))
    adapters = configured_adapters(settings)
    interactive = not adapters and sys.stdin.isatty()
    logs = Path(settings.data_dir) / "logs"
    # With the chat on screen, the children write to files: nothing may print over the conversation.
    children = up_children(settings, adapters, interactive=interactive, worker_argv=worker_argv)
    supervisor = Supervisor(children)
    interrupt_on_stop_signals()
    try:  # a signal while the children start still stops the ones already started
        supervisor.start()
        if interactive:
            configure_logging(settings, path=logs / "chat.log")
            typer.echo(f"Worker logs: {logs / 'worker.log'}", err=True)
            _chat(worker_log=logs / "worker.log")
        else:
            if not adapters:
                tokens = " or ".join(bundle.missing_setting for bundle in platform_bundles() if bundle.adapter_command)
                typer.echo(f"No platform is configured ({tokens}) and no terminal is attached: running the "
                           "worker and beat only. Use `deepthread research \"question\"` or `deepthread chat`.",
                           err=True)
            supervisor.wait()
    except KeyboardInterrupt:
        pass
    finally:
        ignore_stop_signals()  # a second signal must not cut the stop short and leave a child running
        if interactive:
            _tell("Stopping the worker…")
            supervisor.stop_in_background(data_dir=None if settings.redis_url else os.path.abspath(settings.data_dir),
                                          log_path=logs / "worker.log")
        else:
            _tell(f"Stopping {', '.join(child.command for child in children)}…")
            supervisor.stop()


def _tell(line: str) -> None:
    """`line` on stderr, unless the terminal is gone (a hang-up)."""
    try:
        typer.echo(line, err=True)
    except OSError:
        pass


@app.command("worker")
def worker_command(
    concurrency: int | None = typer.Option(None, "--concurrency", help="Runs in flight (default WORKER_CONCURRENCY)."),
    hostname: str | None = typer.Option(None, "--hostname", help="Celery node name, e.g. worker1@%h."),
) -> None:
    """Start a research worker: Celery on the configured Redis, runs in threads, CPU work in a process pool."""
    from worker.tasks import configure, worker_argv

    settings = settings_or_exit()
    if concurrency:
        settings = settings.model_copy(update={"worker_concurrency": concurrency})
    _require_token_key(settings, _database(settings))
    configure_logging(settings)
    celery = configure(settings, platforms=platform_bundles())
    celery.worker_main(worker_argv(settings, hostname=hostname))


@app.command("beat")
def beat_command() -> None:
    """Start the scheduler of watches (Celery beat): every WATCH_TICK_SECONDS it asks the workers to start the watches
    that are due. Two running at once do no harm."""
    from worker.beat import beat_app, beat_argv

    settings = settings_or_exit()
    configure_logging(settings)
    beat_app(settings).start(beat_argv(settings))


IF_CONFIGURED_HELP = "Without this platform's token, say so and exit 0 instead of failing (for compose)."


def _exit_unless_configured(bundle: PlatformBundle, settings: Settings, if_configured: bool) -> None:
    """With --if-configured, a platform whose token is not set is not an error: one line, exit 0."""
    if if_configured and not bundle.configured(settings):
        typer.echo(f"{bundle.missing_setting} is not set: the {bundle.name} bot is not started.", err=True)
        raise typer.Exit(code=0)


@app.command("slack")
def slack_command(
    port: int = typer.Option(3000, "--port", help="Port for POST /slack/events (HTTP mode) and GET /healthz."),
    host: str | None = typer.Option(None, "--host", help="Address to listen on (default: HTTP_BIND_ADDRESS, "
                                                          "127.0.0.1 unless set)."),
    if_configured: bool = typer.Option(False, "--if-configured", help=IF_CONFIGURED_HELP),
) -> None:
    """Run the Slack bot: Socket Mode when SLACK_APP_TOKEN is set, otherwise HTTP mode at /slack/events."""
    from bot.slack.bundle import BUNDLE, missing_adapter_setting
    from bot.slack.server import run

    settings = settings_or_exit()
    _exit_unless_configured(BUNDLE, settings, if_configured)
    problem = missing_adapter_setting(settings)
    if problem is not None:
        typer.echo(problem, err=True)
        raise typer.Exit(code=2)
    sessions = _database(settings)
    _require_token_key(settings, sessions)
    configure_logging(settings)
    run(settings, platform_core(BUNDLE, settings, sessions), host=host or settings.http_bind_address, port=port)


@app.command("discord")
def discord_command(
    sync: bool = typer.Option(False, "--sync", help="Also sync the commands globally (Discord caps command "
                                                    "creations at 200 a day; they take up to an hour to appear)."),
    if_configured: bool = typer.Option(False, "--if-configured", help=IF_CONFIGURED_HELP),
) -> None:
    """Run the Discord bot: slash commands (synced to DISCORD_GUILD_IDS at start), threads, follow-ups, reactions."""
    import asyncio

    import httpx

    from bot.discord.app import DiscordBot, discover
    from bot.discord.bundle import BUNDLE, TOKEN_SETTING, http

    settings = settings_or_exit()
    _exit_unless_configured(BUNDLE, settings, if_configured)
    token = settings.secret("discord_bot_token")
    if token is None:
        typer.echo(f"{TOKEN_SETTING} is required for the Discord bot (see the README's Discord section).", err=True)
        raise typer.Exit(code=2)
    sessions = _database(settings)
    configure_logging(settings)
    core = platform_core(BUNDLE, settings, sessions)

    async def serve() -> None:
        probe = http(settings)
        try:
            connection = await discover(probe)
        except httpx.HTTPError as error:
            typer.echo(f"Discord refused or did not answer at {settings.discord_api_url} ({error}); check "
                       f"{TOKEN_SETTING} and DISCORD_API_URL (`deepthread doctor`).", err=True)
            raise typer.Exit(code=1) from None
        finally:
            await probe.aclose()
        bot = DiscordBot(settings, core, core.messenger, renderer=core.renderer, connection=connection)
        bot.sync_globally = sync
        await bot.run(token)

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass


@app.command("discord-invite")
def discord_invite() -> None:
    """Print the OAuth2 URL that adds the bot to a server (scopes bot and applications.commands, only the
    permissions it uses)."""
    from bot.discord.bundle import invite_url

    settings = settings_or_exit()
    if not settings.discord_application_id:
        typer.echo("DISCORD_APPLICATION_ID is not set: copy it from the developer portal (General Information → "
                   "Application ID) into .env.", err=True)
        raise typer.Exit(code=2)
    typer.echo(invite_url(settings.discord_application_id))


# The shell's code for a death by SIGTERM, for a command stopped before (or without) its own handling of it.
TERMINATED_EXIT_CODE = 128 + signal.SIGTERM


def _exit_on_sigterm(_signal: int, _frame: object) -> None:
    raise SystemExit(TERMINATED_EXIT_CODE)


def main() -> None:
    """`deepthread`'s entry point: the command, then an exit that leaves the process's objects to the system."""
    # Until a command handles SIGTERM itself (the worker, the bots, the chat and `up` stop cleanly and exit 0), it ends
    # the process through its exit hooks, so the last user of the embedded Redis stops it, even while starting up.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        app(prog_name="deepthread")
    finally:
        # The interpreter's teardown collects garbage over every object still alive: 0.9 s after a research run, with
        # its report printed and its pool stopped. Frozen objects are not examined; nothing runs after this.
        gc.freeze()


if __name__ == "__main__":
    main()
