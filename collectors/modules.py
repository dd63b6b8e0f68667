"""Module ranges: each ``nn.Module`` call in the profiled window as a ``record_function`` range
named with the module's qualified name and class (:class:`ModuleRanges`), so that a report can
give FLOPs, time and achieved rate per module (forward from the range that holds an op,
backward through the autograd sequence number of the op that built each backward function).

The ranges are ``pardiag::module::{path} ({class})``
(:data:`pardiag.analyzer.trace.vocab.MODULE_RANGE_PREFIX`): ``path`` is the module's qualified
name under its root, prefixed with the root's name (``GPT.blocks.0.attn``,
as :class:`ModuleRanges` says).
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


def _printable(name: str) -> str:
    """``name`` in printable ASCII, other characters escaped as Python writes them (``ü`` →
    ``\\xfc``, a tab → ``\\t``): Kineto writes a range whose name is not plain ASCII as
    ``unknown``."""
    return name if name.isascii() and name.isprintable() else ascii(name)[1:-1]


class ModuleRanges:
    """Global module forward hooks that open a range when a module's call starts and close it
    when the call returns or raises (``always_call``). Installed for the profiler's warmup and
    active steps only; outside them no hook runs. Inside a ``torch.compile``'d region the
    hooks do nothing (the compiled call is one range, named as the module that was compiled);
    adding and removing global hooks makes a compiled model recompile, in the warmup step and
    in the step after the window, neither of which is measured.

    Names follow ``torch.utils.flop_counter``'s module tracker: the first time a module that
    has no name is called, it becomes a root, named by its class (``GPT``; ``GPT_1`` for the
    second root of that class, as a GAN's two ``Sequential``), and every module it holds is
    named by its qualified name under it (``GPT.blocks.0.attn``). A module named under a root
    that a later root holds is renamed under the later one (``Dec`` called alone first, then
    inside ``Model``: ``Model.dec``); a module held by two roots keeps its first name. Names
    are printable ASCII (:func:`_printable`). Looked up by object with weak references (a freed
    module's name goes with it). Per-thread stacks: activation checkpointing reruns forwards on
    the autograd thread.

    Attributes:
        calls: ranges opened since installed.
    """

    def __init__(self) -> None:
        #: each named module's range name; the root it was named under
        self._labels: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._root_of: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._roots_of_class: dict[str, int] = {}
        self._local = threading.local()
        self._handles: list = []
        self.calls = 0

    def _stack(self) -> list:
        st = getattr(self._local, "stack", None)
        if st is None:
            st = self._local.stack = []
        return st

    def _walk(self, root) -> None:
        """Name ``root`` and every module it holds (see the class docstring)."""
        cls = type(root).__name__
        k = self._roots_of_class.get(cls, 0)
        self._roots_of_class[cls] = k + 1
        label = _printable(cls if k == 0 else f"{cls}_{k}")
        try:
            subs = list(root.named_modules(remove_duplicate=True))
        except Exception:   # a module whose tree cannot be walked: the root alone
            subs = [("", root)]
        held = {id(m) for _, m in subs}
        for path, sub in subs:
            before = self._root_of.get(sub)
            if sub in self._labels and not (before is not None and before is not root
                                            and id(before) in held):
                continue   # named under another tree: a shared module keeps its first name
            name = f"{label}.{_printable(path)}" if path else label
            self._labels[sub] = (f"{vocab.MODULE_RANGE_PREFIX}{name} "
                                 f"({_printable(type(sub).__name__)})")
            self._root_of[sub] = root

    def _label(self, module) -> str:
        try:
            label = self._labels.get(module)
            if label is None:
                self._walk(module)
                label = self._labels[module]
        except (TypeError, KeyError):   # not weakly referenceable: its class names it
            name = _printable(type(module).__name__)
            return f"{vocab.MODULE_RANGE_PREFIX}{name} ({name})"
        return label

    def _pre(self, module, args) -> None:
        if torch.compiler.is_compiling():
            return
        stack = self._stack()
        rng = _Range(self._label(module))
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
