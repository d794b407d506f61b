"""Exceptions raised for bad user input, each naming what was wrong and where."""


class ModelLoadError(ValueError):
    """A model could not be loaded: `path` names the file or model, the message says why."""

    def __init__(self, path: object, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


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
