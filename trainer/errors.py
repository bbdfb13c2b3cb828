"""The trainer's error for bad user input; imports nothing, so data, backend and ranks need no Hydra."""


class ConfigError(ValueError):
    """Bad user input, reported before any training; the message names the key and the fix."""


def disk_full(e: BaseException | None) -> str:
    """What says a disk or quota is full in ``e`` or an error it came from ("" where nothing does):
    SQLite's words, or the OSError's (ENOSPC, EDQUOT) with its file."""
    import errno

    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return f"{e.strerror}: {e.filename}" if e.filename else str(e.strerror)
        if "database or disk is full" in str(e):
            return "SQLite: database or disk is full"
        e = e.__cause__ or e.__context__
    return ""
