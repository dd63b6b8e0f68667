"""Module ranges: each ``nn.Module`` call in the profiled window as a ``record_function`` range
named with the module's qualified name and class (:class:`ModuleRanges`), so that a report can
give FLOPs, time and achieved rate per module (forward from the range that holds an op,
backward through the autograd sequence number of the op that built each backward function).

The ranges are ``pardiag::module::{path} ({class})``
(:data:`pardiag.analyzer.trace.vocab.MODULE_RANGE_PREFIX`): ``path`` is the qualified name in
the outermost module called (``transformer.h.0.attn``), the class name for that module itself.
The analyses take them as annotations, never as work (torch's fast record function writes them
as ``cpu_op`` events; the reader makes them ``user_annotation``). Their cost:
``benchmarks/module_ranges_cost.py``.
"""

from __future__ import annotations

import threading
import warnings
import weakref

import torch

from ..analyzer.trace import vocab


def _range_class():
    """torch's fast record function (a C++ range, several times cheaper than ``record_function``
    under the profiler; torch ≥ 2.2), else ``record_function``."""
    try:
        from torch._C._profiler import _RecordFunctionFast
        return _RecordFunctionFast
    except ImportError:
        return torch.profiler.record_function


_Range = _range_class()


class ModuleRanges:
    """Global module forward hooks that open a range when a module's call starts and close it
    when the call returns or raises (``always_call``). Installed for the profiler's warmup and
    active steps only; outside them no hook runs. Inside a ``torch.compile``'d region the
    hooks do nothing (the compiled call is one range, named as the module that was compiled).

    Names come from the outermost module a thread calls: its ``named_modules()`` give the
    qualified names of all it holds, looked up by object (weak references: a freed module's
    name goes with it). A module called outside every known tree is named by its class.
    Per-thread stacks: activation checkpointing reruns forwards on the autograd thread.

    Attributes:
        calls: ranges opened since installed.
    """

    def __init__(self) -> None:
        self._names: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._labels: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._local = threading.local()
        self._handles: list = []
        self.calls = 0

    def _stack(self) -> list:
        st = getattr(self._local, "stack", None)
        if st is None:
            st = self._local.stack = []
        return st

    def _name(self, module, outermost: bool) -> str:
        try:
            name = self._names.get(module)
        except TypeError:   # not weakly referenceable
            return type(module).__name__
        if name is None and outermost:
            try:
                for path, sub in module.named_modules(remove_duplicate=True):
                    self._names.setdefault(sub, path or type(module).__name__)
            except Exception:   # a module whose tree cannot be walked: its class names it
                pass
            name = self._names.get(module)
        return name if name is not None else type(module).__name__

    def _label(self, module, outermost: bool) -> str:
        try:
            label = self._labels.get(module)
        except TypeError:   # not weakly referenceable
            return f"{vocab.MODULE_RANGE_PREFIX}{type(module).__name__} ({type(module).__name__})"
        if label is None:
            label = (f"{vocab.MODULE_RANGE_PREFIX}{self._name(module, outermost)} "
                     f"({type(module).__name__})")
            if module in self._names:   # a name from a tree walk is final; a class name is not
                self._labels[module] = label
        return label

    def _pre(self, module, args) -> None:
        if torch.compiler.is_compiling():
            return
        stack = self._stack()
        rng = _Range(self._label(module, not stack))
        rng.__enter__()
        stack.append(rng)
        self.calls += 1

    def _post(self, module, args, output) -> None:
        if torch.compiler.is_compiling():
            return
        stack = self._stack()
        if stack:
            stack.pop().__exit__(None, None, None)

    def install(self) -> None:
        """Add the hooks (once)."""
        if self._handles:
            return
        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )
        # global hooks make torch.compile warn that they also fire for its OptimizedModule:
        # that is what a range per call wants
        warnings.filterwarnings("ignore", message=r"Using `torch\.compile\(module\)` when there "
                                                  r"are global hooks")
        self._handles = [register_module_forward_pre_hook(self._pre),
                         register_module_forward_hook(self._post, always_call=True)]

    def uninstall(self) -> None:
        """Remove the hooks and close this thread's ranges still open."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        stack = self._stack()
        while stack:
            stack.pop().__exit__(None, None, None)
