"""Exceptions raised for bad user input, each naming what was wrong and where."""


class ModelLoadError(ValueError):
    """A model could not be loaded: `path` names the file or model, the message says why."""

    def __init__(self, path: object, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class ModelNotFoundError(ModelLoadError, FileNotFoundError):
    """The model path or id does not exist locally."""
