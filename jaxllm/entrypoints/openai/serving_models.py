"""The models a server answers to: its served base-model names and its LoRA adapters.

Adapters come from `--lora-modules` (registered with engine.add_lora at start-up, so that a bad one stops the
server before it serves) and, with runtime updating allowed, from POST /v1/load_lora_adapter. A request's `model`
field picks one by name; each adapter has its own lora_int_id (1, 2, ... in the order they were added), never
reused, not even after it was unloaded (the engine refuses a removed id).

The registry is touched on the event loop only; the engine only on its thread (AsyncEngine.call).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import os
from typing import Sequence

from jaxllm.entrypoints.openai.async_engine import EngineDeadError, RequestFailedError
from jaxllm.entrypoints.openai.errors import OpenAIError, bad_request
from jaxllm.entrypoints.openai.protocol import ModelCard
from jaxllm.lora.request import LoRARequest

RUNTIME_UPDATING_ENV = "JAXLLM_ALLOW_RUNTIME_LORA_UPDATING"


@dataclasses.dataclass(frozen=True)
class LoRAModule:
    """One --lora-modules entry: the adapter's name, its PEFT directory, and the served base model it belongs to
    (None: the first served name)."""

    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_module(text: str) -> LoRAModule:
    """`name=path` or a JSON object {"name", "path", "base_model_name"?} (vLLM's two forms); an argparse type."""
    text = text.strip()
    if text.startswith("{"):
        return _module_from_json(text)
    name, sep, path = text.partition("=")
    if not sep or not name.strip() or not path.strip():
        raise argparse.ArgumentTypeError(f"expected name=path or a JSON object with \"name\" and \"path\", got "
                                         f"{text!r}")
    return LoRAModule(name.strip(), path.strip())


def _module_from_json(text: str) -> LoRAModule:
    try:
        entry = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not valid JSON ({e})") from None
    if not isinstance(entry, dict):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a JSON object")
    unknown = sorted(set(entry) - {"name", "path", "base_model_name"})
    if unknown:
        raise argparse.ArgumentTypeError(f"{text!r}: unknown keys {unknown} (known: name, path, base_model_name)")
    for key in ("name", "path"):
        if not isinstance(entry.get(key), str) or not entry[key].strip():
            raise argparse.ArgumentTypeError(f"{text!r}: {key!r} must be a non-empty string")
    base = entry.get("base_model_name")
    if base is not None and not isinstance(base, str):
        raise argparse.ArgumentTypeError(f"{text!r}: 'base_model_name' must be a string")
    return LoRAModule(entry["name"].strip(), entry["path"].strip(), base)


def check_lora_modules(modules: Sequence[LoRAModule], served_names: Sequence[str], enable_lora: bool) -> None:
    """ValueError for --lora-modules that could never be served: LoRA not enabled, a name used twice or taken by
    a served model name, a base_model_name that is not served."""
    if not modules:
        return
    if not enable_lora:
        raise ValueError("--lora-modules needs --enable-lora")
    seen: set[str] = set()
    for module in modules:
        if module.name in served_names:
            raise ValueError(f"--lora-modules: the name {module.name!r} is already a served model name")
        if module.name in seen:
            raise ValueError(f"--lora-modules: the name {module.name!r} is given twice")
        if module.base_model_name is not None and module.base_model_name not in served_names:
            raise ValueError(f"--lora-modules {module.name}: base_model_name {module.base_model_name!r} is not a "
                             f"served model name ({', '.join(map(repr, served_names))})")
        seen.add(module.name)


def runtime_updating_allowed(flag: bool | None) -> bool:
    """--allow-runtime-lora-updating, or JAXLLM_ALLOW_RUNTIME_LORA_UPDATING=1/true."""
    return bool(flag) or os.environ.get(RUNTIME_UPDATING_ENV, "").strip().lower() in ("1", "true", "yes")


class ServedModels:
    def __init__(self, engine, base_names: Sequence[str]):
        """engine: the AsyncEngine (its .engine is the LLMEngine); base_names: the served model names."""
        self.engine = engine
        self.base_names = list(base_names)
        self._adapters: dict[str, LoRARequest] = {}  # name -> request, in the order added
        self._parents: dict[str, str] = {}  # name -> the served base model it belongs to
        self._busy: set[str] = set()  # names being loaded or unloaded right now
        self._ids = itertools.count(1)

    @property
    def lora_enabled(self) -> bool:
        return getattr(getattr(self.engine, "engine", None), "lora", None) is not None

    @property
    def adapters(self) -> list[LoRARequest]:
        return list(self._adapters.values())

    # ------------------------------------------------------------------ requests
    def resolve(self, model: str | None) -> LoRARequest | None:
        """The adapter `model` names (None for a base model, or no model); a 404 for a name not served."""
        if model is None or model in self.base_names:
            return None
        lora = self._adapters.get(model)
        if lora is None:
            raise OpenAIError(404, f"the model {model!r} does not exist; this server serves {self._listing()}",
                              "model", "model_not_found")
        return lora

    def _listing(self) -> str:
        listing = ", ".join(map(repr, self.base_names))
        if self._adapters:
            listing += f" and the LoRA adapters {', '.join(map(repr, self._adapters))}"
        return listing

    def response_name(self, lora: LoRARequest | None) -> str:
        """The `model` of a response: the adapter's name, or the first served name."""
        return lora.lora_name if lora is not None else self.base_names[0]

    def cards(self, max_model_len: int) -> list[ModelCard]:
        """/v1/models: the base models (parent null), then every adapter (root: its path; parent: its base)."""
        cards = [ModelCard(id=name, root=name, max_model_len=max_model_len) for name in self.base_names]
        cards += [ModelCard(id=name, root=lora.lora_path, parent=self._parents[name], max_model_len=max_model_len)
                  for name, lora in self._adapters.items()]
        return cards

    # ------------------------------------------------------------------ adding and removing adapters
    def add_at_start(self, modules: Sequence[LoRAModule]) -> None:
        """Register the --lora-modules before the engine thread starts; ValueError naming the module and the
        problem (the engine read and checked its files)."""
        check_lora_modules(modules, self.base_names, self.lora_enabled)
        for module in modules:
            lora = LoRARequest(module.name, next(self._ids), module.path)
            try:
                self.engine.engine.add_lora(lora)
            except ValueError as e:
                raise ValueError(f"--lora-modules {module.name}={module.path}: {e}") from None
            self._add(lora, module.base_model_name)

    def _add(self, lora: LoRARequest, base_model_name: str | None) -> None:
        self._adapters[lora.lora_name] = lora
        self._parents[lora.lora_name] = base_model_name or self.base_names[0]

    async def load(self, name: str, path: str) -> str:
        """POST /v1/load_lora_adapter: read and check the adapter (on the engine thread, between two steps) and
        serve it under `name`; a 400 naming the problem."""
        if not self.lora_enabled:
            raise bad_request("LoRA is not enabled on this server (start it with --enable-lora)")
        if not name.strip():
            raise bad_request("lora_name must not be empty", "lora_name")
        if not path.strip():
            raise bad_request("lora_path must not be empty", "lora_path")
        if name in self.base_names:
            raise bad_request(f"lora_name {name!r} is a served model name", "lora_name")
        if name in self._adapters or name in self._busy:
            raise bad_request(f"the LoRA adapter {name!r} is already loaded", "lora_name")
        lora = LoRARequest(name, next(self._ids), path)  # a failed load uses up its id too: ids are never reused
        self._busy.add(name)
        # shielded: once the engine took the adapter, the registry must know it even if the caller is gone
        await asyncio.shield(self._load_on_engine(lora))
        return f"Success: LoRA adapter {name!r} added (id {lora.lora_int_id})."

    async def _load_on_engine(self, lora: LoRARequest) -> None:
        try:
            await self._on_engine(lambda engine: engine.add_lora(lora))
        except ValueError as e:
            raise bad_request(f"the LoRA adapter {lora.lora_name!r} cannot be loaded: {e}", "lora_path") from None
        finally:
            self._busy.discard(lora.lora_name)
        self._add(lora, None)

    async def unload(self, name: str) -> str:
        """POST /v1/unload_lora_adapter: stop serving `name` (requests already running with it finish); a 404
        for a name not loaded."""
        if not self.lora_enabled:
            raise bad_request("LoRA is not enabled on this server (start it with --enable-lora)")
        lora = self._adapters.get(name)
        if lora is None:
            raise OpenAIError(404, f"the LoRA adapter {name!r} cannot be found", "lora_name", "model_not_found")
        del self._adapters[name], self._parents[name]  # new requests for it are 404s from now on
        self._busy.add(name)
        await asyncio.shield(self._unload_on_engine(lora))
        return f"Success: LoRA adapter {name!r} removed."

    async def _unload_on_engine(self, lora: LoRARequest) -> None:
        try:
            await self._on_engine(lambda engine: engine.remove_lora(lora.lora_int_id))
        finally:
            self._busy.discard(lora.lora_name)

    async def _on_engine(self, fn) -> None:
        """fn(engine) on the engine thread; the engine's own failures as OpenAIErrors (a ValueError passes)."""
        try:
            await self.engine.call(fn)
        except EngineDeadError as e:
            raise OpenAIError(503, str(e), code="engine_dead") from None
        except RequestFailedError as e:
            raise OpenAIError(500, str(e), code="request_failed") from None
