"""Send what points wrote while the tracking server was away (trainer/record/journal.py).

    python -m sweeper.sync [FOLDER ...]     # default: multirun/, every sweep's points

Each point's folder may hold a journal its run left when the server did not answer in time;
this sends it, in order, and ends the run as its trainer did. Sending twice is harmless.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sweeper import display
from trainer.record import journal


def sync(folders: list[Path]) -> int:
    """Send every journal under ``folders``; 0 when all are sent, 1 when one could not be."""
    results = [r for folder in folders for r in journal.send_left(folder)]
    for path, what in results:
        display.console.print(f"{path.parent}: {what}")
    if not results:
        display.console.print(f"nothing to send under {', '.join(map(str, folders))}")
    return int(any(what.startswith("not sent") for _, what in results))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sweeper.sync", description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="*", type=Path, default=[Path("multirun")], help="sweep or point folders")
    return sync(parser.parse_args(argv).folders)


if __name__ == "__main__":
    sys.exit(main())
