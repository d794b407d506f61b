"""The child process of ChatRenderer (chat_renderer.py): run by its path (python -P), so that it imports
transformers' tokenizer and nothing of jaxllm or JAX.

    stdin:  memory bound (bytes), the pickled tokenizer, then jobs (messages, options), each pickled
    stdout: "ready" once the tokenizer is loaded, then one reply per job: (True, text) or (False, (kind, message))
"""

import os
import pickle
import resource
import sys

MAX_TEXT_CHARS = 1 << 25  # a rendered prompt longer than this is refused (no model takes 32 Mi characters)


def main() -> None:
    jobs, replies = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # anything else printed goes to the parent's log, not into the replies
    memory_bytes = pickle.load(jobs)
    tokenizer = pickle.load(jobs)
    limit_memory(memory_bytes)
    os.nice(10)  # a template that loops until it is killed yields the CPU to the server's own work
    pickle.dump("ready", replies)
    replies.flush()
    while True:
        try:
            messages, options = pickle.load(jobs)
        except EOFError:  # the parent is gone
            return
        pickle.dump(render(tokenizer, messages, options, memory_bytes), replies)
        replies.flush()


def render(tokenizer, messages, options, memory_bytes: int):
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, **options)
    except MemoryError:
        return False, ("ValueError", f"the chat template ran out of memory (its bound: {memory_bytes >> 20} MiB) "
                                     f"on these messages")
    except ValueError as e:  # the messages do not suit the template (HF's checks)
        return False, ("ValueError", str(e))
    except Exception as e:  # noqa: BLE001 - the template's own failure, named as it raised it
        return False, (type(e).__name__, str(e))
    if len(text) > MAX_TEXT_CHARS:
        return False, ("ValueError", f"the chat template's output is {len(text)} characters on these messages; at "
                                     f"most {MAX_TEXT_CHARS} are allowed")
    return True, text


def limit_memory(extra_bytes: int) -> None:
    """Cap the address space at what the process maps now plus extra_bytes (a MemoryError past it)."""
    try:
        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * resource.getpagesize()
    except OSError:  # no /proc: no memory bound
        return
    resource.setrlimit(resource.RLIMIT_AS, (mapped + extra_bytes, mapped + extra_bytes))


if __name__ == "__main__":
    main()
