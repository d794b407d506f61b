"""ChatRenderer: a model's chat template rendered in a child process, under a time and a memory bound.

A chat template is a Jinja program that comes with the model's files. Hugging Face renders it in a Jinja sandbox,
which keeps it away from Python's internals but not from looping for hours or building a string of gigabytes. So
each render runs in a child process that can be killed (chat_template_process.py):

    caller's thread                                  child process (started at the first render, again after a kill)
    prompt_ids(messages) --(messages, options)-->    tokenizer.apply_chat_template(..., tokenize=False)
                         <--(text | error)--         address space limited to its size at start + memory_bytes
    no answer within timeout_s: the child is killed and the render fails with ValueError naming the bound
    (timeout_s counts from the job: the child has loaded the tokenizer and said so before)
    the text is encoded in the caller's thread

The tokenizer travels to the child once, when it starts. A renderer runs one render at a time (a lock): give
each thread that renders its own.
"""

from __future__ import annotations

import os
import pickle
import select
import subprocess
import sys
import threading
from pathlib import Path
from typing import Sequence

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MEMORY_BYTES = 1 << 30  # beyond what the child holds once started
START_TIMEOUT_S = 120.0  # a child that has not loaded the tokenizer by then is stopped
CHILD = Path(__file__).with_name("chat_template_process.py")


class ChatRenderer:
    def __init__(self, tokenizer, timeout_s: float = DEFAULT_TIMEOUT_S, memory_bytes: int = DEFAULT_MEMORY_BYTES):
        self.tokenizer = tokenizer
        self.timeout_s = timeout_s
        self.memory_bytes = memory_bytes
        self._child: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def prompt_ids(self, messages: Sequence[dict], add_generation_prompt: bool = True,
                   continue_final_message: bool = False, *, chat_template: str | None = None,
                   tools: list[dict] | None = None, template_kwargs: dict | None = None) -> list[int]:
        """Token ids of `messages` through the chat template (the model's, or `chat_template`), ending with the
        assistant's turn opened (add_generation_prompt) or the last message left open for the model to continue.
        tools: the OpenAI tools list the template lays out; template_kwargs: values of the template's own
        variables (chat_templates.template_kwargs). ValueError when there is no template, the messages do not
        suit it or it runs over a bound; jinja2's TemplateError when the template fails (a sandbox escape
        included: jinja2's SecurityError)."""
        if chat_template is None and not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("this model's tokenizer has no chat template; use plain prompts instead")
        options = dict(template_kwargs or {}, add_generation_prompt=add_generation_prompt,
                       continue_final_message=continue_final_message)
        if chat_template is not None:
            options["chat_template"] = chat_template
        if tools:
            options["tools"] = tools
        text = self.render(list(messages), options)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def render(self, messages: list[dict], options: dict) -> str:
        with self._lock:
            self._start()
            pickle.dump((messages, options), self._child.stdin)
            self._child.stdin.flush()
            ok, value = self._reply(self.timeout_s, "the chat template did not finish within {:g} s on these messages")
        if not ok:
            raise _as_exception(*value)
        return value

    def start(self) -> None:
        """Start the child if none runs, and wait until it has loaded the tokenizer (a render does it itself)."""
        with self._lock:
            self._start()

    def _start(self) -> None:
        if self._child is not None:
            return
        search_path = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, sys.path))}  # the tokenizer's class
        self._child = subprocess.Popen([sys.executable, "-P", str(CHILD)], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, env=search_path)
        try:
            pickle.dump(self.memory_bytes, self._child.stdin)
            pickle.dump(self.tokenizer, self._child.stdin)
            self._child.stdin.flush()
        except BrokenPipeError:
            pass  # the child died: _reply says so
        except BaseException:  # the tokenizer does not pickle: no child
            self.close()
            raise
        self._reply(START_TIMEOUT_S, "the chat template's process did not start within {:g} s")

    def _reply(self, timeout_s: float, late: str):
        """The child's next message; ValueError (the child stopped) if none comes within timeout_s."""
        ready, _, _ = select.select([self._child.stdout], [], [], timeout_s)
        if not ready:
            self.close()
            raise ValueError(late.format(timeout_s))
        try:
            return pickle.load(self._child.stdout)
        except EOFError:
            code = self._child.wait()
            self.close()
            raise ValueError(f"the chat template's process died (exit code {code})") from None

    def close(self) -> None:
        """Stop the child (the next render starts another); the renderer's own thread, or one it no longer uses."""
        if self._child is not None:
            self._child.kill()
            self._child.wait()
            self._child.stdin.close()
            self._child.stdout.close()
        self._child = None



def _as_exception(kind: str, message: str) -> Exception:
    """The child's error in the caller: ValueError (the messages, or a bound), else jinja2's TemplateError
    named after the error the template raised."""
    if kind == "ValueError":
        return ValueError(message)
    from jinja2 import TemplateError

    return TemplateError(message if kind == "TemplateError" else f"{kind}: {message}")
