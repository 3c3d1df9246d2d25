"""Online A/B experiments: ``ragqa experiment set|stop|status|report``."""

from __future__ import annotations

from typing import Any

import click

from ragqa.cli.common import Context, emit, handle_errors

__all__ = ["experiment_group"]


def _settings(obj: Context) -> Any:
    from rag.config import Settings

    return Settings.load(obj.config, **obj.overrides())


@click.group("experiment")
def experiment_group() -> None:
    """Split answers between generator profiles, and roll back in a second.

    The experiment lives where every worker and instance reads it on each request: Redis when
    serve.redis_url is set, else experiment.json in the data directory. No restart is needed;
    PUT and DELETE /v1/admin/experiment do the same over HTTP.
    """


@experiment_group.command("set")
@click.argument("name")
@click.option("--arm", "-a", "arms", multiple=True, required=True, metavar="NAME=PROFILE:WEIGHT",
              help="An arm, e.g. control=default:90 (repeat; the first is the control).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
@click.pass_obj
@handle_errors
def set_cmd(obj: Context, name: str, arms: tuple[str, ...], as_json: bool) -> None:
    """Start or change experiment NAME: every server follows at its next request.

    A caller (API key, or conversation with experiment.assign_by conversation) stays in its
    arm; changing the weights moves only the callers that must move.
    """
    from rag.experiments import Experiment, check_profiles, experiment_store, parse_arm

    settings = _settings(obj)
    exp = Experiment.create(name, [parse_arm(a) for a in arms], by="cli")
    check_profiles(exp, settings)
    store = experiment_store(settings)
    store.save(exp)
    emit({"experiment": exp.to_dict(), "store": store.where}, as_json, _status_text)


@experiment_group.command("stop")
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
@click.pass_obj
@handle_errors
def stop_cmd(obj: Context, as_json: bool) -> None:
    """Stop the experiment: from the next request on, everyone gets the control arm."""
    from rag.errors import ConfigError
    from rag.experiments import experiment_store

    store = experiment_store(_settings(obj))
    exp = store.load()
    if exp is None:
        raise ConfigError("no experiment is set")
    stopped = exp.stop(by="cli")
    store.save(stopped)
    emit({"experiment": stopped.to_dict(), "store": store.where}, as_json, _status_text)


@experiment_group.command("status")
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
@click.pass_obj
@handle_errors
def status_cmd(obj: Context, as_json: bool) -> None:
    """The experiment now: its arms, their shares of the traffic, and where it is kept."""
    from rag.experiments import experiment_store

    store = experiment_store(_settings(obj))
    exp = store.load()
    emit({"experiment": None if exp is None else exp.to_dict(), "store": store.where}, as_json, _status_text)


def _status_text(d: dict[str, Any]) -> str:
    import datetime

    exp = d["experiment"]
    if exp is None:
        return f"no experiment ({d['store']})"
    state = f"stopped: everyone on {exp['arms'][0]['name']}" if exp["stopped"] else "running"
    when = (datetime.datetime.fromtimestamp(exp["updated"], datetime.UTC).isoformat(timespec="seconds")
            if exp["updated"] else "start-up")
    lines = [f"experiment {exp['name']}: {state} (changed by {exp['by'] or '?'} at {when}; kept in {d['store']})"]
    for i, arm in enumerate(exp["arms"]):
        role = " (control)" if i == 0 and arm["name"] != "control" else ""
        lines.append(f"  {arm['name']}{role}: profile {arm['profile']}, weight {arm['weight']:g}, "
                     f"{exp['shares'][arm['name']]:.0%} of requests")
    return "\n".join(lines)


@experiment_group.command("report")
@click.option("--experiment", "-e", "name", help="Only this experiment (default: every one recorded).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per arm, in a list.")
@click.pass_obj
@handle_errors
def report_cmd(obj: Context, name: str | None, as_json: bool) -> None:
    """Per arm, from the recorded answers and feedback: answers, latency and TTFT (p50/p95 of
    generated answers), tokens/s, abstention, citation compliance, thumbs up and down."""
    from rag.feedback import answer_records, summarise

    records = answer_records(_settings(obj))
    try:
        rows = summarise(records.answers(), records.feedback(), name)
    finally:
        records.close()
    emit(rows, as_json, _report_text)


def _report_text(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no recorded answers"

    def f(v: Any, spec: str = "g") -> str:
        return "-" if v is None else format(v, spec)

    head = (f"{'experiment':<20} {'arm':<12} {'answers':>7} {'cached':>6} {'p50 ms':>8} {'p95 ms':>8} "
            f"{'ttft ms':>8} {'tok/s':>7} {'abstain':>7} {'cited':>6} {'up':>4} {'down':>4}")
    lines = [head]
    for r in rows:
        lines.append(f"{str(r['experiment'] or '-'):<20} {str(r['arm'] or '-'):<12} {r['answers']:>7} "
                     f"{r['cached']:>6} {f(r['latency_p50_ms']):>8} {f(r['latency_p95_ms']):>8} "
                     f"{f(r['ttft_p50_ms']):>8} {f(r['tokens_per_s']):>7} {f(r['abstention'], '.0%'):>7} "
                     f"{f(r['citation_compliance'], '.0%'):>6} {r['feedback_up']:>4} {r['feedback_down']:>4}")
    return "\n".join(lines)
