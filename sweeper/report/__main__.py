"""``python -m sweeper.report SWEEP_ID|latest|FOLDER [...] [--out DIR]``: rebuild a sweep's report from MLflow.

Reads only the tracking store (``--tracking-uri``, else MLFLOW_TRACKING_URI, else
sqlite:///mlflow.db). Several ids make one study of all their points.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from trainer import metrics
from trainer.record import store


def find_parents(client: Any, experiment_id: str, ids: list[str]) -> list[Any]:
    """Parent runs by sweep id (or parent run id); ``latest`` is the newest sweep."""
    sweeps = client.search_runs(
        [experiment_id],
        filter_string=f"tags.`{metrics.TAG_SCHEDULER}` LIKE '%'",
        order_by=["start_time DESC"],
        max_results=50000,
    )
    sweeps = [r for r in sweeps if "mlflow.parentRunId" not in r.data.tags]
    found = []
    for wanted in ids:
        if wanted == "latest":
            match = sweeps[:1]
        elif _names_a_folder(wanted):  # a sweep's folder (multirun/DATE/TIME), there (open_experiment)
            folder = Path(wanted).resolve()
            match = [r for r in sweeps if r.data.tags.get(metrics.TAG_SWEEP_DIR) == str(folder)]
            if not match:
                raise SystemExit(f"Error: {wanted} is not the folder of a sweep in this store (none ran there)")
        else:
            match = [r for r in sweeps if wanted in (r.data.tags.get(metrics.TAG_SWEEP_ID), r.info.run_id)]
        if not match:
            known = ", ".join(r.data.tags.get(metrics.TAG_SWEEP_ID, "?") for r in sweeps[:8]) or "none"
            raise SystemExit(f"Error: no sweep {wanted!r} in this experiment; recent sweep ids: {known}")
        found.append(match[0])
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sweeper.report", description=__doc__.split("\n")[0])
    parser.add_argument("sweeps", nargs="+", metavar="SWEEP_ID", help="sweep id(s), 'latest', or a sweep's folder")
    parser.add_argument("--out", type=Path, help="folder to write to (default: the sweep's folder/report)")
    store_arguments(parser)
    parser.add_argument("--no-attach", action="store_true", help="do not log the report to the parent run")
    parser.add_argument("--target", type=float, help="time to accuracy: the test precision (default: 3 of 4 reach it)")
    args = parser.parse_args(argv)
    if args.target is not None and not 0 < args.target <= 1:
        parser.error(f"--target {args.target}: a test precision in (0, 1], e.g. 0.9")

    from sweeper.report import report_for

    client, experiment_id = open_experiment(args, args.sweeps)
    parents = find_parents(client, experiment_id, args.sweeps)
    folder = args.out or default_folder(parents)
    if (folder / "report.html").exists():  # said before the seconds of building, not after
        print(f"rewriting the report in {folder}: its files are replaced (--out FOLDER writes elsewhere)", flush=True)
    else:
        print(f"writing the report to {folder}", flush=True)
    report = report_for(client, parents, folder, attach=not args.no_attach, target=args.target)
    print(f"report of {len(report.rows)} point(s) in {report.seconds:.1f} s: {folder / 'report.html'}")
    return 0


def store_arguments(parser: argparse.ArgumentParser) -> None:
    """--tracking-uri and --experiment, as every command that reads sweeps back takes them."""
    parser.add_argument(
        "--tracking-uri", help="MLflow tracking URI (default: MLFLOW_TRACKING_URI or sqlite:///mlflow.db)"
    )
    parser.add_argument("--experiment", help="MLflow experiment (default: MLFLOW_EXPERIMENT_NAME or sweepscale)")


def _names_a_folder(wanted: str) -> bool:
    return "/" in wanted or Path(wanted).is_dir()


def open_experiment(args: argparse.Namespace, ids: list[str]) -> tuple[Any, str]:
    """The store's client and the experiment's id; without the experiment, an error and exit status 2.
    A folder among the sweeps ``ids`` that does not exist is said first: opening the store costs
    MLflow's import, 3 CPU-s."""

    uri = store.absolute_uri(store.tracking_uri(args.tracking_uri))
    db = store.sqlite_file(uri)
    if db is not None and not db.is_file():  # opening it would create an empty store
        print(f"Error: no MLflow store at {db}; run a sweep here first, or pass --tracking-uri", file=sys.stderr)
        raise SystemExit(2)
    for wanted in ids:
        if wanted != "latest" and _names_a_folder(wanted) and not Path(wanted).is_dir():
            raise SystemExit(f"Error: {wanted}: no such folder; name a sweep id, latest, or a sweep's folder")
    client = store.client(uri)
    name = store.experiment_name(args.experiment)
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        print(f"Error: no experiment {name!r} at {uri}; pass --experiment or --tracking-uri", file=sys.stderr)
        raise SystemExit(2)
    return client, experiment.experiment_id


def default_folder(parents: list[Any]) -> Path:
    sweep_dir = parents[0].data.tags.get(metrics.TAG_SWEEP_DIR)
    if len(parents) == 1 and sweep_dir and Path(sweep_dir).is_dir():
        return Path(sweep_dir) / "report"
    return Path("reports") / "+".join(p.data.tags.get(metrics.TAG_SWEEP_ID, p.info.run_id[:8]) for p in parents)


if __name__ == "__main__":
    sys.exit(main())
