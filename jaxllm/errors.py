"""Exceptions raised for bad user input, each naming what was wrong and where."""

import re


MAX_PROBLEM_CHARS = 1000  # a library's error quoted in a problem can run to pages (a whole pytree)


class ModelLoadError(ValueError):
    """A model could not be loaded: `path` names the file or model, the message says why, on one line."""

    def __init__(self, path: object, problem: str):
        self.path = str(path)
        self.problem = one_line(problem, MAX_PROBLEM_CHARS)
        super().__init__(f"{self.path}: {self.problem}")


class ModelNotFoundError(ModelLoadError, FileNotFoundError):
    """The model path or id does not exist locally."""


def lone_surrogate(text: str) -> int | None:
    """Where `text` holds a lone UTF-16 surrogate (not valid Unicode; tokenizers and JSON encoders fail on it),
    or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def printable(text: str) -> str:
    """`text` with anything that is not valid Unicode (a lone surrogate quoted from a request) escaped."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def one_line(text: str, max_chars: int | None = None) -> str:
    """`text` with its line breaks folded into spaces, cut to max_chars (the cut marked by "...")."""
    text = re.sub(r"\s*\n\s*", " ", text).strip()
    return text if max_chars is None or len(text) <= max_chars else text[:max_chars - 3] + "..."
