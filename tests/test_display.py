"""What the terminal shows at a sweep's end: a closing table that fits 80 columns, and an MLflow UI
command whose port is free and named by the links printed under it."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

from tests.conftest import recorded_parent

TABLE_OF_NINE = """
import sys
from sweeper import display
from trainer import metrics
from trainer.record import store

client = store.client(sys.argv[1])
outcomes = []
for h in (512, 1024, 2048):
    for n in (1, 2, 4):
        run = client.create_run(sys.argv[2], run_name=f"hidden={h},nproc={n}").info.run_id
        values = {metrics.TRAIN_LOSS_EPOCH: 0.0564, metrics.TEST_PRECISION: 0.9644,
                  metrics.weight_error("max"): 3.14e-4 * h, metrics.SAMPLES_PER_S: 4.1e7 * n}
        for key, value in values.items():
            client.log_metric(run, key, value)
        client.set_terminated(run, "FINISHED")
        outcomes.append(display.Outcome(f"hidden={h},nproc={n}", "FINISHED", client.get_run(run)))
display.summary(outcomes)
"""


def closing_table(uri: str, experiment: str, columns: int) -> list[str]:
    env = {**os.environ, "COLUMNS": str(columns)}
    done = subprocess.run(
        [sys.executable, "-c", TABLE_OF_NINE, uri, experiment], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_closing_table_of_nine_points_fits_80_columns_a_row_a_line(mlflow_uri):
    _client, exp, _parent, _tags = recorded_parent(mlflow_uri, "s80", "sweep", "hidden,nproc")
    lines = closing_table(mlflow_uri, exp, 80)
    assert all(len(line) <= 80 for line in lines), "\n".join(lines)
    rows = [line for line in lines if line.startswith("hidden=")]
    assert len(rows) == 9, "\n".join(lines)  # each point whole on one line
    for row in rows:  # its numbers whole: an exponent split over two lines reads as another number
        assert re.search(r"FINISHED +0\.0564 +0\.9644 +\d\.\d\de-0[1-4] +\d+\.\d M", row), row
    wide = closing_table(mlflow_uri, exp, 160)  # room for the run ids
    assert any(re.search(r"[0-9a-f]{32}", line) for line in wide), "\n".join(wide)


FIRST_FREE = "from trainer.record.console import ui_port; print(ui_port())"


def test_the_mlflow_ui_command_takes_a_port_nothing_listens_on_and_its_links_name_it():
    taken = int(subprocess.check_output([sys.executable, "-c", FIRST_FREE], text=True, timeout=60))
    with socket.socket() as server:  # another server comes to listen there (another MLflow, say)
        server.bind(("127.0.0.1", taken))
        server.listen()
        show = "from sweeper import display; display.closing(None, 'sqlite:////tmp/x.db', '1', 'abc')"
        out = subprocess.check_output([sys.executable, "-c", show], text=True, timeout=60)
    port = int(re.search(r"--port (\d+)", out).group(1))
    assert port != taken, out
    links = re.findall(r"http://127\.0\.0\.1:(\d+)/", out)
    assert links and set(links) == {str(port)}, out


PROGRESS = """
import time
from sweeper import display
p = display.Progress(6)
p.update({"running": 4, "queued": 2}, running=["hidden=16", "hidden=24", "hidden=32", "hidden=40"])
time.sleep(0.2)
p.update({"running": 2, "done": 2, "queued": 2}, running=["hidden=48", "hidden=56"])
p.update({"running": 2, "done": 2, "queued": 2}, running=["hidden=48 (epoch 3/50)", "hidden=56"])
p.update({"running": 5, "done": 1}, running=["hidden=48 (epoch 4/50)", "hidden=56", "hidden=64"], n_running=5)
"""


def test_the_progress_line_names_the_points_running_and_the_time_left():
    out = subprocess.check_output([sys.executable, "-c", PROGRESS], text=True, timeout=60).splitlines()
    assert out[0].endswith("queued 2  running 4  of 6  now: hidden=16, hidden=24, hidden=32 +1"), out
    assert "left]" not in out[0]  # no pace yet: nothing has ended
    assert re.search(
        r"\[sweep +0\.\d s, about 0 s left\] queued 2  running 2  done 2  of 6  now: hidden=48, hidden=56$", out[1]
    ), out
    # Off a terminal a point's next epoch prints no line of its own; the epoch rides on the next one.
    assert len(out) == 3 and out[2].endswith("now: hidden=48 (epoch 4/50), hidden=56, hidden=64 +2"), out


def test_the_time_left_counts_from_when_the_points_began():
    """Points started ahead of the store (sweeper/track/ahead.py) may have ended before the watch's
    first line: timed from the watch, 2 of 6 ended read "about 0 s left"; from their start, 20 s."""
    began = "import time; from sweeper import display; p = display.Progress(6, t0=time.monotonic() - 10)"
    script = f"{began}; p.update({{'done': 2, 'running': 2, 'queued': 2}})"
    out = subprocess.check_output([sys.executable, "-c", script], text=True, timeout=60)
    # 10 s before the line, and whatever a busy machine adds between (2 of 6 ended: twice that left).
    assert re.search(r"\[sweep +1\d\.\d s, about [23]\d s left\] queued 2  running 2  done 2  of 6", out), out
